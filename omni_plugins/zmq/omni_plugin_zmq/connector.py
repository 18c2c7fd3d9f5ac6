"""The ``tcp`` connector: payloads pulled over ZeroMQ from the producing process's outbox.

Every instance binds a ROUTER socket when it is built (``host``/``port``; port 0 picks an
ephemeral port) and serves its outbox from a daemon thread. ``put`` encodes the payload with
:mod:`omni_core.pipeline.payload`, stores one snapshot of the encoded frame under
``{request_id}/{edge.key}/{seq}`` and returns ``{"addr", "key", "nbytes"}``; a payload of at most
``inline_threshold_bytes`` travels in the handle itself (``{"inline", "nbytes"}``), with no
server involved. ``get`` asks the producer's server for the key with a DEALER socket, and the
server answers with the frame and forgets it (read once). See :mod:`omni_plugin_zmq.transport`
for the wire protocol.

Copies: the producer encodes once into its snapshot, ZeroMQ sends that buffer without copying
it, and the consumer decodes the frame ZeroMQ received in place (tensors and arrays view it).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import socket
import sys
import threading
import time
import weakref
from typing import Any

import zmq
from pydantic import BaseModel, ConfigDict, Field

from omni_core.errors import ConnectorError, PayloadError
from omni_core.pipeline.connector import Connector, ConnectorContext, ConnectorOptions, Edge, Handle
from omni_plugin_zmq import transport

log = logging.getLogger(__name__)

#: hosts that mean "every interface": not an address a consumer can connect to
_WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "::", "[::]"})
#: how long close() waits for the server thread
_STOP_TIMEOUT_S = 2.0
#: from this size on, a snapshot goes into a numpy array when numpy is imported (see _snapshot)
_NUMPY_SNAPSHOT_BYTES = 1 << 20


class TcpBinding(BaseModel):
    """Where one process of the pipeline listens (an entry of ``per_owner``): unset fields keep
    the connector-wide value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str | None = Field(default=None, min_length=1)
    port: int | None = Field(default=None, ge=0, le=65535)
    advertise_host: str | None = Field(default=None, min_length=1)


class TcpOptions(ConnectorOptions):
    """The ``extra`` options of the ``tcp`` connector."""

    #: the interface the server binds: 127.0.0.1 (one machine), 0.0.0.0 (every interface)
    host: str = Field(default="127.0.0.1", min_length=1)
    #: the port the server binds; 0: an ephemeral port chosen by the system
    port: int = Field(default=0, ge=0, le=65535)
    #: what consumers connect to (a name or address of this machine they can reach); None: host
    #: (the machine's hostname when host is a wildcard such as 0.0.0.0)
    advertise_host: str | None = Field(default=None, min_length=1)
    #: payloads of at most this many encoded bytes travel inside the handle, with no server
    inline_threshold_bytes: int = Field(default=65536, ge=0)
    #: the most encoded bytes this process holds for consumers; a put over it waits for room
    max_buffered_bytes: int = Field(default=1 << 30, ge=1)
    #: per process (a stage's name, or "orchestrator"): host, port and advertise_host overrides,
    #: for fixed ports with several processes on one machine and for multi-machine pipelines
    per_owner: dict[str, TcpBinding] = Field(default_factory=dict)


#: connectors not closed yet: closed at interpreter exit so no socket or thread outlives it
_LIVE: weakref.WeakSet[TcpConnector] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # pragma: no cover - runs at interpreter exit
    for conn in list(_LIVE):
        try:
            conn.close()
        except Exception as exc:
            log.debug("tcp connector: close at exit failed: %s", exc)


class TcpConnector(Connector):
    """Payloads over ZeroMQ (TCP): pulled by the consumer from the producer's outbox, read once."""

    options_type = TcpOptions
    options: TcpOptions

    def __init__(self, extra: dict[str, Any] | ConnectorOptions | None, context: ConnectorContext) -> None:
        super().__init__(extra, context)
        opts = self.options
        binding = opts.per_owner.get(context.owner, TcpBinding())
        self.host = binding.host if binding.host is not None else opts.host
        port = binding.port if binding.port is not None else opts.port
        advertise = binding.advertise_host or opts.advertise_host
        if advertise is None:
            advertise = socket.gethostname() if self.host in _WILDCARD_HOSTS else self.host
        self._seq = itertools.count()
        self._close_lock = threading.Lock()
        self._closed = False
        self._outbox = transport.Outbox(opts.max_buffered_bytes)
        try:
            self._ctx: zmq.Context[Any] = zmq.Context(io_threads=1)
        except zmq.ZMQError as exc:
            raise ConnectorError(
                f"tcp connector in {context.owner!r} cannot start ZeroMQ: {exc}", name=self.name
            ) from None
        try:
            self._server = transport.Server(self._ctx, self._outbox, self.host, port)
        except zmq.ZMQError as exc:
            self._ctx.term()
            raise ConnectorError(_bind_problem(self.host, port, exc, context.owner), name=self.name) from None
        self._dealers = transport.Dealers(self._ctx)
        self.port = self._server.port
        self.addr = transport.endpoint(advertise, self.port)
        _LIVE.add(self)

    # -- producer side -------------------------------------------------------------------------

    def put(self, edge: Edge, request_id: str, payload: Any, *, timeout: float) -> Handle:
        from omni_core.pipeline.payload import encode

        self._check_open("put", edge)
        encoded = encode(payload)
        nbytes = encoded.nbytes
        self.check_payload_size(nbytes, edge)
        if nbytes <= self.options.inline_threshold_bytes:
            return {"inline": encoded.to_bytes(), "nbytes": nbytes}

        limit = self.options.max_buffered_bytes
        if nbytes > limit:
            raise ConnectorError(
                f"payload of {nbytes:,} bytes on edge {edge} is larger than the tcp connector's "
                f"max_buffered_bytes ({limit:,}) in {self.context.owner!r}: raise max_buffered_bytes "
                "(pipeline.connectors.<name>.extra.max_buffered_bytes) or send less per chunk",
                name=self.name,
            )
        state = self._outbox.reserve(nbytes, timeout)
        if state == "closed":
            raise ConnectorError(f"tcp connector is closed: cannot put on edge {edge}", name=self.name)
        if state == "full":
            _, buffered = self._outbox.stats()
            raise ConnectorError(
                f"tcp connector outbox of {self.context.owner!r} stayed full for {timeout:g}s: "
                f"{buffered:,} bytes wait for consumers and this payload of {nbytes:,} bytes on edge {edge} "
                f"would exceed max_buffered_bytes ({limit:,}). Check that the consuming stage "
                f"{edge.target!r} is reading its inputs, or raise max_buffered_bytes "
                "(pipeline.connectors.<name>.extra.max_buffered_bytes)",
                name=self.name,
            )
        key = f"{request_id}/{edge.key}/{next(self._seq)}"
        try:
            # the one copy on this side: a snapshot, so the producer may change its tensors as soon
            # as put returns
            data = _snapshot(encoded)
        except BaseException:
            self._outbox.release(nbytes)
            raise
        if not self._outbox.add(key, transport.Entry(request_id, data)):
            raise ConnectorError(f"tcp connector closed during a put on edge {edge}", name=self.name)
        return {"addr": self.addr, "key": key, "nbytes": nbytes}

    def cleanup(self, request_id: str) -> None:
        dropped = self._outbox.drop_request(request_id)
        if dropped:
            log.debug("tcp connector: dropped %d unread payload(s) of request %s", dropped, request_id)

    # -- consumer side -------------------------------------------------------------------------

    def get(self, edge: Edge, request_id: str, handle: Handle, *, timeout: float) -> Any:
        from omni_core.pipeline.payload import decode

        self._check_open("get", edge)
        parsed = _parse_handle(handle, edge)
        nbytes = parsed["nbytes"]
        if "inline" in parsed:
            try:  # a copy: the handle's bytes are immutable, and small
                return decode(parsed["inline"], copy=True)
            except PayloadError as exc:
                raise ConnectorError(
                    f"tcp handle for edge {edge} carries inline bytes that are not a payload ({exc}); "
                    "pass get() the handle put() returned",
                    name=self.name,
                ) from exc

        addr, key = parsed["addr"], parsed["key"]
        deadline = time.monotonic() + max(timeout, 0.0)
        closed = ConnectorError(f"tcp connector is closed: cannot get on edge {edge}", name=self.name)
        try:
            sock = self._dealers.checkout(addr)
        except zmq.ContextTerminated:
            raise closed from None
        except zmq.ZMQError as exc:
            raise ConnectorError(
                f"tcp connector cannot connect to {addr} for edge {edge}: {exc}; "
                "the handle's addr must be tcp://host:port of the producing process",
                name=self.name,
            ) from None
        if sock is None:
            raise closed
        answer = None
        try:
            answer = transport.request(sock, key, deadline)
        except zmq.ContextTerminated:
            raise closed from None
        except zmq.ZMQError as exc:
            raise ConnectorError(
                f"tcp connector: get from {addr} on edge {edge} failed: {exc}", name=self.name
            ) from None
        finally:
            # a socket that got no answer may still receive one late: it is closed, never reused
            self._dealers.checkin(addr, sock, reusable=answer is not None)
        if answer is None:
            raise ConnectorError(
                f"no answer from {addr} within {timeout:g}s for payload {key!r} on edge {edge} (tcp connector): "
                f"is the producing stage {edge.source!r} still running, and can this machine reach {addr} "
                "(a firewall, or advertise_host set to a name or address other machines cannot reach)?",
                name=self.name,
            )
        status, body = answer
        if status == transport.GONE:
            raise ConnectorError(
                f"payload {key!r} on edge {edge} is gone from {addr}: already read, or its request was cleaned up "
                "(each tcp handle is read once)",
                name=self.name,
            )
        if status != transport.OK:
            raise ConnectorError(
                f"{addr} refused the request for {key!r} on edge {edge}: {bytes(body.buffer).decode(errors='replace')}",
                name=self.name,
            )
        frame = body.buffer
        if len(frame) != nbytes:
            raise ConnectorError(
                f"payload {key!r} on edge {edge} from {addr} is {len(frame):,} bytes but its handle says "
                f"{nbytes:,}: the handle does not describe this payload",
                name=self.name,
            )
        try:  # no copy: arrays and tensors view the memory ZeroMQ received (writable, kept alive by them)
            return decode(frame, copy=False)
        except PayloadError as exc:
            raise ConnectorError(
                f"payload {key!r} from {addr} on edge {edge} does not decode: {exc}", name=self.name
            ) from exc

    # -- lifecycle -----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        buffered, buffered_bytes = self._outbox.stats()
        report: dict[str, Any] = {
            "ok": True,
            "addr": self.addr,
            "buffered": buffered,
            "buffered_bytes": buffered_bytes,
        }
        if self._closed:
            report.update(ok=False, reason="closed")
        elif not self._server.alive:
            report.update(ok=False, reason=f"the server thread stopped: {self._server.error or 'unknown cause'}")
        elif self._server.error:
            report["last_error"] = self._server.error
        return report

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        _LIVE.discard(self)
        self._outbox.close()
        stopped = self._server.stop(_STOP_TIMEOUT_S)
        self._dealers.close()
        if stopped:
            # sockets still in a get see ETERM at once, and are closed by their get
            self._ctx.term()
        else:  # pragma: no cover - the server thread polls every 50 ms
            log.warning("tcp connector: the server thread on port %d did not stop; leaving it (daemon)", self.port)

    def _check_open(self, what: str, edge: Edge) -> None:
        if self._closed:
            raise ConnectorError(f"tcp connector is closed: cannot {what} on edge {edge}", name=self.name)


def _snapshot(encoded: Any) -> Any:
    """The encoded frame in memory of its own, written once.

    A large frame goes into a numpy array when numpy is already imported (a payload with
    tensors or arrays): numpy asks for transparent huge pages for large arrays, which halves the
    cost of touching fresh memory (256 MiB: about 80 ms instead of 150-200 ms for a bytearray
    or ``to_bytes``). Otherwise a bytearray."""
    nbytes = encoded.nbytes
    np = sys.modules.get("numpy")
    data = np.empty(nbytes, dtype=np.uint8) if np is not None and nbytes >= _NUMPY_SNAPSHOT_BYTES else bytearray(nbytes)
    encoded.write_into(memoryview(data))
    return data


def _bind_problem(host: str, port: int, exc: zmq.ZMQError, owner: str) -> str:
    where = f"{host}:{port or '*'}"
    if exc.errno == zmq.EADDRINUSE:
        return (
            f"tcp connector in {owner!r} cannot listen on {where}: the address is already in use (another "
            "process, perhaps another stage of this pipeline on this machine, holds the port). Use port 0 "
            "(an ephemeral port), a free port, or give each process its own with per_owner"
        )
    return (
        f"tcp connector in {owner!r} cannot listen on {where}: {exc.strerror}. Set host to an address of this "
        "machine (127.0.0.1 for one machine, 0.0.0.0 for every interface) and port to a free port (0: any)"
    )


def _parse_handle(handle: Any, edge: Edge) -> dict[str, Any]:
    """The fields of a tcp handle, checked: ``{"inline", "nbytes"}`` or ``{"addr", "key", "nbytes"}``."""

    def bad(problem: str) -> ConnectorError:
        return ConnectorError(
            f"malformed tcp connector handle for edge {edge}: {problem}; pass get() the handle put() returned"
        )

    if not isinstance(handle, dict):
        raise bad(f"expected a dict, got {type(handle).__name__}")
    nbytes = handle.get("nbytes")
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise bad(f"'nbytes' must be a non-negative int, got {nbytes!r}")
    if "inline" in handle:
        data = handle["inline"]
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise bad(f"'inline' must be bytes, got {type(data).__name__}")
        if len(data) != nbytes:
            raise bad(f"'inline' holds {len(data):,} bytes but 'nbytes' says {nbytes:,}")
        return {"inline": data, "nbytes": nbytes}
    addr, key = handle.get("addr"), handle.get("key")
    if not isinstance(addr, str) or not addr.startswith("tcp://"):
        raise bad(f"'addr' must be a 'tcp://host:port' string, got {addr!r}")
    host, _, port = addr[len("tcp://") :].rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad(f"'addr' must be a 'tcp://host:port' string, got {addr!r}")
    try:
        key_ok = isinstance(key, str) and 0 < len(key.encode("utf-8")) <= transport.MAX_KEY_BYTES
    except UnicodeEncodeError:
        key_ok = False
    if not key_ok:
        raise bad(
            f"'key' must be a non-empty string of at most {transport.MAX_KEY_BYTES} UTF-8 bytes, got {key!r:.200}"
        )
    return {"addr": addr, "key": key, "nbytes": nbytes}
