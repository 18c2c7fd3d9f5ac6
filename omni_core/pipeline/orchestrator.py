"""The orchestrator: starts a pipeline's stages and sends each request through the graph.

::

    pipeline = Pipeline(resolved)          # resolve_pipeline(...) validated it; nothing runs yet
    pipeline.start()                       # every stage loaded and ready, or PipelineStartError
    stream = pipeline.submit("Hello")      # a RequestStream: items as the final stages make them
    for out in stream: ...                 # StageOutput(stage, modality, items)
    result = pipeline.run("Hello")         # or everything at once: PipelineResult
    pipeline.close()                       # no process, port or shared-memory segment left

Routing is the orchestrator's alone: a stage puts its items on each edge's connector and tells
the orchestrator the handle; the orchestrator forwards it to the next stage (or reads it, for a
final output). Connectors only move bytes.

Nothing waits without a bound: start-up (each stage's ``startup_timeout``), a request in a
stage (``request_timeout``, counted from when the stage begins it), a cancelled request the
stage does not let go of (``shutdown_timeout``, then the stage process is restarted), a put or
get (the edge's ``transfer_timeout``) and shutdown.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omni_core.errors import (
    EngineFailedError,
    OmniError,
    PipelineStartError,
    RequestCancelled,
    ServerBusyError,
    StageFailedError,
    StageRequestError,
)
from omni_core.pipeline.connector import ConnectorContext
from omni_core.pipeline.executor import StageExecutor, StageHandle, builtin_executor
from omni_core.pipeline.topology import OUTPUT

if TYPE_CHECKING:
    from omni_core.pipeline.connector import Connector
    from omni_core.pipeline.placement import ResolvedPipeline, ResolvedStage

_POLL = 0.2
#: stage states that pass by themselves: new requests wait for them (bounded) instead of failing
_PASSING = ("starting", "restarting", "draining")


@dataclass
class StageOutput:
    """Items a final stage produced for a request: one chunk, as its edge to the output carried it."""

    stage: str
    modality: str
    items: list[Any]


@dataclass
class PipelineResult:
    request_id: str
    #: modality -> every item, in order
    outputs: dict[str, list[Any]]
    #: stage -> seconds from the stage beginning the request to finishing it
    stage_seconds: dict[str, float]
    #: seconds from submit to the first output item, and to the end
    first_output_s: float | None
    total_s: float
    #: how the answer ended (:attr:`RequestStream.finish_reason`): ``stop`` or ``length``
    finish_reason: str = "stop"
    #: stage -> how its part of the answer ended, for the stages that ran
    finish_reasons: dict[str, str] = field(default_factory=dict)


# -- requests -------------------------------------------------------------------------------------


@dataclass
class _Flight:
    """One request on its way through the graph."""

    rid: str
    plan: dict[str, tuple[str, ...]]
    events: queue.Queue[StageOutput | BaseException | None] = field(default_factory=queue.Queue)
    pending: set[str] = field(default_factory=set)
    open_outputs: set[str] = field(default_factory=set)
    begun: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    #: stage -> how its answer ended (``stop``, ``length``), as each stage reports it when done
    finish_reasons: dict[str, str] = field(default_factory=dict)
    submitted: float = field(default_factory=time.monotonic)
    first_output: float | None = None
    finished: bool = False
    #: chunks forwarded on an edge and not yet taken: (source, target) -> count; credited back
    #: to the producer if the request fails, so a failed request never starves an edge
    outstanding: dict[tuple[str, str], int] = field(default_factory=dict)
    #: stages told to cancel that have not let go yet: stage -> when to give up on them
    letting_go: dict[str, float] = field(default_factory=dict)


def _stop_quietly(handle: Any, timeout: float) -> None:
    """Stop one stage at shutdown; a handle that fails to is killed (nothing is left running)."""
    try:
        handle.stop(timeout)
    except Exception:
        try:
            handle.kill()
        except Exception:
            pass


class RequestStream:
    """The outputs of one request, as the final stages make them. Iterate for
    :class:`StageOutput` chunks; :meth:`result` collects them all. Closing the stream early
    cancels the request everywhere it still runs."""

    def __init__(self, pipeline: Pipeline, flight: _Flight) -> None:
        self._pipeline = pipeline
        self._flight = flight
        self.request_id = flight.rid

    def __iter__(self) -> Iterator[StageOutput]:
        try:
            while True:
                try:
                    event = self._flight.events.get(timeout=_POLL)
                except queue.Empty:
                    continue
                if event is None:
                    return
                if isinstance(event, BaseException):
                    raise event
                yield event
        except GeneratorExit:
            self.cancel()
            raise

    def cancel(self) -> None:
        self._pipeline.cancel(self.request_id)

    @property
    def stage_seconds(self) -> dict[str, float]:
        """Stage -> seconds from it beginning the request to finishing it, for the stages done so far."""
        return dict(self._flight.seconds)

    @property
    def finish_reasons(self) -> dict[str, str]:
        """Stage -> how its part of the answer ended (``stop`` or ``length``, what its engine's
        ``run`` returned), for the stages done so far."""
        return dict(self._flight.finish_reasons)

    @property
    def finish_reason(self) -> str:
        """How the answer ended, once the stream is exhausted: ``length`` when a stage stopped
        because its token budget (``max_tokens``) ran out, so the answer is cut short; else
        ``stop``. The chat route's ``finish_reason``."""
        return "length" if "length" in self._flight.finish_reasons.values() else "stop"

    def result(self) -> PipelineResult:
        outputs: dict[str, list[Any]] = {}
        for chunk in self:
            outputs.setdefault(chunk.modality, []).extend(chunk.items)
        f = self._flight
        return PipelineResult(
            request_id=f.rid,
            outputs=outputs,
            stage_seconds=dict(f.seconds),
            first_output_s=None if f.first_output is None else f.first_output - f.submitted,
            total_s=time.monotonic() - f.submitted,
            finish_reason=self.finish_reason,
            finish_reasons=dict(f.finish_reasons),
        )


# -- the orchestrator -----------------------------------------------------------------------------


class Pipeline:
    """A resolved pipeline, running."""

    def __init__(self, resolved: ResolvedPipeline, *, plugins: Any = None) -> None:
        from omni_core.plugins import get_plugins

        self.resolved = resolved
        self.plugins = plugins if plugins is not None else get_plugins()
        self.stages: dict[str, StageHandle] = {}
        #: stage -> "starting" | "ready" | "restarting" | "down: <why>"
        self.state: dict[str, str] = {}
        self.restarts: dict[str, int] = {s.name: 0 for s in resolved.stages}
        self.flights: dict[str, _Flight] = {}
        self.connectors: dict[str, Connector] = {}
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._ready = threading.Condition(self._lock)
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None
        #: failed requests whose stages were told to drop them and have not said so yet, by id
        self._letting_go: dict[str, _Flight] = {}
        #: placement name -> the executor that launches its stages
        self.executors: dict[str, StageExecutor] = {}
        self.hops = 0  # messages routed: for overhead figures

    # -- start and stop ---------------------------------------------------------------------------

    def start(self) -> Pipeline:
        """Launch every stage and wait until each reports ready (bounded by its startup_timeout);
        on any failure stop what started and raise :class:`PipelineStartError`. Once only."""
        if self.stages:
            raise RuntimeError("this pipeline is already started")
        for edge in self.resolved.edges:
            if edge.target == OUTPUT or self.resolved.process_of(edge.source) == "orchestrator":
                self._connector(edge.connector, edge.connector_name, edge.extra)
        # the orchestrator owns the run: its instance of every connector used anywhere reclaims
        # what a crashed stage left behind
        for edge in self.resolved.edges:
            self._connector(edge.connector, edge.connector_name, edge.extra)
        try:
            for stage in self.resolved.stages:
                self._launch(stage)
            for stage in self.resolved.stages:
                self._await_ready(stage)
        except BaseException:
            self.close()
            raise
        self._watchdog = threading.Thread(target=self._watch, name="omni-pipeline-watchdog", daemon=True)
        self._watchdog.start()
        return self

    def _connector(self, connector: str, label: str, extra: dict[str, Any]) -> Connector:
        if label not in self.connectors:
            cls = self.plugins.connectors.load(connector)
            context = ConnectorContext(run_id=self.resolved.run_id, owner="orchestrator", is_owner=True)
            self.connectors[label] = cls(extra, context)
        return self.connectors[label]

    def _executor(self, placement: str) -> StageExecutor:
        if placement not in self.executors:
            cls = builtin_executor(placement) or self.plugins.executors.load(placement)
            self.executors[placement] = cls(self.resolved.executors.get(placement, {}), self.resolved, self.plugins)
        return self.executors[placement]

    def _launch(self, stage: ResolvedStage) -> None:
        handle = self._executor(stage.placement).launch(stage.name)
        with self._lock:
            self.stages[stage.name] = handle
            self.state[stage.name] = "starting"
        handle.start()
        threading.Thread(
            target=self._read, args=(stage.name, handle), name=f"omni-read-{stage.name}", daemon=True
        ).start()

    def _await_ready(self, stage: ResolvedStage) -> None:
        deadline = time.monotonic() + stage.startup_timeout
        with self._ready:
            while self.state[stage.name] == "starting":
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PipelineStartError(
                        f"stage {stage.name!r} did not report ready within its startup_timeout "
                        f"({stage.startup_timeout:g} s); raise pipeline.stages.{stage.name}.startup_timeout in the "
                        "recipe if its model takes longer to load",
                        name=stage.name,
                    )
                self._ready.wait(min(left, _POLL))
            state = self.state[stage.name]
        if state != "ready":
            raise PipelineStartError(
                f"stage {stage.name!r} failed to start: {state.removeprefix('down: ')}", name=stage.name
            )

    def close(self) -> None:
        """Stop every stage (bounded), fail what is still in flight, free every connector's
        resources. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            flights = list(self.flights.values())
        for flight in flights:
            self._fail(flight, RequestCancelled(f"request {flight.rid} was cancelled: the pipeline is shutting down"))
        # every stage at once: a pipeline stops in its slowest stage's time, not in their sum
        stoppers = [
            threading.Thread(
                target=_stop_quietly, args=(handle, self.resolved.stage(name).shutdown_timeout), daemon=True
            )
            for name, handle in list(self.stages.items())
        ]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join()
        for executor in self.executors.values():
            try:
                executor.close()
            except Exception:
                pass
        for connector in self.connectors.values():
            try:
                connector.close()
            except Exception:
                pass

    def __enter__(self) -> Pipeline:
        return self if self.stages else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ---------------------------------------------------------------------------------

    def submit(
        self,
        request_input: Any,
        *,
        params: dict[str, dict[str, Any]] | None = None,
        outputs: tuple[str, ...] | None = None,
        request_id: str | None = None,
    ) -> RequestStream:
        """Send one request into the graph. ``params`` are per stage; ``outputs`` the modalities
        wanted (None: all), which decides where the request stops."""
        from omni_core.errors import PipelineConfigError

        if self._closed.is_set():
            raise EngineFailedError("this pipeline is closed")
        try:
            plan = self.resolved.topology.plan(outputs)
        except ValueError as exc:
            raise PipelineConfigError(str(exc), field="outputs") from None
        unknown = sorted(set(params or {}) - set(self.resolved.topology.names))
        if unknown:
            raise PipelineConfigError(
                f"params name stage(s) {unknown} this pipeline does not have; its stages are "
                f"{self.resolved.topology.names}",
                field="params",
            )
        asked = tuple(self.resolved.topology.modalities) if outputs is None else tuple(outputs)
        rid = request_id or f"r{next(self._ids)}"
        with self._lock:
            for name in plan:
                self._check_serving(name)
            if len(self.flights) >= self.resolved.max_requests:
                raise ServerBusyError(
                    f"{len(self.flights)} requests are in the pipeline, its max_requests; retry shortly or raise "
                    "pipeline.max_requests"
                )
            if rid in self.flights:
                raise ValueError(f"request id {rid!r} is already in flight")
            flight = _Flight(rid, plan, pending=set(plan), open_outputs={s for s, t in plan.items() if OUTPUT in t})
            self.flights[rid] = flight
            entry = self.resolved.topology.entry.name
            for name in reversed(list(plan)):  # downstream first: a chunk never beats its start
                message: dict[str, Any] = {
                    "op": "start",
                    "rid": rid,
                    "params": (params or {}).get(name, {}),
                    "outputs": list(asked),
                    "targets": list(plan[name]),
                }
                if name == entry:
                    message["input"] = request_input
                self._send(name, message)
        return RequestStream(self, flight)

    def run(self, request_input: Any, **options: Any) -> PipelineResult:
        """:meth:`submit` and wait for everything."""
        return self.submit(request_input, **options).result()

    def cancel(self, rid: str) -> None:
        with self._lock:
            flight = self.flights.get(rid)
        if flight is not None:
            self._fail(flight, RequestCancelled(f"request {rid} was cancelled"))

    def _check_serving(self, name: str) -> None:
        state = self.state.get(name, "down")
        if state in _PASSING:  # wait (bounded) for it to let go of a failed request or to restart
            stage = self.resolved.stage(name)
            deadline = time.monotonic() + stage.shutdown_timeout + stage.startup_timeout
            while self.state[name] in _PASSING and time.monotonic() < deadline:
                self._ready.wait(_POLL)
            state = self.state[name]
        if state != "ready":
            raise EngineFailedError(
                f"stage {name!r} is down ({state.removeprefix('down: ')}); the pipeline cannot serve requests "
                "that need it until it is restarted",
                name=name,
            )

    def _send(self, name: str, message: dict[str, Any]) -> None:
        try:
            self.stages[name].channel.send(message)
        except (OSError, ValueError, EOFError):
            pass  # the reader sees the stage gone and fails its requests

    # -- events from the stages -------------------------------------------------------------------

    def _read(self, name: str, handle: StageHandle) -> None:
        while True:
            try:
                message = handle.channel.recv(_POLL)
            except EOFError:
                break
            if message is None:
                if handle.alive():
                    continue
                try:  # the process is gone: drain what it sent before dying
                    message = handle.channel.recv(0)
                except EOFError:
                    break
                if message is None:
                    break
            try:
                self._on_event(name, message)
            except Exception as exc:
                flight = self.flights.get(message.get("rid", ""))
                if flight is not None:
                    self._fail(flight, StageFailedError(f"stage {name!r}: {type(exc).__name__}: {exc}", name=name))
        if not self._closed.is_set() and self.stages.get(name) is handle:
            self._stage_died(name, handle)

    def _on_event(self, name: str, message: dict[str, Any]) -> None:
        ev = message.get("ev")
        if ev == "ready":
            with self._ready:
                self.state[name] = "ready"
                self._ready.notify_all()
            return
        if ev == "failed":
            error = message.get("error") or {}
            with self._ready:
                self.state[name] = f"down: {error.get('type')}: {error.get('message')}"
                self._ready.notify_all()
            return
        flight = self.flights.get(message.get("rid", ""))
        if flight is None:
            dropped = self._letting_go.get(message.get("rid", ""))
            if dropped is not None and ev in ("done", "error"):  # it let go of a failed request
                self._let_go(dropped, name)
            elif ev == "chunk" and message.get("handle") is not None:
                self._drop_chunk(name, message)
            return
        self.hops += 1
        if ev == "begin":
            flight.begun[name] = time.monotonic()
        elif ev == "chunk":
            self._on_chunk(name, flight, message)
        elif ev == "taken":
            key = (message["source"], name)
            flight.outstanding[key] = flight.outstanding.get(key, 0) - 1
            self._send(message["source"], {"op": "credit", "target": name})
        elif ev == "done":
            flight.seconds[name] = time.monotonic() - flight.begun.get(name, flight.submitted)
            flight.finish_reasons[name] = str(message.get("finish_reason") or "stop")
            flight.pending.discard(name)
            self._maybe_finish(flight)
        elif ev == "error":
            error = message.get("error") or {}
            flight.pending.discard(name)  # it has let go of the request already
            if str(error.get("http_status", "")).startswith("4"):
                refused = f"stage {name!r} refused the request: {error.get('message')}"
                self._fail(flight, StageRequestError(refused, name=name, field=error.get("field")))
                return
            self._fail(
                flight,
                StageFailedError(
                    f"stage {name!r} failed on request {flight.rid}: {error.get('type')}: {error.get('message')}",
                    name=name,
                ),
            )

    def _on_chunk(self, name: str, flight: _Flight, message: dict[str, Any]) -> None:
        target = message["target"]
        if target != OUTPUT:
            if message.get("handle") is not None:
                key = (name, target)
                flight.outstanding[key] = flight.outstanding.get(key, 0) + 1
            self._send(
                target,
                {
                    "op": "chunk",
                    "rid": flight.rid,
                    "source": name,
                    "handle": message.get("handle"),
                    "last": bool(message.get("last")),
                },
            )
            return
        edge = self.resolved.edge(name, OUTPUT)
        items: list[Any] = []
        if message.get("handle") is not None:
            connector = self.connectors[edge.connector_name]
            items = connector.get(edge.edge, flight.rid, message["handle"], timeout=edge.transfer_timeout)
            self._send(name, {"op": "credit", "target": OUTPUT})
        if items:
            if flight.first_output is None:
                flight.first_output = time.monotonic()
            flight.events.put(StageOutput(name, self.resolved.stage(name).final or "", list(items)))
        if message.get("last"):
            flight.open_outputs.discard(name)
            self._maybe_finish(flight)

    def _maybe_finish(self, flight: _Flight) -> None:
        with self._lock:
            if flight.finished or flight.pending or flight.open_outputs:
                return
            flight.finished = True
            self.flights.pop(flight.rid, None)
        flight.events.put(None)

    def _fail(self, flight: _Flight, error: OmniError) -> None:
        """End a request with ``error``: tell its stages to drop it, free its payloads."""
        with self._lock:
            if flight.finished:
                return
            flight.finished = True
            self.flights.pop(flight.rid, None)
            now = time.monotonic()
            for name in flight.pending:
                if name in flight.begun:  # it must let go within its shutdown_timeout
                    flight.letting_go[name] = now + self.resolved.stage(name).shutdown_timeout
            if flight.letting_go:  # registered with the flight's removal: a late "done" finds it
                self._letting_go[flight.rid] = flight
                for name in flight.letting_go:  # no new work for it until it lets go or restarts
                    if self.state.get(name) == "ready":
                        self.state[name] = "draining"
            for name in flight.pending:
                self._send(name, {"op": "cancel", "rid": flight.rid})
            for (source, target), count in flight.outstanding.items():
                for _ in range(max(count, 0)):
                    self._send(source, {"op": "credit", "target": target})
        for connector in self.connectors.values():
            try:
                connector.cleanup(flight.rid)
            except Exception:
                pass
        flight.events.put(error)

    def _let_go(self, flight: _Flight, name: str) -> None:
        """Stage ``name`` dropped a failed request: it may take new work again."""
        with self._ready:
            flight.letting_go.pop(name, None)
            if not flight.letting_go:
                self._letting_go.pop(flight.rid, None)
            still = any(name in f.letting_go for f in self._letting_go.values())
            if not still and self.state.get(name) == "draining":
                self.state[name] = "ready"
                self._ready.notify_all()

    def _drop_chunk(self, name: str, message: dict[str, Any]) -> None:
        """A chunk put for a request that has already failed: free it and give the producer its
        credit back."""
        edge = self.resolved.edge(name, message["target"])
        try:
            self.connectors[edge.connector_name].cleanup(message["rid"])
        except Exception:
            pass
        self._send(name, {"op": "credit", "target": message["target"]})

    # -- faults -----------------------------------------------------------------------------------

    def _stage_died(self, name: str, handle: StageHandle) -> None:
        reason = handle.exit_reason()
        pid = handle.where()
        with self._ready:
            victims = [f for f in self.flights.values() if name in f.pending]
            stage = self.resolved.stage(name)
            was = self.state.get(name, "")
            if was == "starting":  # it never came up: the start fails, nothing to restart
                self.state[name] = f"down: its {handle.noun}{pid} {reason} before it was ready"
                self._ready.notify_all()
                return
            if was.startswith("down"):  # it reported why it failed before it ended
                return
            restart = self.restarts[name] < stage.max_restarts and handle.restartable
            self.state[name] = "restarting" if restart else f"down: its {handle.noun}{pid} {reason}"
            self._ready.notify_all()
        for flight in victims:
            self._fail(
                flight,
                StageFailedError(
                    f"stage {name!r}{pid} {reason} while running request {flight.rid}; "
                    + ("it is being restarted" if restart else "it is not restarted again (max_restarts reached)"),
                    name=name,
                ),
            )
        if restart and not self._closed.is_set():
            self.restarts[name] += 1
            try:
                self._launch(stage)
                self._await_ready(stage)
            except OmniError as exc:
                with self._ready:
                    self.state[name] = f"down: restart failed: {exc.message}"
                    self._ready.notify_all()

    def _watch(self) -> None:
        """Deadlines: a request past a stage's request_timeout fails; a stage that does not let go
        of a cancelled request within its shutdown_timeout is restarted."""
        while not self._closed.wait(_POLL):
            now = time.monotonic()
            with self._lock:
                flights = list(self.flights.values())
                stuck = list(self._letting_go.values())
            for flight in flights:
                for name, began in list(flight.begun.items()):
                    if name in flight.pending and now - began > self.resolved.stage(name).request_timeout:
                        limit = self.resolved.stage(name).request_timeout
                        self._fail(
                            flight,
                            StageFailedError(
                                f"stage {name!r} ran past its request_timeout ({limit:g} s) on request {flight.rid}; "
                                f"raise pipeline.stages.{name}.request_timeout in the recipe if it needs longer",
                                name=name,
                            ),
                        )
                        break
            for flight in stuck:
                for name, deadline in list(flight.letting_go.items()):
                    if now > deadline:
                        flight.letting_go.pop(name)
                        handle = self.stages.get(name)
                        if handle is not None and handle.restartable:
                            handle.kill()  # its reader sees it gone and restarts it
                        else:
                            with self._ready:
                                self.state[name] = (
                                    f"down: it did not let go of request {flight.rid} within its shutdown_timeout, "
                                    "and a stage in the orchestrator's process cannot be restarted (place it in a "
                                    "process to have it restarted)"
                                )
                                self._ready.notify_all()
                if not flight.letting_go:
                    with self._lock:
                        self._letting_go.pop(flight.rid, None)

    def health(self) -> dict[str, Any]:
        return {
            "ok": all(s == "ready" for s in self.state.values()),
            "stages": dict(self.state),
            "restarts": dict(self.restarts),
            "in_flight": len(self.flights),
            "connectors": {k: c.health() for k, c in self.connectors.items()},
        }
