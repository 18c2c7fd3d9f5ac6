"""The ``mooncake`` connector: payloads read by the consumer out of the producer's registered
staging pool, with Mooncake's transfer engine (TCP by default, RDMA where the machines have it).

**One engine per instance.** Building the connector starts a ``mooncake.engine.TransferEngine``
(``local_hostname``, ``metadata_server``, ``protocol``, ``device_name``). With the default
``metadata_server="P2PHANDSHAKE"`` no metadata server is needed: a consumer reaches a producer
at ``"{local_hostname}:{rpc port}"`` (its *session*) and fetches its registered memory map
there on first contact.

**put** encodes the payload (the core's payload codec, never pickle) straight into a slot of
this process's staging pool (``buffer_bytes``, an anonymous mapping registered with the engine
at the first put that needs it) and returns
``{"session": "host:port", "addr": slot address, "nbytes": n, "key": 16 hex digits}``. A slot
is a 64-byte header (magic, the key, a tag of run/request/edge, the size, a state word) and
the frame. A payload of at most ``inline_threshold_bytes`` travels in the handle instead:
``{"inline": frame, "nbytes": n}``. When the pool has no room, put waits for consumers to take
payloads, up to its timeout.

**get** reads header and frame from the producer with one transfer into a fresh local mapping,
checks the header (the key, the request and edge, the size, not taken yet), reads the header
once more (the slot was not freed and reused while it was read), then writes "taken" into the
producer's header and decodes the frame in place: the arrays and tensors it returns view the
mapping, which lives as long as they do. A second get of the handle finds "taken" (or another
key) and raises ConnectorError.

**Freeing.** The producer frees a slot once its header says "taken" (checked at every put and
``health``), at ``cleanup(request_id)`` for that request's slots, read or not, and at
``close``. A consumer holds nothing once get returned. A process's pool dies with the process,
so the owner's ``close`` has nothing of other processes to reclaim.

**Timeouts.** Every transfer of a get runs against the get's deadline (the engine's own limit,
``MC_TRANSFER_TIMEOUT``, is 30 s and its first handshake with a silent peer can take a minute):
past it, get raises ConnectorError and keeps its local buffer registered until the engine is
surely done with it. A dead producer fails a get at once.

**Security.** The engine listens on every interface (0.0.0.0) whatever ``local_hostname``
says, and any host that reaches its ports can read and write the registered pool: run it on a
trusted network only.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import mmap
import re
import secrets
import struct
import threading
import time
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field

from omni_core.errors import ConnectorError, PayloadError
from omni_core.kinds import Kind
from omni_core.pipeline.connector import (
    Connector,
    ConnectorContext,
    ConnectorOptions,
    Edge,
    Handle,
    check_handle,
    check_timeout,
)
from omni_core.pipeline.payload import decode, encode

log = logging.getLogger(__name__)

#: the slot header: magic, key, tag of (run, request, edge), frame size, state; 64 bytes in all
_HEADER = struct.Struct("<8sQQQQ")
HEADER_BYTES = 64
_MAGIC = b"OMNIMC01"
_STATE_OFFSET = 32
_STATE = struct.Struct("<Q")
_READY = 1
_TAKEN = 2
#: every slot starts at a multiple of this (its frame too: 64 bytes after it)
_ALIGN = 64
#: the smallest frame the payload codec writes (its fixed prefix)
_MIN_FRAME = 20
#: how long a buffer of an abandoned transfer stays registered: past the engine's own limits
#: (MC_TRANSFER_TIMEOUT 30 s, a first handshake ~60 s)
_ABANDON_GRACE_S = 120.0
_KEY_RE = re.compile(r"[0-9a-f]{16}")
_SESSION_RE = re.compile(r"(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}")
_SHAPE = (
    "a mooncake handle is {'session': 'host:port', 'addr': int, 'nbytes': int, 'key': 16 hex digits} "
    "or {'inline': frame bytes, 'nbytes': int}"
)


class MooncakeBinding(BaseModel):
    """One process's own values (an entry of ``per_owner``): unset fields keep the connector-wide value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    local_hostname: str | None = Field(default=None, min_length=1)
    device_name: str | None = None


class MooncakeOptions(ConnectorOptions):
    """The ``extra`` options of the ``mooncake`` connector."""

    #: the address of this machine that the other processes reach it at (its session host)
    local_hostname: str = Field(default="127.0.0.1", min_length=1)
    #: "tcp" (any network), or "rdma" (RDMA NICs: name them in device_name)
    protocol: Literal["tcp", "rdma"] = "tcp"
    #: RDMA devices to use, comma-separated ("mlx5_0,mlx5_1"); "" lets the engine pick
    device_name: str = ""
    #: "P2PHANDSHAKE": peers exchange their memory maps directly (no server); or an etcd / http
    #: metadata server URL, as Mooncake takes it
    metadata_server: str = Field(default="P2PHANDSHAKE", min_length=1)
    #: the staging pool of a producing process: every payload waiting for its consumer lives in
    #: it (registered with the engine: pinned with rdma), so it bounds a payload's size
    buffer_bytes: int = Field(default=256 << 20, ge=1 << 20, le=1 << 40)
    #: payloads of at most this many encoded bytes travel inside the handle; 0: none
    inline_threshold_bytes: int = Field(default=65536, ge=0)
    #: per process (a stage's name, or "orchestrator"): local_hostname and device_name of its
    #: own, for pipelines that span machines
    per_owner: dict[str, MooncakeBinding] = Field(default_factory=dict)


class _Slot:
    __slots__ = ("key", "offset", "request_id", "size")

    def __init__(self, key: int, offset: int, size: int, request_id: str) -> None:
        self.key, self.offset, self.size, self.request_id = key, offset, size, request_id


class _Pool:
    """An anonymous mapping registered with the engine, carved into slots (first fit)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.mapping = mmap.mmap(-1, size)
        self._anchor: Any = ctypes.c_char.from_buffer(self.mapping)
        self.base = ctypes.addressof(self._anchor)
        self.view = memoryview(self.mapping)
        self._free: list[tuple[int, int]] = [(0, size)]  # (offset, size), sorted, coalesced
        self.used = 0

    def alloc(self, size: int) -> int | None:
        for i, (offset, room) in enumerate(self._free):
            if room >= size:
                if room == size:
                    del self._free[i]
                else:
                    self._free[i] = (offset + size, room - size)
                self.used += size
                return offset
        return None

    def release(self, offset: int, size: int) -> None:
        self.used -= size
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < offset:
            i += 1
        free.insert(i, (offset, size))
        if i + 1 < len(free) and offset + size == free[i + 1][0]:
            free[i] = (offset, size + free[i + 1][1])
            del free[i + 1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == offset:
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
            del free[i]

    def close(self) -> None:
        self.view.release()
        del self._anchor
        self.mapping.close()


def _tag(run_id: str, request_id: str, edge: Edge) -> int:
    """64 bits naming (run, request, edge): a handle is read only on the edge and request it was put on."""
    text = "\0".join((run_id, request_id, edge.source, edge.target))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8], "little")


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class MooncakeConnector(Connector):
    """Payloads through Mooncake's transfer engine: read once by the consumer from the producer's pool."""

    options_type = MooncakeOptions
    options: MooncakeOptions

    def __init__(self, extra: dict[str, Any] | ConnectorOptions | None, context: ConnectorContext) -> None:
        super().__init__(extra, context)
        from omni_plugin_mooncake.engine import Engine

        opts = self.options
        binding = opts.per_owner.get(context.owner, MooncakeBinding())
        hostname = binding.local_hostname or opts.local_hostname
        device = binding.device_name if binding.device_name is not None else opts.device_name
        self._lock = threading.Lock()
        self._closed = False
        self._pool: _Pool | None = None
        self._slots: dict[int, _Slot] = {}
        #: local buffers of transfers given up past a deadline: (release time, address, mapping)
        self._abandoned: list[tuple[float, int, mmap.mmap]] = []
        try:
            self._engine = Engine(hostname, opts.metadata_server, opts.protocol, device)
        except ImportError as exc:
            self._fail(f"mooncake connector in {context.owner!r} cannot start: {exc}")
        except RuntimeError as exc:
            self._fail(
                f"mooncake connector in {context.owner!r} cannot start its transfer engine: {exc}. Check "
                "local_hostname (an address of this machine), protocol and device_name (rdma needs RDMA NICs), "
                "and metadata_server (reachable, or 'P2PHANDSHAKE')"
            )
        host = hostname.rsplit(":", 1)[0] if hostname.count(":") == 1 else hostname
        # P2P handshake: peers reach this engine at its RPC port; with a metadata server, by its name
        self.session = f"{host}:{self._engine.rpc_port}" if opts.metadata_server == "P2PHANDSHAKE" else hostname

    # -- producer side ------------------------------------------------------------------------

    def put(self, edge: Edge, request_id: str, payload: Any, *, timeout: float) -> Handle:
        self._check_open(edge, "put")
        timeout = check_timeout(self.name, edge, "put", timeout)
        encoded = encode(payload)  # PayloadError for what the codec does not carry
        nbytes = encoded.nbytes
        self.check_payload_size(nbytes, edge)
        if nbytes <= self.options.inline_threshold_bytes:
            return {"inline": encoded.to_bytes(), "nbytes": nbytes}

        size = _aligned(HEADER_BYTES + nbytes)
        limit = self.options.buffer_bytes
        if size > limit:
            self._fail(
                f"mooncake put on edge {edge}: a payload of {nbytes:,} bytes does not fit the staging pool "
                f"(buffer_bytes {limit:,}, {HEADER_BYTES} bytes of it per payload for a header): raise "
                "pipeline.connectors.<name>.extra.buffer_bytes or send less per chunk"
            )
        offset, key = self._reserve(edge, request_id, size, nbytes, time.monotonic() + timeout)
        pool = self._pool
        if pool is None:  # closed meanwhile
            self._fail(f"mooncake connector closed during a put on edge {edge}")
        try:
            start = offset + HEADER_BYTES
            encoded.write_into(pool.view[start : start + nbytes])
            # the header last: until it says READY with this key, a get of the handle fails
            tag = _tag(self.context.run_id, request_id, edge)
            _HEADER.pack_into(pool.view, offset, _MAGIC, key, tag, nbytes, _READY)
        except BaseException:
            self._drop(key)
            raise
        return {"session": self.session, "addr": pool.base + offset, "nbytes": nbytes, "key": f"{key:016x}"}

    def _reserve(self, edge: Edge, request_id: str, size: int, nbytes: int, deadline: float) -> tuple[int, int]:
        """A slot of ``size`` bytes, waiting up to ``deadline`` for consumers to take payloads."""
        pause = 0.0005
        while True:
            with self._lock:
                if self._closed:
                    self._fail(f"mooncake connector closed during a put on edge {edge}")
                pool = self._pool or self._open_pool(edge)
                self._reap()
                offset = pool.alloc(size)
                if offset is not None:
                    key = secrets.randbits(64) or 1
                    while key in self._slots:
                        key = secrets.randbits(64) or 1
                    # no READY header yet: a stale handle that pointed here finds another key or state
                    _HEADER.pack_into(pool.view, offset, b"\0" * 8, 0, 0, 0, 0)
                    self._slots[key] = _Slot(key, offset, size, request_id)
                    return offset, key
                waiting, used = len(self._slots), pool.used
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(
                    f"mooncake staging pool of {self.context.owner!r} stayed full: {waiting} payload(s) "
                    f"({used:,} of buffer_bytes {pool.size:,}) wait for their consumers and this payload of "
                    f"{nbytes:,} bytes on edge {edge} found no room in time. Check that stage {edge.target!r} "
                    "reads its inputs, or raise pipeline.connectors.<name>.extra.buffer_bytes"
                )
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 0.01)

    def _open_pool(self, edge: Edge) -> _Pool:
        """The staging pool, mapped and registered at the first put that needs it (before any
        handle to it exists: consumers cache the memory map they fetch on first contact)."""
        size = self.options.buffer_bytes
        try:
            pool = _Pool(size)
        except (OSError, ValueError) as exc:
            self._fail(f"mooncake put on edge {edge}: cannot map a staging pool of {size:,} bytes: {exc}")
        try:
            self._engine.register(pool.base, size)
        except RuntimeError as exc:
            pool.close()
            self._fail(
                f"mooncake put on edge {edge}: cannot register a staging pool of {size:,} bytes: {exc} "
                "(rdma pins it: check `ulimit -l`, or lower buffer_bytes)"
            )
        self._pool = pool
        return pool

    def _reap(self) -> None:
        """Free the slots consumers marked taken (with the lock held)."""
        pool = self._pool
        if pool is None:
            return
        for key, slot in list(self._slots.items()):
            (state,) = _STATE.unpack_from(pool.view, slot.offset + _STATE_OFFSET)
            if state == _TAKEN:
                del self._slots[key]
                pool.release(slot.offset, slot.size)

    def _drop(self, key: int) -> None:
        with self._lock:
            slot = self._slots.pop(key, None)
            if slot is not None and self._pool is not None:
                _HEADER.pack_into(self._pool.view, slot.offset, b"\0" * 8, 0, 0, 0, 0)  # stale handles: gone
                self._pool.release(slot.offset, slot.size)

    def cleanup(self, request_id: str) -> None:
        with self._lock:
            keys = [key for key, slot in self._slots.items() if slot.request_id == request_id]
        for key in keys:
            self._drop(key)

    # -- consumer side --------------------------------------------------------------------------

    def get(self, edge: Edge, request_id: str, handle: Handle, *, timeout: float) -> Any:
        self._check_open(edge, "get")
        timeout = check_timeout(self.name, edge, "get", timeout)
        if isinstance(handle, dict) and "inline" in handle:
            check_handle(self.name, edge, handle, {"inline": (bytes, bytearray), "nbytes": int}, _SHAPE)
            frame = handle["inline"]
            if len(frame) != handle["nbytes"]:
                self._fail(
                    f"mooncake get on edge {edge}: the handle's inline payload has {len(frame):,} bytes but its "
                    f"'nbytes' says {handle['nbytes']:,}: the handle was altered"
                )
            return self._decode(edge, "the inline payload", bytearray(frame))
        check_handle(self.name, edge, handle, {"session": str, "addr": int, "nbytes": int, "key": str}, _SHAPE)
        session, addr, nbytes, key_text = handle["session"], handle["addr"], handle["nbytes"], handle["key"]
        if not _SESSION_RE.fullmatch(session):
            self._fail(f"mooncake get on edge {edge}: the handle's session {session[:80]!r} is not 'host:port'")
        if not _KEY_RE.fullmatch(key_text):
            self._fail(f"mooncake get on edge {edge}: the handle's key {key_text[:40]!r} is not 16 hex digits")
        if addr <= 0 or addr >= 1 << 64:
            self._fail(f"mooncake get on edge {edge}: the handle's addr {addr} is not an address")
        if nbytes < _MIN_FRAME:
            self._fail(f"mooncake get on edge {edge}: the handle says {nbytes} bytes: no payload is that small")
        limit = self.options.max_payload_bytes
        if limit is not None and nbytes > limit:
            self._fail(
                f"mooncake get on edge {edge}: the handle says {nbytes:,} bytes, over this connector's "
                f"max_payload_bytes ({limit:,}): not read"
            )
        return self._read(edge, request_id, session, addr, nbytes, int(key_text, 16), time.monotonic() + timeout)

    def _read(
        self, edge: Edge, request_id: str, session: str, addr: int, nbytes: int, key: int, deadline: float
    ) -> Any:
        total = HEADER_BYTES + nbytes
        try:
            local = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
        except (OSError, ValueError, OverflowError) as exc:
            self._fail(f"mooncake get on edge {edge}: cannot map {total:,} bytes to read the payload into: {exc}")
        anchor = ctypes.c_char.from_buffer(local)
        base = ctypes.addressof(anchor)
        del anchor  # the address stays valid while `local` is mapped
        what = f"payload {key:016x} at {session}"
        try:
            self._engine.register(base, total)
        except RuntimeError as exc:
            local.close()
            self._fail(f"mooncake get on edge {edge}: cannot register the buffer to read {what} into: {exc}")
        keep = False
        try:
            self._engine.read(session, base, addr, total, deadline)
            self._check_header(edge, request_id, local, key, nbytes, what)
            # read the header again: the producer did not free and reuse the slot meanwhile
            self._engine.read(session, base, addr, HEADER_BYTES, deadline)
            self._check_header(edge, request_id, local, key, nbytes, what)
            _STATE.pack_into(local, _STATE_OFFSET, _TAKEN)
            try:
                self._engine.write(session, base + _STATE_OFFSET, addr + _STATE_OFFSET, _STATE.size, deadline)
            except ConnectorError as exc:
                if not getattr(exc, "transfer_failed", False):
                    raise
                keep = getattr(exc, "abandoned", False)
                # the payload is here and checked; the producer frees its slot at cleanup or close
                log.debug("mooncake: could not mark %s taken: %s", what, exc)
        except ConnectorError as exc:
            if not getattr(exc, "transfer_failed", False):
                raise
            keep = getattr(exc, "abandoned", False)
            if keep:
                self._fail(
                    f"mooncake get on edge {edge}: {what} did not arrive within the get's timeout ({exc}); "
                    "the producing process is stopped, overloaded or unreachable"
                )
            self._fail(f"mooncake get on edge {edge}: {what} could not be read: {exc}")
        finally:
            if keep:
                # the engine may still write into it: keep it registered and mapped for a while
                with self._lock:
                    self._abandoned.append((time.monotonic() + _ABANDON_GRACE_S, base, local))
            else:
                self._engine.unregister(base)
            self._release_abandoned()
        frame = memoryview(local)[HEADER_BYTES:total]
        # decode views the mapping: the arrays and tensors it returns keep it alive
        return self._decode(edge, what, frame)

    def _check_header(self, edge: Edge, request_id: str, local: mmap.mmap, key: int, nbytes: int, what: str) -> None:
        magic, got_key, tag, size, state = _HEADER.unpack_from(local, 0)
        gone = (
            f"mooncake get on edge {edge}: {what} is gone: already read (each handle is read once), "
            "its request was cleaned up, or its producer closed"
        )
        if magic != _MAGIC or got_key != key:
            self._fail(gone)
        if state == _TAKEN:
            self._fail(f"mooncake get on edge {edge}: {what} was already read (each handle is read once)")
        if tag != _tag(self.context.run_id, request_id, edge) or size != nbytes or state != _READY:
            self._fail(
                f"mooncake get on edge {edge}: {what} is not a payload of request {request_id!r} on this edge "
                f"of run {self.context.run_id!r} with {nbytes:,} bytes: the handle was altered or misrouted"
            )

    def _release_abandoned(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [entry for entry in self._abandoned if entry[0] <= now]
            self._abandoned = [entry for entry in self._abandoned if entry[0] > now]
        for _, base, _mapping in due:
            self._engine.unregister(base)

    def _decode(self, edge: Edge, what: str, frame: bytearray | memoryview) -> Any:
        try:
            return decode(frame, copy=False)
        except PayloadError as exc:
            self._fail(f"mooncake get on edge {edge}: {what} does not decode: {exc}")

    # -- lifecycle ------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        if self._closed:
            return {"ok": False, "reason": f"the mooncake connector of run {self.context.run_id!r} is closed"}
        with self._lock:
            self._reap()
            pool = self._pool
            return {
                "ok": True,
                "session": self.session,
                "protocol": self.options.protocol,
                "waiting_payloads": len(self._slots),
                "pool_bytes": self.options.buffer_bytes,
                "pool_used_bytes": pool.used if pool is not None else 0,
            }

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
            self._slots.clear()
        engine = getattr(self, "_engine", None)
        if engine is None:
            return
        if pool is not None:
            engine.unregister(pool.base)
        engine.close()  # stops the engine: nothing reads the pool or writes the abandoned buffers after
        if pool is not None:
            pool.close()
        # self._abandoned keeps the buffers of transfers given up on: a handshake thread still
        # blocked may yet start one; they go with this object

    # -- helpers --------------------------------------------------------------------------------

    def _fail(self, message: str) -> NoReturn:
        raise ConnectorError(message, kind=Kind.CONNECTOR, name=self.name)

    def _check_open(self, edge: Edge, op: str) -> None:
        if self._closed:
            self._fail(f"mooncake {op} on edge {edge}: the connector is closed")
