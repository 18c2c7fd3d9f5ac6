"""The cache backend contract: skipping a diffusion transformer's work between denoising steps
whose inputs barely changed, and reusing what an earlier step computed.

A cache backend is registered through ``omni_register_cache_backends`` (its ``ref`` is a
subclass of :class:`CacheBackend`). At most one is active per model, chosen when the model is
opened (``--cache-backend``, a recipe's ``cache``, ``Omni(..., cache=...)``). Each declares,
as data, what it cannot be combined with (``incompatible_with`` in its registration: other
features such as ``offload:layerwise``, ``attention:<BACKEND>`` or ``family:<name>``), and
:func:`choose_cache_backend` checks every declaration, the family's declaration for the
backend and the options *before* any hook is installed.

What a backend caches is the family's to declare, as data: a family lists, per backend name,
what that backend needs of it (TeaCache: the extractor of the modulated input and the
rescaling coefficients; Cache-DiT: the block lists and their forward pattern), in
:attr:`CacheTarget.declaration`. A family without a declaration for a backend is refused with
the families that have one.

The lifecycle, driven by the model runtime::

    backend = cls(target, options)       # nothing is touched yet
    backend.enable()                     # once, after the model is loaded: install hooks
    backend.refresh(steps, quality)      # before each request (a new step count, a quality)
    ...                                  # the denoising loop; hooks compute or reuse
    backend.report()                     # which steps were computed and which reused
    backend.disable()                    # remove every hook: the model is exactly as before

``quality`` is request-scoped: ``lossless`` computes every step (no reuse; the output equals
an uncached run's), ``high`` a conservative profile, and None the profile the backend was
opened with.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from omni_core.errors import CacheConfigError as CacheConfigError
from omni_core.identity import DeclaredIdentity  # name etc. come from the registration
from omni_core.kinds import Kind
from omni_core.selection import Explanation, Outcome

if TYPE_CHECKING:
    from omni_core.plugins import PluginSet

#: a request's cache quality: every step computed, a conservative profile (None: the startup one)
CacheQuality = Literal["lossless", "high"]
CACHE_QUALITIES: tuple[str, ...] = ("lossless", "high")


@dataclass(frozen=True)
class CacheTarget:
    """What a cache backend is given of a loaded model."""

    #: the family's registered name
    family: str
    #: the loaded pipeline (diffusers' ``DiffusionPipeline``, or the family's own)
    pipeline: Any
    #: the denoiser the steps run (``pipeline.transformer``): a ``torch.nn.Module``
    transformer: Any
    #: what the family declares for this backend (see the backend's documentation)
    declaration: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class StepReport:
    """One request's steps, as the backend saw the transformer being called: which denoising
    steps it computed and which it reused. Step indices count from 0; a step that ran the
    transformer more than once (classifier-free guidance) is listed once."""

    computed: list[int] = field(default_factory=list)
    reused: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.computed) + len(self.reused)

    def as_dict(self) -> dict[str, Any]:
        return {"computed": list(self.computed), "reused": list(self.reused)}


class CacheBackend(DeclaredIdentity, abc.ABC, identity_of=Kind.CACHE_BACKEND):
    """One step-caching method, bound to one loaded model."""

    name: ClassVar[str]

    def __init__(self, target: CacheTarget, options: Mapping[str, Any] | None = None) -> None:
        self.target = target
        self.options = dict(options or {})

    @classmethod
    def option_problems(cls, options: Mapping[str, Any]) -> list[str]:
        """What is wrong with ``options`` (``--cache-config``), each a sentence naming the
        option and what it takes; empty when they are fine. Must not touch a model."""
        return []

    @classmethod
    def declaration_problems(cls, family: str, declaration: Mapping[str, Any]) -> list[str]:
        """What is wrong with a family's declaration for this backend (a missing key, an
        unknown extractor); empty when it can be served. Must not touch a model."""
        return []

    @abc.abstractmethod
    def enable(self) -> None:
        """Install the hooks, once, after the model is loaded. Leaves nothing installed on failure."""

    @abc.abstractmethod
    def refresh(self, num_inference_steps: int, quality: CacheQuality | None = None) -> None:
        """Prepare for one request of ``num_inference_steps`` steps at ``quality``: forget every
        step of the previous request (nothing is reused across requests) and start a new
        :meth:`report`."""

    @abc.abstractmethod
    def disable(self) -> None:
        """Remove every hook: the model computes exactly as it did before :meth:`enable`."""

    @abc.abstractmethod
    def is_enabled(self) -> bool: ...

    @abc.abstractmethod
    def report(self) -> StepReport:
        """The steps of the request since the last :meth:`refresh`."""

    def describe(self) -> str:
        """One line for ``omni explain model`` and a result's metadata: the settings in force."""
        return ", ".join(f"{k}={v}" for k, v in sorted(self.options.items())) or "defaults"


def cache_backend_contract_problems(cls: Any) -> list[str]:
    if not (isinstance(cls, type) and issubclass(cls, CacheBackend)):
        return [f"{cls!r} is not a subclass of omni_core.cache.CacheBackend"]
    if getattr(cls, "__abstractmethods__", None):
        return [f"abstract methods not implemented: {sorted(cls.__abstractmethods__)}"]
    return []


@dataclass
class CacheChoice:
    name: str
    backend_class: type[CacheBackend]
    options: dict[str, Any] = field(default_factory=dict)


def _requested(value: str | None) -> str | None:
    name = (value or "").strip()
    return None if not name or name.casefold() == "none" else name


def choose_cache_backend(
    plugins: PluginSet,
    requested: str | None,
    options: Mapping[str, Any],
    family: str,
    declarations: Mapping[str, Mapping[str, Any]],
    features: set[str],
) -> tuple[CacheChoice | None, Explanation]:
    """The cache backend to enable, after checking (touching no model) that it is installed,
    that it declares no incompatibility with the run's ``features`` (``offload:<name>``,
    ``attention:<BACKEND>``, ``family:<name>``, ``platform:<name>``), that the family declares
    what it needs (``declarations``, by backend name), and that ``options`` are its options.
    Raises :class:`CacheConfigError` naming the problem and the fix."""
    explanation = Explanation("cache backend")
    registry = plugins.cache_backends
    name = _requested(requested)
    if name is None:
        if options:
            raise CacheConfigError(
                "--cache-config was given without a cache backend; name one with --cache-backend NAME "
                f"(installed: {', '.join(registry.names()) or 'none'})"
            )
        for entry in registry:
            explanation.add(entry.name, Outcome.NOT_CONSIDERED, "no cache backend requested", str(entry.provider))
        explanation.rule = "no cache backend requested: every step is computed"
        return None, explanation
    if name not in registry:
        import difflib

        known = ", ".join(registry.names()) or "none (install omni-plugin-teacache or omni-plugin-cache-dit)"
        close = difflib.get_close_matches(name.casefold(), [n.casefold() for n in registry.names()], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise CacheConfigError(
            f"unknown cache backend {name!r}{hint}: {registry.why_missing(name)}; installed: {known}"
        )
    entry = registry.get(name)
    active = {f.casefold() for f in features}
    clashes = [c for c in entry.spec.incompatible_with if c.casefold() in active]
    if clashes:
        raise CacheConfigError(
            f"cache backend {entry.name!r} cannot be combined with {', '.join(clashes)} "
            f"(declared by {entry.provider.distribution}). Drop one of them."
        )
    declaration = _declaration_for(entry.name, declarations)
    if declaration is None:
        raise CacheConfigError(
            f"cache backend {entry.name!r} has nothing to hook in family {family!r}: the family declares no "
            f"{entry.name} settings (it declares: {', '.join(sorted(declarations)) or 'none'}). Drop "
            "--cache-backend, or choose one the family declares"
        )
    cls = entry.load()
    problems = cache_backend_contract_problems(cls)
    if problems:
        raise CacheConfigError(f"cache backend {entry.name!r} ({entry.provider}) is broken: {'; '.join(problems)}")
    problems = cls.declaration_problems(family, declaration)
    if problems:
        raise CacheConfigError(
            f"family {family!r} declares {entry.name} settings that cannot be served: {'; '.join(problems)}; "
            "report this to the family plugin's authors"
        )
    problems = cls.option_problems(options)
    if problems:
        raise CacheConfigError(f"--cache-config for {entry.name!r}: {'; '.join(problems)}")
    for other in registry:
        if other.name != entry.name:
            explanation.add(other.name, Outcome.NOT_CONSIDERED, "another backend was chosen", str(other.provider))
    explanation.add(
        entry.name, Outcome.SELECTED, f"requested; family {family!r} declares its settings", str(entry.provider)
    )
    explanation.winner, explanation.rule = entry.name, "explicit choice"
    return CacheChoice(entry.name, cls, dict(options)), explanation


def _declaration_for(name: str, declarations: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for key, value in declarations.items():
        if key.casefold() == name.casefold():
            return value
    return None
