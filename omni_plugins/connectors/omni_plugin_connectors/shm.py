"""``shm``: payloads between processes of one Linux machine through POSIX shared memory.

``put`` encodes the payload (the core's payload codec, never pickle) straight into a new
segment ``/dev/shm/omni-{run}-{request}-{edge}-{instance}_{n}`` and returns
``{"shm": name, "nbytes": n}``; a payload of at most ``inline_threshold_bytes`` travels inside
the handle instead: ``{"inline": frame, "nbytes": n}``. ``get`` opens the segment, unlinks it at
once (so nothing outlives a consumer that crashes later, and a second get of the handle finds
nothing), maps it and decodes it without a copy: the arrays and tensors it returns view the
mapping, which lives exactly as long as they do.

**Linux only.** A segment is what ``shm_open(3)`` (and Python's ``SharedMemory``) creates on
Linux: a file in the tmpfs ``/dev/shm``. This module works on those files directly, which is
what lets ``cleanup`` and ``close`` find a request's or a run's segments by name (a crashed
stage's included), write a segment with ``pwritev`` instead of through a mapping, and keep the
consumer's mapping alive through the returned views. Python's ``multiprocessing``
``resource_tracker`` never sees these segments: it neither unlinks them when their producer
exits (the consumer may not have read them yet) nor warns about them.

**Writing.** ``put`` never maps its segment: it writes the frame's pieces (prefix and header,
padding, each array's own memory) with vectored ``pwritev`` calls, one copy of each buffer and
no page faults. That is about twice as fast as copying into a fresh shared mapping, where every
4 KiB page costs a fault and the zeroing of the page before the copy overwrites it, and the GIL
is released during the copy. Every byte of the segment is written, so every page exists before
the handle does: a full ``/dev/shm`` is ``ENOSPC`` from a write (an error naming the sizes, the
partial segment unlinked), never a SIGBUS, in the producer or in a consumer reading its mapping.

**Timeouts.** Both operations are immediate: ``put`` never waits for room, and ``get`` never
waits for a segment to appear (the orchestrator forwards a handle only after its ``put``
returned), so a missing segment is a ConnectorError at once. ``timeout`` is still checked.

**Inline handles** carry the payload itself: read-once is enforced for segments only (an
inline handle read twice decodes twice).

In containers ``/dev/shm`` is often small (Docker's default is 64 MB): start the container
with ``--shm-size`` (or ``--ipc=host``), or raise ``inline_threshold_bytes`` / pick another
connector for the edge.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import re
import stat
import struct
import threading
import uuid
from typing import Any, NoReturn, cast

from pydantic import Field

from omni_core.errors import ConnectorError, PayloadError
from omni_core.kinds import Kind
from omni_core.pipeline.connector import Connector, ConnectorContext, ConnectorOptions, Edge, Handle
from omni_core.pipeline.payload import ALIGNMENT, MAGIC, PREFIX_SIZE, VERSION, Encoded, decode, encode
from omni_plugin_connectors._common import check_handle, check_timeout, fail, name_component

#: where POSIX shared memory lives on Linux (``shm_open("/x")`` is ``/dev/shm/x``)
SHM_DIR = "/dev/shm"

#: the characters of every name this connector creates or accepts (no "/", no ".")
_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,255}")
_RUN_LIMIT = 40
_REQUEST_LIMIT = 64
_EDGE_LIMIT = 48

#: what a valid handle looks like, for the errors about one that is not
_SHAPE = "a shm handle is {'shm': segment name, 'nbytes': n} or {'inline': frame bytes, 'nbytes': n}"

_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = _OPEN_FLAGS | os.O_CREAT | os.O_EXCL

#: the errors of a write that found no room (tmpfs full, memory cgroup, quota, ``ulimit -f``)
_NO_ROOM = frozenset({errno.ENOSPC, errno.ENOMEM, errno.EDQUOT, errno.EFBIG})
#: the most buffers one ``pwritev`` takes (Linux's IOV_MAX)
_IOV_MAX = 1024
#: the frame's fixed prefix (omni_core.pipeline.payload's layout): magic, version, flags, header
#: length, frame length; the tests check that segments hold exactly the codec's own frames
_FRAME_PREFIX = struct.Struct("<4sHHIQ")
_ZEROS = bytes(ALIGNMENT)


class ShmOptions(ConnectorOptions):
    """The ``extra`` options of the ``shm`` connector."""

    #: payloads of at most this many encoded bytes travel inside the handle (no segment); 0: none
    inline_threshold_bytes: int = Field(default=65536, ge=0)


def segment_prefix(run_id: str, request_id: str | None = None) -> str:
    """The name prefix of a run's segments, or of one request's: ``omni-{run}-`` / ``omni-{run}-{request}-``."""
    prefix = f"omni-{name_component(run_id, _RUN_LIMIT)}-"
    if request_id is not None:
        prefix += f"{name_component(request_id, _REQUEST_LIMIT)}-"
    return prefix


def segments(prefix: str) -> list[str]:
    """The names in ``/dev/shm`` that start with ``prefix`` (empty if ``/dev/shm`` is missing)."""
    try:
        with os.scandir(SHM_DIR) as entries:
            return sorted(e.name for e in entries if e.name.startswith(prefix))
    except OSError:
        return []


def _unlink(name: str) -> bool:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        return False
    return True


def shm_free_bytes() -> int | None:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _frame_parts(encoded: Encoded) -> list[bytes | memoryview]:
    """The frame ``encoded.write_into`` would write, as its consecutive non-empty pieces: the
    prefix with the header, then each buffer (the payload's own memory, not copied) after the
    zero padding that aligns it, then the final padding. ``b"".join`` of them is
    ``encoded.to_bytes()``; the layout is omni_core.pipeline.payload's (its module docstring)."""
    header = encoded.header
    nbytes = encoded.nbytes
    parts: list[bytes | memoryview] = [_FRAME_PREFIX.pack(MAGIC, VERSION, 0, len(header), nbytes) + header]
    pos = PREFIX_SIZE + len(header)
    for buffer in encoded.buffers:
        pad = -pos % ALIGNMENT
        if pad:
            parts.append(_ZEROS[:pad])
        if buffer.nbytes:
            parts.append(buffer)
        pos += pad + buffer.nbytes
    tail = nbytes - pos
    if not 0 <= tail < ALIGNMENT:  # the codec's layout is not the one above: fall back on its own copy
        return [encoded.to_bytes()]
    if tail:
        parts.append(_ZEROS[:tail])
    return parts


def _write_frame(fd: int, parts: list[bytes | memoryview]) -> None:
    """Write ``parts`` one after the other into ``fd`` from offset 0, with as few ``pwritev``
    calls as ``_IOV_MAX`` allows. A short write (a single write stops short of 2 GiB; a tmpfs
    that fills up writes what fits and fails on the next write) goes on where it stopped; an
    ``OSError`` (``ENOSPC``, ``EFBIG``, ...) is left to the caller."""
    views = [view for view in map(memoryview, parts) if view.nbytes]
    pos = 0
    i = 0
    while i < len(views):
        written = os.pwritev(fd, views[i : i + _IOV_MAX], pos)
        if written <= 0:  # no progress and no error: treat it as a full file system, never loop forever
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        pos += written
        while written:
            size = views[i].nbytes
            if written < size:
                views[i] = views[i][written:]
                break
            written -= size
            i += 1


class ShmConnector(Connector):
    """Payloads as POSIX shared memory segments, mapped zero-copy by the consumer."""

    options_type = ShmOptions

    def __init__(self, extra: dict[str, Any] | ConnectorOptions | None, context: ConnectorContext) -> None:
        super().__init__(extra, context)
        self._run_prefix = segment_prefix(context.run_id)
        #: marks the segments this instance creates, so its close can reclaim them
        self._token = uuid.uuid4().hex[:12]
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def _threshold(self) -> int:
        return cast(ShmOptions, self.options).inline_threshold_bytes

    # -- the contract ---------------------------------------------------------------------------

    def put(self, edge: Edge, request_id: str, payload: Any, *, timeout: float) -> Handle:
        self._check_open(edge, "put")
        check_timeout(self.name, edge, "put", timeout)
        encoded = encode(payload)  # PayloadError for what the codec does not carry
        nbytes = encoded.nbytes
        self.check_payload_size(nbytes, edge)
        if nbytes <= self._threshold:
            return {"inline": encoded.to_bytes(), "nbytes": nbytes}

        fd, name = self._create(edge, request_id, nbytes)
        try:
            try:
                os.ftruncate(fd, nbytes)  # a `ulimit -f` under the size fails here, before any copy
                _write_frame(fd, _frame_parts(encoded))  # every byte: no page of the segment is left a hole
            finally:
                os.close(fd)  # the segment persists until the consumer (or a cleanup) unlinks it
        except BaseException as exc:
            _unlink(name)  # after the close: a partial segment's pages are free again for _no_room to count
            if isinstance(exc, OSError):
                self._write_failed(edge, name, nbytes, exc)
            raise
        return {"shm": name, "nbytes": nbytes}

    def get(self, edge: Edge, request_id: str, handle: Handle, *, timeout: float) -> Any:
        self._check_open(edge, "get")
        check_timeout(self.name, edge, "get", timeout)  # nothing to wait for: see the module docstring
        if isinstance(handle, dict) and "inline" in handle:
            check_handle(self.name, edge, handle, {"inline": (bytes, bytearray), "nbytes": int}, _SHAPE)
            return self._get_inline(edge, handle)
        check_handle(self.name, edge, handle, {"shm": str, "nbytes": int}, _SHAPE)
        return self._get_segment(edge, request_id, handle["shm"], handle["nbytes"])

    def cleanup(self, request_id: str) -> None:
        for name in segments(segment_prefix(self.context.run_id, request_id)):
            _unlink(name)

    def health(self) -> dict[str, Any]:
        if self._closed:
            return {"ok": False, "reason": f"the {self.name} connector of run {self.context.run_id!r} is closed"}
        if not os.path.isdir(SHM_DIR):
            return {
                "ok": False,
                "reason": f"{SHM_DIR} does not exist: the shm connector needs Linux POSIX shared memory; "
                "use another connector on this machine",
            }
        if not os.access(SHM_DIR, os.W_OK | os.X_OK):
            return {
                "ok": False,
                "reason": f"{SHM_DIR} is not writable by this process (uid {os.getuid()}): fix its permissions "
                "(it should be mode 1777) or use another connector",
            }
        return {"ok": True, "segments": len(segments(self._run_prefix)), "shm_free_bytes": shm_free_bytes()}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for name in segments(self._run_prefix):
            # the owner reclaims the whole run's (a crashed stage's included); others their own unread ones
            if self.context.is_owner or name.rsplit("-", 1)[-1].startswith(f"{self._token}_"):
                _unlink(name)

    # -- put ------------------------------------------------------------------------------------

    def _create(self, edge: Edge, request_id: str, nbytes: int) -> tuple[int, str]:
        free = shm_free_bytes()
        if free is not None and nbytes > free:
            self._no_room(edge, nbytes, None)
        base = f"{self._edge_prefix(edge, request_id)}{self._token}_"
        for _ in range(8):
            name = f"{base}{next(self._seq)}"
            try:
                return os.open(os.path.join(SHM_DIR, name), _CREATE_FLAGS, 0o600), name
            except FileExistsError:
                continue  # another process made this name (a stale segment): take the next number
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                    self._no_room(edge, nbytes, exc)
                fail(
                    self.name,
                    f"{self.name} put on edge {edge}: cannot create a segment in {SHM_DIR}: {exc.strerror} "
                    f"(errno {exc.errno}); check that {SHM_DIR} exists and is writable, or use another connector",
                )
        fail(self.name, f"{self.name} put on edge {edge}: 8 segment names in a row were taken ({base}*)")

    def _write_failed(self, edge: Edge, name: str, nbytes: int, exc: OSError) -> NoReturn:
        if exc.errno in _NO_ROOM:
            self._no_room(edge, nbytes, exc)
        raise ConnectorError(
            f"{self.name} put on edge {edge}: cannot write segment {name!r} of {nbytes:,} bytes in {SHM_DIR}: "
            f"{exc.strerror} (errno {exc.errno}); check {SHM_DIR}, or move this edge to another connector",
            kind=Kind.CONNECTOR,
            name=self.name,
        ) from exc

    def _no_room(self, edge: Edge, nbytes: int, exc: OSError | None) -> NoReturn:
        free = shm_free_bytes()
        have = f"{free:,} bytes free" if free is not None else "an unknown amount free"
        cause = f" ({exc.strerror}, errno {exc.errno})" if exc is not None else ""
        if exc is not None and exc.errno == errno.EFBIG:
            cause += " (this process's file size limit, `ulimit -f`, is under the payload's size: raise it)"
        raise ConnectorError(
            f"{self.name} put on edge {edge}: no room in {SHM_DIR} for a payload of {nbytes:,} bytes{cause}: "
            f"{SHM_DIR} has {have}. Give it more (a container: docker run --shm-size=8g, or --ipc=host), "
            "send less per chunk, or move this edge to another connector (or, for payloads of a few KiB, "
            "raise the recipe's connectors.shm.extra.inline_threshold_bytes so they travel in the handle)",
            kind=Kind.CONNECTOR,
            name=self.name,
        ) from exc

    # -- get ------------------------------------------------------------------------------------

    def _get_inline(self, edge: Edge, handle: Handle) -> Any:
        frame = handle["inline"]
        if len(frame) != handle["nbytes"]:
            fail(
                self.name,
                f"{self.name} get on edge {edge}: the handle's inline payload has {len(frame):,} bytes but its "
                f"'nbytes' says {handle['nbytes']:,}: the handle was altered",
            )
        return self._decode(edge, "the inline payload", bytearray(frame))  # a writable copy of its own

    def _get_segment(self, edge: Edge, request_id: str, name: str, nbytes: int) -> Any:
        prefix = self._edge_prefix(edge, request_id)
        if not (_NAME_RE.fullmatch(name) and name.startswith(prefix)):
            fail(
                self.name,
                f"{self.name} get on edge {edge}: segment name {name[:120]!r} is not a payload of request "
                f"{request_id!r} on this edge of run {self.context.run_id!r} (expected {prefix}...)",
            )
        if nbytes == 0:
            fail(self.name, f"{self.name} get on edge {edge}: the handle says 0 bytes, but no payload is empty")
        path = os.path.join(SHM_DIR, name)
        gone = (
            f"{self.name} get on edge {edge}: payload {name!r} is gone: already read (each handle is read "
            "once), or its request was cleaned up"
        )
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            fail(self.name, gone)
        except OSError as exc:
            fail(self.name, f"{self.name} get on edge {edge}: cannot open segment {name!r}: {exc.strerror}")
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != nbytes:
                fail(
                    self.name,
                    f"{self.name} get on edge {edge}: segment {name!r} has {info.st_size:,} bytes but the handle "
                    f"says {nbytes:,}: the handle was altered (the segment is left for its real handle)",
                )
            try:
                # unlink before reading: exactly one get of a handle wins, and nothing outlives this process
                os.unlink(path)
            except FileNotFoundError:
                fail(self.name, gone)
            mapping = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)  # the mapping stays valid without the descriptor and the name
        # decode views the mapping: the arrays and tensors it returns keep it (through a
        # memoryview) alive, and it is unmapped when the last of them is freed. Nothing here
        # closes it, so no view is ever left pointing at unmapped memory.
        return self._decode(edge, f"segment {name!r}", memoryview(mapping))

    def _decode(self, edge: Edge, what: str, frame: bytearray | memoryview) -> Any:
        try:
            return decode(frame, copy=False)
        except PayloadError as exc:
            fail(self.name, f"{self.name} get on edge {edge}: {what} does not decode: {exc}")

    def _edge_prefix(self, edge: Edge, request_id: str) -> str:
        """``omni-{run}-{request}-{edge}-``: every segment of this request on this edge."""
        return f"{segment_prefix(self.context.run_id, request_id)}{name_component(edge.key, _EDGE_LIMIT)}-"

    def _check_open(self, edge: Edge, op: str) -> None:
        if self._closed:
            fail(self.name, f"{self.name} {op} on edge {edge}: the connector is closed")
