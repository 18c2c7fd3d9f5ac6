"""The diffusion runtime: one loaded diffusers pipeline, served the omni way.

Opening a model does, in this order, and fails at the first problem:

1. choose the attention backend for every role the family declares (an explicit choice
   that cannot run is an error here, before any weight is read);
2. choose the offload strategy, checking every declared incompatibility;
3. load the pipeline with ``from_pretrained`` from the local directory (no network);
4. place it on the platform's device, route the transformers' attention through the chosen
   backends, enable the offloader.

``generate`` validates the request against the family's profile before any compute, seeds a
generator, runs the pipeline with a progress bar over the denoising steps, and returns typed
numpy outputs with the metadata of what ran. Between denoising steps it checks for
cancellation (:func:`omni_core.cancel.check_cancelled`), so a server's cancelled request
stops at the next step.

``batch_key`` / ``generate_batch`` (the optional
:class:`~omni_core.generation.model.BatchingEngine` methods) run several text-to-image
requests that differ only in prompt, negative prompt and seed as one pipeline call: a prompt
list and one seeded generator per request, so each request's noise is what it gets alone.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_core.attention.selector import AttentionChoice, CallProfile, explain_attention
from omni_core.cache import CacheChoice, CacheTarget, choose_cache_backend
from omni_core.cancel import check_cancelled
from omni_core.errors import ModelLoadError, ModelRuntimeError, OmniError
from omni_core.generation.outputs import GeneratedImage, GeneratedVideo, GenerationMetadata, GenerationResult
from omni_core.generation.request import GenerationRequest, ResolvedGeneration
from omni_core.offload import OffloadChoice, OffloadPlan, choose_offloader
from omni_core.selection import Explanation
from omni_core.tiny import has_random_weights
from omni_plugin_diffusion.attention import AttentionRouter

if TYPE_CHECKING:
    from omni_core.cache import CacheBackend
    from omni_core.generation.model import EngineOptions
    from omni_core.offload import Offloader
    from omni_plugin_diffusion.family import DiffusersFamily

__all__ = ["DiffusionEngine", "ModelLoadError", "StartupPlan", "plan_startup"]


@dataclass
class StartupPlan:
    """Every choice made before a weight is read: dtype, attention per role, offload strategy,
    cache backend. ``omni explain model`` shows it without loading; the engine then acts on it."""

    plugins: Any
    platform: Any
    dtype: str
    choices: dict[str, AttentionChoice]
    offload: OffloadChoice | None
    cache: CacheChoice | None
    explanations: dict[str, Explanation] = field(default_factory=dict)


def plan_startup(family_cls: type[DiffusersFamily], model_dir: Path, options: EngineOptions) -> StartupPlan:
    """Choose the dtype, each declared role's attention backend and the offload strategy.
    Raises (an explicit backend that cannot run, an incompatible offload) without loading."""
    from omni_core.platforms import current_platform
    from omni_core.plugins import get_plugins

    plugins = options.plugins or get_plugins()
    platform = options.platform or current_platform()
    dtype = options.dtype or family_cls.default_dtypes.get(platform.device_type, family_cls.fallback_dtype)
    if dtype not in platform.supported_dtypes():
        raise OmniError(
            f"dtype {dtype} is not supported on {platform.name} "
            f"(supported: {', '.join(platform.supported_dtypes())}); choose one with --dtype"
        )
    explanations: dict[str, Explanation] = {}
    if options.resolution is not None:
        explanations["model"] = options.resolution.explanation
    try:
        transformer_config = json.loads((model_dir / "transformer" / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        transformer_config = {}
    choices: dict[str, AttentionChoice] = {}
    for role, category in family_cls.declared_roles():
        call = CallProfile(
            head_size=family_cls.head_size(transformer_config, role), dtype=dtype, mask=family_cls.passes_masks(role)
        )
        choice, explanation = explain_attention(plugins, platform, options.attention, role, category, call)
        explanations[f"attention:{role}"] = explanation
        if choice is None:
            raise OmniError(f"no attention backend can run role {role!r} of {options.family}:\n{explanation.render()}")
        choices[role] = choice
    features = {f"family:{options.family}", f"platform:{platform.name}", *family_cls.features}
    features |= {f"attention:{c.backend}" for c in choices.values()}
    offload, explanations["offload"] = choose_offloader(plugins, options.offload, features, platform)
    if offload is not None:
        features.add(f"offload:{offload.name}")
    cache, explanations["cache"] = choose_cache_backend(
        plugins,
        options.cache_backend,
        options.cache_config,
        options.family,
        family_cls.cache_declarations_for(model_dir),
        features,
    )
    return StartupPlan(plugins, platform, dtype, choices, offload, cache, explanations)


class DiffusionEngine:
    """A diffusers pipeline for one family, ready to generate."""

    def __init__(self, family_cls: type[DiffusersFamily], model_dir: Path, options: EngineOptions) -> None:
        self.family_cls = family_cls
        self.family = options.family
        self.model_dir = model_dir
        self.options = options
        startup = plan_startup(family_cls, model_dir, options)  # fails here, before loading
        self.plugins, self.platform, self.dtype = startup.plugins, startup.platform, startup.dtype
        self.profile = family_cls.profile_for(model_dir)
        self.choices = startup.choices
        self.explanations = startup.explanations
        self.pipeline = self._load()
        self.device = self.platform.device(0)
        self.router = AttentionRouter(self.choices, family_cls.declared_site, self.family)
        for name in family_cls.dit_modules:
            module = getattr(self.pipeline, name, None)
            if module is not None:
                self.router.attach(name, module)
        self.offloader: Offloader | None = None
        if startup.offload is None:
            try:
                self.pipeline.to(self.device)
            except Exception as exc:  # out of device memory, mostly
                raise ModelLoadError(
                    f"could not place {self.family} ({self.model_dir}) on {self.device}: {type(exc).__name__}: "
                    f"{_first_line(exc)}. If the device is out of memory, use --offload (`omni plugins list` "
                    "shows the strategies) or a smaller --dtype"
                ) from exc
        else:
            offload_options = {
                "blocking": self.platform.blocking_offload_copies,
                **startup.offload.options,
                **options.offload_options,
            }
            self.offloader = startup.offload.offloader_class(self.offload_plan(), self.device, offload_options)
            self.offloader.check()
            self.offloader.enable()
        self.cache: CacheBackend | None = None
        if startup.cache is not None:
            declarations = family_cls.cache_declarations_for(model_dir)
            declaration = next(v for k, v in declarations.items() if k.casefold() == startup.cache.name.casefold())
            target = CacheTarget(self.family, self.pipeline, self.pipeline.transformer, declaration)
            self.cache = startup.cache.backend_class(target, startup.cache.options)
            self.cache.enable()
        self.pipeline.set_progress_bar_config(disable=not options.progress, desc=f"{self.family} denoising")
        self.random_weights = has_random_weights(model_dir)
        #: the pipeline argument through which it calls back after each denoising step (where
        #: cancellation is checked): "callback_on_step_end", the older "callback", or None
        self.step_callback = _step_callback_argument(self.pipeline)
        #: the cache backend's account of the last pipeline call (None without one)
        self.cache_report: dict[str, Any] | None = None

    # -- startup -----------------------------------------------------------------------------

    def _load(self) -> Any:
        import torch

        from omni_core.inputs import check_checkpoint_files
        from omni_core.quiet import quiet_libraries

        # malformed configs and truncated or corrupt weights are named, with the file, before
        # diffusers reads them (its own errors range from vague to stack traces)
        check_checkpoint_files(self.model_dir)
        try:
            with quiet_libraries(progress=self.options.progress):
                cls = self.family_cls.pipeline_type()
                return cls.from_pretrained(str(self.model_dir), dtype=getattr(torch, self.dtype), local_files_only=True)
        except Exception as exc:  # any loader failure is this checkpoint's problem; the cause stays chained
            raise ModelLoadError(self._load_failure(exc)) from exc

    def _load_failure(self, exc: Exception) -> str:
        """Why loading failed, and the fix: a forced family that does not match the checkpoint
        says so; anything else points at the checkpoint's completeness."""
        from omni_core.generation.resolve import Checkpoint

        pipeline_class = self.family_cls.pipeline_class
        message = (
            f"could not load {self.model_dir} as {pipeline_class} ({self.family}): "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ).rstrip(". ")
        resolution = self.options.resolution
        rule = getattr(resolution, "rule", "")
        try:
            declared = Checkpoint(self.model_dir).class_name
        except OmniError:
            declared = None
        if rule in ("explicit", "recipe") and declared and declared != pipeline_class:
            source = "--model-class-name" if rule == "explicit" else "the recipe's model_class_name"
            return (
                f"{message}. {source} chose {self.family} ({pipeline_class}), but the checkpoint's model_index.json "
                f"names {declared}: drop {source} to let omni pick the family, or name one that serves {declared} "
                "(`omni models list`)"
            )
        return (
            f"{message}. Check that the directory is a complete diffusers checkpoint (model_index.json and one "
            "folder per component), and re-download any part that is missing or damaged"
        )

    def offload_plan(self) -> OffloadPlan:
        """The family's declarations over the loaded components; the offloader validates them
        (a misspelled name is an error there, not silently dropped here)."""
        fam = self.family_cls
        return OffloadPlan(
            components=dict(self.pipeline.components),
            dit_modules=fam.dit_modules,
            encoder_modules=fam.encoder_modules,
            resident_modules=fam.resident_modules,
            block_attrs=fam.block_attrs,
        )

    # -- generation --------------------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> GenerationResult:
        import torch

        # the same rules `omni generate` checked before loading, so the API gets them too
        resolved = self.family_cls.validate(self.model_dir, request, self.pipeline)
        kwargs = self.family_cls.call_kwargs(resolved, self.pipeline)
        # a CPU generator makes the initial noise identical on every device for a given seed
        kwargs["generator"] = torch.Generator(device="cpu").manual_seed(resolved.seed)
        output, seconds = self._run(kwargs, resolved)
        metadata = self._metadata(resolved, seconds)
        if resolved.is_video:
            videos = [GeneratedVideo(_to_uint8(v), fps=resolved.fps or 1, index=i) for i, v in enumerate(output.frames)]
            return GenerationResult(images=[], videos=videos, metadata=metadata)
        images = [GeneratedImage(_to_uint8(img), index=i) for i, img in enumerate(output.images)]
        return GenerationResult(images=images, videos=[], metadata=metadata)

    # -- batching (omni_core.generation.model.BatchingEngine) ----------------------------------

    def batch_key(self, request: GenerationRequest) -> Hashable | None:
        """Validate ``request`` as :meth:`generate` does and return every resolved value but the
        prompt, the negative prompt and the seed (whether a negative prompt is given stays in:
        it changes the call); None for what never batches (see :func:`_batch_key`)."""
        return _batch_key(self.family_cls, self.family_cls.validate(self.model_dir, request, self.pipeline))

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """One pipeline call for ``requests`` (equal, non-None :meth:`batch_key`; else
        ``ValueError``): a list of prompts (and negative prompts) and one CPU generator per
        request seeded with its own seed, so request ``i``'s initial noise is what it gets alone."""
        import torch

        if not requests:
            return []
        resolved = [self.family_cls.validate(self.model_dir, r, self.pipeline) for r in requests]
        keys = [_batch_key(self.family_cls, r) for r in resolved]
        if keys[0] is None:
            raise ValueError(
                f"{self.family}: this request cannot run in a batch (batch_key is None: a video, several outputs, "
                "or a family that does not batch); generate it alone"
            )
        if any(key != keys[0] for key in keys[1:]):
            raise ValueError(
                f"{self.family}: generate_batch takes requests of one batch_key only (they may differ in prompt, "
                "negative prompt and seed); group the requests by batch_key first"
            )
        calls = [self.family_cls.call_kwargs(r, self.pipeline) for r in resolved]
        kwargs = dict(calls[0])
        for name in _PER_REQUEST_ARGUMENTS:
            if name in kwargs:
                kwargs[name] = [call.get(name) for call in calls]
        for name, value in kwargs.items():
            if name not in _PER_REQUEST_ARGUMENTS and not all(_same(call.get(name), value) for call in calls[1:]):
                raise ValueError(
                    f"{self.family}: requests with equal batch keys gave different pipeline argument {name!r}; the "
                    f"family's call_kwargs depends on the prompt or seed, so it must set batchable = False"
                )
        kwargs["generator"] = [torch.Generator(device="cpu").manual_seed(r.seed) for r in resolved]
        output, seconds = self._run(kwargs, resolved[0])
        images = list(output.images)
        if len(images) != len(resolved):
            raise ModelRuntimeError(
                f"{self.family}: a batch of {len(resolved)} prompts gave {len(images)} images; report this to "
                f"{self.options.provider or 'the family plugin'}"
            )
        return [
            GenerationResult(
                images=[GeneratedImage(_to_uint8(image), index=0)],
                videos=[],
                metadata=self._metadata(r, seconds, batch_size=len(resolved)),
            )
            for r, image in zip(resolved, images, strict=True)
        ]

    # -- one pipeline call -------------------------------------------------------------------

    def _run(self, kwargs: dict[str, Any], resolved: ResolvedGeneration) -> tuple[Any, float]:
        """Call the pipeline (numpy output, cancellation checked between steps); returns the
        output and the seconds it took. The runtime's own failures become ModelRuntimeError.
        The cache backend starts afresh for every call: nothing computed for another request
        (another prompt, size or seed) is ever reused."""
        import torch

        kwargs["output_type"] = "np"
        if self.step_callback == "callback_on_step_end":
            _check_cancelled_each_step(kwargs)
        elif self.step_callback == "callback":
            _check_cancelled_each_step_legacy(kwargs)
        check_cancelled()  # a request cancelled while it waited never starts
        self.router.reset()
        if self.cache is not None:
            self.cache.refresh(resolved.num_inference_steps, resolved.cache_quality)
        self.cache_report = None
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                output = self.pipeline(**kwargs)
        except OmniError:  # RequestCancelled among them: a stop on purpose, passed on as it is
            raise
        except Exception as exc:  # the runtime's own failure: named, with the cause chained for OMNI_DEBUG=1
            raise ModelRuntimeError(self._run_failure(exc)) from exc
        seconds = time.perf_counter() - started
        if self.cache is not None:
            report = self.cache.report()
            self.cache_report = {
                "backend": self.cache.name,
                "settings": self.cache.describe(),
                "quality": resolved.cache_quality,
                **report.as_dict(),
            }
        self._check_attention_ran()
        return output, seconds

    def _metadata(self, resolved: ResolvedGeneration, seconds: float, batch_size: int = 1) -> GenerationMetadata:
        return GenerationMetadata(
            model=str(self.model_dir),
            family=self.family,
            provider=self.options.provider,
            request=resolved,
            attention=self.router.ran(),
            offload=self.offloader.name if self.offloader else None,
            cache=dict(self.cache_report) if self.cache_report else None,
            device=str(self.device),
            dtype=self.dtype,
            random_weights=self.random_weights,
            seconds=seconds,
            batch_size=batch_size,
        )

    def _check_attention_ran(self) -> None:
        """A routed transformer that ran without one attention call computed its attention
        somewhere omni does not route (a custom processor, a fused kernel of its own): the
        backends chosen for its roles never ran, and the report must not claim they did."""
        silent = self.router.silent()
        if silent:
            roles = ", ".join(self.choices)
            raise ModelRuntimeError(
                f"{self.family}: {' and '.join(silent)} ran without making one attention call through torch's "
                f"scaled_dot_product_attention, so the backends chosen for its roles ({roles}) never ran. Its "
                "attention processors compute attention some other way; the family plugin must keep diffusers' "
                f"SDPA-based processors (report this to {self.options.provider or 'the family plugin'})"
            )

    def _run_failure(self, exc: Exception) -> str:
        text = _first_line(exc)
        message = f"{self.family} ({self.model_dir}) failed while generating: {type(exc).__name__}: {text}".rstrip(". ")
        if "out of memory" in text.lower():
            return f"{message}. Lower --width/--height, -n or --frames, or use --offload"
        return (
            f"{message}. Check that the checkpoint matches the family (`omni explain model --model "
            f"{self.model_dir}`); if it does, rerun with OMNI_DEBUG=1 and report the traceback to "
            f"{self.options.provider or 'the family plugin'}"
        )

    def explain(self) -> dict[str, Explanation]:
        return dict(self.explanations)

    def close(self) -> None:
        if self.cache is not None and self.cache.is_enabled():
            self.cache.disable()
        if self.offloader is not None and self.offloader.is_enabled():
            self.offloader.disable()
        self.router.detach()
        self.pipeline = None

    def __repr__(self) -> str:
        return f"DiffusionEngine({self.family!r}, {str(self.model_dir)!r}, {self.dtype} on {self.platform.name})"


#: pipeline arguments that are lists, one item per request, in a batched call
_PER_REQUEST_ARGUMENTS = ("prompt", "negative_prompt")


def _batch_key(family_cls: type[DiffusersFamily], resolved: ResolvedGeneration) -> Hashable | None:
    """Every resolved value but the per-request ones, frozen; None where batching could change
    a request's output or cannot split it back: video (one call per clip), an input image,
    several outputs per request, a family that declares ``batchable = False``, or an ``extra``
    value that cannot be compared."""
    if not family_cls.batchable or resolved.is_video or resolved.image is not None or resolved.num_outputs != 1:
        return None
    fields = resolved.model_dump(exclude={"prompt", "negative_prompt", "seed", "image"})
    fields["negative_prompt"] = resolved.negative_prompt is not None
    try:
        key: Hashable = _freeze(fields)
        hash(key)
    except TypeError:
        return None
    return key


def _freeze(value: Any) -> Any:
    """A hashable stand-in for nested dicts, lists and sets (TypeError for anything else unhashable)."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(_freeze(v) for v in value)
    hash(value)
    return value


def _same(a: Any, b: Any) -> bool:
    """Whether two pipeline arguments are equal; anything that does not compare plainly (a
    tensor, an image) counts as different."""
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _step_callback_argument(pipeline: Any) -> str | None:
    """Which per-step callback the pipeline's ``__call__`` takes: ``callback_on_step_end``, else
    the older ``callback`` (with ``callback_steps``), else None (cancellation is then checked
    only before the call starts)."""
    try:
        parameters = inspect.signature(pipeline.__call__).parameters
    except (TypeError, ValueError):
        return None
    if "callback_on_step_end" in parameters:
        return "callback_on_step_end"
    if "callback" in parameters and "callback_steps" in parameters:
        return "callback"
    return None


def _check_cancelled_each_step(kwargs: dict[str, Any]) -> None:
    """Set the pipeline's step-end callback to check for cancellation, then run the family's
    own callback if it set one (its tensor inputs kept: the pipeline reads them off callback
    objects, which the wrapper is not)."""
    own: Callable[..., Any] | None = kwargs.get("callback_on_step_end")

    def on_step_end(pipeline: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        check_cancelled()
        if own is not None:
            result: dict[str, Any] = own(pipeline, step, timestep, callback_kwargs)
            return result
        return callback_kwargs

    tensor_inputs = getattr(own, "tensor_inputs", None)
    if tensor_inputs is not None and "callback_on_step_end_tensor_inputs" not in kwargs:
        kwargs["callback_on_step_end_tensor_inputs"] = list(tensor_inputs)
    kwargs["callback_on_step_end"] = on_step_end


def _check_cancelled_each_step_legacy(kwargs: dict[str, Any]) -> None:
    """The same for pipelines with the older ``callback(step, timestep, latents)``: called every
    step now, the family's own callback still only every ``callback_steps`` steps it asked for."""
    own: Callable[..., Any] | None = kwargs.get("callback")
    every = int(kwargs.get("callback_steps") or 1)

    def on_step(step: int, timestep: Any, latents: Any) -> None:
        check_cancelled()
        if own is not None and step % every == 0:
            own(step, timestep, latents)

    kwargs["callback"] = on_step
    kwargs["callback_steps"] = 1


def _to_uint8(array: Any) -> Any:
    """Pipeline ``np`` output (floats in [0, 1]) to uint8 pixels."""
    import numpy as np

    arr = np.asarray(array)
    if arr.dtype != np.uint8:
        arr = (np.clip(arr, 0.0, 1.0) * 255.0).round().astype(np.uint8)
    return np.ascontiguousarray(arr)


def _first_line(exc: BaseException) -> str:
    """An exception's message, cut to its first few lines (loaders print whole tables)."""
    lines = str(exc).strip().splitlines() or [""]
    text = " ".join(line.strip() for line in lines[:3])
    return text if len(text) <= 600 else text[:600] + "..."
