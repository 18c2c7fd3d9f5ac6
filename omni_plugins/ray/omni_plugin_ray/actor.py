"""The Ray actor that hosts one stage: a :class:`~omni_core.pipeline.stage.StageLoop` on a thread
of its own, talking to the orchestrator through two queues.

The orchestrator's side (:class:`omni_plugin_ray.executor.ActorChannel`) calls

* ``push(seq, message)``: one message for the stage. Messages carry the sequence number the
  orchestrator gave them and enter the stage's inbox strictly in that order (:class:`Inbox`): a
  threaded actor does not promise to run calls in the order they were made, and a ``start``
  overtaken by its ``chunk`` would lose the chunk. (``push`` also runs in a concurrency group of
  one thread; the sequence numbers are what guarantees the order.)
* ``pull(timeout)``: the stage's messages waiting in its outbox, as one batch (waits up to
  ``timeout`` for the first); ``ended`` says the loop raised and will send nothing more.
* ``info()``, ``wait_ended(timeout)``: where the actor runs, and whether its loop has ended.

This module imports Ray: it is loaded only when a stage is launched, and in the actor.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
from typing import Any

import ray

from omni_core.pipeline.stage import QueueChannel, StageLoop, error_info

#: most messages one pull returns
MAX_BATCH = 512
#: hosts that bind every interface (the tcp connector's own list): not an address to advertise
_WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "::", "[::]"})
#: the end of the outbox: the loop is over
_END = object()


class Inbox:
    """Delivers numbered messages to ``queue`` in number order, whatever order they arrive in.
    ``put(seq, None)`` delivers the end of the stream (the stage loop reads it as its
    orchestrator gone)."""

    def __init__(self, target: queue.Queue[Any]) -> None:
        self._target = target
        self._next = 0
        self._held: dict[int, Any] = {}
        self._lock = threading.Lock()

    def put(self, seq: int, message: Any) -> None:
        with self._lock:
            if seq < self._next or seq in self._held:
                return  # a duplicate: delivered already
            self._held[seq] = message
            while self._next in self._held:
                self._target.put(self._held.pop(self._next))
                self._next += 1

    @property
    def waiting(self) -> int:
        """Messages held back for an earlier one that has not arrived."""
        with self._lock:
            return len(self._held)


def advertise_node_ip(pipeline: Any, stage: str, node_ip: str) -> Any:
    """``pipeline`` with the ``tcp`` edges of ``stage`` advertising ``node_ip``, where the stage
    binds a wildcard host (``0.0.0.0``) and the recipe names no ``advertise_host`` for it: the
    address Ray itself reaches the node by, instead of the tcp connector's default (the
    machine's hostname). Edges of other connectors, and anything the recipe set, stay as they are."""
    edges = []
    changed = False
    for edge in pipeline.edges:
        if edge.connector == "tcp" and stage in (edge.source, edge.target):
            extra = dict(edge.extra)
            per_owner = {k: dict(v) for k, v in (extra.get("per_owner") or {}).items()}
            binding = per_owner.get(stage, {})
            host = binding.get("host") or extra.get("host") or "127.0.0.1"
            if host in _WILDCARD_HOSTS and not (binding.get("advertise_host") or extra.get("advertise_host")):
                per_owner[stage] = {**binding, "advertise_host": node_ip}
                extra["per_owner"] = per_owner
                edge = edge.model_copy(update={"extra": extra})
                changed = True
        edges.append(edge)
    return pipeline.model_copy(update={"edges": tuple(edges)}) if changed else pipeline


class StageActor:
    """One stage in a Ray actor (made remote by :func:`remote_class`). ``__init__`` returns at
    once: the stage loads its engine on its own thread and reports ``ready`` (or ``failed``)
    through the outbox, as a stage process does through its pipe."""

    def __init__(self, pipeline_json: str, name: str, advertise: bool = True) -> None:
        self._inbox_queue: queue.Queue[Any] = queue.Queue()
        self._outbox: queue.Queue[Any] = queue.Queue()
        self._inbox = Inbox(self._inbox_queue)
        self._ended: str | None = None
        self._node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self._thread = threading.Thread(
            target=self._serve, args=(pipeline_json, name, advertise), name=f"omni-stage-{name}", daemon=True
        )
        self._thread.start()

    # -- the stage -------------------------------------------------------------------------------

    def make_loop(self, channel: QueueChannel, pipeline_json: str, name: str, advertise: bool) -> Any:
        """What the actor's thread serves: the stage's loop over ``channel``."""
        from omni_core.pipeline.placement import ResolvedPipeline

        pipeline = ResolvedPipeline.model_validate_json(pipeline_json)
        if advertise:
            pipeline = advertise_node_ip(pipeline, name, self._node_ip)
        return StageLoop(pipeline, name, channel)

    def _serve(self, pipeline_json: str, name: str, advertise: bool) -> None:
        channel = QueueChannel(self._inbox_queue, self._outbox)
        try:
            loop = self.make_loop(channel, pipeline_json, name, advertise)
        except BaseException as exc:
            self._outbox.put({"ev": "failed", "error": error_info(exc)})
            return
        try:
            loop.serve()
        except BaseException as exc:  # a bug, not a stage failure (the loop reports those itself)
            info = error_info(exc)
            self._ended = f"ended: its stage loop raised {info['type']}: {info['message']}"
            self._outbox.put(_END)
        # a loop that returned (after stop, or after reporting it could not start) leaves the
        # actor to the orchestrator, which stops it: the stream does not end here, so a stage
        # that reported `failed` is not taken for one that died (and restarted)

    # -- what the orchestrator calls -------------------------------------------------------------

    @ray.method(concurrency_group="inbox")
    def push(self, seq: int, message: dict[str, Any] | None) -> None:
        self._inbox.put(seq, message)

    @ray.method(concurrency_group="outbox")
    def pull(self, timeout: float) -> dict[str, Any]:
        """``{"messages": [...], "ended": None | why}``: what the stage sent, at most
        :data:`MAX_BATCH` messages, waiting up to ``timeout`` for the first."""
        messages: list[dict[str, Any]] = []
        try:
            item = self._outbox.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return {"messages": messages, "ended": None}
        while True:
            if item is _END:
                return {"messages": messages, "ended": self._ended or "ended"}
            messages.append(item)
            if len(messages) >= MAX_BATCH:
                break
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                break
        return {"messages": messages, "ended": None}

    def info(self) -> dict[str, Any]:
        """Where the actor runs (its creation is complete once this answers)."""
        return {
            "pid": os.getpid(),
            "node_ip": self._node_ip,
            "node_id": ray.get_runtime_context().get_node_id(),
            "hostname": socket.gethostname(),
        }

    def wait_ended(self, timeout: float) -> bool:
        """Whether the stage's loop has ended, waiting up to ``timeout`` for it."""
        self._thread.join(max(timeout, 0.0))
        return not self._thread.is_alive()


#: the actor's concurrency groups: one thread each for the inbox and the outbox (so a pull that
#: waits never holds back a push), two for info and wait_ended
CONCURRENCY_GROUPS = {"inbox": 1, "outbox": 1}
DEFAULT_CONCURRENCY = 2

_REMOTE: dict[type, Any] = {}


def remote_class(cls: type[StageActor] = StageActor) -> Any:
    """``cls`` as a Ray actor class (made once per class)."""
    if cls not in _REMOTE:
        make: Any = ray.remote  # its overloads do not list the concurrency options
        _REMOTE[cls] = make(concurrency_groups=CONCURRENCY_GROUPS, max_concurrency=DEFAULT_CONCURRENCY)(cls)
    return _REMOTE[cls]
