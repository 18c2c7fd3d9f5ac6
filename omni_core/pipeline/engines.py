"""Which engine runs each stage: the model's own, or a registered stage engine.

A model plugin names its own engine for every stage (``StageDef.engine``, shown as
``engine_name``). A stage engine plugin (``[[stage_engine]]``, vLLM for autoregressive stages)
offers to run stages of a ``kind`` and an ``architecture``. For each stage, in order:

1. the operator's choice (``pipeline.stages.<stage>.engine`` in a recipe, or
   ``--stage STAGE.engine=NAME``): the model's own engine by its name, or a registered one that
   claims the stage and whose probe agrees; anything else is an error naming the choices;
2. else the registered engines that claim the stage, highest ``priority`` first: the first
   whose probe says it can run the architecture here;
3. else the model's own engine.

Every step is recorded as words (:attr:`EngineChoice.why`) for ``omni explain pipeline``.
Probes are import-light (no torch, no engine library), so choosing costs nothing; the chosen
engine's ``option_problems`` (when it has one) checks the stage's ``engine_options`` before any
process starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omni_core.errors import OmniError, PipelineConfigError

if TYPE_CHECKING:
    from omni_core.pipeline.topology import StageDef
    from omni_core.plugins import PluginSet
    from omni_core.registry import Registered, StageEngineSpec


@dataclass(frozen=True)
class EngineChoice:
    """The engine a stage runs on: its ``module:Class``, its name, and why."""

    ref: str
    name: str
    why: str


def probe_engine(entry: Registered[StageEngineSpec], architecture: str) -> tuple[bool, str]:
    """Whether a stage engine can run ``architecture`` here, and how it knows. A probe that
    raises counts as "no", with its error as the reason (never a crash of the caller)."""
    from omni_core.guard import contained
    from omni_core.lazy import LazyRef
    from omni_core.platforms import ProbeResult

    if entry.spec.probe is None:
        return True, "no probe: always available"
    try:
        with contained():
            result = LazyRef(entry.spec.probe, owner=entry.provider.plugin).resolve()(architecture)
    except Exception as exc:
        return False, f"its probe raised {type(exc).__name__}: {exc}"
    if isinstance(result, ProbeResult):
        return result.claims, result.reason
    if isinstance(result, bool):
        return result, "its probe answered " + ("yes" if result else "no")
    return False, f"its probe returned {type(result).__name__}, expected ProbeResult or bool"


def _claims(entry: Registered[StageEngineSpec], stage: StageDef) -> bool:
    return stage.kind in entry.spec.stage_kinds and stage.architecture in entry.spec.architectures


def choose_engine(stage: StageDef, plugins: PluginSet, *, wanted: str | None, field: str) -> EngineChoice:
    """The engine ``stage`` runs on. ``wanted``: the operator's choice (None: choose), set at
    ``field`` (named in errors)."""
    own = EngineChoice(stage.engine, stage.engine_name, "")
    claiming = sorted(
        (e for e in plugins.stage_engines if _claims(e, stage)), key=lambda e: (-e.spec.priority, e.name.casefold())
    )
    if wanted is not None:
        return _the_wanted(stage, plugins, wanted, field, own, claiming)
    passed_over: list[str] = []
    for entry in claiming:
        ok, reason = probe_engine(entry, str(stage.architecture))
        if ok:
            others = f"; passed over: {'; '.join(passed_over)}" if passed_over else ""
            return EngineChoice(
                entry.spec.ref,
                entry.name,
                f"{entry.provider.distribution} {entry.provider.version} runs {stage.architecture} here ({reason})"
                f"{others}",
            )
        passed_over.append(f"{entry.name} cannot run it here: {reason}")
    if passed_over:
        why = f"the model's own; {'; '.join(passed_over)}"
    elif stage.architecture is None:
        why = "the model's own (the stage names no architecture another engine could run)"
    else:
        why = f"the model's own (no installed stage engine runs {stage.architecture} {stage.kind} stages)"
    return EngineChoice(own.ref, own.name, why)


def _the_wanted(
    stage: StageDef,
    plugins: PluginSet,
    wanted: str,
    field: str,
    own: EngineChoice,
    claiming: list[Registered[StageEngineSpec]],
) -> EngineChoice:
    # the names the operator can choose here: the model's own, and the engines that claim the
    # stage and whose probe agrees (one that cannot run here is no choice to offer)
    choices = [own.name, *(e.name for e in claiming if probe_engine(e, str(stage.architecture))[0])]
    if wanted.casefold() == own.name.casefold():
        return EngineChoice(own.ref, own.name, f"the model's own, as {field} asks")
    entry = next((e for e in claiming if e.name.casefold() == wanted.casefold()), None)
    if entry is None:
        if wanted in plugins.stage_engines:
            spec = plugins.stage_engines.get(wanted).spec
            problem = (
                f"stage engine {wanted!r} does not run stage {stage.name!r} ({stage.kind}, "
                f"{stage.architecture or 'no architecture'}): it runs {', '.join(spec.stage_kinds)} stages of "
                f"{', '.join(spec.architectures)}"
            )
        else:
            problem = f"no stage engine {wanted!r} ({plugins.stage_engines.why_missing(wanted)})"
        raise PipelineConfigError(f"{field}: {problem}; stage {stage.name!r} can run on {choices}", field=field)
    ok, reason = probe_engine(entry, str(stage.architecture))
    if not ok:
        raise PipelineConfigError(
            f"{field}: stage engine {entry.name!r} cannot run {stage.architecture} here: {reason}. Fix that, or "
            f"choose another of {choices}",
            field=field,
        )
    return EngineChoice(
        entry.spec.ref,
        entry.name,
        f"{entry.provider.distribution} {entry.provider.version}, as {field} asks ({reason})",
    )


def check_engine_options(choice: EngineChoice, stage: str, options: dict[str, Any], plugins: PluginSet) -> type | None:
    """A registered engine's own check of a stage's ``engine_options`` (its ``option_problems``
    classmethod), before any process starts; returns its class. A model's own engine is not
    imported here (None): its module may import torch, which the orchestrator's process does
    not need."""
    if choice.name not in plugins.stage_engines or plugins.stage_engines.get(choice.name).spec.ref != choice.ref:
        return None
    try:
        cls = plugins.stage_engines.load(choice.name)
    except OmniError as exc:
        raise PipelineConfigError(
            f"stage {stage!r}: stage engine {choice.name!r} failed to load: {exc.message}"
        ) from None
    check = getattr(cls, "option_problems", None)
    problems = list(check(dict(options))) if callable(check) else []
    if problems:
        raise PipelineConfigError(
            f"stage {stage!r}: engine_options for the {choice.name} engine: " + "; ".join(problems),
            field=f"pipeline.stages.{stage}.engine_options",
        )
    return cls if isinstance(cls, type) else None
