"""Test helpers (a module name unique across plugins): a tiny real FLUX pipeline to offload.

The pipeline is a real ``diffusers.FluxPipeline`` with random weights: a FLUX transformer with
2 joint blocks and 1 single block, a CLIP and a T5 text encoder, and a small VAE. Each test gets
a fresh one (offloaders change the modules), built from a seed so every copy is identical.
"""

from __future__ import annotations

from typing import Any

#: the plan a FLUX family declares
FLUX_PLAN = {
    "dit_modules": ("transformer",),
    "encoder_modules": ("text_encoder", "text_encoder_2"),
    "resident_modules": ("vae",),
    "block_attrs": ("transformer.transformer_blocks", "transformer.single_transformer_blocks"),
}
BLOCKS = (
    "transformer.transformer_blocks.0",
    "transformer.transformer_blocks.1",
    "transformer.single_transformer_blocks.0",
)


def build_tiny_flux(seed: int = 0, num_layers: int = 2, num_single_layers: int = 1) -> Any:
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
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
        num_layers=num_layers,
        num_single_layers=num_single_layers,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,  # the T5 encoder's d_model
        pooled_projection_dim=32,  # CLIP's pooled output
        axes_dims_rope=(2, 2, 4),  # sums to attention_head_dim
    )
    seeded(seed + 1)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=32,
        scaling_factor=0.3611,
        shift_factor=0.1159,
    )
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=tiny_clip_text(seed + 2),
        tokenizer=tiny_clip_tokenizer(),
        text_encoder_2=tiny_t5_encoder(seed + 3),
        tokenizer_2=tiny_t5_tokenizer(),
        transformer=transformer.eval(),
    )
    pipe.set_progress_bar_config(disable=True)
    assert all(p.dtype == torch.float32 for p in transformer.parameters())
    return pipe


def run_flux(pipe: Any, prompt: str = "a red fox in snow", seed: int = 0, steps: int = 2) -> Any:
    import torch

    return pipe(
        prompt=prompt,
        height=16,
        width=16,
        num_inference_steps=steps,
        guidance_scale=3.5,
        max_sequence_length=16,
        generator=torch.Generator().manual_seed(seed),
        output_type="pt",
    ).images


def make_plan(pipe: Any, **overrides: Any) -> Any:
    from omni_core.offload import OffloadPlan

    fields = {**FLUX_PLAN, **overrides}
    return OffloadPlan(components=dict(pipe.components), **fields)


def snapshot(pipe: Any) -> dict[str, tuple[Any, Any, Any]]:
    """Every parameter and buffer: (the object, its data pointer, a copy of its values)."""
    out = {}
    for comp, module in pipe.components.items():
        if hasattr(module, "named_parameters"):
            for name, t in [*module.named_parameters(), *module.named_buffers()]:
                out[f"{comp}.{name}"] = (t, t.data_ptr(), t.detach().clone())
    return out


def all_hooks(pipe: Any) -> int:
    return sum(
        len(m._forward_pre_hooks)
        for module in pipe.components.values()
        if hasattr(module, "modules")
        for m in module.modules()
    )
