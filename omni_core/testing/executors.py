"""The conformance kit's executor check: the contract of :mod:`omni_core.pipeline.executor`, and
a real pipeline run on the executor.

:func:`executor_problems` (``CAPABILITY_CHECKS[Kind.EXECUTOR]``) checks the class, then runs
the kit's own pipeline with both of its stages placed on the executor:

* The class subclasses :class:`~omni_core.pipeline.executor.StageExecutor` and implements
  ``launch``; its ``options_type`` and ``stage_options_type`` subclass
  :class:`~omni_core.pipeline.executor.ExecutorOptions` and build from ``{}`` (a recipe that
  places a stage on the executor without options builds them so, and so does the kit); its
  name is not one of the core's own placements.
* **A request**: the kit's two stages (:data:`TOPOLOGY`: ``kit_source`` splits the request's
  text into words, ``kit_target`` upper-cases them; plain Python, no torch) start through
  ``launch`` and ``start``, report ready, and one request comes back whole. Each item carries
  the pid of the process each stage ran in: a handle that has a ``pid`` must name that process.
* **A restart** (when the handle is ``restartable``): ``kill()`` ends the downstream stage,
  ``alive()`` turns False, ``exit_reason()`` says how it ended, the orchestrator launches it
  again through the executor, and a second request comes back whole.
* **Close**: the pipeline closes (every ``stop(timeout)``, then the executor's ``close()``)
  within the stages' ``shutdown_timeout`` and a margin, and no handle is alive after.

The stages move their items through the kit's own connector (:class:`KitConnector`, which
carries each payload inside its handle), registered by a plugin the kit writes into a
directory of its own and puts at the front of ``sys.path`` for the run (:func:`kit_transport`):
so an executor passes only if the stages it starts see this process's ``sys.path``, as every
executor's must (the plugins and modules the orchestrator sees are the ones a stage needs).

For an executor's own tests: :func:`kit_pipeline` (the kit's pipeline, started on an
executor, with its options) and :func:`kit_request` (one request, and what each stage saw:
its pid, its scheduling priority and the environment variables asked for).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_core.conflicts import Provider
from omni_core.errors import OmniError
from omni_core.pipeline.connector import Connector, Edge, Handle, check_handle
from omni_core.pipeline.executor import BUILTIN_EXECUTORS, ExecutorOptions, StageExecutor
from omni_core.pipeline.stage import StageEngine
from omni_core.pipeline.topology import PipelineTopology, StageDef

if TYPE_CHECKING:
    from omni_core.pipeline.executor import StageHandle
    from omni_core.pipeline.orchestrator import Pipeline
    from omni_core.plugins import PluginSet

#: the kit's stages, in order: the first takes the request, the second answers it
STAGES = ("kit_source", "kit_target")
TOPOLOGY = PipelineTopology(
    name="omni-kit",
    stages=(
        StageDef(name=STAGES[0], kind="generation", engine=f"{__name__}:KitSource", emits="words"),
        StageDef(
            name=STAGES[1], kind="generation", engine=f"{__name__}:KitTarget", inputs=(STAGES[0],), emits="words",
            final="text",
        ),
    ),
)
#: the request the check sends
TEXT = "every stage runs where its executor puts it"
#: the kit's connector, and the plugin that registers it
KIT_CONNECTOR = "omni-kit-inline"
KIT_PLUGIN = "omni-kit-transport"
_KIT_PACKAGE = "omni_kit_transport"
_KIT_MANIFEST = f"""omni_api = ">=1.2,<2"
description = "the conformance kit's transport: each payload inside its handle"

[[connector]]
name = "{KIT_CONNECTOR}"
ref = "{__name__}:KitConnector"
"""
#: the kit pipeline's stage settings (a test may change them through kit_pipeline)
STAGE_DEFAULTS: dict[str, Any] = {
    "startup_timeout": 120.0,
    "request_timeout": 60.0,
    "shutdown_timeout": 10.0,
    "max_restarts": 1,
}
#: seconds beyond a bound the check waits: for a killed stage to be seen dead, for close()
SETTLE_S = 30.0


# -- the kit's pipeline ----------------------------------------------------------------------------


def stage_facts(params: dict[str, Any]) -> dict[str, Any]:
    """What a stage reports about where it runs: its pid, its niceness, and the values of the
    environment variables the request names (``params["env"]``; None for one not set)."""
    return {
        "pid": os.getpid(),
        "nice": os.nice(0),
        "env": {name: os.environ.get(name) for name in params.get("env", ())},
    }


class KitSource(StageEngine):
    """Takes the request (a text) and yields one item per word."""

    def run(self, inputs: Iterator[Any], params: dict[str, Any]) -> Iterator[Any]:
        facts = stage_facts(params)
        for text in inputs:
            for word in str(text).split():
                yield {"word": word, "facts": {self.stage.name: facts}}


class KitTarget(StageEngine):
    """Upper-cases each word, adding what it saw to what the source saw."""

    def run(self, inputs: Iterator[Any], params: dict[str, Any]) -> Iterator[Any]:
        facts = stage_facts(params)
        for item in inputs:
            yield {"word": item["word"].upper(), "facts": {**item["facts"], self.stage.name: facts}}


class KitConnector(Connector):
    """Carries each payload inside its handle, so it works between any two processes the
    orchestrator's control channel joins; nothing to store, clean up or close."""

    def put(self, edge: Edge, request_id: str, payload: Any, *, timeout: float) -> Handle:
        from omni_core.pipeline.payload import encode

        encoded = encode(payload)
        self.check_payload_size(encoded.nbytes, edge)
        return {"inline": encoded.to_bytes(), "nbytes": encoded.nbytes}

    def get(self, edge: Edge, request_id: str, handle: Handle, *, timeout: float) -> Any:
        from omni_core.pipeline.payload import decode

        check_handle(self.name, edge, handle, {"inline": bytes, "nbytes": int})
        return decode(handle["inline"], copy=True)

    def cleanup(self, request_id: str) -> None:
        pass

    def close(self) -> None:
        pass


def expected_words(text: str = TEXT) -> list[str]:
    """What the kit's pipeline answers for ``text``."""
    return [word.upper() for word in text.split()]


@contextlib.contextmanager
def kit_transport() -> Iterator[Path]:
    """The plugin that registers :data:`KIT_CONNECTOR`, written into a new directory at the front
    of ``sys.path`` (processes started meanwhile find it there, as they find any plugin this
    process sees); removed again after."""
    with tempfile.TemporaryDirectory(prefix="omni-kit-transport-") as tmp:
        site = Path(tmp)
        package = site / _KIT_PACKAGE
        package.mkdir()
        (package / "__init__.py").write_text("", encoding="utf-8")
        (package / "hooks.py").write_text("from omni_core.declared import *  # noqa: F403\n", encoding="utf-8")
        (package / "omni_plugin.toml").write_text(_KIT_MANIFEST, encoding="utf-8")
        dist = site / f"{_KIT_PACKAGE}-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {KIT_PLUGIN}\nVersion: 1.0\n", encoding="utf-8")
        (dist / "entry_points.txt").write_text(
            f"[omni.plugins]\n{KIT_PLUGIN} = {_KIT_PACKAGE}.hooks\n", encoding="utf-8"
        )
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        try:
            yield site
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(str(site))
            for module in [m for m in sys.modules if m.split(".")[0] == _KIT_PACKAGE]:
                del sys.modules[module]


def kit_plugins(name: str, ref: str, provider: Provider | None = None) -> PluginSet:
    """Registries holding the executor ``name`` (``ref``) and the kit's connector, nothing else."""
    from omni_core.plugins import plugin_set_of
    from omni_core.registry import ConnectorRegistrar, ExecutorRegistrar

    executors = ExecutorRegistrar(provider or Provider("omni-kit", "omni-kit", "1.0"))
    executors.register(name, ref)
    connectors = ConnectorRegistrar(Provider(KIT_PLUGIN, KIT_PLUGIN, "1.0"))
    connectors.register(KIT_CONNECTOR, f"{__name__}:KitConnector")
    return plugin_set_of([*executors.offers(), *connectors.offers()])


def kit_placement(
    name: str,
    options: dict[str, Any] | None = None,
    stage_options: dict[str, dict[str, Any]] | None = None,
    **defaults: Any,
) -> dict[str, Any]:
    """The recipe's ``pipeline:`` section that places both kit stages on ``name``: ``options``
    are ``pipeline.executors.<name>``, ``stage_options`` each stage's ``executor_options``, and
    ``defaults`` change :data:`STAGE_DEFAULTS`."""
    return {
        "defaults": {"placement": name, **STAGE_DEFAULTS, **defaults},
        "stages": {stage: {"executor_options": dict(given)} for stage, given in (stage_options or {}).items()},
        "executors": {name: dict(options)} if options else {},
        "edge_defaults": {"connector": KIT_CONNECTOR, "window": 2},
    }


def _identify(executor: str | type[StageExecutor]) -> tuple[str, str, Provider | None]:
    """(name, ref, provider) of an installed executor's name, or of a class."""
    if isinstance(executor, str):
        from omni_core.plugins import load_plugins
        from omni_core.testing.checks import isolated_settings

        entry = load_plugins(isolated_settings()).executors.get(executor)
        return entry.name, entry.spec.ref, entry.provider
    name = getattr(executor, "name", None)
    if not isinstance(name, str):
        raise ValueError(f"{executor.__qualname__} has no name: pass the installed executor's name instead")
    return name, f"{executor.__module__}:{executor.__qualname__}", None


def _start(name: str, ref: str, provider: Provider | None, site: Path, placement: dict[str, Any]) -> Pipeline:
    from omni_core.pipeline.orchestrator import Pipeline
    from omni_core.pipeline.placement import resolve_pipeline

    plugins = kit_plugins(name, ref, provider)
    resolved = resolve_pipeline(TOPOLOGY, placement, model_dir=site, plugins=plugins)
    return Pipeline(resolved, plugins=plugins).start()


@contextlib.contextmanager
def kit_pipeline(
    executor: str | type[StageExecutor],
    *,
    options: dict[str, Any] | None = None,
    stage_options: dict[str, dict[str, Any]] | None = None,
    **defaults: Any,
) -> Iterator[Pipeline]:
    """The kit's pipeline, both stages placed on ``executor`` (an installed executor's name, or
    the class), started (or :class:`~omni_core.errors.PipelineStartError`, or
    :class:`~omni_core.errors.PipelineConfigError` for bad options) and closed after.
    ``options``, ``stage_options`` and ``defaults`` as :func:`kit_placement` takes them."""
    name, ref, provider = _identify(executor)
    with kit_transport() as site:
        pipeline = _start(name, ref, provider, site, kit_placement(name, options, stage_options, **defaults))
        try:
            yield pipeline
        finally:
            pipeline.close()


@dataclass
class KitRun:
    """One request of the kit's pipeline: the words it answered, and what each stage saw
    (:func:`stage_facts`, by stage name)."""

    words: list[str]
    facts: dict[str, dict[str, Any]]


def kit_request(pipeline: Pipeline, text: str = TEXT, env: tuple[str, ...] | list[str] = ()) -> KitRun:
    """Send ``text`` through the kit's pipeline; each stage reports the variables ``env`` names."""
    params = {stage: {"env": list(env)} for stage in STAGES}
    items = pipeline.run(text, params=params).outputs.get("text", [])
    return KitRun(words=[item["word"] for item in items], facts=dict(items[0]["facts"]) if items else {})


# -- the check -------------------------------------------------------------------------------------


def class_problems(name: str, ref: str, obj: Any) -> list[str]:
    """What the class itself gets wrong (nothing is started)."""
    import inspect

    from pydantic import ValidationError

    from omni_core.errors import validation_problems

    label = f"executor {name!r}"
    if not (inspect.isclass(obj) and issubclass(obj, StageExecutor)):
        return [f"{label}: {ref} must be a subclass of omni_core.pipeline.executor.StageExecutor"]
    problems = []
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        problems.append(f"{label}: {obj.__name__} does not implement {missing}")
    for attr in ("options_type", "stage_options_type"):
        value = getattr(obj, attr, None)
        if not (inspect.isclass(value) and issubclass(value, ExecutorOptions)):
            problems.append(f"{label}: {attr} must be a subclass of omni_core.pipeline.executor.ExecutorOptions")
            continue
        try:
            value()
        except ValidationError as exc:
            needs = "; ".join(validation_problems(exc, model=value))
            problems.append(
                f"{label}: {attr} ({value.__name__}) does not build from no options ({needs}); give every "
                "option a default: a recipe that places a stage on the executor without options builds it from {}"
            )
    if name in BUILTIN_EXECUTORS:
        problems.append(
            f"{label}: {name!r} is the core's own placement; register the executor under another name"
        )
    return problems


def _wait(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class _Check:
    """One run of the kit's pipeline on an executor, each problem prefixed with its label."""

    def __init__(self, name: str) -> None:
        self.label = f"executor {name!r}"
        self.problems: list[str] = []

    def problem(self, text: str) -> None:
        self.problems.append(f"{self.label}: {text}")

    def request(self, pipeline: Pipeline, what: str) -> KitRun | None:
        try:
            run = kit_request(pipeline)
        except OmniError as exc:
            self.problem(f"{what} failed: {type(exc).__name__}: {exc}")
            return None
        if run.words != expected_words():
            self.problem(f"{what} answered {run.words!r:.200}, not {expected_words()!r}")
            return None
        for stage in STAGES:
            handle = pipeline.stages[stage]
            pid = run.facts.get(stage, {}).get("pid")
            if handle.pid is not None and handle.pid != pid:
                self.problem(
                    f"stage {stage!r}: its handle's pid is {handle.pid}, but the stage runs in pid {pid}: the "
                    "messages about the stage (where()) would name the wrong process"
                )
        return run

    def handles(self, pipeline: Pipeline) -> None:
        for stage, handle in pipeline.stages.items():
            if not handle.alive():
                self.problem(f"stage {stage!r} reported ready, but its handle's alive() is False")
            for attr, kind in (("noun", str), ("restartable", bool)):
                if not isinstance(getattr(handle, attr, None), kind):
                    self.problem(f"stage {stage!r}: its handle's {attr} is not a {kind.__name__}")
            where = handle.where()
            if not isinstance(where, str):
                self.problem(f"stage {stage!r}: its handle's where() returned a {type(where).__name__}, not a str")

    def restart(self, pipeline: Pipeline) -> None:
        """Kill the downstream stage; the orchestrator must see it dead and bring it back."""
        stage = STAGES[1]
        old = pipeline.stages[stage]
        if not old.restartable:
            return
        old.kill()
        if not _wait(lambda: not old.alive(), SETTLE_S):
            self.problem(f"stage {stage!r}: alive() is still True {SETTLE_S:g} s after kill()")
            return
        reason = old.exit_reason()
        if not (isinstance(reason, str) and reason.strip()):
            self.problem(f"stage {stage!r}: exit_reason() of a killed stage is {reason!r}, not words")
        bound = float(STAGE_DEFAULTS["startup_timeout"]) + SETTLE_S

        def settled() -> bool:
            state = pipeline.state.get(stage, "")
            return state.startswith("down") or (pipeline.stages[stage] is not old and state == "ready")

        if not (_wait(settled, bound) and pipeline.state.get(stage) == "ready"):
            self.problem(
                f"stage {stage!r} was killed and is not back within {bound:g} s (its state: "
                f"{pipeline.state.get(stage)!r}); the orchestrator restarts a restartable stage with a new handle "
                "from launch(), which must start like the first"
            )
            return
        self.request(pipeline, "a request after the stage was killed and restarted")


def _close(pipeline: Pipeline) -> bool:
    """Close the pipeline, waiting a bounded time; whether it returned."""
    closer = threading.Thread(target=pipeline.close, name="omni-kit-close", daemon=True)
    closer.start()
    closer.join(float(STAGE_DEFAULTS["shutdown_timeout"]) + SETTLE_S)
    return not closer.is_alive()


def run_problems(name: str, obj: type[StageExecutor]) -> list[str]:
    """Run the kit's pipeline on the executor class ``obj`` registered as ``name``."""
    check = _Check(name)
    ref = f"{obj.__module__}:{obj.__qualname__}"
    if "<locals>" in obj.__qualname__ or obj.__module__ == "__main__":
        return [f"{check.label}: {ref} cannot be imported by its reference; define the class at a module's top level"]
    with kit_transport() as site:
        try:
            pipeline = _start(name, ref, None, site, kit_placement(name))
        except OmniError as exc:
            text = f"the kit's pipeline did not start on it: {type(exc).__name__}: {exc}"
            if KIT_CONNECTOR in str(exc):
                text += (
                    f" (the kit's connector {KIT_CONNECTOR!r} is registered by a plugin on this process's sys.path: "
                    "the stages must see this process's sys.path, e.g. as PYTHONPATH, so that they load the plugins "
                    "and modules the orchestrator sees)"
                )
            return [f"{check.label}: {text}"]
        seen: list[tuple[str, StageHandle]] = list(pipeline.stages.items())
        try:
            check.handles(pipeline)
            if check.request(pipeline, "a request through both stages") is not None:
                check.restart(pipeline)
        except Exception as exc:
            check.problem(f"the check stopped: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}")
        finally:
            seen += [(stage, h) for stage, h in pipeline.stages.items() if all(h is not s for _, s in seen)]
            closed = _close(pipeline)
        if not closed:
            check.problem(
                f"the pipeline did not close within {float(STAGE_DEFAULTS['shutdown_timeout']) + SETTLE_S:g} s: a "
                "handle's stop(timeout) must return once the timeout has passed, ending the stage by force"
            )
            return check.problems
        for stage, handle in seen:
            if handle.alive():
                check.problem(
                    f"stage {stage!r}{handle.where()}: alive() is still True after the pipeline closed; stop(timeout) "
                    "ends the stage, by force once the timeout has passed"
                )
                with contextlib.suppress(Exception):
                    handle.kill()
    return check.problems


def executor_problems(name: str, ref: str, obj: Any) -> list[str]:
    """Every executor check for the class ``obj`` registered as ``name`` (``ref``)."""
    problems = class_problems(name, ref, obj)
    if problems:
        return problems
    return run_problems(name, obj)
