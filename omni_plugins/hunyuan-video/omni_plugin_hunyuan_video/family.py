"""The HunyuanVideo families: declarations for the shared diffusion runtime.

* ``hunyuan-video`` serves ``HunyuanVideoPipeline`` (HunyuanVideo, 13B): a Llama text encoder
  (llava-llama-3-8b, third-to-last hidden state) plus a CLIP text encoder for the pooled
  embedding, ``HunyuanVideoTransformer3DModel`` (20 dual-stream and 40 single-stream blocks,
  guidance-distilled: the guidance scale is *embedded* into the model, not classifier-free),
  ``AutoencoderKLHunyuanVideo`` (8x spatial, 4x temporal compression) and a flow-matching
  Euler scheduler.
* ``hunyuan-video-1.5`` serves ``HunyuanVideo15Pipeline`` (HunyuanVideo 1.5, 8.3B): a
  Qwen2.5-VL text model (chat template, third-to-last hidden state), a ByT5 glyph encoder
  (``T5EncoderModel``) that encodes quoted text in the prompt, ``HunyuanVideo15Transformer3DModel``
  (54 dual-stream blocks), ``AutoencoderKLHunyuanVideo15`` (16x spatial, 4x temporal) and real
  classifier-free guidance through a ``ClassifierFreeGuidance`` guider component.

Nothing here is imported when plugins load; torch, diffusers and transformers are imported
inside the methods that build or run a model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from omni_plugin_diffusion.family import AttentionRoles, DiffusersFamily
from omni_plugin_diffusion.tiny import seeded, tiny_clip_text, tiny_clip_tokenizer, tiny_t5_encoder, tiny_tokenizer

from omni_core.generation.request import GenerationOptionError, GenerationProfile, ResolvedGeneration

#: the text-token refiner inside the transformer's context embedder: self attention over the
#: prompt tokens (masked by the prompt's padding)
_REFINER = ("transformer.context_embedder.*", "hunyuan.refiner", "self")

#: special tokens of the Llama 3 prompt template the HunyuanVideo pipeline wraps prompts in
_LLAMA3_SPECIALS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

#: a Qwen2-style chat template (system, user, generation prompt), as HunyuanVideo 1.5 applies it
_QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class HunyuanVideo(DiffusersFamily):
    """HunyuanVideo text-to-video (``hunyuanvideo-community/HunyuanVideo``).

    ``guidance_scale`` is the embedded (distilled) guidance, 6.0 in production. True
    classifier-free guidance with a negative prompt is opt-in: ``extra={"true_cfg_scale": 2.0}``
    runs the transformer twice per step (an empty negative prompt when none is given)."""

    pipeline_class = "HunyuanVideoPipeline"
    profile = GenerationProfile(
        task="text-to-video",
        default_width=1280,
        default_height=720,
        # VAE 8x spatial compression times the transformer's 2x2 patches
        size_multiple=16,
        max_size=1280,
        default_steps=50,
        default_guidance=6.0,
        supports_negative_prompt=True,
        default_frames=129,
        frames_step=4,
        frames_offset=1,
        max_frames=129,
        default_fps=24,
        extra_options={
            "true_cfg_scale": "true classifier-free guidance scale (> 1 enables it, with negative_prompt or an "
            "empty one); 1.0, off, in production: the model is guidance-distilled",
        },
    )
    attention_roles: ClassVar[AttentionRoles] = (
        _REFINER,
        ("transformer.single_transformer_blocks.*", "hunyuan.single", "self"),
        ("transformer.transformer_blocks.*", "hunyuan.joint", "self"),
    )
    #: text padding is masked in the refiner and in every joint/single block
    attention_masks = True
    dit_modules = ("transformer",)
    encoder_modules = ("text_encoder", "text_encoder_2")
    resident_modules = ("vae",)
    block_attrs = ("transformer.transformer_blocks", "transformer.single_transformer_blocks")

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoTransformer3DModel
        from transformers import LlamaConfig, LlamaModel

        seeded(seed)
        transformer = HunyuanVideoTransformer3DModel(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=16,
            num_layers=2,
            num_single_layers=2,
            num_refiner_layers=2,
            patch_size=2,
            patch_size_t=1,
            guidance_embeds=True,
            text_embed_dim=32,
            pooled_projection_dim=32,
            rope_axes_dim=(4, 6, 6),
        )
        seeded(seed + 1)
        vae = AutoencoderKLHunyuanVideo(
            latent_channels=4,
            block_out_channels=(8, 8, 16, 16),
            layers_per_block=1,
            norm_num_groups=4,
            spatial_compression_ratio=8,
            temporal_compression_ratio=4,
        )
        seeded(seed + 2)
        # three layers: the pipeline reads the third-to-last hidden state, so two would leave
        # only the embeddings
        text_encoder = LlamaModel(
            LlamaConfig(
                vocab_size=384,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=3,
                num_attention_heads=2,
                num_key_value_heads=2,
                max_position_embeddings=512,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
            )
        ).eval()
        # the pipeline pads to 256 prompt tokens plus the 95-token template prefix it crops
        tokenizer = tiny_tokenizer(
            model_max_length=512,
            pad="<|finetune_right_pad_id|>",
            bos="<|begin_of_text|>",
            eos="<|end_of_text|>",
            extra_special=_LLAMA3_SPECIALS,
            add_bos=True,
            add_eos=False,
        )
        return {
            "transformer": transformer,
            "vae": vae,
            "text_encoder": text_encoder,
            "tokenizer": tokenizer,
            "text_encoder_2": tiny_clip_text(seed + 3),
            "tokenizer_2": tiny_clip_tokenizer(),
            # the production scheduler: flow matching with shift 7
            "scheduler": FlowMatchEulerDiscreteScheduler(shift=7.0),
        }

    @classmethod
    def check_request(cls, request: ResolvedGeneration, pipeline: Any) -> None:
        true_cfg = request.extra.get("true_cfg_scale")
        if true_cfg is not None and (isinstance(true_cfg, bool) or not isinstance(true_cfg, (int, float))):
            raise GenerationOptionError(f"true_cfg_scale must be a number, not {true_cfg!r}")
        if true_cfg is not None and true_cfg < 1:
            raise GenerationOptionError(f"true_cfg_scale {true_cfg} is not allowed: use 1 (off) or more")
        if request.negative_prompt is not None and (true_cfg is None or true_cfg <= 1):
            raise GenerationOptionError(
                "negative_prompt has no effect on HunyuanVideo unless true classifier-free guidance is on: "
                "also pass extra={'true_cfg_scale': N} with N > 1 (guidance_scale is the embedded guidance)"
            )

    @classmethod
    def call_kwargs(cls, request: ResolvedGeneration, pipeline: Any) -> dict[str, Any]:
        kwargs = super().call_kwargs(request, pipeline)
        # true CFG without a negative prompt: guide away from the empty prompt
        if kwargs.get("true_cfg_scale", 1.0) > 1 and "negative_prompt" not in kwargs:
            kwargs["negative_prompt"] = ""
        return kwargs


class HunyuanVideo15(DiffusersFamily):
    """HunyuanVideo 1.5 text-to-video (``hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v``).

    ``guidance_scale`` is real classifier-free guidance, applied through the pipeline's guider
    component (6.0 in production; 1.0 turns it off, as the CFG-distilled checkpoints want)."""

    pipeline_class = "HunyuanVideo15Pipeline"
    profile = GenerationProfile(
        task="text-to-video",
        # the pipeline's own default for the 480p checkpoints: the 16:9 bucket of target size 640
        default_width=848,
        default_height=480,
        # VAE 16x spatial compression, 1x1 patches
        size_multiple=16,
        max_size=1280,
        default_steps=50,
        default_guidance=6.0,
        supports_negative_prompt=True,
        # the pipeline's image embeddings are sized per prompt, not per video: one video a call
        max_outputs=1,
        default_frames=121,
        frames_step=4,
        frames_offset=1,
        max_frames=121,
        default_fps=24,
    )
    attention_roles: ClassVar[AttentionRoles] = (
        _REFINER,
        ("transformer.transformer_blocks.*", "hunyuan.joint", "self"),
    )
    attention_masks = True
    dit_modules = ("transformer",)
    encoder_modules = ("text_encoder", "text_encoder_2")
    resident_modules = ("vae",)
    block_attrs = ("transformer.transformer_blocks",)
    #: the transformer's ``target_size`` -> the pipeline's 16:9 default for it (480p, 720p)
    default_sizes: ClassVar[dict[int, tuple[int, int]]] = {640: (848, 480), 960: (1280, 720)}

    @classmethod
    def profile_for(cls, model_dir: Path) -> GenerationProfile:
        """Per checkpoint: the guider's scale is the default guidance (1.0 on the CFG-distilled
        releases, 6.0 otherwise), and the transformer's target size picks 480p or 720p."""
        updates: dict[str, Any] = {}
        guider = _json(model_dir / "guider" / "guider_config.json")
        if isinstance(guider.get("guidance_scale"), (int, float)):
            updates["default_guidance"] = float(guider["guidance_scale"])
        size = cls.default_sizes.get(_json(model_dir / "transformer" / "config.json").get("target_size"))
        if size is not None:
            updates["default_width"], updates["default_height"] = size
        return cls.profile.model_copy(update=updates) if updates else cls.profile

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        from diffusers import (
            AutoencoderKLHunyuanVideo15,
            ClassifierFreeGuidance,
            FlowMatchEulerDiscreteScheduler,
            HunyuanVideo15Transformer3DModel,
        )
        from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

        latent = 4
        seeded(seed)
        transformer = HunyuanVideo15Transformer3DModel(
            # noisy latents + condition latents + condition mask
            in_channels=2 * latent + 1,
            out_channels=latent,
            num_attention_heads=2,
            attention_head_dim=16,
            num_layers=2,
            num_refiner_layers=2,
            text_embed_dim=32,
            text_embed_2_dim=32,
            image_embed_dim=16,
            rope_axes_dim=(4, 6, 6),
            target_size=640,
            task_type="t2v",
        )
        seeded(seed + 1)
        vae = AutoencoderKLHunyuanVideo15(
            latent_channels=latent,
            block_out_channels=(8, 8, 16, 16, 16),
            layers_per_block=1,
            spatial_compression_ratio=16,
            temporal_compression_ratio=4,
        )
        seeded(seed + 2)
        # three layers: the pipeline reads the third-to-last hidden state
        text_encoder = Qwen2_5_VLTextModel(
            Qwen2_5_VLTextConfig(
                vocab_size=384,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=3,
                num_attention_heads=2,
                num_key_value_heads=1,
                max_position_embeddings=2048,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]},
                pad_token_id=0,
                bos_token_id=None,
                eos_token_id=1,
            )
        ).eval()
        # the pipeline pads to 1000 prompt tokens plus the 108-token system prefix it crops
        tokenizer = tiny_tokenizer(
            model_max_length=2048,
            pad="<|endoftext|>",
            eos="<|im_end|>",
            extra_special=("<|im_start|>",),
            add_eos=False,
            chat_template=_QWEN_CHAT_TEMPLATE,
        )
        return {
            "transformer": transformer,
            "vae": vae,
            "text_encoder": text_encoder,
            "tokenizer": tokenizer,
            # the glyph encoder: ByT5 is byte level, so its real tokenizer needs no vocabulary file
            "text_encoder_2": tiny_t5_encoder(seed + 3, d_model=32, vocab_size=384),
            "tokenizer_2": ByT5Tokenizer(),
            # the 480p text-to-video production settings: flow shift 5, CFG 6
            "scheduler": FlowMatchEulerDiscreteScheduler(shift=5.0),
            "guider": ClassifierFreeGuidance(guidance_scale=6.0),
        }

    @classmethod
    def call_kwargs(cls, request: ResolvedGeneration, pipeline: Any) -> dict[str, Any]:
        kwargs = super().call_kwargs(request, pipeline)
        # the pipeline takes no guidance_scale: its guider component applies CFG
        scale = kwargs.pop("guidance_scale")
        guider = getattr(pipeline, "guider", None)
        if guider is not None and getattr(guider, "guidance_scale", None) != scale:
            pipeline.guider = guider.new(guidance_scale=scale)
        return kwargs


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
