"""A test-only family for the runtime's own tests: PixArt-alpha's diffusers pipeline (a T5
encoder and a DiT whose blocks have self ``attn1`` and cross ``attn2`` attention), tiny.

Shipped families live in their own plugins; this one exists so the runtime is tested without
depending on any of them."""

from __future__ import annotations

from typing import Any

from omni_plugin_diffusion import DiffusersFamily
from omni_plugin_diffusion.tiny import seeded, tiny_t5_encoder, tiny_t5_tokenizer

from omni_core.generation.request import GenerationProfile


class TinyPixArt(DiffusersFamily):
    pipeline_class = "PixArtAlphaPipeline"
    profile = GenerationProfile(
        task="text-to-image",
        default_width=32,
        default_height=32,
        size_multiple=16,
        max_size=256,
        default_steps=2,
        default_guidance=4.5,
    )
    attention_roles = (("*.attn2", "cross", "cross"), ("*", "self", "self"))
    attention_masks = True
    block_attrs = ("transformer.transformer_blocks",)

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        from diffusers import AutoencoderKL, DPMSolverMultistepScheduler, PixArtTransformer2DModel

        seeded(seed)
        transformer = PixArtTransformer2DModel(
            sample_size=4,
            num_layers=3,
            patch_size=2,
            attention_head_dim=8,
            num_attention_heads=2,
            caption_channels=32,
            in_channels=4,
            cross_attention_dim=16,
            out_channels=8,
            attention_bias=True,
            activation_fn="gelu-approximate",
            num_embeds_ada_norm=1000,
            norm_type="ada_norm_single",
            norm_elementwise_affine=False,
            norm_eps=1e-6,
        )
        seeded(seed + 1)
        vae = AutoencoderKL(
            block_out_channels=(8, 16),
            in_channels=3,
            out_channels=3,
            latent_channels=4,
            norm_num_groups=8,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            sample_size=32,
        )
        return {
            "transformer": transformer.eval(),
            "vae": vae.eval(),
            "text_encoder": tiny_t5_encoder(seed + 2),
            "tokenizer": tiny_t5_tokenizer(),
            "scheduler": DPMSolverMultistepScheduler(),
        }

    @classmethod
    def call_kwargs(cls, request: Any, pipeline: Any) -> dict[str, Any]:
        kwargs = super().call_kwargs(request, pipeline)
        kwargs["max_sequence_length"] = 32
        kwargs["use_resolution_binning"] = False
        kwargs["clean_caption"] = False
        return kwargs
