"""``inprocess``: the reference transport for stages that share one Python process, and for tests.

``put`` encodes the payload with the core's payload codec (never pickle) into a frame of its
own and stores it; ``get`` pops the frame (each payload is read once) and decodes it, the
arrays and tensors viewing that frame. So the consumer gets its own copy, exactly as it would
across processes: mutating what ``get`` returned never touches the producer's objects.

The stages of an in-process pipeline share one Python process but each builds its own
instance, so the store is shared per ``context.run_id`` (a module-level registry). It is
dropped when the owner (the orchestrator) closes, or when the last instance of the run does;
an instance of a dropped store refuses puts and gets.

The handle is ``{"key": "<edge key>#<sequence>#<request id>", "nbytes": n}``. A ``get`` of a key
that is not stored yet waits for it up to ``timeout``; a key of another request or edge, one
already read or cleaned up, or a handle of the wrong shape is a ConnectorError at once.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, ClassVar

from omni_core.errors import PayloadError
from omni_core.pipeline.connector import Connector, ConnectorContext, ConnectorOptions, Edge, Handle
from omni_core.pipeline.payload import decode, encode
from omni_plugin_connectors._common import check_handle, check_timeout, fail

#: (request id, edge key, sequence number): where a frame is stored
_Key = tuple[str, str, int]


class _RunStore:
    """The frames of one pipeline run, shared by every instance built with its run id."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.cond = threading.Condition()
        #: key -> (the token of the instance that put it, the encoded frame)
        self.frames: dict[_Key, tuple[str, bytearray]] = {}
        #: the sequence number the next put takes: a key below it that is not stored is gone
        self.next_seq = 0
        self.users = 0
        self.closed = False


_STORES: dict[str, _RunStore] = {}
_STORES_LOCK = threading.Lock()


def _attach(run_id: str) -> _RunStore:
    with _STORES_LOCK:
        store = _STORES.get(run_id)
        if store is None:
            store = _STORES[run_id] = _RunStore(run_id)
        with store.cond:
            store.users += 1
        return store


def _drop(store: _RunStore) -> None:
    """Close ``store``: its frames are freed, its waiting gets fail, new instances get a new one."""
    with _STORES_LOCK:
        if _STORES.get(store.run_id) is store:
            del _STORES[store.run_id]
    with store.cond:
        store.closed = True
        store.frames.clear()
        store.cond.notify_all()


class InProcessConnector(Connector):
    """Payloads between stages of one process, as encoded frames in a store shared per run."""

    same_process_only: ClassVar[bool] = True

    def __init__(self, extra: dict[str, Any] | ConnectorOptions | None, context: ConnectorContext) -> None:
        super().__init__(extra, context)
        self._token = uuid.uuid4().hex
        self._closed = False
        self._store = _attach(context.run_id)

    # -- the contract ---------------------------------------------------------------------------

    def put(self, edge: Edge, request_id: str, payload: Any, *, timeout: float) -> Handle:
        self._check_open(edge, "put")
        check_timeout(self.name, edge, "put", timeout)  # a put never waits: the store is unbounded
        encoded = encode(payload)  # PayloadError for what the codec does not carry
        nbytes = encoded.nbytes
        self.check_payload_size(nbytes, edge)
        frame = bytearray(nbytes)
        encoded.write_into(memoryview(frame))
        store = self._store
        with store.cond:
            self._check_open(edge, "put")
            seq = store.next_seq
            store.next_seq += 1
            store.frames[(request_id, edge.key, seq)] = (self._token, frame)
            store.cond.notify_all()
        return {"key": f"{edge.key}#{seq}#{request_id}", "nbytes": nbytes}

    def get(self, edge: Edge, request_id: str, handle: Handle, *, timeout: float) -> Any:
        self._check_open(edge, "get")
        wait = check_timeout(self.name, edge, "get", timeout)
        check_handle(self.name, edge, handle, {"key": str, "nbytes": int})
        key = self._parse_key(edge, request_id, handle["key"])
        store = self._store
        deadline = time.monotonic() + wait
        with store.cond:
            while True:
                self._check_open(edge, "get")
                entry = store.frames.get(key)
                if entry is not None:
                    frame = entry[1]
                    if len(frame) != handle["nbytes"]:
                        fail(
                            self.name,
                            f"{self.name} get on edge {edge}: the handle says {handle['nbytes']:,} bytes but payload "
                            f"{handle['key']!r} has {len(frame):,}: the handle was altered (the payload is left "
                            "for its real handle)",
                        )
                    del store.frames[key]
                    break
                if key[2] < store.next_seq:
                    fail(
                        self.name,
                        f"{self.name} get on edge {edge}: payload {handle['key']!r} is gone: already read "
                        "(each handle is read once), or its request was cleaned up",
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    fail(
                        self.name,
                        f"{self.name} get on edge {edge}: payload {handle['key']!r} was not put within the "
                        f"{wait:g} s timeout",
                    )
                store.cond.wait(remaining)
        try:
            return decode(frame, copy=False)  # views of the frame, which nobody else holds now
        except PayloadError as exc:
            fail(self.name, f"{self.name} get on edge {edge}: payload {handle['key']!r} does not decode: {exc}")

    def cleanup(self, request_id: str) -> None:
        store = self._store
        with store.cond:
            for key in [k for k in store.frames if k[0] == request_id]:
                del store.frames[key]
            store.cond.notify_all()

    def health(self) -> dict[str, Any]:
        if self._closed or self._store.closed:
            return {"ok": False, "reason": f"the {self.name} connector of run {self.context.run_id!r} is closed"}
        with self._store.cond:
            return {"ok": True, "payloads": len(self._store.frames)}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        store = self._store
        with store.cond:
            store.users -= 1
            last = store.users <= 0
            # what this instance put and nobody read
            for key in [k for k, (token, _) in store.frames.items() if token == self._token]:
                del store.frames[key]
            store.cond.notify_all()
        if self.context.is_owner or last:
            _drop(store)

    # -- helpers --------------------------------------------------------------------------------

    def _check_open(self, edge: Edge, op: str) -> None:
        if self._closed:
            fail(self.name, f"{self.name} {op} on edge {edge}: the connector is closed")
        if self._store.closed:
            fail(
                self.name,
                f"{self.name} {op} on edge {edge}: the connector is closed (run {self.context.run_id!r} "
                "was closed by its owner)",
            )

    def _parse_key(self, edge: Edge, request_id: str, key: str) -> _Key:
        head, tail = f"{edge.key}#", f"#{request_id}"
        middle = key[len(head) : len(key) - len(tail)] if len(key) > len(head) + len(tail) else ""
        if not (key.startswith(head) and key.endswith(tail) and middle.isascii() and middle.isdigit()):
            fail(
                self.name,
                f"{self.name} get on edge {edge}: key {key[:120]!r} is not a payload of request "
                f"{request_id!r} on this edge (expected '{edge.key}#<n>#{request_id}')",
            )
        return (request_id, edge.key, int(middle))
