"""Typed registries. Plugins register into a :class:`Registrar` from their hooks; the core
validates each registration, applies the conflict policy and exposes one :class:`Registry`
per extension kind. Registered objects stay lazy references until first use.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from omni_core.conflicts import Conflict, Decision, Offer, Provider
from omni_core.errors import ConflictError, RegistrationError, UnknownExtensionError, validation_problems
from omni_core.kinds import Kind
from omni_core.lazy import LazyRef, check_ref
from omni_core.manifest import NAME_MAX_LENGTH, NAME_PATTERN, Declared, fold, names_of

_NAME_PATTERN = NAME_PATTERN  # one pattern for manifests and registrations


class ExtensionSpec(BaseModel):
    """What every registration carries. Kind-specific specs add their own fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: ClassVar[Kind]

    name: str = Field(min_length=1, max_length=NAME_MAX_LENGTH, pattern=_NAME_PATTERN)
    #: ``package.module:attribute`` of the implementation, imported on first use
    ref: str
    #: wins over lower priorities when two plugins offer the same name
    priority: int = 0

    @field_validator("ref")
    @classmethod
    def _valid_ref(cls, v: str) -> str:
        return check_ref(v)


class PlatformSpec(ExtensionSpec):
    """A hardware platform: ``ref`` is a :class:`omni_core.platforms.Platform` subclass."""

    kind: ClassVar[Kind] = Kind.PLATFORM
    #: ``module:function`` returning a ProbeResult (or bool). Must not import torch or init drivers.
    probe: str

    @field_validator("probe")
    @classmethod
    def _valid_probe(cls, v: str) -> str:
        return check_ref(v)


class AttentionBackendSpec(ExtensionSpec):
    """An attention backend: ``ref`` is an :class:`omni_core.attention.AttentionBackend` subclass."""

    kind: ClassVar[Kind] = Kind.ATTENTION_BACKEND
    #: device types it runs on (empty: any), repeating the class's declaration for listings
    device_types: tuple[str, ...] = ()


class ModelSpec(ExtensionSpec):
    """A model family: ``ref`` is the object that builds and runs it."""

    kind: ClassVar[Kind] = Kind.MODEL
    #: checkpoint class names it serves (``model_index.json`` ``_class_name`` or HF ``architectures``)
    architectures: tuple[str, ...] = ()
    #: HF ``model_type`` values it serves
    model_types: tuple[str, ...] = ()
    #: old names that still resolve to this model
    aliases: tuple[str, ...] = ()
    #: what it does, e.g. ``text-to-image``, ``text-to-video``
    tasks: tuple[str, ...] = ()
    #: tells siblings that share an architecture apart, read from the checkpoint's configs:
    #: ``"<component>.<key>": value``, where component is ``model_index``, ``config`` (the
    #: top-level config.json) or a subfolder (``transformer``); ``{"exists": true}`` tests
    #: presence. Every entry must hold. Never decided by load order.
    config_match: dict[str, Any] = Field(default_factory=dict)

    @field_validator("config_match")
    @classmethod
    def _valid_match(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if key.count(".") < 1 or not all(key.split(".")):
                raise ValueError(
                    f"config_match key {key!r} must be '<component>.<key>', e.g. 'transformer.guidance_embeds'"
                )
        return v


class TTSAdapterSpec(ExtensionSpec):
    """A text-to-speech adapter: ``ref`` is the adapter class."""

    kind: ClassVar[Kind] = Kind.TTS_ADAPTER
    stage_keys: tuple[str, ...] = ()
    model_archs: tuple[str, ...] = ()
    #: lower is tried first during detection
    detect_priority: int = 100


class ConnectorSpec(ExtensionSpec):
    """A connector moving payloads between stage processes: ``ref`` is its constructor."""

    kind: ClassVar[Kind] = Kind.CONNECTOR


class OffloaderSpec(ExtensionSpec):
    """A memory offload strategy: ``ref`` is an :class:`omni_core.offload.Offloader` subclass."""

    kind: ClassVar[Kind] = Kind.OFFLOADER
    #: other strategies or features it cannot be combined with (checked before anything moves)
    incompatible_with: tuple[str, ...] = ()


class CacheBackendSpec(ExtensionSpec):
    """A diffusion step-caching method: ``ref`` is an :class:`omni_core.cache.CacheBackend`
    subclass. A family declares, per backend name, what the backend needs of it."""

    kind: ClassVar[Kind] = Kind.CACHE_BACKEND
    #: features it cannot be combined with (``offload:<name>``, ``attention:<BACKEND>``,
    #: ``family:<name>``, ``platform:<name>``), checked before any hook is installed
    incompatible_with: tuple[str, ...] = ()


class ExecutorSpec(ExtensionSpec):
    """Where a pipeline stage can run besides omni's own ``process`` and ``inprocess``
    (a Ray actor, ...): ``ref`` is an :class:`omni_core.pipeline.executor.StageExecutor` subclass."""

    kind: ClassVar[Kind] = Kind.EXECUTOR


class StageEngineSpec(ExtensionSpec):
    """An engine that runs pipeline stages of other plugins' models (vLLM for autoregressive
    stages, ...): ``ref`` is an :class:`omni_core.pipeline.stage.StageEngine` subclass. A stage
    whose ``kind`` is one of ``stage_kinds`` and whose ``architecture`` is one of
    ``architectures`` may run on it instead of its model's own engine."""

    kind: ClassVar[Kind] = Kind.STAGE_ENGINE
    #: the stage kinds it runs (``ar``, ``generation``, ``diffusion``)
    stage_kinds: tuple[str, ...] = Field(min_length=1)
    #: the checkpoint architectures it runs (a stage's ``architecture``)
    architectures: tuple[str, ...] = Field(min_length=1)
    #: ``module:function(architecture) -> ProbeResult | bool``: can it run that architecture
    #: here (its library installed, the versions right), with the reason when not. Must not
    #: import torch or the engine's library; None: always
    probe: str | None = None

    @field_validator("probe")
    @classmethod
    def _valid_probe(cls, v: str | None) -> str | None:
        return None if v is None else check_ref(v)


class CommandSpec(ExtensionSpec):
    """A CLI command: ``ref`` is a Typer app (a command group) or a plain function."""

    kind: ClassVar[Kind] = Kind.COMMAND
    help: str = ""


SPEC_TYPES: dict[Kind, type[ExtensionSpec]] = {
    cls.kind: cls
    for cls in (
        PlatformSpec,
        AttentionBackendSpec,
        ModelSpec,
        TTSAdapterSpec,
        ConnectorSpec,
        OffloaderSpec,
        ExecutorSpec,
        StageEngineSpec,
        CacheBackendSpec,
        CommandSpec,
    )
}

SpecT = TypeVar("SpecT", bound=ExtensionSpec)


class Registrar(Generic[SpecT]):
    """What a hook receives: collects one plugin's registrations of one kind.

    The core validates every call at once (a bad one raises :class:`RegistrationError`
    naming the plugin) and decides conflicts later, once every plugin has registered.
    """

    spec_type: ClassVar[type[ExtensionSpec]]

    def __init__(self, provider: Provider, declared: tuple[Declared, ...] | None = None) -> None:
        self.provider = provider
        #: this plugin's manifest entries of this kind (``None``: not given, e.g. a registrar a
        #: test builds by hand); what :meth:`register_declared` registers
        self.declared = None if declared is None else tuple(d for d in declared if d.kind is self.kind)
        self.specs: list[SpecT] = []
        #: casefolded name -> spec: the duplicate check is one lookup, so registering n names
        #: costs O(n), not O(n^2) (a plugin may register thousands)
        self._by_name: dict[str, SpecT] = {}

    @property
    def kind(self) -> Kind:
        return self.spec_type.kind

    def offers(self) -> list[Offer]:
        """What this plugin registered, as offers to the conflict policy."""
        p = self.provider
        return [Offer(self.kind, s.name, s.priority, p.plugin, p.distribution, p.version, s) for s in self.specs]

    def register_declared(self) -> list[SpecT]:
        """Register every entry of this kind that the plugin's manifest declares, exactly as
        declared (plugin API 1.1, :mod:`omni_core.declared`). Validated like ``register``."""
        if self.declared is None:
            raise RegistrationError(
                f"plugin {self.provider.plugin!r}: this {self.kind.label} registrar was given no manifest "
                "entries, so register_declared() has nothing to register; register(...) each name instead"
            )
        return [self._add(name=d.name, ref=d.ref, priority=d.priority, **d.fields) for d in self.declared]

    def _add(self, **fields: Any) -> SpecT:
        try:
            spec = self.spec_type(**fields)
        except ValidationError as exc:
            problems = "; ".join(validation_problems(exc, model=self.spec_type))
            raise RegistrationError(
                f"plugin {self.provider.plugin!r} registered an invalid {self.kind.label} "
                f"{fields.get('name')!r}: {problems}",
                kind=self.kind,
                name=fields.get("name"),
                plugin=self.provider.plugin,
            ) from None
        key = spec.name.casefold()
        if key in self._by_name:
            raise RegistrationError(f"plugin {self.provider.plugin!r} registered {self.kind.label} {spec.name!r} twice")
        self._by_name[key] = spec  # type: ignore[assignment]
        self.specs.append(spec)  # type: ignore[arg-type]
        return spec  # type: ignore[return-value]


class PlatformRegistrar(Registrar[PlatformSpec]):
    spec_type = PlatformSpec

    def register(self, name: str, ref: str, *, probe: str, priority: int = 0) -> PlatformSpec:
        return self._add(name=name, ref=ref, probe=probe, priority=priority)


class AttentionBackendRegistrar(Registrar[AttentionBackendSpec]):
    spec_type = AttentionBackendSpec

    def register(
        self, name: str, ref: str, *, device_types: tuple[str, ...] = (), priority: int = 0
    ) -> AttentionBackendSpec:
        return self._add(name=name, ref=ref, device_types=tuple(device_types), priority=priority)


class ModelRegistrar(Registrar[ModelSpec]):
    spec_type = ModelSpec

    def register(
        self,
        name: str,
        ref: str,
        *,
        architectures: tuple[str, ...] = (),
        model_types: tuple[str, ...] = (),
        aliases: tuple[str, ...] = (),
        tasks: tuple[str, ...] = (),
        config_match: dict[str, Any] | None = None,
        priority: int = 0,
    ) -> ModelSpec:
        return self._add(
            name=name,
            ref=ref,
            architectures=tuple(architectures),
            model_types=tuple(model_types),
            aliases=tuple(aliases),
            tasks=tuple(tasks),
            config_match=dict(config_match or {}),
            priority=priority,
        )


class TTSAdapterRegistrar(Registrar[TTSAdapterSpec]):
    spec_type = TTSAdapterSpec

    def register(
        self,
        name: str,
        ref: str,
        *,
        stage_keys: tuple[str, ...] = (),
        model_archs: tuple[str, ...] = (),
        detect_priority: int = 100,
        priority: int = 0,
    ) -> TTSAdapterSpec:
        return self._add(
            name=name,
            ref=ref,
            stage_keys=tuple(stage_keys),
            model_archs=tuple(model_archs),
            detect_priority=detect_priority,
            priority=priority,
        )


class ConnectorRegistrar(Registrar[ConnectorSpec]):
    spec_type = ConnectorSpec

    def register(self, name: str, ref: str, *, priority: int = 0) -> ConnectorSpec:
        return self._add(name=name, ref=ref, priority=priority)


class OffloaderRegistrar(Registrar[OffloaderSpec]):
    spec_type = OffloaderSpec

    def register(
        self, name: str, ref: str, *, incompatible_with: tuple[str, ...] = (), priority: int = 0
    ) -> OffloaderSpec:
        return self._add(name=name, ref=ref, incompatible_with=tuple(incompatible_with), priority=priority)


class ExecutorRegistrar(Registrar[ExecutorSpec]):
    spec_type = ExecutorSpec

    def register(self, name: str, ref: str, *, priority: int = 0) -> ExecutorSpec:
        return self._add(name=name, ref=ref, priority=priority)


class StageEngineRegistrar(Registrar[StageEngineSpec]):
    spec_type = StageEngineSpec

    def register(
        self,
        name: str,
        ref: str,
        *,
        stage_kinds: tuple[str, ...],
        architectures: tuple[str, ...],
        probe: str | None = None,
        priority: int = 0,
    ) -> StageEngineSpec:
        return self._add(
            name=name,
            ref=ref,
            stage_kinds=tuple(stage_kinds),
            architectures=tuple(architectures),
            probe=probe,
            priority=priority,
        )


class CacheBackendRegistrar(Registrar[CacheBackendSpec]):
    spec_type = CacheBackendSpec

    def register(
        self, name: str, ref: str, *, incompatible_with: tuple[str, ...] = (), priority: int = 0
    ) -> CacheBackendSpec:
        return self._add(name=name, ref=ref, incompatible_with=tuple(incompatible_with), priority=priority)


class CommandRegistrar(Registrar[CommandSpec]):
    spec_type = CommandSpec

    def register(self, name: str, ref: str, *, help: str = "", priority: int = 0) -> CommandSpec:
        return self._add(name=name, ref=ref, help=help, priority=priority)


REGISTRAR_TYPES: dict[Kind, type[Registrar[Any]]] = {
    r.spec_type.kind: r
    for r in (
        PlatformRegistrar,
        AttentionBackendRegistrar,
        ModelRegistrar,
        TTSAdapterRegistrar,
        ConnectorRegistrar,
        OffloaderRegistrar,
        ExecutorRegistrar,
        StageEngineRegistrar,
        CacheBackendRegistrar,
        CommandRegistrar,
    )
}


@dataclass
class Registered(Generic[SpecT]):
    """One name in a registry: its spec, who provided it, and the lazy implementation."""

    spec: SpecT
    provider: Provider
    lazy: LazyRef
    rule: str = "only provider"

    @property
    def name(self) -> str:
        return self.spec.name

    def load(self) -> Any:
        """Import and return the implementation (timed; cached after the first call). A class
        gets its identity attributes from the spec (:func:`omni_core.identity.bind`); one that
        states them differently raises :class:`~omni_core.errors.DeclarationMismatchError`."""
        obj = self.lazy.resolve()
        from omni_core.identity import bind

        bind(obj, self.spec.kind, self.spec, self.provider.plugin)
        return obj


@dataclass
class Registry(Generic[SpecT]):
    """The resolved extensions of one kind. Lookups are case-insensitive."""

    kind: Kind
    _entries: dict[str, Registered[SpecT]] = field(default_factory=dict)
    conflicts: dict[str, Conflict] = field(default_factory=dict)
    #: names removed by a per-kind allow/deny list, with the reason
    filtered: dict[str, str] = field(default_factory=dict)
    #: offers that lost to a pin or a higher priority: (loser, rule that decided)
    shadowed: list[tuple[Registered[SpecT], str]] = field(default_factory=list)
    #: casefolded alias -> the entries that declare it, so a lookup never scans every entry
    _aliases: dict[str, list[Registered[SpecT]]] = field(default_factory=dict)

    def add(self, decision: Decision) -> None:
        def entry(offer: Any, rule: str) -> Registered[SpecT]:
            spec = offer.payload
            return Registered(spec, offer.who, LazyRef(spec.ref, owner=offer.plugin), rule)

        key = fold(decision.winner.name)
        previous = self._entries.get(key)
        if previous is not None:  # replaced: forget the old entry's aliases
            for alias in {fold(a) for a in names_of(previous.spec)[1:]}:
                self._aliases[alias] = [e for e in self._aliases.get(alias, []) if e is not previous]
        winner = self._entries[key] = entry(decision.winner, decision.rule)
        for alias in {fold(a) for a in names_of(winner.spec)[1:]}:
            self._aliases.setdefault(alias, []).append(winner)
        self.shadowed.extend((entry(o, decision.rule), decision.rule) for o in decision.shadowed)

    def _by_alias(self, key: str) -> list[Registered[SpecT]]:
        return list(self._aliases.get(key, ()))

    def names(self) -> list[str]:
        return sorted(e.name for e in self._entries.values())

    def __iter__(self) -> Iterator[Registered[SpecT]]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name.casefold() in self._entries or bool(self._by_alias(name.casefold())))

    def why_missing(self, name: str) -> str:
        """A short reason ``name`` cannot be looked up (conflict, filtered, not installed)."""
        key = name.casefold()
        if key in self.conflicts:
            return self.conflicts[key].message()
        if key in self.filtered:
            return f"installed but {self.filtered[key]}"
        return "not installed: no active plugin provides it"

    def get(self, name: str) -> Registered[SpecT]:
        key = name.casefold()
        if key in self._entries:
            return self._entries[key]
        if key in self.conflicts:
            raise ConflictError(self.conflicts[key].message(), kind=self.kind, name=name)
        aliased = self._by_alias(key)
        if len(aliased) == 1:
            return aliased[0]
        if len(aliased) > 1:
            who = " and ".join(f"{e.name} ({e.provider})" for e in aliased)
            raise ConflictError(
                f"{self.kind.label} alias {name!r} is claimed by {who}; use the name itself", kind=self.kind, name=name
            )
        if key in self.filtered:
            raise UnknownExtensionError(
                f"{self.kind.label} {name!r} is installed but {self.filtered[key]}", kind=self.kind, name=name
            )
        known = ", ".join(self.names()) or "none"
        raise UnknownExtensionError(
            f"unknown {self.kind.label} {name!r}; available: {known}. "
            "`omni plugins list --all` shows every installed plugin and why any is inactive.",
            kind=self.kind,
            name=name,
        )

    def load(self, name: str) -> Any:
        return self.get(name).load()
