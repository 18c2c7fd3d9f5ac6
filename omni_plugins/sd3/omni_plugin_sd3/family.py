"""The Stable Diffusion 3 families, all served by ``StableDiffusion3Pipeline``: an MMDiT
conditioned on two CLIP text encoders with projection (CLIP-L and OpenCLIP bigG: their
penultimate hidden states are concatenated, their pooled projections give the pooled vector)
and T5-XXL, decoded by a 16-channel VAE. Real classifier-free guidance, so negative prompts
work and every step runs the transformer on a batch of two.

The three releases share the pipeline class and are told apart by their transformer config
(see ``hooks.py``), because their tuned step counts and guidance scales differ:

* ``sd3.5-large`` (SD 3.5 Large, 8B; also Large Turbo's layout): 28 steps, guidance 3.5;
* ``sd3.5-medium`` (SD 3.5 Medium, 2.5B MMDiT-X: the first 13 blocks add a second, image-only
  self-attention ``attn2``; a 384-wide position table): 40 steps, guidance 4.5;
* ``sd3-medium`` (SD 3 Medium, 2B, no QK-norm): 28 steps, guidance 7.0.
"""

from __future__ import annotations

from typing import Any, ClassVar

from omni_plugin_diffusion.family import AttentionRoles, DiffusersFamily

from omni_core.generation.request import GenerationOptionError, GenerationProfile, ResolvedGeneration

#: every SD3 / SD3.5 release's ``scheduler/scheduler_config.json``
SD3_SCHEDULER: dict[str, Any] = {"num_train_timesteps": 1000, "shift": 3.0}

EXTRA_OPTIONS = {
    "max_sequence_length": "T5 prompt tokens, 1 to 512 (default 256)",
}


def _profile(steps: int, guidance: float) -> GenerationProfile:
    return GenerationProfile(
        task="text-to-image",
        default_width=1024,
        default_height=1024,
        size_multiple=16,  # VAE 8x times the transformer's 2x2 patches
        max_size=2048,
        default_steps=steps,
        default_guidance=guidance,
        uses_guidance=True,
        supports_negative_prompt=True,
        max_outputs=4,
        extra_options=dict(EXTRA_OPTIONS),
    )


class SD3Family(DiffusersFamily):
    """What every SD3 release shares; subclasses set the profile and the transformer layout."""

    pipeline_class = "StableDiffusion3Pipeline"
    #: ``attn`` is the joint text+image attention of every block; ``attn2`` (SD 3.5 Medium's
    #: MMDiT-X blocks) is a second self-attention over the image tokens only, not a cross-attention
    attention_roles: ClassVar[AttentionRoles] = (
        ("transformer.transformer_blocks.*.attn2", "sd3.image_self", "self"),
        ("transformer.transformer_blocks.*.attn", "sd3.joint", "self"),
        ("*", "self", "self"),
    )
    attention_masks = False
    dit_modules = ("transformer",)
    encoder_modules = ("text_encoder", "text_encoder_2", "text_encoder_3")
    resident_modules = ("vae",)
    block_attrs = ("transformer.transformer_blocks",)
    #: T5 prompt tokens when the request does not say (the pipeline's default)
    max_sequence_length: ClassVar[int] = 256
    #: the tiny transformer's distinguishing config (the real release's values)
    tiny_transformer_config: ClassVar[dict[str, Any]] = {}

    @classmethod
    def check_request(cls, request: ResolvedGeneration, pipeline: Any) -> None:
        value = request.extra.get("max_sequence_length")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 512):
            raise GenerationOptionError(
                f"max_sequence_length {value!r} is not allowed: it must be a whole number from 1 to 512"
            )

    @classmethod
    def call_kwargs(cls, request: ResolvedGeneration, pipeline: Any) -> dict[str, Any]:
        kwargs = super().call_kwargs(request, pipeline)
        kwargs.setdefault("max_sequence_length", cls.max_sequence_length)
        return kwargs

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
        from omni_plugin_diffusion.tiny import (
            seeded,
            tiny_clip_text,
            tiny_clip_tokenizer,
            tiny_t5_encoder,
            tiny_t5_tokenizer,
        )

        clip_dim = 16  # each CLIP's hidden size and projection (real: 768 and 1280)
        t5_dim = 64  # real: 4096; at least the two CLIP widths together, which are padded to it
        seeded(seed)
        transformer = SD3Transformer2DModel(
            sample_size=32,
            patch_size=2,
            in_channels=4,
            out_channels=4,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=2,
            joint_attention_dim=t5_dim,
            caption_projection_dim=16,  # the transformer's width (heads x head dim)
            pooled_projection_dim=2 * clip_dim,
            **cls.tiny_transformer_config,
        )
        seeded(seed + 1)
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            block_out_channels=(8, 16, 16, 16),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=8,
            sample_size=64,
            scaling_factor=1.5305,
            shift_factor=0.0609,
            use_quant_conv=False,
            use_post_quant_conv=False,
        )
        return {
            "transformer": transformer.eval(),
            "vae": vae.eval(),
            "text_encoder": tiny_clip_text(
                seed + 2, hidden_size=clip_dim, projection_dim=clip_dim, with_projection=True
            ),
            "tokenizer": tiny_clip_tokenizer(),
            "text_encoder_2": tiny_clip_text(
                seed + 3, hidden_size=clip_dim, projection_dim=clip_dim, with_projection=True
            ),
            "tokenizer_2": tiny_clip_tokenizer(),
            "text_encoder_3": tiny_t5_encoder(seed + 4, d_model=t5_dim),
            "tokenizer_3": tiny_t5_tokenizer(model_max_length=512),
            "scheduler": FlowMatchEulerDiscreteScheduler(**SD3_SCHEDULER),
        }


class SD35Large(SD3Family):
    """Stable Diffusion 3.5 Large: 28 steps, guidance 3.5."""

    profile = _profile(steps=28, guidance=3.5)
    tiny_transformer_config = {"qk_norm": "rms_norm", "pos_embed_max_size": 96}


class SD35Medium(SD3Family):
    """Stable Diffusion 3.5 Medium (MMDiT-X): 40 steps, guidance 4.5."""

    profile = _profile(steps=40, guidance=4.5)
    tiny_transformer_config = {"qk_norm": "rms_norm", "pos_embed_max_size": 384, "dual_attention_layers": (0,)}


class SD3Medium(SD3Family):
    """Stable Diffusion 3 Medium: 28 steps, guidance 7.0."""

    profile = _profile(steps=28, guidance=7.0)
    tiny_transformer_config = {"qk_norm": None, "pos_embed_max_size": 96}
