"""The Wan video families: Wan 2.1 and Wan 2.2 text-to-video, Wan 2.1 and 2.2 image-to-video.

All four run a ``WanTransformer3DModel`` (``blocks[i].attn1`` self-attention over the video
tokens with 3D RoPE, ``blocks[i].attn2`` cross-attention to the UMT5 prompt; in Wan 2.1 I2V
``attn2`` also attends to the CLIP image tokens through its ``add_k_proj``/``add_v_proj``),
the UMT5 text encoder and the ``AutoencoderKLWan`` VAE (8x spatial, 4x temporal compression,
so frame counts are ``4k+1`` and sizes multiples of 8 x patch 2 = 16).

Wan 2.2 A14B checkpoints use the same pipeline classes as 2.1 but carry a second transformer
(``transformer_2``, the low-noise expert) and ``boundary_ratio`` in ``model_index.json``: the
pipeline hands denoising over to ``transformer_2`` once the timestep falls below
``boundary_ratio * 1000``. omni tells the siblings apart by that key (see ``hooks.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from omni_plugin_diffusion.family import AttentionRoles, DiffusersFamily
from omni_plugin_diffusion.tiny import seeded, tiny_t5_encoder, tiny_t5_tokenizer

from omni_core.generation.request import GenerationProfile, ResolvedGeneration, Task

#: the pipelines pad every prompt to 512 UMT5 tokens (Wan 2.1 I2V's attention splits the image
#: tokens off the text at exactly 512), so the tokenizer must allow that length
TEXT_TOKENS = 512

#: the VAE's compression and the transformer's patch size, shared by every Wan checkpoint
_SIZE_MULTIPLE = 16  # 8 (VAE) x 2 (patch)
_FRAMES_STEP = 4  # temporal compression: frames = 4k+1
#: RoPE tables hold 1024 positions per axis: at most 1024 latent frames, (1024-1)*4+1 frames
_MAX_FRAMES = 4093

_WAN_ROLES: AttentionRoles = (
    ("transformer*.blocks.*.attn1", "self", "self"),
    ("transformer*.blocks.*.attn2", "cross", "cross"),
)

GUIDANCE_2_OPTION = {
    "guidance_scale_2": "classifier-free guidance of the low-noise expert (transformer_2); "
    "the high-noise expert uses guidance_scale",
}


def _tiny_transformer(seed: int, *, in_channels: int = 16, image_dim: int | None = None) -> Any:
    """A 2-block ``WanTransformer3DModel``: 2 heads of 16 (RoPE splits 16 into t/h/w = 8/4/4)."""
    from diffusers import WanTransformer3DModel

    heads, head_dim = 2, 16
    seeded(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        in_channels=in_channels,
        out_channels=16,
        text_dim=32,  # the tiny UMT5's d_model
        freq_dim=256,
        ffn_dim=64,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
        image_dim=image_dim,
        # as in the real I2V checkpoints, the image key/value projections take the transformer width
        added_kv_proj_dim=heads * head_dim if image_dim is not None else None,
        rope_max_seq_len=1024,
    ).eval()


def _tiny_vae(seed: int) -> Any:
    """A small ``AutoencoderKLWan`` with the real compression (8x spatial, 4x temporal) and z_dim 16."""
    from diffusers import AutoencoderKLWan

    seeded(seed)
    return AutoencoderKLWan(
        base_dim=8,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    ).eval()


def _scheduler(flow_shift: float = 3.0) -> Any:
    """The scheduler the Wan diffusers checkpoints ship: UniPC over flow-matching sigmas."""
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        num_train_timesteps=1000,
        flow_shift=flow_shift,
    )


def _text_components(seed: int) -> dict[str, Any]:
    return {
        "text_encoder": tiny_t5_encoder(seed + 1, d_model=32, umt5=True),
        "tokenizer": tiny_t5_tokenizer(model_max_length=TEXT_TOKENS),
    }


def _tiny_clip_vision(seed: int) -> Any:
    """A 2-layer ``CLIPVisionModel`` (the pipeline reads its penultimate hidden states)."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        projection_dim=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    seeded(seed)
    return CLIPVisionModel(config).eval()


def _tiny_clip_image_processor() -> Any:
    """CLIP preprocessing at the tiny encoder's 32 px. transformers' default CLIPImageProcessor
    needs torchvision; the PIL-backed class does the same resize/crop/normalise without it."""
    import transformers

    cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    return cls(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


def _profile(task: Task, width: int, height: int, *, steps: int, guidance: float, **more: Any) -> GenerationProfile:
    """What every Wan release shares: 16-pixel sizes, 4k+1 frames up to the RoPE limit, 81 frames at 16 fps."""
    return GenerationProfile(
        task=task,
        default_width=width,
        default_height=height,
        size_multiple=_SIZE_MULTIPLE,
        default_steps=steps,
        default_guidance=guidance,
        default_frames=81,
        frames_step=_FRAMES_STEP,
        frames_offset=1,
        max_frames=_MAX_FRAMES,
        default_fps=16,
        **more,
    )


#: TeaCache's published Wan 2.1 rescaling in its "retention steps" mode (fitted on the
#: timestep projection each block receives), by transformer depth: 30 blocks is the 1.3B
#: model, 40 the 14B one; their suggested thresholds are 0.08 and 0.2
WAN_TEACACHE_BY_LAYERS: dict[int, tuple[list[float], float]] = {
    30: ([-5.21862437e04, 9.23041404e03, -5.28275948e02, 1.36987616e01, -4.99875664e-02], 0.08),
    40: ([-3.03318725e05, 4.90537029e04, -2.65530556e03, 5.87365115e01, -3.15583525e-01], 0.2),
}


#: the same method's published fit for Wan 2.1 I2V 14B at 480p (retention mode)
WAN_I2V_TEACACHE = ([2.57151496e05, -3.54229917e04, 1.40286849e03, -1.35890334e01, 1.32517977e-01], 0.2)


def _wan_teacache(layers: int, fit: tuple[list[float], float] | None = None) -> dict[str, Any]:
    coefficients, threshold = fit or WAN_TEACACHE_BY_LAYERS.get(layers, WAN_TEACACHE_BY_LAYERS[30])
    return {
        "extractor": "wan",
        "coefficients": coefficients,
        "rel_l1_thresh": threshold,
        "blocks": ["blocks"],
        "block_outputs": ["hidden_states"],
        # the retention mode always computes the first 5 steps, and may reuse the last
        "warmup_steps": 5,
        "compute_last_step": False,
    }


class _WanBase(DiffusersFamily):
    attention_roles: ClassVar[AttentionRoles] = _WAN_ROLES
    attention_masks: ClassVar[bool] = False
    encoder_modules: ClassVar[tuple[str, ...]] = ("text_encoder",)
    resident_modules: ClassVar[tuple[str, ...]] = ("vae",)
    dit_modules: ClassVar[tuple[str, ...]] = ("transformer",)
    block_attrs: ClassVar[tuple[str, ...]] = ("transformer.blocks",)


class _TwoExperts:
    """Wan 2.2 A14B: a high-noise ``transformer`` and a low-noise ``transformer_2``."""

    dit_modules: ClassVar[tuple[str, ...]] = ("transformer", "transformer_2")
    block_attrs: ClassVar[tuple[str, ...]] = ("transformer.blocks", "transformer_2.blocks")
    #: the low-noise expert's guidance when the request does not set ``extra.guidance_scale_2``
    default_guidance_2: ClassVar[float]
    #: model_index.json's boundary_ratio of the real checkpoint (the tiny one copies it)
    boundary_ratio: ClassVar[float]

    @classmethod
    def call_kwargs(cls, request: ResolvedGeneration, pipeline: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = super().call_kwargs(request, pipeline)  # type: ignore[misc]
        kwargs.setdefault("guidance_scale_2", cls.default_guidance_2)
        return kwargs


class _OneExpertCaching:
    """Wan 2.1's one transformer: TeaCache with the coefficients of its size, and Cache-DiT
    over its block list (each block takes (hidden_states, encoder_hidden_states, ...) and
    returns hidden_states: cache-dit's Pattern_2)."""

    cache_declarations: ClassVar[dict[str, dict[str, Any]]] = {
        "teacache": _wan_teacache(30),
        "cache_dit": {"blocks": ["blocks"], "forward_patterns": ["Pattern_2"]},
    }

    #: a fit of its own instead of the text-to-video one chosen by depth (image-to-video)
    teacache_fit: ClassVar[tuple[list[float], float] | None] = None

    @classmethod
    def cache_declarations_for(cls, model_dir: Path) -> dict[str, dict[str, Any]]:
        try:
            config = json.loads((Path(model_dir) / "transformer" / "config.json").read_text(encoding="utf-8"))
            layers = int(config.get("num_layers", 30))
        except (OSError, ValueError, TypeError):
            layers = 30
        return {**cls.cache_declarations, "teacache": _wan_teacache(layers, cls.teacache_fit)}


class Wan21TextToVideo(_OneExpertCaching, _WanBase):
    """Wan 2.1 T2V (1.3B and 14B): 480p by default, 81 frames at 16 fps."""

    pipeline_class = "WanPipeline"
    profile = _profile("text-to-video", 832, 480, steps=50, guidance=5.0)

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        return {
            "transformer": _tiny_transformer(seed),
            "vae": _tiny_vae(seed + 2),
            "scheduler": _scheduler(),
            **_text_components(seed),
        }


class Wan22TextToVideo(_TwoExperts, _WanBase):
    """Wan 2.2 T2V A14B: two 14B experts split at ``boundary_ratio`` 0.875; 720p, 40 steps."""

    pipeline_class = "WanPipeline"
    profile = _profile("text-to-video", 1280, 720, steps=40, guidance=4.0, extra_options=GUIDANCE_2_OPTION)
    default_guidance_2 = 3.0
    boundary_ratio = 0.875

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        return {
            "transformer": _tiny_transformer(seed),
            "transformer_2": _tiny_transformer(seed + 3),
            "boundary_ratio": cls.boundary_ratio,
            "vae": _tiny_vae(seed + 2),
            "scheduler": _scheduler(),
            **_text_components(seed),
        }


class Wan21ImageToVideo(_OneExpertCaching, _WanBase):
    """Wan 2.1 I2V 14B (480p and 720p checkpoints): animates an input image. The transformer
    takes 36 input channels (16 noise + 16 encoded first frame + 4 mask) and attends to the
    image's CLIP tokens (``image_encoder``, a ViT-H ``CLIPVisionModel``) next to the prompt."""

    pipeline_class = "WanImageToVideoPipeline"
    profile = _profile("image-to-video", 832, 480, steps=50, guidance=5.0)
    encoder_modules: ClassVar[tuple[str, ...]] = ("text_encoder", "image_encoder")
    teacache_fit = WAN_I2V_TEACACHE

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        return {
            "transformer": _tiny_transformer(seed, in_channels=36, image_dim=32),
            "image_encoder": _tiny_clip_vision(seed + 4),
            "image_processor": _tiny_clip_image_processor(),
            "vae": _tiny_vae(seed + 2),
            "scheduler": _scheduler(),
            **_text_components(seed),
        }


class Wan22ImageToVideo(_TwoExperts, _WanBase):
    """Wan 2.2 I2V A14B: two experts split at ``boundary_ratio`` 0.9, no CLIP image encoder
    (the first frame conditions through the VAE latents only); 720p, 40 steps, guidance 3.5."""

    pipeline_class = "WanImageToVideoPipeline"
    profile = _profile("image-to-video", 1280, 720, steps=40, guidance=3.5, extra_options=GUIDANCE_2_OPTION)
    default_guidance_2 = 3.5
    boundary_ratio = 0.9

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        return {
            "transformer": _tiny_transformer(seed, in_channels=36),
            "transformer_2": _tiny_transformer(seed + 3, in_channels=36),
            "boundary_ratio": cls.boundary_ratio,
            "vae": _tiny_vae(seed + 2),
            "scheduler": _scheduler(),
            **_text_components(seed),
        }
