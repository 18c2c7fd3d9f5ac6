"""The FLUX families: FLUX.1 [dev] and [schnell] (``FluxPipeline``), FLUX.2 [dev]
(``Flux2Pipeline``) and FLUX.2 [klein] distilled and base (``Flux2KleinPipeline``).

Siblings that share a pipeline class are told apart by their checkpoint's configs, never
by load order (see ``hooks.py``):

* FLUX.1 [dev] is guidance-distilled: its transformer embeds the guidance scale
  (``transformer.guidance_embeds: true``); [schnell] is timestep-distilled to 4 steps and
  has no guidance embedding (``guidance_embeds: false``), so it takes no guidance scale.
* FLUX.2 [klein] checkpoints say in ``model_index.json`` whether they are step-distilled
  (``is_distilled: true``: 4 steps, no guidance); the base models run 50 steps with
  classifier-free guidance.

Everything here is class-level declarations plus ``tiny_components``; the shared runtime in
``omni_plugin_diffusion`` loads and runs the pipelines.
"""

from __future__ import annotations

from typing import Any, ClassVar

from omni_plugin_diffusion.family import AttentionRoles, DiffusersFamily

from omni_core.generation.request import GenerationOptionError, GenerationProfile, ResolvedGeneration

#: FLUX.1 [dev]'s ``scheduler/scheduler_config.json`` (resolution-dependent shift)
FLUX1_DEV_SCHEDULER: dict[str, Any] = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}
#: FLUX.1 [schnell]'s: no shift at all
FLUX1_SCHNELL_SCHEDULER: dict[str, Any] = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": False,
}
#: FLUX.2's (the pipeline computes ``mu`` from the image size and step count)
FLUX2_SCHEDULER: dict[str, Any] = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}


def _int_option(request: ResolvedGeneration, name: str, low: int, high: int) -> None:
    value = request.extra.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GenerationOptionError(f"{name} {value!r} is not allowed: it must be a whole number from {low} to {high}")


def _float_option(request: ResolvedGeneration, name: str, low: float) -> float | None:
    value = request.extra.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
        raise GenerationOptionError(f"{name} {value!r} is not allowed: it must be a number of at least {low}")
    return float(value)


# -- FLUX.1 ----------------------------------------------------------------------------------


class Flux1Family(DiffusersFamily):
    """What FLUX.1 [dev] and [schnell] share: ``FluxPipeline`` with CLIP-L + T5-XXL and a
    19 double-stream + 38 single-stream block MMDiT."""

    pipeline_class = "FluxPipeline"
    #: double-stream blocks attend jointly over text and image tokens; single-stream blocks
    #: run one self-attention over the concatenated sequence
    attention_roles: ClassVar[AttentionRoles] = (
        ("transformer.transformer_blocks.*.attn", "flux.joint", "self"),
        ("transformer.single_transformer_blocks.*.attn", "flux.single", "self"),
        ("*", "self", "self"),
    )
    attention_masks = False
    dit_modules = ("transformer",)
    encoder_modules = ("text_encoder", "text_encoder_2")
    resident_modules = ("vae",)
    block_attrs = ("transformer.transformer_blocks", "transformer.single_transformer_blocks")
    cache_declarations: ClassVar[dict[str, dict[str, Any]]] = {
        # TeaCache's published FLUX.1 rescaling (TeaCache4FLUX), fitted on the first
        # double-stream block's norm1 output; 0.4 is its ~1.8x setting (0.25: 1.5x, 0.6: 2x)
        "teacache": {
            "extractor": "flux",
            "coefficients": [4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00, 2.64230861e-01],
            "rel_l1_thresh": 0.4,
            "blocks": ["transformer_blocks", "single_transformer_blocks"],
            "block_outputs": ["encoder_hidden_states", "hidden_states"],
        },
        # both block lists take (hidden_states, encoder_hidden_states, ...) and return
        # (encoder_hidden_states, hidden_states): cache-dit's Pattern_1
        "cache_dit": {
            "blocks": ["transformer_blocks", "single_transformer_blocks"],
            "forward_patterns": ["Pattern_1", "Pattern_1"],
        },
    }
    #: T5 prompt tokens when the request does not say (the pipeline's own limit is 512)
    max_sequence_length: ClassVar[int] = 512
    max_sequence_limit: ClassVar[int] = 512
    guidance_embeds: ClassVar[bool] = True
    scheduler_config: ClassVar[dict[str, Any]] = FLUX1_DEV_SCHEDULER

    @classmethod
    def check_request(cls, request: ResolvedGeneration, pipeline: Any) -> None:
        _int_option(request, "max_sequence_length", 1, cls.max_sequence_limit)
        true_cfg = _float_option(request, "true_cfg_scale", 1.0)
        if true_cfg is not None and request.negative_prompt is None:
            raise GenerationOptionError(
                "true_cfg_scale applies only with a negative_prompt; give one or leave it unset"
            )

    @classmethod
    def call_kwargs(cls, request: ResolvedGeneration, pipeline: Any) -> dict[str, Any]:
        kwargs = super().call_kwargs(request, pipeline)
        kwargs.setdefault("max_sequence_length", cls.max_sequence_length)
        if request.negative_prompt is not None:
            # FluxPipeline ignores a negative prompt unless true CFG is on (true_cfg_scale > 1)
            kwargs.setdefault("true_cfg_scale", 4.0)
        return kwargs

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
        from omni_plugin_diffusion.tiny import (
            seeded,
            tiny_clip_text,
            tiny_clip_tokenizer,
            tiny_t5_encoder,
            tiny_t5_tokenizer,
        )

        seeded(seed)
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=16,  # 4 latent channels packed 2x2
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,  # the T5 encoder's d_model
            pooled_projection_dim=32,  # the CLIP encoder's pooled output
            guidance_embeds=cls.guidance_embeds,
            axes_dims_rope=(4, 6, 6),  # sums to attention_head_dim
        )
        seeded(seed + 1)
        vae = _tiny_flux1_vae()
        return {
            "transformer": transformer.eval(),
            "vae": vae.eval(),
            "text_encoder": tiny_clip_text(seed + 2, hidden_size=32, projection_dim=32),
            "tokenizer": tiny_clip_tokenizer(),
            "text_encoder_2": tiny_t5_encoder(seed + 3, d_model=32),
            "tokenizer_2": tiny_t5_tokenizer(model_max_length=512),
            "scheduler": FlowMatchEulerDiscreteScheduler(**cls.scheduler_config),
        }


def _tiny_flux1_vae() -> Any:
    """FLUX.1's VAE layout (4 levels: 8x downsampling, no quant convs, its latent scale and
    shift) with 4 latent channels and narrow blocks."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 16, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=64,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


class Flux1Dev(Flux1Family):
    """FLUX.1 [dev]: guidance-distilled, 28 steps at guidance 3.5 (embedded, not CFG)."""

    profile = GenerationProfile(
        task="text-to-image",
        default_width=1024,
        default_height=1024,
        size_multiple=16,  # VAE 8x times the 2x2 latent packing
        max_size=2048,
        default_steps=28,
        default_guidance=3.5,
        uses_guidance=True,
        supports_negative_prompt=True,
        max_outputs=4,
        extra_options={
            "true_cfg_scale": "true classifier-free guidance with the negative prompt (default 4.0 when a "
            "negative prompt is given; each step then runs the transformer twice)",
            "max_sequence_length": "T5 prompt tokens, 1 to 512 (default 512)",
        },
    )
    guidance_embeds = True
    scheduler_config = FLUX1_DEV_SCHEDULER


class Flux1Schnell(Flux1Family):
    """FLUX.1 [schnell]: timestep-distilled to 4 steps; no guidance scale, no negative prompt."""

    profile = GenerationProfile(
        task="text-to-image",
        default_width=1024,
        default_height=1024,
        size_multiple=16,
        max_size=2048,
        default_steps=4,
        max_steps=50,
        default_guidance=0.0,
        uses_guidance=False,
        supports_negative_prompt=False,
        max_outputs=4,
        extra_options={"max_sequence_length": "T5 prompt tokens, 1 to 256 (default 256)"},
    )
    guidance_embeds = False
    scheduler_config = FLUX1_SCHNELL_SCHEDULER
    max_sequence_length = 256
    max_sequence_limit = 256


# -- FLUX.2 ----------------------------------------------------------------------------------


class Flux2Family(DiffusersFamily):
    """What the FLUX.2 pipelines share: a 4D-RoPE MMDiT (``Flux2Transformer2DModel``) fed
    the stacked hidden states of three layers of one decoder LLM, and the FLUX.2 VAE."""

    attention_roles: ClassVar[AttentionRoles] = (
        ("transformer.transformer_blocks.*.attn", "flux2.joint", "self"),
        ("transformer.single_transformer_blocks.*.attn", "flux2.single", "self"),
        ("*", "self", "self"),
    )
    attention_masks = False
    dit_modules = ("transformer",)
    encoder_modules = ("text_encoder",)
    resident_modules = ("vae",)
    block_attrs = ("transformer.transformer_blocks", "transformer.single_transformer_blocks")
    max_sequence_limit: ClassVar[int] = 512

    @classmethod
    def check_request(cls, request: ResolvedGeneration, pipeline: Any) -> None:
        _int_option(request, "max_sequence_length", 1, cls.max_sequence_limit)

    @classmethod
    def call_kwargs(cls, request: ResolvedGeneration, pipeline: Any) -> dict[str, Any]:
        kwargs = super().call_kwargs(request, pipeline)
        kwargs.pop("negative_prompt", None)  # refused by the profile; the pipelines take none
        return kwargs

    @classmethod
    def _tiny_transformer(cls, seed: int, joint_attention_dim: int, guidance_embeds: bool) -> Any:
        from diffusers import Flux2Transformer2DModel
        from omni_plugin_diffusion.tiny import seeded

        seeded(seed)
        return Flux2Transformer2DModel(
            patch_size=1,
            in_channels=16,  # 4 latent channels patchified 2x2
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=joint_attention_dim,
            timestep_guidance_channels=32,
            mlp_ratio=2.0,
            axes_dims_rope=(4, 4, 4, 4),  # sums to attention_head_dim
            guidance_embeds=guidance_embeds,
        ).eval()

    @classmethod
    def _tiny_vae(cls, seed: int) -> Any:
        from diffusers import AutoencoderKLFlux2
        from omni_plugin_diffusion.tiny import seeded

        seeded(seed)
        return AutoencoderKLFlux2(
            block_out_channels=(8, 16, 16, 16),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=8,
            sample_size=64,
        ).eval()


class Flux2Dev(Flux2Family):
    """FLUX.2 [dev]: Mistral Small 3.x as the text encoder, guidance-distilled (the guidance
    scale is embedded), 50 steps at guidance 4.0."""

    pipeline_class = "Flux2Pipeline"
    profile = GenerationProfile(
        task="text-to-image",
        default_width=1024,
        default_height=1024,
        size_multiple=16,
        max_size=2048,
        default_steps=50,
        default_guidance=4.0,
        uses_guidance=True,
        supports_negative_prompt=False,
        max_outputs=4,
        extra_options={"max_sequence_length": "text-encoder prompt tokens, 1 to 512 (default 512)"},
    )

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        from diffusers import FlowMatchEulerDiscreteScheduler

        from omni_plugin_flux.tiny import MISTRAL_OUT_LAYERS, tiny_mistral3, tiny_mistral_tokenizer

        text_encoder = tiny_mistral3(seed + 2)
        hidden = text_encoder.config.text_config.hidden_size
        return {
            "transformer": cls._tiny_transformer(seed, len(MISTRAL_OUT_LAYERS) * hidden, guidance_embeds=True),
            "vae": cls._tiny_vae(seed + 1),
            "text_encoder": text_encoder,
            "tokenizer": tiny_mistral_tokenizer(),
            "scheduler": FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER),
        }


class Flux2KleinFamily(Flux2Family):
    """FLUX.2 [klein]: Qwen3 as the text encoder, no guidance embedding."""

    pipeline_class = "Flux2KleinPipeline"
    is_distilled: ClassVar[bool] = True

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        from diffusers import FlowMatchEulerDiscreteScheduler
        from omni_plugin_diffusion.tiny import tiny_qwen_tokenizer

        from omni_plugin_flux.tiny import QWEN3_OUT_LAYERS, tiny_qwen3_deep

        text_encoder = tiny_qwen3_deep(seed + 2)
        hidden = text_encoder.config.hidden_size
        return {
            "transformer": cls._tiny_transformer(seed, len(QWEN3_OUT_LAYERS) * hidden, guidance_embeds=False),
            "vae": cls._tiny_vae(seed + 1),
            "text_encoder": text_encoder,
            "tokenizer": tiny_qwen_tokenizer(model_max_length=512),
            "scheduler": FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER),
            "is_distilled": cls.is_distilled,
        }


class Flux2Klein(Flux2KleinFamily):
    """FLUX.2 [klein] 4B/9B: step-distilled to 4 steps; takes no guidance scale."""

    profile = GenerationProfile(
        task="text-to-image",
        default_width=1024,
        default_height=1024,
        size_multiple=16,
        max_size=2048,
        default_steps=4,
        max_steps=50,
        default_guidance=1.0,
        uses_guidance=False,
        supports_negative_prompt=False,
        max_outputs=4,
        extra_options={"max_sequence_length": "text-encoder prompt tokens, 1 to 512 (default 512)"},
    )
    is_distilled = True


class Flux2KleinBase(Flux2KleinFamily):
    """FLUX.2 [klein] base 4B/9B: undistilled, 50 steps with classifier-free guidance 4.0
    (against an empty negative prompt, which the pipeline fixes)."""

    profile = GenerationProfile(
        task="text-to-image",
        default_width=1024,
        default_height=1024,
        size_multiple=16,
        max_size=2048,
        default_steps=50,
        default_guidance=4.0,
        uses_guidance=True,
        supports_negative_prompt=False,
        max_outputs=4,
        extra_options={"max_sequence_length": "text-encoder prompt tokens, 1 to 512 (default 512)"},
    )
    is_distilled = False
