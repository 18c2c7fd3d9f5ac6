"""Loading plugins: import each one in isolation, call its hooks one at a time, check what it
registered against its manifest, then resolve every registry with the one conflict policy.

A plugin that fails anywhere is skipped and recorded with the reason; the rest keep working.
With ``OMNI_STRICT_PLUGINS=1`` every such problem raises :class:`PluginLoadError` instead.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import sys
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from omni_core import breadcrumb, hookspecs
from omni_core.breadcrumb import Crash
from omni_core.config import Settings, current_settings
from omni_core.conflicts import Conflict, Offer, Resolution, resolve
from omni_core.declared import DECLARED_MARK
from omni_core.discovery import HARDWARE_KINDS, PluginRecord, Status, api_compatible, discover, extension_filtered
from omni_core.errors import PluginLoadError, RegistrationError
from omni_core.guard import contained, describe
from omni_core.kinds import Kind
from omni_core.lazy import IMPORT_TIMINGS
from omni_core.manifest import Declared, Manifest
from omni_core.registry import (
    REGISTRAR_TYPES,
    SPEC_TYPES,
    AttentionBackendSpec,
    CacheBackendSpec,
    CommandSpec,
    ConnectorSpec,
    ExecutorSpec,
    ExtensionSpec,
    ModelSpec,
    OffloaderSpec,
    PlatformSpec,
    Registrar,
    Registry,
    StageEngineSpec,
    TTSAdapterSpec,
)
from omni_core.runtime_config import OmniConfig
from omni_core.state import HealthStore
from omni_core.text import shell_arg

_HOOK_KIND = {kind.hook_name: kind for kind in Kind}

#: modules whose import while a plugin registers means it imported something heavy or touched a
#: driver: torch and friends, vendor SDKs, kernels and web frameworks. ``omni doctor`` reports
#: them for each plugin, and the conformance kit (``check_import_light``) checks the same list.
HEAVY_MODULES = (
    "torch",
    "numpy",
    "vllm",
    "diffusers",
    "transformers",
    "tensorflow",
    "jax",
    "pynvml",
    "amdsmi",
    "torch_npu",
    "intel_extension_for_pytorch",
    "flash_attn",
    "flashinfer",
    "fastapi",
    "starlette",
    "uvicorn",
    "aiohttp",
    "flask",
)
#: the fix for a heavy import at registration, shared by doctor and the conformance kit
HEAVY_IMPORT_FIX = (
    "import it lazily inside the function that uses it, or register a lazy 'module:attr' reference "
    "(the hook module must import nothing heavy)"
)


def _heavy_loaded() -> set[str]:
    return {m for m in HEAVY_MODULES if m in sys.modules}


@dataclass
class PluginSet:
    """The loaded plugins of this process: their records and the resolved registries."""

    settings: Settings
    records: list[PluginRecord]
    registries: dict[Kind, Registry[Any]]
    conflicts: list[Conflict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    manager: pluggy.PluginManager | None = None
    #: earlier runs that ended while loading a plugin (see :mod:`omni_core.breadcrumb`)
    crashes: list[Crash] = field(default_factory=list)

    def registry(self, kind: Kind) -> Registry[Any]:
        return self.registries[kind]

    @property
    def platforms(self) -> Registry[PlatformSpec]:
        return self.registries[Kind.PLATFORM]

    @property
    def attention_backends(self) -> Registry[AttentionBackendSpec]:
        return self.registries[Kind.ATTENTION_BACKEND]

    @property
    def models(self) -> Registry[ModelSpec]:
        return self.registries[Kind.MODEL]

    @property
    def tts_adapters(self) -> Registry[TTSAdapterSpec]:
        return self.registries[Kind.TTS_ADAPTER]

    @property
    def connectors(self) -> Registry[ConnectorSpec]:
        return self.registries[Kind.CONNECTOR]

    @property
    def offloaders(self) -> Registry[OffloaderSpec]:
        return self.registries[Kind.OFFLOADER]

    @property
    def executors(self) -> Registry[ExecutorSpec]:
        return self.registries[Kind.EXECUTOR]

    @property
    def stage_engines(self) -> Registry[StageEngineSpec]:
        return self.registries[Kind.STAGE_ENGINE]

    @property
    def cache_backends(self) -> Registry[CacheBackendSpec]:
        return self.registries[Kind.CACHE_BACKEND]

    @property
    def commands(self) -> Registry[CommandSpec]:
        return self.registries[Kind.COMMAND]

    def record(self, name: str) -> PluginRecord:
        for r in self.records:
            if r.name.casefold() == name.casefold():
                return r
        raise KeyError(name)

    def problems(self) -> list[str]:
        """Every problem, one line each (disabled plugins are not problems)."""
        found = [r.problem() for r in self.records if r.status.is_problem]
        found += [c.message() for c in self.conflicts]
        if self.settings.strict:
            found += [f"plugin {r.name!r}: {w}" for r in self.records for w in r.warnings if "unknown hook" in w]
        return found


def load_plugins(settings: Settings | None = None) -> PluginSet:
    """Discover, import and register every enabled plugin. Never raises for a broken plugin
    unless strict mode is on."""
    settings = settings if settings is not None else current_settings()  # env + the CLI's flags
    crashes = breadcrumb.collect_stale(settings.cache_dir)
    records = discover(settings)
    for crash in crashes:
        for record in records:
            if (record.name, record.distribution, record.version) == (crash.plugin, crash.distribution, crash.version):
                record.warnings.append(crash.message())
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)

    offers: list[Offer] = []
    try:
        for record in records:
            if record.status is Status.OK:
                offers += _load_one(record, manager, settings.cache_dir)

        config = OmniConfig(
            strict=settings.strict,
            safe_mode=settings.safe_mode,
            platform=settings.platform,
            plugins=tuple(r.name for r in records if r.status is Status.OK),
        )
        _configure(records, manager, config, settings.cache_dir)
    finally:
        # also on a Ctrl-C: only a process that died mid-plugin may leave its breadcrumb
        breadcrumb.clear(settings.cache_dir)
    live = {r.name for r in records if r.status is Status.OK}
    offers = [o for o in offers if o.plugin in live]
    registries, resolution = build_registries(offers, settings)

    plugin_set = PluginSet(
        settings=settings,
        records=records,
        registries=registries,
        conflicts=resolution.conflicts,
        notes=resolution.notes,
        manager=manager,
        crashes=crashes,
    )
    _remember(plugin_set)
    if settings.strict and plugin_set.problems():
        raise PluginLoadError(plugin_set.problems())
    return plugin_set


def build_registries(
    offers: Iterable[Offer], settings: Settings | None = None
) -> tuple[dict[Kind, Registry[Any]], Resolution]:
    """One registry per kind from what plugins offered: the per-kind filters of ``settings``
    (``OMNI_<KIND>S``, ``OMNI_DISABLE_<KIND>S``), then the conflict policy with its pins.

    The one way registries are built: :func:`load_plugins` uses it, and so do tests and the
    conformance kit (``Registrar.offers()`` turns registrations into offers; see
    :func:`plugin_set_of` for a whole :class:`PluginSet`)."""
    settings = settings if settings is not None else Settings()
    registries: dict[Kind, Registry[Any]] = {kind: Registry(kind) for kind in Kind}
    kept: list[Offer] = []
    for offer in offers:
        why = extension_filtered(offer.kind, offer.name, settings)
        if why is None:
            kept.append(offer)
        else:
            registries[offer.kind].filtered[offer.name.casefold()] = why
    resolution = resolve(kept, settings.pins)
    for (kind, _), decision in resolution.decisions.items():
        registries[kind].add(decision)
    for conflict in resolution.conflicts:
        registries[conflict.kind].conflicts[conflict.name.casefold()] = conflict
    return registries, resolution


def plugin_set_of(
    offers: Iterable[Offer], settings: Settings | None = None, records: list[PluginRecord] | None = None
) -> PluginSet:
    """A :class:`PluginSet` built from offers, without discovering or importing anything: for
    tests and tools that register by hand (``registrar.register(...)``, then ``registrar.offers()``)."""
    settings = settings if settings is not None else Settings()
    registries, resolution = build_registries(offers, settings)
    return PluginSet(
        settings=settings,
        records=list(records or []),
        registries=registries,
        conflicts=resolution.conflicts,
        notes=resolution.notes,
    )


def _load_one(record: PluginRecord, manager: pluggy.PluginManager, cache_dir: Path) -> list[Offer]:
    """Import one plugin and call its registration hooks; on any failure record it and
    return nothing, leaving no trace of the plugin in the manager.

    Every piece of plugin code runs inside :func:`~omni_core.guard.contained` (so its
    ``SystemExit`` or ``KeyboardInterrupt`` is its failure, not omni's end) and after a
    breadcrumb naming it (so an ``os._exit`` in it is named by the next command)."""
    heavy_before = _heavy_loaded()
    breadcrumb.mark(cache_dir, record.name, record.distribution, record.version, "import")
    start = time.perf_counter()
    try:
        with contained():
            module = importlib.import_module(record.module)
    except Exception as exc:
        record.fail(
            Status.IMPORT_FAILED,
            f"importing {record.module!r} raised {describe(exc)}",
            f"install its missing dependencies, upgrade it, or `omni plugins disable {shell_arg(record.name)}`",
        )
        return []
    record.loaded = True
    record.import_seconds = time.perf_counter() - start
    try:
        with contained():  # pluggy reads the module's attributes: a module __getattr__ is plugin code
            manager.register(module, name=record.name)
    except Exception as exc:
        with contextlib.suppress(Exception):
            if manager.is_registered(module):
                manager.unregister(module)
        if isinstance(exc, pluggy.PluginValidationError | ValueError):
            reason = f"invalid hook implementation: {exc}"
            fix = "compare the hook names and arguments with omni_core.hookspecs"
        else:
            reason = f"registering its hooks raised {describe(exc)}"
            fix = f"fix the plugin or `omni plugins disable {shell_arg(record.name)}`"
        record.fail(Status.HOOK_FAILED, reason, fix)
        return []
    for caller in manager.get_hookcallers(module) or []:
        if caller.spec is None:
            record.warnings.append(f"unknown hook {caller.name!r} is never called (typo?)")

    assert record.manifest is not None
    provider = record.who
    registrars: dict[Kind, Registrar[Any]] = {}
    uses_declared = False
    for hook_name in hookspecs.REGISTRATION_HOOKS:
        kind = _HOOK_KIND[hook_name]
        # the plugin's own declared entries: what omni_core.declared's hooks register
        registrar = registrars[kind] = REGISTRAR_TYPES[kind](provider, record.manifest.provides)
        for impl in getattr(manager.hook, hook_name).get_hookimpls():
            if impl.plugin is not module:
                continue
            uses_declared = uses_declared or bool(getattr(impl.function, DECLARED_MARK, False))
            breadcrumb.mark(cache_dir, record.name, record.distribution, record.version, hook_name)
            try:
                with contained():
                    _call(impl, {"registry": registrar})
            except Exception as exc:
                manager.unregister(module)
                where = "" if isinstance(exc, RegistrationError) else f"{hook_name} raised "
                record.fail(
                    Status.HOOK_FAILED,
                    f"{where}{describe(exc)}" if where else str(exc),
                    f"fix the plugin or `omni plugins disable {shell_arg(record.name)}`; "
                    f"`omni plugins show {shell_arg(record.name)}` shows the traceback",
                )
                record.traceback = traceback.format_exc(limit=-3).strip()
                return []

    if uses_declared and _admits_api_1_0(record.manifest.omni_api):
        record.warnings.append(
            f"its hooks come from omni_core.declared (plugin API 1.1), but omni_api "
            f"{record.manifest.omni_api!r} admits API 1.0, whose cores cannot import them; "
            'declare omni_api = ">=1.1,<2"'
        )
    for kind, since in KINDS_SINCE.items():
        if record.manifest.of_kind(kind) and _admits_api_below(record.manifest.omni_api, since):
            record.warnings.append(
                f"it declares {kind.label} entries, a kind of plugin API {since}, but omni_api "
                f"{record.manifest.omni_api!r} admits older cores, which do not know the kind; "
                f'declare omni_api = ">={since},<2"'
            )

    heavy = sorted(_heavy_loaded() - heavy_before)
    if heavy:
        record.heavy_imports = heavy
        record.warnings.append(f"imports {', '.join(heavy)} while it registers; {HEAVY_IMPORT_FIX}")

    mismatch = compare_with_manifest(record.manifest, registrars)
    if mismatch:
        manager.unregister(module)
        record.fail(
            Status.METADATA_MISMATCH,
            "what the hooks registered differs from omni_plugin.toml: " + "; ".join(mismatch),
            "make omni_plugin.toml and the hooks agree (the conformance kit shows the diff)",
        )
        return []

    return [
        offer
        for kind, registrar in registrars.items()
        if not record.hardware_only or kind in HARDWARE_KINDS
        for offer in registrar.offers()
    ]


#: kinds added after plugin API 1.0, with the version that added them
KINDS_SINCE: dict[Kind, str] = {Kind.EXECUTOR: "1.2", Kind.STAGE_ENGINE: "1.3"}


def _admits_api_below(omni_api: str, version: str) -> bool:
    """Whether ``omni_api`` admits a minor version of the same major below ``version``."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return any(_admits(omni_api, f"{major}.{m}") for m in range(minor))


def _admits(omni_api: str, version: str) -> bool:
    try:
        return api_compatible(omni_api, version)
    except Exception:  # a malformed range never gets this far (discovery refuses it)
        return False


def _admits_api_1_0(omni_api: str) -> bool:
    try:
        return api_compatible(omni_api, "1.0")
    except Exception:  # a malformed range never gets this far (discovery refuses it)
        return False


def _call(impl: pluggy.HookImpl, kwargs: dict[str, Any]) -> Any:
    """Call one implementation with the arguments it asked for (pluggy's opt-in arguments)."""
    return impl.function(*[kwargs[name] for name in impl.argnames])


def compare_with_manifest(manifest: Manifest, registrars: dict[Kind, Registrar[Any]]) -> list[str]:
    """Differences between declared and registered extensions; empty when they agree."""
    declared: dict[tuple[Kind, str], Declared] = {d.key: d for d in manifest.provides}
    registered: dict[tuple[Kind, str], ExtensionSpec] = {
        (kind, spec.name.casefold()): spec for kind, r in registrars.items() for spec in r.specs
    }
    problems = []
    for key in sorted(declared.keys() - registered.keys(), key=str):
        problems.append(f"{key[0].label} {declared[key].name!r} is declared but not registered")
    for key in sorted(registered.keys() - declared.keys(), key=str):
        problems.append(f"{key[0].label} {registered[key].name!r} is registered but not declared")
    for key in sorted(declared.keys() & registered.keys(), key=str):
        d, spec = declared[key], registered[key]
        try:
            expected = SPEC_TYPES[d.kind](name=spec.name, ref=d.ref, priority=d.priority, **d.fields)
        except Exception as exc:
            problems.append(f"{d.kind.label} {d.name!r}: declared fields are invalid ({exc})")
            continue
        if expected != spec:
            want, got = expected.model_dump(), spec.model_dump()
            diffs = [f"{f}: declared {want[f]!r}, registered {got[f]!r}" for f in want if want[f] != got[f]]
            problems.append(f"{d.kind.label} {d.name!r}: " + ", ".join(diffs))
    return problems


def _configure(records: list[PluginRecord], manager: pluggy.PluginManager, config: OmniConfig, cache_dir: Path) -> None:
    by_name = {r.name: r for r in records}
    for impl in manager.hook.omni_configure.get_hookimpls():
        record = by_name.get(impl.plugin_name)
        if record is not None:
            breadcrumb.mark(cache_dir, record.name, record.distribution, record.version, "omni_configure")
        try:
            with contained():
                _call(impl, {"config": config})
        except Exception as exc:
            if record is None:
                raise
            manager.unregister(impl.plugin)
            record.fail(
                Status.HOOK_FAILED,
                f"omni_configure raised {describe(exc)}",
                f"fix the plugin or `omni plugins disable {shell_arg(record.name)}`",
            )


def _remember(plugin_set: PluginSet) -> None:
    """Persist each plugin's load outcome, and at exit the import timings measured."""
    store = HealthStore(plugin_set.settings.cache_dir)
    entries: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in plugin_set.records:
        if r.status is Status.DISABLED or (r.status is Status.OK and not r.loaded):
            continue
        imports = {r.module: r.import_seconds} if r.import_seconds is not None else {}
        entries[(r.distribution, r.version, r.name)] = {
            "status": r.status.value,
            "reason": r.reason,
            "fix": r.fix,
            # remembered so `omni plugins show` can print it without importing the plugin
            "traceback": r.traceback,
            "imports": imports,
        }
    store.update(entries)

    for registry in plugin_set.registries.values():
        for entry in list(registry) + [e for e, _ in registry.shadowed]:
            p = entry.provider
            _TIMING_OWNERS[entry.spec.ref] = (store.path, (p.distribution, p.version, p.plugin))
    global _TIMINGS_HOOKED
    if not _TIMINGS_HOOKED:
        atexit.register(_save_timings)
        _TIMINGS_HOOKED = True


#: ref -> (health file, plugin key), so imports made after loading are credited at exit
_TIMING_OWNERS: dict[str, tuple[Path, tuple[str, str, str]]] = {}
_TIMINGS_HOOKED = False


def _save_timings() -> None:
    per_store: dict[Path, dict[tuple[str, str, str], dict[str, Any]]] = {}
    for ref, seconds in IMPORT_TIMINGS.items():
        if ref in _TIMING_OWNERS:
            path, key = _TIMING_OWNERS[ref]
            per_store.setdefault(path, {}).setdefault(key, {"imports": {}})["imports"][ref] = seconds
    for path, entries in per_store.items():
        HealthStore(path.parent).update(entries)


_CURRENT: PluginSet | None = None


def get_plugins() -> PluginSet:
    """The process-wide plugin set, loaded on first call (idempotent)."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = load_plugins()
    return _CURRENT


def reset_plugins() -> None:
    """Forget the process-wide plugin set (tests, or after installing a plugin)."""
    global _CURRENT
    _CURRENT = None
