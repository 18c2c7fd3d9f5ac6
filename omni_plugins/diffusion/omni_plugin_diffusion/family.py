"""``DiffusersFamily``: what a family plugin subclasses to serve a diffusers pipeline.

A family is declarations, not code paths: the pipeline class, the generation profile
(defaults and limits), which attention call sites are which role, which components are
denoisers, encoders and block lists (for offload), and how to build a tiny checkpoint. The
shared runtime (:mod:`omni_plugin_diffusion.engine`) does the loading, attention routing,
offload, progress bars and output conversion the same way for every family::

    class Sana(DiffusersFamily):
        pipeline_class = "SanaPipeline"
        profile = GenerationProfile(task="text-to-image", default_width=1024, default_height=1024,
                                    size_multiple=32, default_steps=20, default_guidance=4.5)
        encoder_modules = ("text_encoder",)
        block_attrs = ("transformer.transformer_blocks",)

        @classmethod
        def tiny_components(cls, seed):
            return {"transformer": ..., "vae": ..., "text_encoder": ..., "tokenizer": ..., "scheduler": ...}
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from omni_core.generation.model import EngineOptions
    from omni_core.generation.request import GenerationProfile, GenerationRequest, ResolvedGeneration
    from omni_core.selection import Explanation
    from omni_plugin_diffusion.engine import DiffusionEngine

#: (module-path glob, role, category); matched against "<component>.<module path>", first wins
AttentionRoles = tuple[tuple[str, str, str], ...]


class DiffusersFamily:
    """Base of every diffusers-backed family. Class-level only: omni never instantiates it."""

    #: the diffusers pipeline class (a name in the ``diffusers`` namespace)
    pipeline_class: ClassVar[str]
    profile: ClassVar[GenerationProfile]
    #: attention call sites by module path; the first matching glob names the role
    attention_roles: ClassVar[AttentionRoles] = (
        ("*.attn2", "cross", "cross"),
        ("*", "self", "self"),
    )
    #: role -> the transformer config key holding its head size (default ``attention_head_dim``)
    head_size_keys: ClassVar[dict[str, str]] = {}
    #: whether the transformer passes attention masks (backends that cannot take one are passed
    #: over): True or False for every role, or the roles that pass them
    attention_masks: ClassVar[bool | tuple[str, ...]] = False
    #: offload declarations (see :class:`omni_core.offload.OffloadPlan`)
    dit_modules: ClassVar[tuple[str, ...]] = ("transformer",)
    encoder_modules: ClassVar[tuple[str, ...]] = ("text_encoder",)
    resident_modules: ClassVar[tuple[str, ...]] = ("vae",)
    block_attrs: ClassVar[tuple[str, ...]] = ("transformer.transformer_blocks",)
    #: what each cache backend needs of this family, by backend name (see the backend's docs:
    #: TeaCache takes the extractor and coefficients, Cache-DiT the block lists and their
    #: forward pattern). A backend the family declares nothing for is refused for it
    cache_declarations: ClassVar[dict[str, dict[str, Any]]] = {}
    #: feature tags other extensions may declare themselves incompatible with
    features: ClassVar[tuple[str, ...]] = ()
    #: whether requests that differ only in prompt, negative prompt and seed may run as one
    #: pipeline call (a server batches them). Set False where a request's output would change
    #: with its batch-mates, e.g. a pipeline that pads prompts to the longest in the call and
    #: attends to the padding
    batchable: ClassVar[bool] = True
    #: compute dtype per device type when the user does not choose one
    default_dtypes: ClassVar[dict[str, str]] = {"cpu": "float32"}
    fallback_dtype: ClassVar[str] = "bfloat16"

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        """The pipeline's components with tiny random weights (see :mod:`omni_plugin_diffusion.tiny`)."""
        raise NotImplementedError(f"{cls.__name__} cannot make a tiny checkpoint")

    @classmethod
    def can_make_tiny(cls) -> bool:
        """Whether this family defines ``tiny_components`` (``omni models list`` asks)."""
        return cls.tiny_components.__func__ is not DiffusersFamily.tiny_components.__func__  # type: ignore[attr-defined]

    @classmethod
    def pipeline_type(cls) -> Any:
        import diffusers

        return getattr(diffusers, cls.pipeline_class)

    @classmethod
    def make_tiny(cls, directory: Path, seed: int = 0) -> None:
        """Save a tiny random-weight checkpoint in the standard diffusers layout
        (``model_index.json``, one folder per component, safetensors weights)."""
        from omni_core.quiet import quiet_libraries

        with quiet_libraries():
            pipeline = cls.pipeline_type()(**cls.tiny_components(seed))
            pipeline.save_pretrained(str(directory), safe_serialization=True)

    # -- running -----------------------------------------------------------------------------

    @classmethod
    def open(cls, model_dir: Path, options: EngineOptions) -> DiffusionEngine:
        from omni_plugin_diffusion.engine import DiffusionEngine

        return DiffusionEngine(cls, Path(model_dir), options)

    @classmethod
    def profile_for(cls, model_dir: Path) -> GenerationProfile:
        """The profile for one checkpoint: ``profile`` unless the family reads checkpoint-specific
        defaults from its configs (a distilled variant's guidance, a 720p variant's size).
        Called before loading, so it reads JSON only."""
        return cls.profile

    @classmethod
    def cache_declarations_for(cls, model_dir: Path) -> dict[str, dict[str, Any]]:
        """The cache declarations for one checkpoint: :attr:`cache_declarations`, unless the
        family picks them by the checkpoint (a model size's own coefficients). Reads JSON only."""
        return cls.cache_declarations

    @classmethod
    def plan(cls, model_dir: Path, options: EngineOptions) -> dict[str, Explanation]:
        """Every choice ``open`` would make, explained, without loading a weight
        (``omni explain model``). Raises what ``open`` would raise before loading."""
        from omni_plugin_diffusion.engine import plan_startup

        return plan_startup(cls, Path(model_dir), options).explanations

    @classmethod
    def head_size(cls, transformer_config: dict[str, Any], role: str) -> int | None:
        """The head size of ``role``'s attention, from the transformer's config (used to pick a
        backend before loading). Override where the config has no head-size key."""
        value = transformer_config.get(cls.head_size_keys.get(role, "attention_head_dim"))
        return value if isinstance(value, int) else None

    @classmethod
    def declared_site(cls, module_path: str) -> tuple[str, str] | None:
        """(role, category) of the attention call site at ``module_path``; None when no glob of
        ``attention_roles`` matches (the runtime refuses attention calls from such a site)."""
        for pattern, role, category in cls.attention_roles:
            if fnmatch.fnmatchcase(module_path, pattern):
                return role, category
        return None

    @classmethod
    def role_for(cls, module_path: str) -> tuple[str, str]:
        """(role, category) of the attention call site at ``module_path``, ``("self", "self")``
        where no glob matches (see :meth:`declared_site`)."""
        return cls.declared_site(module_path) or ("self", "self")

    @classmethod
    def passes_masks(cls, role: str) -> bool:
        masks = cls.attention_masks
        return masks if isinstance(masks, bool) else role in masks

    @classmethod
    def declared_roles(cls) -> list[tuple[str, str]]:
        return list(dict.fromkeys((role, category) for _, role, category in cls.attention_roles))

    @classmethod
    def check_request(cls, request: ResolvedGeneration, pipeline: Any) -> None:
        """Family-specific checks beyond the profile (``--extra`` values, option combinations);
        raise GenerationOptionError. Runs before any weight loads, where ``pipeline`` is None
        (``omni generate`` checks the request before opening the model), so decide from the
        request and the class, not from the loaded pipeline."""

    @classmethod
    def validate(cls, model_dir: Path, request: GenerationRequest, pipeline: Any = None) -> ResolvedGeneration:
        """Every rule a request must meet, without loading: the checkpoint's profile, then
        :meth:`check_request` (see :func:`omni_core.generation.model.validate_request`)."""
        resolved = cls.profile_for(Path(model_dir)).resolve(request)
        cls.check_request(resolved, pipeline)
        return resolved

    @classmethod
    def call_kwargs(cls, request: ResolvedGeneration, pipeline: Any) -> dict[str, Any]:
        """The pipeline call for ``request`` (the generator and output type are added by the
        runtime). Override to rename or add arguments; call ``super()`` for the common ones."""
        kwargs: dict[str, Any] = {
            "prompt": request.prompt,
            "height": request.height,
            "width": request.width,
            "num_inference_steps": request.num_inference_steps,
            "guidance_scale": request.guidance_scale,
        }
        if request.negative_prompt is not None:
            kwargs["negative_prompt"] = request.negative_prompt
        if request.is_video:
            kwargs["num_frames"] = request.num_frames
            kwargs["num_videos_per_prompt"] = request.num_outputs
        else:
            kwargs["num_images_per_prompt"] = request.num_outputs
        if request.image is not None:
            kwargs["image"] = load_image(request.image, request.width, request.height)
        kwargs.update(request.extra)
        return kwargs


def load_image(image: Any, width: int, height: int) -> Any:
    """A PIL image from a path, a PIL image or an HxWx3 uint8 array, resized to the output size."""
    from PIL import Image

    from omni_core.generation.request import GenerationOptionError

    if isinstance(image, (str, Path)):
        try:
            img = Image.open(Path(image).expanduser())
            img.load()
        except OSError as exc:
            raise GenerationOptionError(f"cannot read the input image {str(image)!r}: {exc}") from None
    elif isinstance(image, Image.Image):
        img = image
    else:
        try:
            img = Image.fromarray(image)
        except Exception:
            raise GenerationOptionError(
                f"the input image must be a path, a PIL image or an HxWx3 uint8 array, not {type(image).__name__}"
            ) from None
    return img.convert("RGB").resize((width, height))
