"""A stage: its engine contract, and the loop that runs it in its own process or thread.

A model plugin writes one :class:`StageEngine` per stage and names it in the topology
(``StageDef.engine``). The runtime builds it in the process that runs the stage::

    engine = MyStage(model_dir, stage, options)      # load weights here
    for item in engine.run(inputs, params): ...      # once per request; may return how it ended
    engine.close()

``inputs`` is an iterator over the upstream stage's items (the request's input, as a single
item, for the entry stage). It yields items as they arrive, so a stage that consumes them one
by one starts before its upstream has finished: how many items travel together is the edge's
``window``, which changes *when* items arrive, never *what* a stage computes from them.

``params`` is a :class:`StageParams`: the request's parameters for this stage (a dict), and
``params.outputs``, the modalities the request asked of the whole pipeline. ``run`` may
``return`` how the answer ended (:data:`FinishReason`): ``"length"`` when it stopped because
its token budget (``max_tokens``) ran out, ``"stop"`` (the same as returning nothing) when it
ended by itself (an end-of-sequence token, a stop string).

The loop (:func:`run_stage`) speaks to the orchestrator through a :class:`Channel` of small
messages (dicts of plain values, handles included); payloads travel through the edges'
connectors. Messages, orchestrator to stage:

* ``start {rid, params, outputs, targets, input?}``: queue a request (``outputs``: the
  modalities the request asked for; ``targets``: where this stage's items go; ``input``: the
  request's input, for the entry stage)
* ``chunk {rid, source, handle | None, last}``: a chunk of items arrived on an input edge
* ``credit {target}``: one chunk this stage put towards ``target`` was taken (backpressure)
* ``cancel {rid}``, ``stop``

and stage to orchestrator: ``ready``, ``failed {error}`` (at start-up), ``begin {rid}``,
``chunk {rid, target, handle | None, items, last}``, ``taken {rid, source}``,
``done {rid, finish_reason}``, ``error {rid, error}``.
"""

from __future__ import annotations

import abc
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, get_args

from omni_core.errors import ModelRuntimeError, RequestCancelled
from omni_core.pipeline.connector import ConnectorContext, Edge
from omni_core.pipeline.topology import OUTPUT

if TYPE_CHECKING:
    from omni_core.pipeline.connector import Connector
    from omni_core.pipeline.placement import ResolvedPipeline, ResolvedStage

Message = dict[str, Any]
#: how a stage's answer to a request ended, what its engine's ``run`` returns: ``stop``, it
#: ended by itself (an end-of-sequence token, a stop string; also what returning nothing
#: means), or ``length``, its token budget (``max_tokens``) ran out. The chat route's and
#: ``omni chat``'s ``finish_reason``
FinishReason = Literal["stop", "length"]
FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)


def finish_reason(returned: Any, stage: str) -> str:
    """How an answer ended, from what the engine's ``run`` returned: nothing means ``"stop"``;
    anything but a :data:`FinishReason` fails the request, naming the stage."""
    if returned is None:
        return "stop"
    if returned not in FINISH_REASONS:
        raise ModelRuntimeError(
            f"stage {stage!r}: its engine's run returned {returned!r}; "
            f"a run returns how the answer ended, one of {', '.join(FINISH_REASONS)}, or nothing"
        )
    return str(returned)


class StageParams(dict[str, Any]):
    """One request's parameters for one stage: the dict the request sent the stage (what an
    engine reads, checks and refuses), plus what the request asked of the pipeline as a whole.

    ``outputs`` are the modalities the request asked for (``("text",)``, ``("text", "audio")``):
    a stage may prepare for them, as Qwen2.5-Omni's thinker adds the system prompt its talker
    needs to speak only when audio is asked for. It is an attribute, not a key, so an engine
    that refuses keys it does not take never sees it."""

    def __init__(self, values: Mapping[str, Any] | None = None, *, outputs: Iterable[str] = ()) -> None:
        super().__init__(values or {})
        self.outputs: tuple[str, ...] = tuple(outputs)


class StageEngine(abc.ABC):
    """One stage's model, loaded in the process that runs the stage."""

    #: the engine starts processes of its own (vLLM's engine core and workers). Its stage
    #: process is then started non-daemonic (a daemonic process may not have children) and in
    #: a process group of its own, which the runtime kills whole when it stops or kills the
    #: stage. Read from registered stage engines (their classes are import-light).
    starts_processes: ClassVar[bool] = False

    def __init__(self, model_dir: Path, stage: ResolvedStage, options: dict[str, Any]) -> None:
        self.model_dir = Path(model_dir)
        self.stage = stage
        self.options = options

    @abc.abstractmethod
    def run(self, inputs: Iterator[Any], params: dict[str, Any]) -> Iterator[Any]:
        """Consume ``inputs`` (items of the upstream stage) and yield this stage's items for one
        request. ``params`` are the request's parameters for this stage, a :class:`StageParams`
        (``params.outputs``: the modalities the request asked for). A generator may ``return``
        how the answer ended, a :data:`FinishReason` (``"length"``: its token budget ran out;
        nothing is ``"stop"``). Raising fails the request (the stage keeps serving others)."""

    @classmethod
    def option_problems(cls, options: dict[str, Any]) -> list[str]:
        """What is wrong with a stage's ``engine_options`` for this engine (empty: nothing). A
        registered stage engine is asked before any process starts, so a misspelt option is
        one clear error, not a stage that fails to load; keep it import-light or import the
        engine's library inside. Default: every option is accepted."""
        return []

    def for_output(self, item: Any) -> Any:
        """What a client gets of one item, when this stage is final: called in the stage's own
        process, only for the edge to the output (downstream stages still get ``item``). Text
        answers ``str`` pieces (a stage that emits token ids for its downstream stages
        detokenizes here); audio answers 1-D float arrays or tensors of samples at the stage's
        ``sample_rate``. Default: the item as it is."""
        return item

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model."""


class Channel(Protocol):
    """One direction-pair of messages between the orchestrator and a stage."""

    def send(self, message: Message) -> None: ...

    def recv(self, timeout: float) -> Message | None:
        """The next message, None when ``timeout`` passes; raises EOFError when the peer is gone."""

    def close(self) -> None: ...


class QueueChannel:
    """A channel between threads of one process."""

    def __init__(self, inbox: queue.Queue[Message | None], outbox: queue.Queue[Message | None]) -> None:
        self._in, self._out = inbox, outbox

    @classmethod
    def pair(cls) -> tuple[QueueChannel, QueueChannel]:
        a: queue.Queue[Message | None] = queue.Queue()
        b: queue.Queue[Message | None] = queue.Queue()
        return cls(a, b), cls(b, a)

    def send(self, message: Message) -> None:
        self._out.put(message)

    def recv(self, timeout: float) -> Message | None:
        try:
            message = self._in.get(timeout=timeout)
        except queue.Empty:
            return None
        if message is None:
            raise EOFError
        return message

    def close(self) -> None:
        self._out.put(None)


class PipeChannel:
    """A channel over a ``multiprocessing`` connection; messages are encoded with the payload
    codec (never pickle)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, message: Message) -> None:
        from omni_core.pipeline.payload import dumps

        data = dumps(message)
        with self._lock:
            self._conn.send_bytes(data)

    def recv(self, timeout: float) -> Message | None:
        from omni_core.pipeline.payload import loads

        try:
            if not self._conn.poll(timeout):
                return None
            data = self._conn.recv_bytes()
        except (OSError, EOFError):
            raise EOFError from None
        message: Message = loads(data)
        return message

    def close(self) -> None:
        try:
            self._conn.close()
        except OSError:
            pass


def error_info(exc: BaseException) -> dict[str, str]:
    """An exception as plain values, for a message."""
    from omni_core.errors import OmniError

    info = {"type": type(exc).__name__, "message": str(exc) or type(exc).__name__}
    if isinstance(exc, OmniError):  # the caller's own mistake (a 4xx) stays one across processes
        info["http_status"] = str(exc.http_status)
        if exc.field:
            info["field"] = exc.field
    else:  # a plugin's own failure: keep where it happened, for logs
        info["trace"] = "".join(traceback.format_exception(exc)[-6:])
    return info


class _Request:
    """One request inside a stage: its input chunks as they arrive, and where its items go."""

    def __init__(self, rid: str, params: StageParams, targets: list[str], initial: Any, has_input: bool) -> None:
        self.rid = rid
        self.params = params
        self.targets = targets
        self.chunks: queue.Queue[Message] = queue.Queue()
        self.cancelled = threading.Event()
        if has_input:
            self.chunks.put({"items": [initial], "last": True})


class StageLoop:
    """Runs one stage: receives messages, runs requests one at a time on a worker thread, moves
    items through the connectors. Used as is by a stage process (:func:`stage_process_main`)
    and by an in-process stage's thread."""

    def __init__(self, pipeline: ResolvedPipeline, name: str, channel: Channel, *, plugins: Any = None) -> None:
        self.pipeline = pipeline
        self.stage = pipeline.stage(name)
        self.channel = channel
        self.plugins = plugins
        self.requests: dict[str, _Request] = {}
        self.order: queue.Queue[_Request | None] = queue.Queue()
        self.connectors: dict[str, Connector] = {}
        self.credits: dict[str, threading.Semaphore] = {}
        self.engine: StageEngine | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    # -- set-up ----------------------------------------------------------------------------------

    def _connector(self, connector: str, label: str, extra: dict[str, Any]) -> Connector:
        if label not in self.connectors:
            from omni_core.plugins import get_plugins

            plugins = self.plugins if self.plugins is not None else get_plugins()
            cls = plugins.connectors.load(connector)
            context = ConnectorContext(run_id=self.pipeline.run_id, owner=self.stage.name)
            self.connectors[label] = cls(extra, context)
        return self.connectors[label]

    def open(self) -> None:
        """Build the connectors of the stage's edges and load its engine."""
        from omni_core.lazy import LazyRef

        for edge in [*self.pipeline.edges_into(self.stage.name), *self.pipeline.edges_from(self.stage.name)]:
            self._connector(edge.connector, edge.connector_name, edge.extra)
        for edge in self.pipeline.edges_from(self.stage.name):
            self.credits[edge.target] = threading.Semaphore(edge.max_inflight)
        cls = LazyRef(self.stage.engine, owner=f"stage {self.stage.name}").resolve()
        self.engine = cls(Path(self.pipeline.model_dir), self.stage, dict(self.stage.engine_options))

    # -- the loop --------------------------------------------------------------------------------

    def serve(self) -> None:
        """Report ready, then handle messages until ``stop`` or the orchestrator is gone."""
        try:
            self.open()
        except BaseException as exc:
            self.channel.send({"ev": "failed", "error": error_info(exc)})
            self.close()
            return
        worker = threading.Thread(target=self._work, name=f"omni-stage-{self.stage.name}", daemon=True)
        worker.start()
        self.channel.send({"ev": "ready", "pid": os.getpid()})
        try:
            while not self._stopping.is_set():
                try:
                    message = self.channel.recv(0.5)
                except EOFError:
                    break
                if message is not None:
                    self._handle(message)
        finally:
            self._stopping.set()
            for request in list(self.requests.values()):
                request.cancelled.set()
                request.chunks.put({"cancel": True})
            self.order.put(None)
            worker.join(self.stage.shutdown_timeout)
            self.close()

    def _handle(self, message: Message) -> None:
        op = message.get("op")
        if op == "start":
            rid = message["rid"]
            params = StageParams(message.get("params"), outputs=message.get("outputs") or ())
            request = _Request(rid, params, list(message["targets"]), message.get("input"), "input" in message)
            with self._lock:
                self.requests[rid] = request
            self.order.put(request)
        elif op == "chunk":
            request_or_none = self.requests.get(message["rid"])
            if request_or_none is not None:
                request_or_none.chunks.put(message)
        elif op == "credit":
            semaphore = self.credits.get(message["target"])
            if semaphore is not None:
                semaphore.release()
        elif op == "cancel":
            request_or_none = self.requests.get(message["rid"])
            if request_or_none is not None:
                request_or_none.cancelled.set()
                request_or_none.chunks.put({"cancel": True})
            self._cleanup(message["rid"])
        elif op == "stop":
            self._stopping.set()

    def _work(self) -> None:
        while True:
            request = self.order.get()
            if request is None:
                return
            if request.cancelled.is_set():
                self._forget(request.rid)
                continue
            self.channel.send({"ev": "begin", "rid": request.rid})
            try:
                finish = self._run(request)
            except RequestCancelled:
                self._cleanup(request.rid)
                self.channel.send({"ev": "done", "rid": request.rid, "cancelled": True})
            except BaseException as exc:
                self._cleanup(request.rid)
                self.channel.send({"ev": "error", "rid": request.rid, "error": error_info(exc)})
            else:
                self.channel.send({"ev": "done", "rid": request.rid, "finish_reason": finish})
            self._forget(request.rid)

    def _forget(self, rid: str) -> None:
        with self._lock:
            self.requests.pop(rid, None)

    def _inputs(self, request: _Request) -> Iterator[Any]:
        """The request's input items, as their chunks arrive."""
        edge = self.pipeline.edges_into(self.stage.name)
        timeout = edge[0].transfer_timeout if edge else 30.0
        while True:
            if request.cancelled.is_set():
                raise RequestCancelled
            try:
                message = request.chunks.get(timeout=0.5)
            except queue.Empty:
                continue
            if message.get("cancel"):
                raise RequestCancelled
            if "items" in message:  # the request's own input (entry stage)
                yield from message["items"]
            elif message.get("handle") is not None:
                resolved = self.pipeline.edge(message["source"], self.stage.name)
                connector = self.connectors[resolved.connector_name]
                items = connector.get(resolved.edge, request.rid, message["handle"], timeout=timeout)
                self.channel.send({"ev": "taken", "rid": request.rid, "source": message["source"]})
                yield from items
            if message.get("last"):
                return

    def _run(self, request: _Request) -> str:
        """Run one request through the engine; how its answer ended (a :data:`FinishReason`)."""
        assert self.engine is not None
        edges = {e.target: e for e in self.pipeline.edges_from(self.stage.name)}
        targets = [edges[t] for t in request.targets]
        buffers: dict[str, list[Any]] = {e.target: [] for e in targets}
        engine = self.engine
        run = iter(engine.run(self._inputs(request), request.params))
        try:
            while True:
                try:
                    item = next(run)
                except StopIteration as end:  # a generator's return value: how the answer ended
                    finish = end.value
                    break
                if request.cancelled.is_set():
                    raise RequestCancelled
                for edge in targets:
                    buffer = buffers[edge.target]
                    buffer.append(engine.for_output(item) if edge.target == OUTPUT else item)
                    if edge.window != -1 and len(buffer) >= edge.window:
                        self._send(request, edge, buffer, last=False)
                        buffers[edge.target] = []
        finally:
            close = getattr(run, "close", None)
            if close is not None:  # stopped early (cancelled, a failed put): the engine's finally runs now
                close()
        finish = finish_reason(finish, self.stage.name)
        for edge in targets:
            self._send(request, edge, buffers[edge.target], last=True)
        return finish

    def _send(self, request: _Request, edge: Any, items: list[Any], *, last: bool) -> None:
        """Put one chunk on an edge (waiting for a credit: backpressure) and tell the orchestrator."""
        from omni_core.errors import ConnectorError

        handle = None
        if items:
            deadline = time.monotonic() + edge.transfer_timeout
            semaphore = self.credits[edge.target]
            while not semaphore.acquire(timeout=0.2):
                if request.cancelled.is_set():
                    raise RequestCancelled
                if time.monotonic() > deadline:
                    raise ConnectorError(
                        f"edge {edge.source}->{edge.target}: {edge.max_inflight} chunk(s) are waiting to be taken "
                        f"and none was within transfer_timeout ({edge.transfer_timeout:g} s); the consumer is "
                        "stuck or slower than the edge allows: raise max_inflight or transfer_timeout for the edge"
                    )
            connector = self.connectors[edge.connector_name]
            try:
                handle = connector.put(edge.edge, request.rid, items, timeout=edge.transfer_timeout)
            except BaseException:
                semaphore.release()
                raise
        self.channel.send(
            {
                "ev": "chunk",
                "rid": request.rid,
                "target": edge.target,
                "handle": handle,
                "items": len(items),
                "last": last,
            }
        )

    def _cleanup(self, rid: str) -> None:
        for connector in self.connectors.values():
            try:
                connector.cleanup(rid)
            except Exception:
                pass

    def close(self) -> None:
        if self.engine is not None:
            try:
                self.engine.close()
            except Exception:
                pass
            self.engine = None
        for connector in self.connectors.values():
            try:
                connector.close()
            except Exception:
                pass
        self.connectors.clear()


def stage_process_main(conn: Any, pipeline_json: str, name: str) -> None:
    """Entry point of a spawned stage process."""
    import signal

    from omni_core.pipeline.placement import ResolvedPipeline

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the orchestrator's to handle
    pipeline = ResolvedPipeline.model_validate_json(pipeline_json)
    if pipeline.stage(name).starts_processes:
        os.setpgid(0, 0)  # a group of its own: the engine's processes are stopped with the stage
    channel = PipeChannel(conn)
    try:
        StageLoop(pipeline, name, channel).serve()
    finally:
        channel.close()
    # the engine and the connectors are closed: skip the interpreter's teardown, which takes
    # seconds with torch loaded, and which every stop and restart would wait for
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


__all__ = [
    "FINISH_REASONS",
    "OUTPUT",
    "Channel",
    "Edge",
    "FinishReason",
    "PipeChannel",
    "QueueChannel",
    "StageEngine",
    "StageLoop",
    "StageParams",
    "error_info",
]
