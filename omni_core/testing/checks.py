"""The conformance checks as plain functions. Each returns a list of problems (empty = pass)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omni_core.config import Settings
from omni_core.discovery import PluginRecord, Status, discover
from omni_core.errors import LazyImportError, OmniError
from omni_core.kinds import Kind
from omni_core.lazy import LazyRef
from omni_core.plugins import HEAVY_IMPORT_FIX
from omni_core.plugins import HEAVY_MODULES as _HEAVY_MODULES
from omni_core.registry import Registered

#: modules whose presence after discovery means a plugin imported something heavy or touched
#: a driver; one list, shared with ``omni doctor`` (which reports the same at every load)
HEAVY_MODULES = _HEAVY_MODULES


def isolated_settings(only: str | None = None) -> Settings:
    """Settings from the environment, narrowed to one plugin when ``only`` is given."""
    settings = Settings.from_env()
    if only is not None:
        settings = dataclasses.replace(settings, allow_plugins=frozenset({only.casefold()}), strict=False)
    return dataclasses.replace(settings, strict=False)


def _record(name: str) -> tuple[PluginRecord | None, list[str]]:
    for record in discover(isolated_settings()):
        if record.name.casefold() == name.casefold():
            return record, []
    return None, [f"plugin {name!r} is not installed in this environment; run `pip install -e .` first"]


def check_manifest(name: str) -> list[str]:
    record, problems = _record(name)
    if record is None:
        return problems
    if record.status in (Status.INVALID_MANIFEST, Status.INCOMPATIBLE, Status.DUPLICATE_NAME):
        return [f"{record.status}: {record.reason} (fix: {record.fix})"]
    if record.manifest is not None and not record.manifest.provides:
        return ["the manifest declares nothing: add at least one [[<kind>]] table"]
    return []


def _load_only(name: str) -> tuple[Any, PluginRecord | None, list[str]]:
    from omni_core.plugins import load_plugins

    plugin_set = load_plugins(isolated_settings(name))
    for record in plugin_set.records:
        if record.name.casefold() == name.casefold():
            return plugin_set, record, []
    return plugin_set, None, [f"plugin {name!r} is not installed in this environment"]


def _entries_of(plugin_set: Any, name: str) -> list[Registered[Any]]:
    return [
        entry
        for registry in plugin_set.registries.values()
        for entry in list(registry) + [e for e, _ in registry.shadowed]
        if entry.provider.plugin.casefold() == name.casefold()
    ]


def check_registration(name: str) -> list[str]:
    _, record, problems = _load_only(name)
    if record is None:
        return problems
    if record.status is not Status.OK:
        details = [record.traceback] if record.traceback else []
        return [f"{record.status}: {record.reason} (fix: {record.fix})", *details]
    # an unknown hook, or declared-style hooks under an omni_api range that admits API 1.0
    return [
        f"plugin {name!r}: {w}" for w in record.warnings if w.startswith("unknown hook") or "omni_core.declared" in w
    ]


def _probes_of(manifest: Any) -> list[str]:
    """The probes a manifest declares (a platform's, a stage engine's): references like ``ref``."""
    return [str(d.fields["probe"]) for d in manifest.provides if d.fields.get("probe")]


def check_lazy_refs(name: str) -> list[str]:
    record, problems = _record(name)
    if record is None or record.manifest is None:
        return problems or [f"{name}: no manifest"]
    refs = [d.ref for d in record.manifest.provides]
    refs += _probes_of(record.manifest)
    for ref in refs:
        try:
            LazyRef(ref, owner=name).resolve()
        except LazyImportError as exc:
            problems.append(str(exc))
    return problems


_IMPORT_PROBE = """
import json, sys
from omni_core.platforms import ProbeResult
from omni_core.plugins import load_plugins
from omni_core.lazy import LazyRef
plugin_set = load_plugins()
record = [r for r in plugin_set.records if r.name.casefold() == sys.argv[1].casefold()][0]
probe_errors = []
for entry in plugin_set.platforms:
    if entry.provider.plugin == record.name:
        try:
            LazyRef(entry.spec.probe).resolve()()
        except Exception as exc:
            probe_errors.append(f"probe of {entry.name!r} raised {type(exc).__name__}: {exc}")
# planning a pipeline imports a stage engine's class (its option_problems) and runs its probe,
# in the orchestrator's process: the same here
planned = []
for entry in plugin_set.stage_engines:
    if entry.provider.plugin == record.name:
        try:
            LazyRef(entry.spec.ref).resolve()
            planned.append(entry.spec.ref.partition(":")[0])
            for architecture in entry.spec.architectures if entry.spec.probe else ():
                LazyRef(entry.spec.probe).resolve()(architecture)
        except Exception as exc:
            probe_errors.append(f"stage engine {entry.name!r}: importing it or its probe raised "
                                f"{type(exc).__name__}: {exc}")
print(json.dumps({"status": record.status.value, "reason": record.reason,
                  "modules": sorted(sys.modules), "probe_errors": probe_errors, "planned": planned}))
"""


def check_import_light(name: str) -> list[str]:
    """Discovery, registration and platform probes must import nothing heavy, and none of the
    modules the plugin's references point at (they are imported only when used). A stage
    engine's module is imported, and its probe run, as planning a pipeline does: that must not
    import anything heavy either."""
    record, problems = _record(name)
    if record is None or record.manifest is None:
        return problems
    env = dict(os.environ, OMNI_PLUGINS=name, OMNI_STRICT_PLUGINS="0")
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, name], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        return [f"loading the plugin in a fresh interpreter failed:\n{proc.stderr[-2000:]}"]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    modules = set(result["modules"])
    problems += result["probe_errors"]
    heavy = sorted(m for m in HEAVY_MODULES if m in modules)
    if heavy:
        problems.append(
            f"discovering and registering {name!r} (and running its probes, and importing its stage engines "
            f"as planning a pipeline does) imported {heavy}; {HEAVY_IMPORT_FIX}"
        )
    hook_module = record.module
    hook_parents = {hook_module.rsplit(".", i)[0] for i in range(hook_module.count(".") + 1)}
    probe_modules = {probe.partition(":")[0] for probe in _probes_of(record.manifest)}
    probe_modules |= set(result["planned"])  # imported by planning, on purpose
    for declared in record.manifest.provides:
        module = declared.ref.partition(":")[0]
        if module in modules and module not in hook_parents and module not in probe_modules:
            problems.append(
                f"{declared.kind.label} {declared.name!r}: {module!r} was imported during registration; "
                "it must stay lazy (registered as a string reference, imported on first use)"
            )
    return problems


CapabilityCheck = Callable[[Registered[Any], Any], list[str]]


def _check_platform(entry: Registered[Any], obj: Any) -> list[str]:
    from omni_core.platforms import Platform

    if not (isinstance(obj, type) and issubclass(obj, Platform)):
        return [f"platform {entry.name!r}: {entry.spec.ref} is not a subclass of omni_core.platforms.Platform"]
    problems = []
    if getattr(obj, "__abstractmethods__", None):
        problems.append(f"platform {entry.name!r} leaves {sorted(obj.__abstractmethods__)} unimplemented")
        return problems
    if getattr(obj, "name", None) != entry.name:
        problems.append(f"platform class name attribute {getattr(obj, 'name', None)!r} != registered {entry.name!r}")
    if not isinstance(getattr(obj, "device_type", None), str):
        problems.append(f"platform {entry.name!r}: device_type must be a string")
    # the probe runs as omni runs it: under the time bound, its exits contained
    from omni_core.guard import describe
    from omni_core.platforms import probe_timeout, run_probe

    try:
        claims = run_probe(entry, probe_timeout()).claims
    except Exception as exc:
        return [*problems, f"platform {entry.name!r}: the probe failed: {describe(exc)}"]
    if claims and not problems:  # the hardware is here, so the platform must answer about it
        platform = obj()
        if platform.device_count() < 1:
            problems.append(f"platform {entry.name!r} claims the machine but reports no devices")
        dtypes = platform.supported_dtypes()
        if not dtypes or not all(isinstance(d, str) for d in dtypes):
            problems.append(f"platform {entry.name!r}: supported_dtypes() must be a non-empty tuple of names")
        chain = platform.default_attention_chain()
        if not chain or chain[-1] != "TORCH_SDPA":
            problems.append(f"platform {entry.name!r}: the default attention chain must end with TORCH_SDPA")
    return problems


def _check_attention_backend(entry: Registered[Any], obj: Any) -> list[str]:
    from omni_core.attention import AttentionMetadata, contract_problems

    problems = [f"attention backend {entry.name!r}: {p}" for p in contract_problems(obj)]
    if problems:
        return problems
    # name and device_types: checked and set from the registration first (_with_identity)
    if obj.device_types and "cpu" not in obj.device_types:
        return problems  # numerics are checked on the hardware it declares (vendor test suites)
    if importlib.util.find_spec("torch") is None:
        return problems
    from omni_core.platforms import Platform

    class _Cpu(Platform):  # availability asks the platform; here that is the CPU
        name = "cpu"
        device_type = "cpu"

        def device_count(self) -> int:
            return 1

        def device_name(self, index: int = 0) -> str:
            return "cpu"

        def memory_info(self, index: int = 0) -> Any:
            raise NotImplementedError("not needed for availability")

        def supported_dtypes(self) -> tuple[str, ...]:
            return ("float32",)

    availability = obj.availability(_Cpu())
    if not availability.ok:
        return problems
    import torch

    from omni_core.attention.reference import reference_attention

    gen = torch.Generator().manual_seed(0)
    head = obj.supported_head_sizes[0] if obj.supported_head_sizes else 64
    # (label, query heads, kv heads, causal, mask kind)
    cases: list[tuple[str, int, int, bool, str | None]] = [("plain", 4, 4, False, None)]
    if obj.supports_causal:
        cases.append(("causal", 4, 4, True, None))
    if obj.supports_gqa:
        cases.append(("gqa", 4, 2, False, None))
    if obj.supports_mask:
        cases += [("mask", 4, 4, False, "bool"), ("additive mask", 4, 4, False, "additive")]
        cases.append(("fully masked rows", 4, 4, False, "empty rows"))
    for label, hq, hkv, causal, mask_kind in cases:
        q = torch.randn(2, 7, hq, head, generator=gen)
        k = torch.randn(2, 9, hkv, head, generator=gen)
        v = torch.randn(2, 9, hkv, head, generator=gen)
        mask = _conformance_mask(torch, gen, mask_kind)
        impl = obj.create(hq, head, None, causal, hkv, prefix="conformance")
        out = impl.forward(q, k, v, AttentionMetadata(attn_mask=mask))
        ref = reference_attention(q, k, v, scale=head**-0.5, causal=causal, mask=mask)
        if tuple(out.shape) != tuple(q.shape):
            problems.append(f"{entry.name} {label}: output shape {tuple(out.shape)} != query shape {tuple(q.shape)}")
            continue
        err = (out.double() - ref).abs().max().item()
        if not err <= 1e-4:  # NaN fails too (a fully masked row must give zeros, not NaN)
            problems.append(f"{entry.name} {label}: max abs error {err:.2e} against the reference (float32, tol 1e-4)")
    return problems


def _conformance_mask(torch: Any, gen: Any, kind: str | None) -> Any:
    """The masks the kit checks a mask-taking backend with, all ``(2, 1, 7, 9)``."""
    if kind is None:
        return None
    keep = torch.rand(2, 1, 7, 9, generator=gen) > 0.3
    if kind == "empty rows":
        keep[..., 0] = True
        keep[0, :, 2] = False  # query 2 of batch 0 sees no key: the reference gives zeros
        return keep
    keep[..., 0] = True  # every query keeps one key
    if kind == "bool":
        return keep
    # additive: a real-valued bias where kept, -inf where masked
    bias = torch.randn(2, 1, 7, 9, generator=gen)
    return bias.masked_fill(~keep, float("-inf"))


def _check_tts_adapter(entry: Registered[Any], obj: Any) -> list[str]:
    from omni_core.speech.adapter import TTSAdapter

    label = f"tts adapter {entry.name!r}"
    if not (isinstance(obj, type) and issubclass(obj, TTSAdapter)):
        return [f"{label}: {entry.spec.ref} is not a subclass of omni_core.speech.TTSAdapter"]
    problems = []
    if getattr(obj, "__abstractmethods__", None):
        problems.append(f"{label} leaves {sorted(obj.__abstractmethods__)} unimplemented")
    # name, stage_keys, model_archs, detect_priority: checked and set first (_with_identity)
    if obj.backend not in ("ar", "non_ar"):
        problems.append(f"{label}: backend must be 'ar' or 'non_ar', not {obj.backend!r}")
    return problems + _check_offered_models(label, obj)


def _check_offered_models(label: str, cls: Any) -> list[str]:
    """The optional detection hooks answer in their types, and what they offer can be found:
    each installed model's path is claimed by the adapter's own ``identify`` (or is a
    checkpoint directory), and the offered default voice is one of the installed models."""
    from omni_core.speech.adapter import ModelClaim, ReadyModel

    problems = []
    try:
        installed = cls.installed_models()
        offered = cls.ready_model()
    except Exception as exc:
        return [f"{label}: installed_models() or ready_model() raised {type(exc).__name__}: {exc}"]
    if not isinstance(installed, Mapping):
        return [f"{label}: installed_models() returned {type(installed).__name__}, not a mapping of name to path"]
    for name, path in installed.items():
        if Path(path).is_dir() and (Path(path) / "config.json").is_file():
            continue
        try:
            claim = cls.identify(Path(path))
        except Exception as exc:
            problems.append(f"{label}: identify() raised on its installed model {name!r} ({path}): {exc}")
            continue
        if not isinstance(claim, ModelClaim):
            problems.append(f"{label}: identify() does not claim its installed model {name!r} ({path})")
    if offered is not None:
        names = {str(n).casefold() for n in installed}
        if not isinstance(offered, ReadyModel):
            problems.append(f"{label}: ready_model() returned {type(offered).__name__}, not a ReadyModel or None")
        elif offered.name.casefold() not in names:
            problems.append(
                f"{label}: ready_model() offers {offered.name!r}, which installed_models() does not list; "
                "offer one of the installed models, by a name --model finds"
            )
    return problems


def _check_cache_backend(entry: Registered[Any], obj: Any) -> list[str]:
    """The reference is a complete :class:`omni_core.cache.CacheBackend`."""
    from omni_core.cache import cache_backend_contract_problems

    return [f"cache backend {entry.name!r}: {p}" for p in cache_backend_contract_problems(obj)]


def _check_callable(entry: Registered[Any], obj: Any) -> list[str]:
    if not callable(obj):
        return [f"{entry.spec.kind.label} {entry.name!r}: {entry.spec.ref} is not a class or callable"]
    return []


def _check_connector(entry: Registered[Any], obj: Any) -> list[str]:
    """The reference is a complete :class:`omni_core.pipeline.connector.Connector` with a
    :class:`~omni_core.pipeline.connector.ConnectorOptions` ``options_type``, and payloads
    really travel through it: between two instances of one run in this process and, unless it
    is ``same_process_only``, to and from a spawned process (:mod:`omni_core.testing.connectors`
    says what is checked)."""
    from omni_core.testing.connectors import connector_problems

    # its name: checked and set from the registration first (_with_identity)
    return connector_problems(entry.name, entry.spec.ref, obj)


#: the methods of an image or video family (:class:`omni_core.generation.model.GenerationModel`)
GENERATION_MODEL_METHODS = ("open", "plan", "make_tiny")


def _check_model(entry: Registered[Any], obj: Any) -> list[str]:
    """Every model's reference is callable. An image or video family (one registered for such a
    task, or one with a ``profile``) also follows :class:`~omni_core.generation.model.GenerationModel`:
    a :class:`~omni_core.generation.request.GenerationProfile` whose task it is registered for, and
    ``open``, ``plan`` and ``make_tiny`` callables. Nothing is loaded or called."""
    from typing import get_args

    from omni_core.generation.request import GenerationProfile, Task

    problems = _check_callable(entry, obj)
    generation_tasks = set(get_args(Task))
    registered = tuple(entry.spec.tasks)
    if problems or not (generation_tasks & set(registered) or hasattr(obj, "profile")):
        return problems
    label = f"model {entry.name!r}"
    profile = getattr(obj, "profile", None)
    if not isinstance(profile, GenerationProfile):
        problems.append(
            f"{label}: {entry.spec.ref} is an image or video family, so its 'profile' must be an "
            f"omni_core.generation.request.GenerationProfile, not {type(profile).__name__}"
        )
    # the profile's task among the registered tasks: checked first (_with_identity)
    missing = [m for m in GENERATION_MODEL_METHODS if not callable(getattr(obj, m, None))]
    if missing:
        problems.append(
            f"{label}: {entry.spec.ref} lacks {', '.join(missing)} (an image or video family implements "
            "open, plan and make_tiny; see omni_core.generation.model.GenerationModel)"
        )
    return problems


def _check_offloader(entry: Registered[Any], obj: Any) -> list[str]:
    """The reference is a complete :class:`omni_core.offload.Offloader` named as registered."""
    from omni_core.offload import offloader_contract_problems

    label = f"offloader {entry.name!r}"
    # its name: checked and set from the registration first (_with_identity)
    return [f"{label}: {p}" for p in offloader_contract_problems(obj)]


def _check_executor(entry: Registered[Any], obj: Any) -> list[str]:
    """The reference is a complete :class:`omni_core.pipeline.executor.StageExecutor` whose option
    types build from no options, under a name that is not one of the core's own placements, and
    the kit's two-stage pipeline really runs on it: a request, a killed stage restarted, a clean
    close (:mod:`omni_core.testing.executors` says what is checked)."""
    from omni_core.testing.executors import executor_problems

    # its name: checked and set from the registration first (_with_identity)
    return executor_problems(entry.name, entry.spec.ref, obj)


def _check_stage_engine(entry: Registered[Any], obj: Any) -> list[str]:
    """The reference is a :class:`omni_core.pipeline.stage.StageEngine` subclass with ``run``
    implemented; an ``option_problems`` it has is a classmethod that answers ``{}`` with a
    list; its probe, given each architecture it claims, answers a ProbeResult or a bool (never
    raises). Running it needs its library and weights: the plugin's own tests do that."""
    from omni_core.pipeline.engines import probe_engine
    from omni_core.pipeline.stage import StageEngine

    label = f"stage engine {entry.name!r}"
    if not (isinstance(obj, type) and issubclass(obj, StageEngine)):
        return [f"{label}: {entry.spec.ref} is not a StageEngine subclass (omni_core.pipeline.stage.StageEngine)"]
    problems = []
    if getattr(obj, "__abstractmethods__", None):
        problems.append(f"{label}: {obj.__name__} leaves {sorted(obj.__abstractmethods__)} unimplemented")
    check = getattr(obj, "option_problems", None)
    if check is not None:
        try:
            answer = check({})
        except Exception as exc:
            problems.append(f"{label}: option_problems({{}}) raised {type(exc).__name__}: {exc}")
        else:
            if not isinstance(answer, list) or not all(isinstance(p, str) for p in answer):
                problems.append(f"{label}: option_problems must return a list of str, got {answer!r}")
    for architecture in entry.spec.architectures:
        _, reason = probe_engine(entry, architecture)
        if reason.startswith(("its probe raised", "its probe returned")):
            problems.append(f"{label}: probe({architecture!r}): {reason}")
    return problems


def _with_identity(check: CapabilityCheck) -> CapabilityCheck:
    """``check`` preceded by the one identity check (:mod:`omni_core.identity`): a class that
    states its ``name`` (``device_types``, ``stage_keys``, ...) differently from its registration
    is named; one that agrees gets the attributes it leaves out, as ``entry.load()`` does, so a
    check given a class directly sees what a loaded one has."""

    def run(entry: Registered[Any], obj: Any) -> list[str]:
        from omni_core.identity import bind, identity_problems

        problems = identity_problems(obj, entry.spec.kind, entry.spec)
        if not problems:
            bind(obj, entry.spec.kind, entry.spec, entry.provider.plugin)
        return [f"{entry.spec.kind.label} {entry.name!r}: {p}" for p in problems] + check(entry, obj)

    run.__doc__ = check.__doc__
    return run


#: per-kind capability checks; kinds whose contracts grow add their checks here
CAPABILITY_CHECKS: dict[Kind, CapabilityCheck] = {
    kind: _with_identity(check)
    for kind, check in (
        (Kind.PLATFORM, _check_platform),
        (Kind.ATTENTION_BACKEND, _check_attention_backend),
        (Kind.MODEL, _check_model),
        (Kind.TTS_ADAPTER, _check_tts_adapter),
        (Kind.CONNECTOR, _check_connector),
        (Kind.EXECUTOR, _check_executor),
        (Kind.STAGE_ENGINE, _check_stage_engine),
        (Kind.OFFLOADER, _check_offloader),
        (Kind.CACHE_BACKEND, _check_cache_backend),
        (Kind.COMMAND, _check_callable),
    )
}


def check_capabilities(name: str) -> list[str]:
    plugin_set, record, problems = _load_only(name)
    if record is None or record.status is not Status.OK:
        return problems or [f"plugin {name!r} did not load: {record.status if record else '?'}"]
    for entry in _entries_of(plugin_set, name):
        try:
            obj = entry.load()
            problems += CAPABILITY_CHECKS[entry.spec.kind](entry, obj)
        except (OmniError, Exception) as exc:
            problems.append(f"{entry.spec.kind.label} {entry.name!r}: {type(exc).__name__}: {exc}")
    return problems


def check_no_overlaps(name: str) -> list[str]:
    from omni_core.plugins import load_plugins

    plugin_set = load_plugins(isolated_settings())
    return [c.message() for c in plugin_set.conflicts if any(o.plugin.casefold() == name.casefold() for o in c.offers)]


def check_plugin(name: str) -> dict[str, list[str]]:
    """Run every check; maps check name to its problems."""
    return {
        "manifest": check_manifest(name),
        "registration": check_registration(name),
        "lazy_refs": check_lazy_refs(name),
        "import_light": check_import_light(name),
        "capabilities": check_capabilities(name),
        "no_overlaps": check_no_overlaps(name),
    }
