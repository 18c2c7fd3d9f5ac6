"""Where a pipeline's stages run and how payloads travel: the operator's side of a pipeline.

The placement comes from a recipe's ``pipeline:`` section (or ``--stage`` overrides on the
command line) and is validated *together with* the model's topology, once, before any process
starts (:func:`resolve_pipeline`). Every mistake is one :class:`PipelineConfigError` naming the
field and the fix::

    pipeline:
      defaults: {placement: process, request_timeout: 120}
      stages:
        hidden: {placement: inprocess, engine_options: {block_size: 4}}
      connectors:
        big: {connector: shm, extra: {inline_threshold_bytes: 4096}}
      edges:
        - {from: tokens, to: hidden, connector: big, window: 4, max_inflight: 8}

Precedence for each setting: a stage's own entry > ``defaults`` > the built-in default. An edge
without a connector gets ``inprocess`` when both ends share a process and ``shm`` otherwise,
when installed; :class:`ResolvedPipeline` records which rule chose it, for
``omni explain pipeline``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from omni_core.errors import PipelineConfigError
from omni_core.pipeline.connector import Edge
from omni_core.pipeline.topology import OUTPUT, PipelineTopology, StageDef

if TYPE_CHECKING:
    from omni_core.plugins import PluginSet

#: where a stage runs without a plugin: a thread of the orchestrator's process, or its own
#: spawned process (executor plugins add more: :mod:`omni_core.pipeline.executor`)
PLACEMENTS = ("inprocess", "process")
#: connectors tried, in order, for an edge the recipe leaves open
_DEFAULT_CROSS_PROCESS = "shm"
_DEFAULT_SAME_PROCESS = "inprocess"


#: stage fields the model plugin declares (its topology); a recipe that sets one is told so
_TOPOLOGY_FIELDS = ("name", "kind", "engine_name", "architecture", "inputs", "emits", "final", "sample_rate", "options")


class StagePlacement(BaseModel):
    """How one stage runs. Every field may also be set under ``defaults``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _not_the_models(cls, data: Any) -> Any:
        owned = [k for k in data if k in _TOPOLOGY_FIELDS] if isinstance(data, dict) else []
        if owned:
            raise ValueError(
                f"{owned[0]!r} is the model's to declare (its topology), not the recipe's: a recipe places a stage "
                f"({', '.join(cls.model_fields)}); to change the engine's settings use engine_options"
            )
        return data

    #: ``inprocess`` (a thread of the orchestrator's process) or ``process`` (spawned)
    placement: str | None = None
    #: the engine the stage runs on: its model's own, by name (``transformers``), or a
    #: registered stage engine that runs the stage (``vllm``); unset: chosen
    #: (:mod:`omni_core.pipeline.engines`). Per stage only, not under ``defaults``
    engine: str | None = None
    #: device ids for the stage, e.g. ``"0"`` or ``"0,1"`` (passed to the engine)
    devices: str | None = None
    #: seconds for the stage to load and report ready
    startup_timeout: float | None = Field(default=None, gt=0)
    #: seconds one request may spend in this stage before it fails with a named timeout
    request_timeout: float | None = Field(default=None, gt=0)
    #: how often a stage process that died is restarted before the stage is reported unhealthy
    max_restarts: int | None = Field(default=None, ge=0)
    #: seconds a stopping stage gets before it is killed
    shutdown_timeout: float | None = Field(default=None, gt=0)
    #: options for the stage's engine, on top of what the model declares
    engine_options: dict[str, Any] = Field(default_factory=dict)
    #: options for the executor that places the stage (a Ray actor's ``num_cpus``, ...)
    executor_options: dict[str, Any] = Field(default_factory=dict)


class ConnectorChoice(BaseModel):
    """A named connector configuration edges refer to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the registered connector name (``omni plugins list`` shows them)
    connector: str
    extra: dict[str, Any] = Field(default_factory=dict)


class EdgeSettings(BaseModel):
    """How payloads travel on an edge (``pipeline.edge_defaults``, and each ``pipeline.edges`` entry)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    #: a key of ``connectors``, or a registered connector name
    connector: str | None = None
    #: items per chunk handed downstream; -1: everything at once when the stage finishes
    window: int | None = None
    #: chunks put on the edge and not yet taken before the producer waits (backpressure)
    max_inflight: int | None = Field(default=None, ge=1)
    #: seconds a put or get on this edge may wait
    transfer_timeout: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _window(self) -> EdgeSettings:
        if self.window is not None and self.window != -1 and self.window < 1:
            raise ValueError(f"window must be -1 (hand over at the end) or at least 1, got {self.window}")
        return self


class EdgePlacement(EdgeSettings):
    """One edge of the model's graph, by its ends (``from: tokens, to: hidden``)."""

    source: str = Field(alias="from")
    target: str = Field(alias="to")


class PipelinePlacement(BaseModel):
    """A recipe's ``pipeline:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: StagePlacement = Field(default_factory=StagePlacement)
    stages: dict[str, StagePlacement] = Field(default_factory=dict)
    connectors: dict[str, ConnectorChoice] = Field(default_factory=dict)
    #: options of each executor a stage is placed on (``ray: {address: auto}``)
    executors: dict[str, dict[str, Any]] = Field(default_factory=dict)
    edges: list[EdgePlacement] = Field(default_factory=list)
    #: defaults for every edge the ``edges`` list does not name, or leaves a field of open
    edge_defaults: EdgeSettings = Field(default_factory=EdgeSettings)
    #: requests in the pipeline at once; one more waits (offline) or is refused (server)
    max_requests: int = Field(default=16, ge=1)

    @classmethod
    def parse(cls, data: dict[str, Any], *, what: str = "the pipeline placement") -> PipelinePlacement:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise PipelineConfigError.from_validation(exc, what=what, model=cls) from None


#: built-in defaults, the last layer of the precedence
BUILTIN_STAGE = StagePlacement(
    placement="process",
    devices="0",
    startup_timeout=600.0,
    request_timeout=600.0,
    max_restarts=3,
    shutdown_timeout=10.0,
)
BUILTIN_EDGE = {"window": -1, "max_inflight": 4, "transfer_timeout": 30.0}
#: a final stage's edge to the caller hands over each item as it is made: a streaming client
#: (the server's SSE, ``omni chat``) sees the answer grow, not all of it at the end
BUILTIN_OUTPUT_WINDOW = 1


class ResolvedStage(BaseModel):
    """One stage with every setting decided: what a stage process is started with. Transport-safe
    (plain values only), so it crosses to the stage's process as is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: str
    engine: str
    emits: str
    final: str | None
    inputs: tuple[str, ...]
    placement: str
    devices: str
    startup_timeout: float
    request_timeout: float
    max_restarts: int
    shutdown_timeout: float
    engine_options: dict[str, Any]
    executor_options: dict[str, Any] = Field(default_factory=dict)
    #: the checkpoint architecture the stage runs (what ``engine`` loads)
    architecture: str | None = None
    #: the engine's name (the model's own ``engine_name``, or a registered stage engine) and why
    #: it was chosen, for ``omni explain pipeline``
    engine_name: str = "model"
    engine_why: str = ""
    #: the engine starts processes of its own (``StageEngine.starts_processes``)
    starts_processes: bool = False
    #: where each setting came from (``recipe stage``, ``recipe defaults``, ``built-in``)
    sources: dict[str, str] = Field(default_factory=dict)


class ResolvedEdge(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    target: str
    carries: str
    connector: str
    connector_name: str
    extra: dict[str, Any]
    window: int
    max_inflight: int
    transfer_timeout: float
    #: why this connector: ``recipe edge``, ``default: both ends share a process``, ...
    why: str

    @property
    def edge(self) -> Edge:
        return Edge(self.source, self.target)


class ResolvedPipeline(BaseModel):
    """Topology and placement, validated together: everything the orchestrator and each stage
    process need, and nothing process-local."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_dir: str
    topology: PipelineTopology
    stages: tuple[ResolvedStage, ...]
    edges: tuple[ResolvedEdge, ...]
    max_requests: int
    #: options of each executor in use, by placement name (the core's own take none)
    executors: dict[str, dict[str, Any]] = Field(default_factory=dict)
    #: names this run's connector resources; fresh per resolution
    run_id: str

    def stage(self, name: str) -> ResolvedStage:
        return next(s for s in self.stages if s.name == name)

    def edge(self, source: str, target: str) -> ResolvedEdge:
        return next(e for e in self.edges if e.source == source and e.target == target)

    def edges_into(self, name: str) -> list[ResolvedEdge]:
        return [e for e in self.edges if e.target == name]

    def edges_from(self, name: str) -> list[ResolvedEdge]:
        return [e for e in self.edges if e.source == name]

    def process_of(self, name: str) -> str:
        """Which process a stage (or ``output``) lives in: ``orchestrator`` or its own name."""
        if name == OUTPUT:
            return "orchestrator"
        return "orchestrator" if self.stage(name).placement == "inprocess" else name


def _fix(field: str, message: str) -> PipelineConfigError:
    return PipelineConfigError(message, field=field)


def resolve_pipeline(
    topology: PipelineTopology,
    placement: PipelinePlacement | dict[str, Any] | None,
    *,
    model_dir: str | Path,
    plugins: PluginSet,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> ResolvedPipeline:
    """Validate the model's topology and the operator's placement together, before any process
    starts. ``overrides`` (stage name -> fields, from the command line or ``Omni(...)``) beat the
    recipe's stage entries. Raises :class:`PipelineConfigError` naming the field and the fix."""
    if not isinstance(placement, PipelinePlacement):
        placement = PipelinePlacement.parse(placement or {})
    names = topology.names
    for key in placement.stages:
        if key not in names:
            raise _fix(
                f"pipeline.stages.{key}",
                f"pipeline.stages names {key!r}, which is not a stage of {topology.name!r}; its stages are {names}",
            )
    for key in overrides or {}:
        if key not in names:
            raise _fix(f"--stage {key}", f"--stage {key}: no such stage in {topology.name!r}; its stages are {names}")
    if placement.defaults.engine is not None:
        raise _fix(
            "pipeline.defaults.engine",
            "pipeline.defaults.engine: an engine is chosen per stage (pipeline.stages.<stage>.engine), since "
            "stages run different architectures",
        )
    stages = tuple(_resolve_stage(s, placement, (overrides or {}).get(s.name, {}), plugins) for s in topology.stages)
    executors = _check_executors(stages, placement, plugins)
    by_name = {s.name: s for s in stages}
    edges = _resolve_edges(topology, placement, by_name, plugins)
    return ResolvedPipeline(
        executors=executors,
        model_dir=str(model_dir),
        topology=topology,
        stages=stages,
        edges=tuple(edges),
        max_requests=placement.max_requests,
        run_id=uuid.uuid4().hex[:12],
    )


def _resolve_stage(
    stage: StageDef, placement: PipelinePlacement, override: dict[str, Any], plugins: PluginSet
) -> ResolvedStage:
    from omni_core.pipeline.engines import check_engine_options, choose_engine

    try:
        given = StagePlacement.model_validate(override)
    except ValidationError as exc:
        raise PipelineConfigError.from_validation(exc, what=f"--stage {stage.name}", model=StagePlacement) from None
    layers = (
        ("command line", given),
        ("recipe stage", placement.stages.get(stage.name, StagePlacement())),
        ("recipe defaults", placement.defaults),
        ("built-in", BUILTIN_STAGE),
    )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for field in ("placement", "devices", "startup_timeout", "request_timeout", "max_restarts", "shutdown_timeout"):
        for label, layer in layers:
            value = getattr(layer, field)
            if value is not None:
                values[field], sources[field] = value, label
                break
    executor_options = {
        **placement.defaults.executor_options,
        **placement.stages.get(stage.name, StagePlacement()).executor_options,
        **given.executor_options,
    }
    recipe_stage = placement.stages.get(stage.name, StagePlacement())
    wanted, field = (
        (given.engine, f"--stage {stage.name}.engine")
        if given.engine is not None
        else (recipe_stage.engine, f"pipeline.stages.{stage.name}.engine")
    )
    choice = choose_engine(stage, plugins, wanted=wanted, field=field)
    # the options a model fixes are for its own engine; another engine gets the recipe's only
    options = dict(stage.options) if choice.ref == stage.engine else {}
    options.update(placement.defaults.engine_options)
    options.update(recipe_stage.engine_options)
    options.update(given.engine_options)
    engine_class = check_engine_options(choice, stage.name, options, plugins)
    if wanted is not None:
        sources["engine"] = "command line" if given.engine is not None else "recipe stage"
    return ResolvedStage(
        executor_options=executor_options,
        name=stage.name,
        kind=stage.kind,
        engine=choice.ref,
        engine_name=choice.name,
        engine_why=choice.why,
        starts_processes=bool(getattr(engine_class, "starts_processes", False)),
        architecture=stage.architecture,
        emits=stage.emits,
        final=stage.final,
        inputs=stage.inputs,
        engine_options=options,
        sources=sources,
        **values,
    )


def _executor_class(plugins: PluginSet, name: str) -> Any:
    from omni_core.pipeline.executor import builtin_executor

    builtin = builtin_executor(name)
    if builtin is not None:
        return builtin
    if name in plugins.executors:
        return plugins.executors.load(name)
    return None


def _check_executors(
    stages: tuple[ResolvedStage, ...], placement: PipelinePlacement, plugins: PluginSet
) -> dict[str, dict[str, Any]]:
    """Every stage's placement names an executor, and its options (shared and per stage) are
    valid; the options of each executor in use, for the orchestrator."""
    in_use: dict[str, dict[str, Any]] = {}
    for stage in stages:
        cls = _executor_class(plugins, stage.placement)
        if cls is None:
            where = "pipeline.stages" if stage.sources.get("placement") == "recipe stage" else "pipeline.defaults"
            known = [*PLACEMENTS, *plugins.executors.names()]
            raise _fix(
                f"{where}.placement",
                f"stage {stage.name!r}: placement {stage.placement!r} is not one of {known}"
                + (
                    ""
                    if stage.placement in plugins.executors
                    else f" ({plugins.executors.why_missing(stage.placement)})"
                ),
            )
        try:
            cls.stage_options_type(**stage.executor_options)
        except ValidationError as exc:
            raise PipelineConfigError.from_validation(
                exc, what=f"pipeline.stages.{stage.name}.executor_options", model=cls.stage_options_type
            ) from None
        if stage.placement not in in_use:
            given = placement.executors.get(stage.placement, {})
            try:
                cls.options_type(**given)
            except ValidationError as exc:
                raise PipelineConfigError.from_validation(
                    exc, what=f"pipeline.executors.{stage.placement}", model=cls.options_type
                ) from None
            in_use[stage.placement] = dict(given)
    unused = sorted(set(placement.executors) - set(in_use))
    if unused:
        raise _fix(
            f"pipeline.executors.{unused[0]}",
            f"pipeline.executors.{unused[0]} configures an executor no stage is placed on; place a stage on it "
            f"(pipeline.stages.<stage>.placement: {unused[0]}) or remove the entry",
        )
    return in_use


def _resolve_edges(
    topology: PipelineTopology, placement: PipelinePlacement, stages: dict[str, ResolvedStage], plugins: PluginSet
) -> list[ResolvedEdge]:
    edges = topology.edges()
    declared = {(e.source, e.target): (i, e) for i, e in enumerate(placement.edges)}
    valid = {(e.source, e.target) for e in edges}
    for (source, target), (i, _) in declared.items():
        if (source, target) not in valid:
            known = ", ".join(f"{e.source}->{e.target}" for e in edges)
            raise _fix(
                f"pipeline.edges[{i}]",
                f"pipeline.edges[{i}] is {source}->{target}, which is not an edge of {topology.name!r}; "
                f"its edges are {known}",
            )
    for name, choice in placement.connectors.items():
        _connector_class(plugins, choice.connector, f"pipeline.connectors.{name}.connector")

    resolved: list[ResolvedEdge] = []
    for edge in edges:
        index, given = declared.get((edge.source, edge.target), (None, None))
        field = f"pipeline.edges[{index}]" if index is not None else "pipeline.edge_defaults"
        layers = [x for x in (given, placement.edge_defaults) if x is not None]
        settings: dict[str, Any] = {}
        for key in ("window", "max_inflight", "transfer_timeout"):
            builtin = BUILTIN_OUTPUT_WINDOW if key == "window" and edge.target == OUTPUT else BUILTIN_EDGE[key]
            settings[key] = next((getattr(x, key) for x in layers if getattr(x, key) is not None), builtin)
        source_proc = "orchestrator" if stages[edge.source].placement == "inprocess" else edge.source
        target_proc = (
            "orchestrator" if edge.target == OUTPUT or stages[edge.target].placement == "inprocess" else edge.target
        )
        same = source_proc == target_proc
        named = next((x.connector for x in layers if x.connector is not None), None)
        if named is not None:
            why = "recipe edge" if given is not None and given.connector else "recipe edge_defaults"
            if named in placement.connectors:
                choice = placement.connectors[named]
                label, extra = named, dict(choice.extra)
                connector = choice.connector
            else:
                label, connector, extra = named, named, {}
            cls = _connector_class(plugins, connector, f"{field}.connector")
        else:
            connector, why = (_DEFAULT_SAME_PROCESS, "") if same else _default_cross_process(plugins, stages, edge)
            if connector not in plugins.connectors and same:
                connector = _DEFAULT_CROSS_PROCESS  # a cross-process transport works in one process too
            if connector not in plugins.connectors:
                raise _fix(
                    f"{field}.connector",
                    f"edge {edge} has no connector: the recipe names none and the default {connector!r} is "
                    f"not installed ({plugins.connectors.why_missing(connector)}). Install omni-plugin-connectors, "
                    "or name an installed connector in pipeline.edges (`omni plugins list` shows them)",
                )
            label, extra = connector, {}
            why = why or ("default: both ends share a process" if same else "default: the ends are separate processes")
            cls = plugins.connectors.load(connector)
        if getattr(cls, "same_process_only", False) and not same:
            raise _fix(
                f"{field}.connector",
                f"edge {edge} crosses processes ({source_proc} -> {target_proc}) but connector {connector!r} "
                "only works within one process; name a cross-process connector (shm, tcp) for this edge, or "
                "place both stages inprocess",
            )
        try:
            options = cls.validate_options(extra)
        except ValidationError as exc:
            raise PipelineConfigError.from_validation(
                exc, what=f"options of connector {label!r} (pipeline.connectors.{label}.extra)", model=cls.options_type
            ) from None
        resolved.append(
            ResolvedEdge(
                source=edge.source,
                target=edge.target,
                carries=topology.stage(edge.source).emits,
                connector=connector,
                connector_name=label,
                extra=options.model_dump(exclude_unset=True),
                why=why,
                **settings,
            )
        )
    return resolved


def _default_cross_process(plugins: PluginSet, stages: dict[str, ResolvedStage], edge: Edge) -> tuple[str, str]:
    """``shm``, unless an end's executor asks for another (stages that may sit on other machines);
    with the reason ``omni explain pipeline`` shows."""
    for end in (edge.source, edge.target):
        if end in stages:
            cls = _executor_class(plugins, stages[end].placement)
            wanted = getattr(cls, "default_connector", _DEFAULT_CROSS_PROCESS)
            if wanted != _DEFAULT_CROSS_PROCESS:
                return str(
                    wanted
                ), f"default: stage {end!r} runs on the {stages[end].placement} executor, which asks for it"
    return _DEFAULT_CROSS_PROCESS, ""


def _connector_class(plugins: PluginSet, name: str, field: str) -> Any:
    from omni_core.errors import OmniError

    try:
        return plugins.connectors.load(name)
    except OmniError as exc:
        raise _fix(field, f"{field}: {exc.message}") from None


_OVERRIDE_EXAMPLES = "e.g. --stage hidden.placement=inprocess, --stage tokens.engine_options.seed=3"


def parse_stage_overrides(values: list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The command line's ``--stage STAGE.FIELD=VALUE`` settings as ``overrides`` (stage name ->
    fields), which beat the recipe. ``VALUE`` is read as YAML (``3``, ``true``, ``[0, 1]``, a
    word); ``FIELD`` may go deeper into a mapping field (``engine_options.seed``). Whether the
    stage and the field exist is :func:`resolve_pipeline`'s to say, with the model at hand."""
    import yaml  # type: ignore[import-untyped]

    overrides: dict[str, dict[str, Any]] = {}
    for text in values:
        path, sep, raw = text.partition("=")
        keys = path.strip().split(".")
        if not sep or len(keys) < 2 or not all(keys):
            raise _fix("--stage", f"--stage {text!r} is not STAGE.FIELD=VALUE ({_OVERRIDE_EXAMPLES})")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            problem = str(exc).splitlines()[0]
            raise _fix("--stage", f"--stage {text!r}: its value does not read as YAML ({problem}); quote it") from None
        node = overrides.setdefault(keys[0], {})
        for key in keys[1:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise _fix("--stage", f"--stage {text!r}: {key!r} was given a value already, so it has no fields")
            node = child
        if isinstance(node.get(keys[-1]), dict):
            raise _fix("--stage", f"--stage {text!r}: {path!r} has fields given already; set those instead")
        node[keys[-1]] = value
    return overrides


def load_placement(path: str | Path) -> PipelinePlacement:
    """The ``pipeline:`` section of a recipe file (empty when it has none)."""
    from omni_core.generation.recipe import load_recipe

    return load_recipe(path).pipeline or PipelinePlacement()


def plan_pipeline(
    model_dir: str | Path,
    *,
    recipe: str | Path | PipelinePlacement | dict[str, Any] | None = None,
    plugins: PluginSet | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    model_class_name: str | None = None,
) -> ResolvedPipeline:
    """The resolved pipeline of a checkpoint, from its JSON files and the recipe: the family the
    model registry finds declares the topology (``topology_for``), the recipe places it. Nothing
    is loaded and no process starts: what ``omni explain pipeline`` prints and
    :class:`~omni_core.pipeline.orchestrator.Pipeline` runs."""
    from omni_core.generation.resolve import resolve_model
    from omni_core.plugins import get_plugins

    plugins = plugins if plugins is not None else get_plugins()
    model_dir = Path(model_dir).expanduser()
    resolution = resolve_model(plugins, model_dir, model_class_name=model_class_name)
    family = resolution.entry.load()
    topology_for = getattr(family, "topology_for", None)
    if not callable(topology_for):
        raise PipelineConfigError(
            f"{model_dir} is served by family {resolution.family!r}, which is not a pipeline model (it declares no "
            "topology_for); run it with `omni generate` or `omni speak`",
            field="model",
        )
    placement = load_placement(recipe) if isinstance(recipe, (str, Path)) else recipe
    return resolve_pipeline(
        topology_for(model_dir), placement, model_dir=model_dir, plugins=plugins, overrides=overrides
    )


def describe(resolved: ResolvedPipeline) -> str:
    """The resolved graph in words: stages with their engine and placement, then each edge with
    its connector and why it was chosen."""
    lines = [f"pipeline {resolved.topology.name} ({resolved.model_dir})", "stages:"]
    width = max(len(s.name) for s in resolved.stages)
    for s in resolved.stages:
        source = f"from {s.inputs[0]}" if s.inputs else "takes the request"
        final = f", final for {s.final}" if s.final else ""
        lines.append(
            f"  {s.name:<{width}}  {s.kind:<10} {s.placement:<9} devices {s.devices:<4} {source}, emits {s.emits}"
            f"{final}"
        )
        lines.append(f"  {'':<{width}}  engine {s.engine_name}: {s.engine_why}")
        timeouts = f"startup {s.startup_timeout:g} s, request {s.request_timeout:g} s, restarts {s.max_restarts}"
        lines.append(f"  {'':<{width}}  {timeouts}")
        if s.engine_options:
            lines.append(f"  {'':<{width}}  engine options {json.dumps(s.engine_options, sort_keys=True, default=str)}")
        given = [f"{k} ({v})" for k, v in s.sources.items() if v != "built-in"]
        if given:
            lines.append(f"  {'':<{width}}  set by: {', '.join(given)}")
    lines.append("edges:")
    for e in resolved.edges:
        window = "at the end" if e.window == -1 else f"every {e.window} item(s)"
        via = e.connector if e.connector_name == e.connector else f"{e.connector_name} ({e.connector})"
        lines.append(
            f"  {e.source} -> {e.target}: {e.carries}, {via}, hand over {window}, "
            f"max {e.max_inflight} in flight, timeout {e.transfer_timeout:g} s  [{e.why}]"
        )
    return "\n".join(lines)
