"""The LTX-Video family: Lightricks' real-time video DiT (``LTXPipeline``, text-to-video).

``LTXVideoTransformer3DModel`` runs ``transformer_blocks[i].attn1`` (self-attention over the
video tokens with 3D RoPE) and ``transformer_blocks[i].attn2`` (cross-attention to the T5-XXL
prompt, with the prompt's padding mask). Its ``AutoencoderKLLTXVideo`` compresses 32x in
space (patch 4 x three 2x downsamplings) and 8x in time, with 128 latent channels, so the
transformer uses patch size 1: sizes are multiples of 32 and frame counts ``8k+1``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from omni_plugin_diffusion.family import AttentionRoles, DiffusersFamily
from omni_plugin_diffusion.tiny import seeded, tiny_t5_encoder, tiny_t5_tokenizer

from omni_core.generation.request import GenerationProfile, ResolvedGeneration

#: the T5 tokenizer length of the released checkpoints (and the pipeline's max_sequence_length)
TEXT_TOKENS = 128


class LTXVideo(DiffusersFamily):
    """LTX-Video 2B (0.9.x releases in the diffusers layout): 704x480, 161 frames at 25 fps."""

    pipeline_class = "LTXPipeline"
    profile = GenerationProfile(
        task="text-to-video",
        default_width=704,
        default_height=480,
        # the release recommends up to 720x1280 and fewer than 257 frames; more runs, but degrades
        size_multiple=32,
        min_size=32,
        default_steps=50,
        default_guidance=3.0,
        default_frames=161,
        frames_step=8,
        frames_offset=1,
        default_fps=25,
        extra_options={
            "decode_timestep": "timestep the VAE decodes at (0.9.1+ VAEs with timestep conditioning; e.g. 0.05)",
            "decode_noise_scale": "noise mixed into the latents before a timestep-conditioned decode (e.g. 0.025)",
            "guidance_rescale": "rescales the guided noise prediction to curb over-exposure (0 = off)",
        },
    )
    attention_roles: ClassVar[AttentionRoles] = (
        ("transformer.transformer_blocks.*.attn1", "self", "self"),
        ("transformer.transformer_blocks.*.attn2", "cross", "cross"),
    )
    #: attn2 passes the prompt's padding mask (as an additive bias)
    attention_masks: ClassVar[bool | tuple[str, ...]] = ("cross",)
    dit_modules: ClassVar[tuple[str, ...]] = ("transformer",)
    encoder_modules: ClassVar[tuple[str, ...]] = ("text_encoder",)
    resident_modules: ClassVar[tuple[str, ...]] = ("vae",)
    block_attrs: ClassVar[tuple[str, ...]] = ("transformer.transformer_blocks",)
    default_dtypes: ClassVar[dict[str, str]] = {"cpu": "float32"}
    fallback_dtype: ClassVar[str] = "bfloat16"

    @classmethod
    def call_kwargs(cls, request: ResolvedGeneration, pipeline: Any) -> dict[str, Any]:
        kwargs = super().call_kwargs(request, pipeline)
        # LTX scales its temporal RoPE by the frame rate: the rate asked for is a model input
        kwargs["frame_rate"] = request.fps
        return kwargs

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXVideoTransformer3DModel

        latent_channels = 16
        seeded(seed)
        transformer = LTXVideoTransformer3DModel(
            in_channels=latent_channels,
            out_channels=latent_channels,
            patch_size=1,
            patch_size_t=1,
            num_attention_heads=2,
            attention_head_dim=16,
            cross_attention_dim=32,
            num_layers=2,
            caption_channels=32,  # the tiny T5's d_model
        ).eval()
        seeded(seed + 2)
        # the 0.9.0 VAE's layout (patch 4, three spatio-temporal downsamplings: 32x / 8x), narrow
        vae = AutoencoderKLLTXVideo(
            in_channels=3,
            out_channels=3,
            latent_channels=latent_channels,
            block_out_channels=(8, 8, 8, 8),
            decoder_block_out_channels=(8, 8, 8, 8),
            layers_per_block=(1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1, 1),
            spatio_temporal_scaling=(True, True, True, False),
            decoder_spatio_temporal_scaling=(True, True, True, False),
            decoder_inject_noise=(False, False, False, False, False),
            upsample_residual=(False, False, False, False),
            upsample_factor=(1, 1, 1, 1),
            timestep_conditioning=False,
            patch_size=4,
            patch_size_t=1,
            encoder_causal=True,
            decoder_causal=False,
        ).eval()
        # the scheduler the released checkpoints ship (diffusers' LTX conversion)
        scheduler = FlowMatchEulerDiscreteScheduler(
            use_dynamic_shifting=True,
            base_shift=0.95,
            max_shift=2.05,
            base_image_seq_len=1024,
            max_image_seq_len=4096,
            shift_terminal=0.1,
        )
        return {
            "transformer": transformer,
            "vae": vae,
            "scheduler": scheduler,
            "text_encoder": tiny_t5_encoder(seed + 1, d_model=32),
            "tokenizer": tiny_t5_tokenizer(model_max_length=TEXT_TOKENS),
        }
