"""Z-Image and Z-Image-Turbo: text-to-image with diffusers' ``ZImagePipeline``.

Both checkpoints are the same 6B model: a single-stream DiT (``ZImageTransformer2DModel``:
3840 wide, 30 heads of 128) that first refines the image tokens (``noise_refiner``, 2 blocks)
and the caption tokens (``context_refiner``, 2 blocks) separately, then runs 30 blocks of
self-attention over both together (``layers``); the FLUX VAE (``AutoencoderKL``, 8x, 16
channels, 2x2 patches, so sizes are multiples of 16); and Qwen3-4B as the text encoder (its
second-to-last hidden state, prompt wrapped in Qwen3's chat template).

* **Z-Image-Turbo** (``Tongyi-MAI/Z-Image-Turbo``) is distilled to 8 function evaluations
  without classifier-free guidance: 9 scheduler steps, ``guidance_scale`` 0 (setting one, or a
  negative prompt, is refused). Its scheduler shift is 3.0.
* **Z-Image** (``Tongyi-MAI/Z-Image``), the undistilled base model, uses CFG: 50 steps,
  guidance 4.0 (3 to 5 recommended), negative prompts. Its scheduler shift is 6.0, which is how
  omni tells the two checkpoints apart (every other config is identical).

Z-Image's guidance convention: the pipeline combines ``cond + g * (cond - uncond)``, so
``guidance_scale`` 0 turns CFG off (one pass per step) and any value above 0 turns it on.
"""

from __future__ import annotations

from numbers import Real
from typing import Any, ClassVar

from omni_plugin_diffusion.family import AttentionRoles, DiffusersFamily

from omni_core.generation.request import GenerationOptionError, GenerationProfile, ResolvedGeneration

#: the scheduler/scheduler_config.json both checkpoints publish, but for ``shift``
SCHEDULER_CONFIG: dict[str, Any] = {"num_train_timesteps": 1000, "use_dynamic_shifting": False}
TURBO_SHIFT = 3.0
BASE_SHIFT = 6.0


class _ZImageFamily(DiffusersFamily):
    """What Z-Image and Z-Image-Turbo share: the pipeline, module layout and tiny checkpoint."""

    pipeline_class = "ZImagePipeline"
    #: FlowMatchEulerDiscreteScheduler shift of the published checkpoint (its config_match)
    scheduler_shift: ClassVar[float]
    attention_roles: ClassVar[AttentionRoles] = (
        ("transformer.noise_refiner.*.attention", "zimage.noise_refiner", "self"),
        ("transformer.context_refiner.*.attention", "zimage.context_refiner", "self"),
        ("transformer.layers.*.attention", "zimage.joint", "self"),
    )
    dit_modules: ClassVar[tuple[str, ...]] = ("transformer",)
    encoder_modules: ClassVar[tuple[str, ...]] = ("text_encoder",)
    resident_modules: ClassVar[tuple[str, ...]] = ("vae",)
    block_attrs: ClassVar[tuple[str, ...]] = (
        "transformer.noise_refiner",
        "transformer.context_refiner",
        "transformer.layers",
    )
    default_dtypes: ClassVar[dict[str, str]] = {"cpu": "float32"}
    fallback_dtype: ClassVar[str] = "bfloat16"

    @classmethod
    def head_size(cls, transformer_config: dict[str, Any], role: str) -> int | None:
        """Z-Image's config has no head-size key: every role's heads are ``dim // n_heads`` wide."""
        dim, heads = transformer_config.get("dim"), transformer_config.get("n_heads")
        return dim // heads if isinstance(dim, int) and isinstance(heads, int) and heads else None

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        """Two joint blocks and one refiner block of each kind (2 heads of 16, rope axes 4+6+6),
        a 4-level VAE (8x, 4 latent channels) with the FLUX VAE's scaling, a 2-layer Qwen3 and
        the real scheduler with this checkpoint's shift."""
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImageTransformer2DModel
        from omni_plugin_diffusion.tiny import seeded, tiny_qwen3, tiny_qwen_tokenizer

        text_dim, latent = 32, 4
        seeded(seed)
        transformer = ZImageTransformer2DModel(
            all_patch_size=(2,),
            all_f_patch_size=(1,),
            in_channels=latent,
            dim=32,
            n_layers=2,
            n_refiner_layers=1,
            n_heads=2,
            n_kv_heads=2,
            qk_norm=True,
            cap_feat_dim=text_dim,
            rope_theta=256.0,
            axes_dims=[4, 6, 6],
            axes_lens=[1536, 512, 512],
        )
        seeded(seed + 1)
        vae = AutoencoderKL(
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            block_out_channels=(16, 16, 32, 32),
            layers_per_block=1,
            latent_channels=latent,
            norm_num_groups=8,
            scaling_factor=0.3611,
            shift_factor=0.1159,
            use_quant_conv=False,
            use_post_quant_conv=False,
        )
        return {
            "transformer": transformer.eval(),
            "vae": vae.eval(),
            "text_encoder": tiny_qwen3(seed + 2, hidden_size=text_dim),
            "tokenizer": tiny_qwen_tokenizer(),
            "scheduler": FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG, shift=cls.scheduler_shift),
        }


class ZImageTurbo(_ZImageFamily):
    """``Tongyi-MAI/Z-Image-Turbo``: 1024x1024, 9 steps (8 DiT evaluations), no CFG."""

    scheduler_shift = TURBO_SHIFT
    profile = GenerationProfile(
        task="text-to-image",
        default_width=1024,
        default_height=1024,
        size_multiple=16,  # 8x VAE times 2x2 patches
        default_steps=9,
        default_guidance=0.0,
        uses_guidance=False,  # distilled without CFG: the pipeline must get 0
        supports_negative_prompt=False,  # only read by CFG
    )
    # one prompt per call and no CFG batch: every caption in a batch has the same length, so
    # the transformer builds no padding mask
    attention_masks: ClassVar[bool] = False


class ZImage(_ZImageFamily):
    """``Tongyi-MAI/Z-Image``: 1024x1024, 50 steps, CFG 4.0 with a negative prompt."""

    scheduler_shift = BASE_SHIFT
    profile = GenerationProfile(
        task="text-to-image",
        default_width=1024,
        default_height=1024,
        size_multiple=16,
        default_steps=50,
        default_guidance=4.0,
        uses_guidance=True,
        supports_negative_prompt=True,
        extra_options={
            "cfg_normalization": "cap the guided prediction's norm at this multiple of the conditional one "
            "(true = 1.0, false = off; the model card suggests false for stylised images, true for realism)",
            "cfg_truncation": "turn guidance off once the normalised time passes this value, 0..1 (1.0 = never)",
        },
    )
    # CFG batches the prompt with the negative prompt; captions of different lengths are padded
    # and masked in the context refiner and the joint blocks
    attention_masks: ClassVar[bool] = True

    @classmethod
    def check_request(cls, request: ResolvedGeneration, pipeline: Any) -> None:
        problems = []
        normalization = request.extra.get("cfg_normalization")
        if normalization is not None and not (
            isinstance(normalization, bool) or (isinstance(normalization, Real) and normalization >= 0)
        ):
            problems.append(f"cfg_normalization must be true, false or a number >= 0, not {normalization!r}")
        truncation = request.extra.get("cfg_truncation")
        if truncation is not None and (
            isinstance(truncation, bool) or not isinstance(truncation, Real) or not 0 <= truncation <= 1
        ):
            problems.append(f"cfg_truncation must be a number between 0 and 1, not {truncation!r}")
        if request.guidance_scale == 0:
            unused = [name for name in ("negative_prompt",) if getattr(request, name) is not None]
            unused += sorted(request.extra)
            if unused:
                one = len(unused) == 1
                problems.append(
                    f"{', '.join(unused)} {'has' if one else 'have'} no effect at guidance_scale 0: Z-Image applies "
                    f"{'it' if one else 'them'} only through classifier-free guidance, which any guidance_scale "
                    f"above 0 turns on (default 4.0); raise guidance_scale or leave {'it' if one else 'them'} unset"
                )
        if problems:
            raise GenerationOptionError("; ".join(problems))
