"""The contract of an image or video model family: what a ``ModelSpec.ref`` points at.

A family plugin registers a model (``omni_register_models``) whose ``ref`` is a class
following :class:`GenerationModel`. omni resolves a checkpoint to a family
(:mod:`omni_core.generation.resolve`), then calls ``open`` and drives the returned
:class:`GenerationEngine`. How the family runs (diffusers pipelines, a custom DiT, a remote
stage) is its own business; the shared diffusers runtime, ``omni-plugin-diffusion``, is one
implementation that most families build on.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from omni_core.attention.config import AttentionConfig

if TYPE_CHECKING:
    from omni_core.generation.outputs import GenerationResult
    from omni_core.generation.request import GenerationProfile, GenerationRequest, ResolvedGeneration
    from omni_core.selection import Explanation


class EngineOptions(BaseModel):
    """How to run a model, independent of what is generated. Validated before loading."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    #: the registered family name the checkpoint resolved to, and who provides it
    family: str
    provider: str = ""
    #: attention backend per role (``--attention-backend`` is ``default.backend``)
    attention: AttentionConfig = Field(default_factory=AttentionConfig)
    #: offload strategies asked for; more than one is refused unless they declare compatibility
    offload: tuple[str, ...] = ()
    #: options for the offload strategy, e.g. ``{"window": 2}`` for layer-wise offload
    offload_options: dict[str, Any] = Field(default_factory=dict)
    #: the cache backend (``--cache-backend``; None: every step is computed) and its options
    #: (``--cache-config``), checked with the family's declaration before loading
    cache_backend: str | None = None
    cache_config: dict[str, Any] = Field(default_factory=dict)
    #: compute dtype name; None lets the family choose (float32 on CPU)
    dtype: str | None = None
    #: show progress bars (loading, denoising steps)
    progress: bool = True
    #: the loaded plugins and platform (None: the process's own)
    plugins: Any = None
    platform: Any = None
    #: how the family was chosen, kept for ``explain``
    resolution: Any = None

    @classmethod
    def build(
        cls, resolution: Any, plugins: Any, recipe: Any, given: dict[str, Any], environment: Any = None
    ) -> EngineOptions:
        """Options for a resolved family, each setting by the one precedence: what the caller gave
        (``Omni(...)`` keywords, the command line's flags) > the recipe > the environment
        (``environment``, an :class:`~omni_core.config.EngineSettings`; read now when None) > the
        family's and the platform's defaults. The CLI and the offline API both come through here."""
        from omni_core.attention.config import layered_attention
        from omni_core.config import EngineSettings

        env = environment if environment is not None else EngineSettings.from_env()
        attention = layered_attention(
            given.get("attention"),
            backend=given.get("attention_backend"),
            recipe=recipe.attention if recipe is not None else None,
            environment=env.attention_backend,
        )
        offload = given.get("offload")
        if offload is None:
            offload = recipe.offload if recipe is not None else ()
        offload_options = given.get("offload_options") or (recipe.offload_options if recipe is not None else {})
        cache_backend, cache_config = given.get("cache_backend"), given.get("cache_config")
        recipe_cache = recipe.cache if recipe is not None else None
        if cache_backend is None and recipe_cache is not None:
            cache_backend = recipe_cache.backend
            cache_config = cache_config if cache_config is not None else recipe_cache.config
        if cache_backend is None:
            cache_backend = env.cache_backend
        return cls(
            family=resolution.entry.name,
            provider=str(resolution.entry.provider),
            attention=attention,
            offload=(offload,) if isinstance(offload, str) else tuple(offload),
            offload_options=dict(offload_options),
            cache_backend=cache_backend,
            cache_config=dict(cache_config or {}),
            dtype=given.get("dtype") or (recipe.dtype if recipe is not None else None),
            progress=given.get("progress", True),
            plugins=plugins,
            platform=given.get("platform"),
            resolution=resolution,
        )


@runtime_checkable
class GenerationEngine(Protocol):
    """A loaded model, ready to generate."""

    family: str
    model_dir: Path

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Validate ``request`` against the profile (before any compute), run, return outputs."""

    def explain(self) -> dict[str, Explanation]:
        """How the family, each attention role's backend and the offloader were chosen."""

    def close(self) -> None:
        """Release the model (and any hooks an offloader installed)."""


@runtime_checkable
class BatchingEngine(GenerationEngine, Protocol):
    """An engine that can run several requests as one pipeline call. Optional: a server
    (through :meth:`omni_core.api.Omni.batch_key` and :meth:`~omni_core.api.Omni.generate_batch`)
    checks ``isinstance(engine, BatchingEngine)`` and otherwise runs requests one by one.

    The caller asks :meth:`batch_key` of each request as it arrives, groups the waiting
    requests whose keys are equal (never one whose key is None), and hands each group to
    :meth:`generate_batch`. Batching is a throughput measure only: a request's outputs must not
    depend on what it was batched with."""

    def batch_key(self, request: GenerationRequest) -> Hashable | None:
        """Validate ``request`` as :meth:`generate` would (raising ``GenerationOptionError``
        before any compute) and return what decides whether it can share a pipeline call:
        requests with equal keys can run as one call. Everything but the per-request inputs
        (prompt, negative prompt, seed) belongs in the key. None: never batch this request (a
        video, several outputs per request, a family that cannot batch)."""

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Run ``requests`` (equal, non-None batch keys; else ``ValueError``) as one pipeline
        call, each with its own seed and random generator. Result ``i`` belongs to request ``i``
        and carries its own metadata (seed, prompt) with ``batch_size`` set; its pixels equal,
        within 1/255, what :meth:`generate` gives for that request alone."""


@runtime_checkable
class GenerationModel(Protocol):
    """A model family class (the registered ``ref``). Class-level: never instantiated by omni."""

    profile: ClassVar[GenerationProfile]

    @classmethod
    def open(cls, model_dir: Path, options: EngineOptions) -> GenerationEngine:
        """Load the checkpoint in ``model_dir`` (local files only) and return its engine."""

    @classmethod
    def profile_for(cls, model_dir: Path) -> GenerationProfile:
        """The profile of one checkpoint (``profile``, or checkpoint-specific defaults read from
        its configs). Called before loading: requests are validated against it."""

    @classmethod
    def plan(cls, model_dir: Path, options: EngineOptions) -> dict[str, Explanation]:
        """Every choice ``open`` would make (attention per role, offload, ...), explained,
        without loading weights: what ``omni explain model`` prints."""

    @classmethod
    def make_tiny(cls, directory: Path, seed: int = 0) -> None:
        """Write a tiny random-weight checkpoint in the family's standard on-disk layout."""

    # Optional (not part of the protocol, so families written before it keep conforming):
    #
    #     @classmethod
    #     def validate(cls, model_dir: Path, request: GenerationRequest) -> ResolvedGeneration:
    #         """The profile's rules plus the family's own (``--extra`` values, option
    #         combinations), without loading: raises GenerationOptionError."""
    #
    # :func:`validate_request` calls it when present, else the profile's rules only.


def validate_request(family_cls: Any, model_dir: Path, request: GenerationRequest) -> ResolvedGeneration:
    """Check ``request`` against a family before any weight loads: the profile's rules and the
    family's own checks (``validate`` when the family defines one). ``omni generate`` calls it
    before opening the model, and engines call it again per request, so one function decides.
    Raises :class:`~omni_core.generation.request.GenerationOptionError`."""
    validate = getattr(family_cls, "validate", None)
    if callable(validate):
        resolved: ResolvedGeneration = validate(Path(model_dir), request)
        return resolved
    return family_cls.profile_for(Path(model_dir)).resolve(request)  # type: ignore[no-any-return]
