"""Qwen-Image: text-to-image with diffusers' ``QwenImagePipeline``.

The model (``Qwen/Qwen-Image``, and ``Qwen/Qwen-Image-2512`` with the same layout) is a
60-layer dual-stream MMDiT (``QwenImageTransformer2DModel``: 24 heads of 128, joint attention
over text and image tokens in every block), a Wan-style 3D VAE used on single frames
(``AutoencoderKLQwenImage``, 8x spatial, 16 latent channels, 2x2 latent patches, so sizes are
multiples of 16) and Qwen2.5-VL-7B-Instruct as the text encoder (its last hidden state, after
a fixed 34-token system prompt is dropped).

Guidance is *true* classifier-free guidance: the pipeline runs the transformer twice per step
(prompt and negative prompt) and mixes them with ``true_cfg_scale``; its ``guidance_scale``
argument is only for guidance-distilled transformers (``guidance_embeds``), which Qwen-Image is
not. So omni's ``guidance_scale`` is passed as ``true_cfg_scale``, and because the pipeline
enables CFG only when a negative prompt is given, a request without one gets ``" "`` (a blank
negative prompt, as in the reference usage) whenever the scale is above 1. A scale of 1 or
less turns CFG off (one transformer pass per step); a negative prompt is then refused, since it
would have no effect.
"""

from __future__ import annotations

from typing import Any, ClassVar

from omni_plugin_diffusion.family import AttentionRoles, DiffusersFamily

from omni_core.generation.request import GenerationOptionError, GenerationProfile, ResolvedGeneration

#: Qwen/Qwen-Image's scheduler/scheduler_config.json (FlowMatchEulerDiscreteScheduler): dynamic,
#: exponential time shift between 256 and 8192 image tokens, stretched to a terminal sigma of 0.02
SCHEDULER_CONFIG: dict[str, Any] = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}

#: what the pipeline's CFG needs when the user gives no negative prompt (the reference usage's)
BLANK_NEGATIVE_PROMPT = " "


class QwenImage(DiffusersFamily):
    """``Qwen/Qwen-Image`` (and ``Qwen/Qwen-Image-2512``): 1328x1328, 50 steps, true CFG 4.0."""

    pipeline_class = "QwenImagePipeline"
    profile = GenerationProfile(
        task="text-to-image",
        # the 1:1 training resolution; the model card's other aspect ratios are 1664x928,
        # 928x1664, 1472x1140 (use 1472x1136), 1140x1472, 1584x1056 and 1056x1584
        default_width=1328,
        default_height=1328,
        size_multiple=16,  # 8x VAE times 2x2 latent patches
        default_steps=50,
        default_guidance=4.0,
        uses_guidance=True,
        supports_negative_prompt=True,
    )
    # every block is one joint attention over [text, image] tokens (QwenDoubleStreamAttnProcessor2_0)
    attention_roles: ClassVar[AttentionRoles] = (("transformer.transformer_blocks.*.attn", "qwen.joint", "self"),)
    # the pipeline drops the text mask when it is all ones, which it is for one prompt per call
    # (omni encodes the prompt and the negative prompt in separate calls), so no mask reaches attention
    attention_masks: ClassVar[bool] = False
    # prompts of different lengths batched together need a padding mask, which the roles above
    # are declared without (mask-free kernels may serve them): requests run one call each
    batchable: ClassVar[bool] = False
    dit_modules: ClassVar[tuple[str, ...]] = ("transformer",)
    encoder_modules: ClassVar[tuple[str, ...]] = ("text_encoder",)
    resident_modules: ClassVar[tuple[str, ...]] = ("vae",)
    block_attrs: ClassVar[tuple[str, ...]] = ("transformer.transformer_blocks",)
    cache_declarations: ClassVar[dict[str, dict[str, Any]]] = {
        # no TeaCache fit for Qwen-Image is published by its authors; these coefficients are
        # the ones the reference system ships for it (provisional: fitted on no omni run)
        "teacache": {
            "extractor": "qwen-image",
            "coefficients": [-4.5e02, 2.8e02, -4.5e01, 3.2e00, -2.0e-02],
            "rel_l1_thresh": 0.2,
            "blocks": ["transformer_blocks"],
            "block_outputs": ["encoder_hidden_states", "hidden_states"],
        },
        # each block takes (hidden_states, encoder_hidden_states, ...) and returns
        # (encoder_hidden_states, hidden_states): cache-dit's Pattern_1
        "cache_dit": {"blocks": ["transformer_blocks"], "forward_patterns": ["Pattern_1"]},
    }
    default_dtypes: ClassVar[dict[str, str]] = {"cpu": "float32"}
    fallback_dtype: ClassVar[str] = "bfloat16"

    @classmethod
    def check_request(cls, request: ResolvedGeneration, pipeline: Any) -> None:
        if request.negative_prompt is not None and request.guidance_scale <= 1.0:
            raise GenerationOptionError(
                f"negative_prompt has no effect at guidance_scale {request.guidance_scale}: Qwen-Image applies "
                "a negative prompt only through classifier-free guidance, which needs guidance_scale above 1 "
                "(default 4.0); raise guidance_scale or leave negative_prompt unset"
            )

    @classmethod
    def call_kwargs(cls, request: ResolvedGeneration, pipeline: Any) -> dict[str, Any]:
        kwargs = super().call_kwargs(request, pipeline)
        scale = kwargs.pop("guidance_scale")
        kwargs["true_cfg_scale"] = scale
        if scale > 1.0 and "negative_prompt" not in kwargs:
            kwargs["negative_prompt"] = BLANK_NEGATIVE_PROMPT
        return kwargs

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        """Two 2-head blocks (head_dim 16, rope axes 4+6+6), a 3-level VAE with 4 latent
        channels that keeps the real 8x scale, a 2-layer Qwen2.5-VL and the real scheduler."""
        from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
        from omni_plugin_diffusion.tiny import seeded, tiny_qwen2_5_vl, tiny_qwen_tokenizer

        text_dim, z_dim = 32, 4
        seeded(seed)
        transformer = QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=z_dim * 4,
            out_channels=z_dim,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=text_dim,
            guidance_embeds=False,
            axes_dims_rope=(4, 6, 6),
        )
        seeded(seed + 1)
        vae = AutoencoderKLQwenImage(
            base_dim=16,
            z_dim=z_dim,
            dim_mult=[1, 2, 2, 2],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
            latents_mean=[0.0] * z_dim,
            latents_std=[1.0] * z_dim,
        )
        return {
            "transformer": transformer.eval(),
            "vae": vae.eval(),
            "text_encoder": tiny_qwen2_5_vl(seed + 2, hidden_size=text_dim),
            "tokenizer": tiny_qwen_tokenizer(),
            "scheduler": FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        }
