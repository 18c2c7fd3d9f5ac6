"""``shm``: payloads between processes of one Linux machine through POSIX shared memory.

``put`` encodes the payload (the core's payload codec, never pickle) straight into a segment
``/dev/shm/omni-{run}-{request}-{edge}-{instance}_{n}`` (a new one, or a large one of the run's
pool: see **Reuse**) and returns ``{"shm": name, "nbytes": n}``; a payload of at most
``inline_threshold_bytes`` travels inside the handle instead: ``{"inline": frame, "nbytes": n}``.
``get`` opens the segment and takes its name at once, so exactly one get of a handle wins and a
second finds nothing: it unlinks it (nothing outlives a consumer that crashes later), or, for a
segment of at least ``reuse_threshold_bytes``, renames it to ``{name}-{instance}_h``, a name of
its own that it holds while it views the segment. It maps the segment and decodes it without a
copy: the arrays and tensors it returns view the mapping, which lives exactly as long as they do.

**Linux only.** A segment is what ``shm_open(3)`` (and Python's ``SharedMemory``) creates on
Linux: a file in the tmpfs ``/dev/shm``. This module works on those files directly, which is
what lets ``cleanup`` and ``close`` find a request's or a run's segments by name (a crashed
stage's included), write a segment with ``pwritev`` instead of through a mapping, pass a
segment's pages from a consumer back to a producer by renaming it, and keep the consumer's
mapping alive through the returned views. Python's ``multiprocessing`` ``resource_tracker``
never sees these segments: it neither unlinks them when their producer exits (the consumer may
not have read them yet) nor warns about them.

**Reuse.** A new segment costs the kernel allocating and zeroing every page before the copy
overwrites it: for a large payload more than the copy itself. So large segments are used again.
When the last view a consumer decoded from a held segment is freed (every tensor, array, slice,
tensor made from an array: the mapping, watched by a ``weakref.finalize``, goes only with the
last of them), the consumer renames the segment into the run's pool,
``omni-{run}--pool-{edge}-{size}-{stamp}-{instance}_p{n}`` (no request's prefix matches it). A
put of at least ``reuse_threshold_bytes`` on that edge, in any process of the run, first claims
one of the edge's pool segments by renaming it to its payload's name (atomic: one put wins
each): the smallest that holds the payload, cut to its size, else the largest, grown (an edge's
sizes recur; another edge's smaller payloads would cut a segment down). A segment is in the
pool only once nothing views it, so no put ever writes under a consumer's data; a forked
child's copies of the views dying never pool it (the parent may still view it). The pool
belongs to the run, not to a request: it holds at most ``reuse_pool_bytes``, and never more
than a quarter of ``/dev/shm``'s size. A segment let go of when the pool is full pushes the
oldest ones out (one larger than the bound is unlinked); a put short of room unlinks pool
segments, oldest first, before it gives up. Several consumers letting go at the same instant
may each see room for theirs: the bound can be passed by those few segments until the next
release. ``reuse_pool_bytes: 0`` turns reuse off: every get unlinks, every put makes a segment.

What reclaims what: ``cleanup(request)`` unlinks the request's segments, held ones too (the
views stay valid: unlinking never breaks a mapping; nothing is pooled when they go); a
consumer's ``close``, or its process's exit without one, unlinks what it holds and what it
pooled (and a closed consumer pools nothing more); a producer's ``close`` its unread payloads;
the owner's ``close`` every ``omni-{run}-*``. A consumer killed while it holds a segment leaves
the held name to its request's cleanup (the orchestrator's, failing the request) or the owner's
close; pool segments of a killed consumer stay, within the bound, until the owner's close.

**Writing.** ``put`` never maps a new segment: it writes the frame's pieces (prefix and header,
padding, each array's own memory) with vectored ``pwritev`` calls, one copy of each buffer and
no page faults. That is about twice as fast as copying into a fresh shared mapping, where every
4 KiB page costs a fault and the zeroing of the page before the copy overwrites it, and the GIL
is released during the copy. A claimed pool segment whose pages all exist and that holds the
payload is cut to its size and copied into through a mapping: one ``memmove`` per piece, in one
go (for a large copy the C library picks its fastest way, which a copy in slices misses) and
with the GIL released. The first time, the mapping is made with ``MAP_POPULATE`` (the existing
pages wired in at once: no fault per page, no zeroing, no room needed); the producer then keeps
it, so that refilling the segment when it comes back from the pool is that copy alone. (On a
2-CPU VM, 64 and 256 MiB: ``pwritev`` into existing pages took about twice as long as the copy,
and mapping and unmapping the segment for each put half as long again.) A kept mapping holds
its segment's pages even once the segment is unlinked: a producer keeps at most
``reuse_pool_bytes`` of them (and 32), and lets go of one whose segment was unlinked since (a
cleanup, a full pool, a close) at its next large put, of all of them at its close or when a put
runs short of room; ``health()`` reports them as ``mapped_bytes``. A claimed segment too short
is grown and written with ``pwritev``, as a new one is. Every byte of the segment is written,
so every page exists before the handle does: a full ``/dev/shm`` is ``ENOSPC`` from a write (an
error naming the sizes, the partial segment unlinked), never a SIGBUS, in the producer or in a
consumer reading its mapping.

**Timeouts.** Both operations are immediate: ``put`` never waits for room, and ``get`` never
waits for a segment to appear (the orchestrator forwards a handle only after its ``put``
returned), so a missing segment is a ConnectorError at once. ``timeout`` is still checked.

**Inline handles** carry the payload itself: read-once is enforced for segments only (an
inline handle read twice decodes twice).

In containers ``/dev/shm`` is often small (Docker's default is 64 MB): start the container
with ``--shm-size`` (or ``--ipc=host``), or raise ``inline_threshold_bytes`` / pick another
connector for the edge. The pool takes at most a quarter of a small ``/dev/shm``, and gives it
back to a put that needs it.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import itertools
import mmap
import os
import re
import stat
import struct
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn, cast

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
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
#: how many pool segments one put tries to claim before it makes a fresh one
_CLAIM_TRIES = 8
#: the most mappings a producer keeps of segments it filled (each holds a descriptor)
_MAPS_KEPT = 32


class ShmOptions(ConnectorOptions):
    """The ``extra`` options of the ``shm`` connector."""

    #: payloads of at most this many encoded bytes travel inside the handle (no segment); 0: none
    inline_threshold_bytes: int = Field(default=65536, ge=0)
    #: segments of at least this many bytes are reused once their consumer let go of them
    #: ("Reuse" in the module docstring); the get unlinks smaller ones at once
    reuse_threshold_bytes: int = Field(default=1 << 20, ge=0)
    #: the most bytes of released segments the run keeps for reuse (its pool), and the most a
    #: producer keeps mapped for refills; never more than a quarter of /dev/shm's size. 0: no
    #: reuse, every get unlinks its segment at once and every put makes a new one
    reuse_pool_bytes: int = Field(default=512 << 20, ge=0)


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


def _copy_frame(mapping: mmap.mmap, parts: list[bytes | memoryview]) -> None:
    """Copy ``parts`` one after the other into ``mapping`` from offset 0: one ``memmove`` per
    piece, with the GIL released (a ctypes call), and in one go (for a large copy the C library
    picks its fastest way, which a copy in slices misses). A read-only piece that is not
    ``bytes`` (no address to take) is copied as a memoryview, holding the GIL."""
    target = memoryview(mapping)
    anchor = (ctypes.c_char * len(mapping)).from_buffer(mapping)
    try:
        base = ctypes.addressof(anchor)
        pos = 0
        for part in parts:
            size = memoryview(part).nbytes
            if isinstance(part, bytes):
                ctypes.memmove(base + pos, part, size)
            elif size:
                with memoryview(part) as view:
                    source = view if view.ndim == 1 and view.format == "B" else view.cast("B")
                    if source.readonly:
                        target[pos : pos + size] = source
                    else:
                        ctypes.memmove(base + pos, (ctypes.c_char * size).from_buffer(source), size)
            pos += size
    finally:
        del anchor  # the mapping can be closed only once nothing exports it
        target.release()


def _all_pages_there(info: os.stat_result) -> bool:
    """Whether every page of the file ``info`` describes is allocated (tmpfs counts them in
    ``st_blocks``): writing through a mapping of it then never needs a new page, so can never
    SIGBUS for want of room."""
    pages = -(-info.st_size // mmap.PAGESIZE)
    return info.st_blocks * 512 >= pages * mmap.PAGESIZE


class _Map(NamedTuple):
    """A producer's mapping of a segment it filled, with a descriptor to see whether it was unlinked since."""

    key: tuple[int, int]
    mapping: mmap.mmap
    fd: int
    size: int

    def unlinked(self) -> bool:
        try:
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return True

    def close(self) -> None:
        self.mapping.close()
        os.close(self.fd)


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
        #: False once closed (or its process exits): a released segment is then unlinked, not pooled
        self._reusing = True
        self._pid = os.getpid()
        #: the run's pool of released segments: ``omni-{run}--pool-{edge}-{size}-{stamp}-{token}_p{n}``.
        #: No request's prefix matches it (a request's name component is never empty).
        self._pool_prefix = f"{self._run_prefix}-pool-"
        #: the mappings this producer filled, by (device, inode), oldest first: refilling the
        #: same segment when it comes back from the pool is then a plain copy ("Writing")
        self._maps: dict[tuple[int, int], _Map] = {}
        _MADE[self._token] = (self._run_prefix, self._pid)

    @property
    def _threshold(self) -> int:
        return cast(ShmOptions, self.options).inline_threshold_bytes

    def _reuses(self, nbytes: int) -> bool:
        options = cast(ShmOptions, self.options)
        return self._reusing and options.reuse_pool_bytes > 0 and nbytes >= options.reuse_threshold_bytes

    # -- the contract ---------------------------------------------------------------------------

    def put(self, edge: Edge, request_id: str, payload: Any, *, timeout: float) -> Handle:
        self._check_open(edge, "put")
        check_timeout(self.name, edge, "put", timeout)
        encoded = encode(payload)  # PayloadError for what the codec does not carry
        nbytes = encoded.nbytes
        self.check_payload_size(nbytes, edge)
        if nbytes <= self._threshold:
            return {"inline": encoded.to_bytes(), "nbytes": nbytes}

        claimed = None
        if self._reuses(nbytes):
            # a kept mapping of a segment unlinked since (a cleanup, a full pool) holds its pages: drop it
            self._unmap(_Map.unlinked)
            claimed = self._claim(edge, request_id, nbytes)
        fd, name = claimed or self._create(edge, request_id, nbytes)
        try:
            try:
                if claimed is not None:
                    self._refill(edge, fd, nbytes, _frame_parts(encoded))
                else:
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
        pool = self._pool()
        return {
            "ok": True,
            "segments": len(segments(self._run_prefix)),
            "pool_segments": len(pool),
            "pool_bytes": sum(size for _, size, _, _ in pool),
            "mapped_bytes": sum(kept.size for kept in list(self._maps.values())),
            "shm_free_bytes": shm_free_bytes(),
        }

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._reusing = False
            _MADE.pop(self._token, None)
        self._unmap(lambda kept: True)
        for name in segments(self._run_prefix):
            # the owner reclaims the whole run's (a crashed stage's included); others what they made:
            # their unread payloads, the segments they hold and those they released to the pool
            if self.context.is_owner or name.rsplit("-", 1)[-1].startswith(f"{self._token}_"):
                _unlink(name)

    # -- reuse ----------------------------------------------------------------------------------

    def _pool(self) -> list[tuple[int, int, str, str]]:
        """The run's pool, oldest first: (stamp, size, name, edge component) of each released segment."""
        pool = []
        for name in segments(self._pool_prefix):
            fields = name[len(self._pool_prefix) :].split("-")
            if len(fields) == 4 and fields[1].isdigit() and fields[2].isdigit():
                pool.append((int(fields[2]), int(fields[1]), name, fields[0]))
        return sorted(pool)

    def _pool_limit(self) -> int:
        limit = cast(ShmOptions, self.options).reuse_pool_bytes
        try:
            st = os.statvfs(SHM_DIR)
        except OSError:
            return limit
        return min(limit, st.f_blocks * st.f_frsize // 4)  # an idle pool never takes most of a small /dev/shm

    def _evict(self, need: int) -> None:
        """Unlink pool segments, oldest first, until ``need`` bytes are free (or the pool is empty),
        after letting go of this producer's mappings (they keep unlinked segments' pages)."""
        self._unmap(lambda kept: True)
        for _, _, name, _ in self._pool():
            free = shm_free_bytes()
            if free is None or free >= need:
                return
            _unlink(name)

    def _release(self, held: str, edge_key: str, nbytes: int, pid: int) -> None:
        """The consumer's last view of the held segment ``held`` is gone (its mapping with it):
        pool the segment for the next put, if the pool has room, else unlink it. A finalizer:
        never raises."""
        if os.getpid() != pid:
            return  # a forked child's copy of the mapping died: the parent may still view the segment
        try:
            limit = self._pool_limit()
            if not self._reusing or _exiting or nbytes > limit:
                _unlink(held)
                return
            pool = self._pool()
            used = sum(size for _, size, _, _ in pool)
            for _, size, name, _ in pool:  # make room, oldest first: the newest sizes are likeliest to recur
                if used + nbytes <= limit:
                    break
                _unlink(name)
                used -= size
            stamp = time.monotonic_ns()
            pooled = f"{self._pool_prefix}{edge_key}-{nbytes}-{stamp}-{self._token}_p{next(self._seq)}"
            os.rename(os.path.join(SHM_DIR, held), os.path.join(SHM_DIR, pooled))
        except FileNotFoundError:
            pass  # a cleanup or a close unlinked it meanwhile
        except OSError:
            _unlink(held)

    def _claim(self, edge: Edge, request_id: str, nbytes: int) -> tuple[int, str] | None:
        """Take a pool segment of this edge for a put of ``nbytes``: the smallest that holds it,
        else the largest (grown by the write). Only this edge's: sizes recur on an edge, and a
        small edge taking a large one's segment would cut it down. Renaming it to the payload's
        name is atomic: one put wins each, and one that finds it gone tries the next."""
        key = name_component(edge.key, _EDGE_LIMIT)
        pool = [(size, name) for _, size, name, edge_key in self._pool() if edge_key == key]
        fits = sorted((size, name) for size, name in pool if size >= nbytes)
        short = sorted(((size, name) for size, name in pool if size < nbytes), reverse=True)
        base = f"{self._edge_prefix(edge, request_id)}{self._token}_"
        for _, pooled in (fits + short)[:_CLAIM_TRIES]:
            name = f"{base}{next(self._seq)}"
            path = os.path.join(SHM_DIR, name)
            try:
                os.rename(os.path.join(SHM_DIR, pooled), path)
            except OSError:
                continue  # another put took it (or a close unlinked it)
            try:
                return os.open(path, _OPEN_FLAGS), name
            except OSError:
                _unlink(name)  # a cleanup of this request raced the put: make a fresh one
                return None
        return None

    def _refill(self, edge: Edge, fd: int, nbytes: int, parts: list[bytes | memoryview]) -> None:
        """Write the frame into a claimed segment. One whose pages all exist and that is at least
        this long: cut to the size and copied into through a mapping populated at once (its pages
        exist: no zeroing, no fault per page, no room needed), a mapping kept for the next time
        this producer claims the segment. Else grown and written as a fresh segment is (the write
        allocates the missing pages, or fails with ENOSPC)."""
        info = os.fstat(fd)
        if not (info.st_size >= nbytes and _all_pages_there(info)):
            self._unmap(lambda kept: kept.key == (info.st_dev, info.st_ino))
            self._ensure_room(edge, nbytes, nbytes - info.st_blocks * 512)
            os.ftruncate(fd, nbytes)
            _write_frame(fd, parts)
            return
        key = (info.st_dev, info.st_ino)
        with self._lock:
            # taken out while it is written into, so no other thread unmaps it. The same inode is
            # the same file: the mapping keeps it alive, so its number cannot be reused.
            kept = self._maps.pop(key, None)
        if kept is not None and not kept.size == info.st_size == nbytes:
            kept.close()
            kept = None
        if kept is None:
            if info.st_size != nbytes:
                os.ftruncate(fd, nbytes)
            kept = _Map(key, mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | _MAP_POPULATE), os.dup(fd), nbytes)
        try:
            _copy_frame(kept.mapping, parts)
        except BaseException:
            kept.close()
            raise
        self._keep(kept)

    def _keep(self, kept: _Map) -> None:
        """Keep ``kept`` for the next refill, within the pool's bound (oldest mappings go first)."""
        limit = self._pool_limit()
        with self._lock:
            if self._closed or kept.size > limit:
                dropped = [kept]
            else:
                self._maps[kept.key] = kept
                dropped = []
                total = sum(m.size for m in self._maps.values())
                while total > limit or len(self._maps) > _MAPS_KEPT:
                    oldest = self._maps.pop(next(iter(self._maps)))
                    total -= oldest.size
                    dropped.append(oldest)
        for mapping in dropped:
            mapping.close()

    def _unmap(self, which: Callable[[_Map], bool]) -> None:
        """Let go of the kept mappings ``which`` selects."""
        with self._lock:
            dropped = [kept for kept in self._maps.values() if which(kept)]
            for kept in dropped:
                del self._maps[kept.key]
        for kept in dropped:
            kept.close()

    def _ensure_room(self, edge: Edge, nbytes: int, need: int) -> None:
        """ConnectorError unless ``need`` more bytes fit in /dev/shm, after evicting pool segments if need be."""
        free = shm_free_bytes()
        if free is not None and need > free:
            self._evict(need)
            free = shm_free_bytes()
            if free is not None and need > free:
                self._no_room(edge, nbytes, None)

    # -- put ------------------------------------------------------------------------------------

    def _create(self, edge: Edge, request_id: str, nbytes: int) -> tuple[int, str]:
        self._ensure_room(edge, nbytes, nbytes)
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
        # a payload's name has no "-" after its edge: a held segment's (``...-{token}_h``) is no payload
        if not (_NAME_RE.fullmatch(name) and name.startswith(prefix) and "-" not in name[len(prefix) :]):
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
            # take the name before reading: exactly one get of a handle wins. A reusable segment is
            # renamed to a name of this instance's that still starts with the request's (cleanup and
            # close find it), any other unlinked: nothing of it outlives this process
            held = f"{name}-{self._token}_h" if self._reuses(nbytes) else None
            try:
                if held is None:
                    os.unlink(path)
                else:
                    os.rename(path, os.path.join(SHM_DIR, held))
            except FileNotFoundError:
                fail(self.name, gone)
            try:
                mapping = mmap.mmap(fd, nbytes)
            except BaseException:
                if held is not None:
                    _unlink(held)
                raise
        finally:
            os.close(fd)  # the mapping stays valid without the descriptor and the name
        # decode views the mapping: the arrays and tensors it returns keep it (through a
        # memoryview) alive, and it is unmapped when the last of them is freed. Nothing here
        # closes it, so no view is ever left pointing at unmapped memory. Only then, with no
        # view left, does the finalizer hand a held segment to the pool for the next put.
        release = None
        if held is not None:
            edge_key = name_component(edge.key, _EDGE_LIMIT)
            release = weakref.finalize(mapping, self._release, held, edge_key, nbytes, os.getpid())
            release.atexit = False  # at exit _exit_all unlinks it: views may live until the process ends
        try:
            return self._decode(edge, f"segment {name!r}", memoryview(mapping))
        except BaseException:
            if release is not None and release.detach() is not None:
                _unlink(held)  # what does not decode is not reused
            raise

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


#: token: (run prefix, process id) of every instance this process made and has not closed
_MADE: dict[str, tuple[str, int]] = {}
_exiting = False


@atexit.register
def _exit_all() -> None:
    """This process exits with instances it did not close: from now on a released segment is
    unlinked, not pooled, and what they hold or pooled goes (views may live until the very end:
    unlinking never breaks a mapping). Their unread payloads stay for their consumers."""
    global _exiting
    _exiting = True
    for token, (run_prefix, pid) in list(_MADE.items()):
        if pid != os.getpid():
            continue  # made by the process this one was forked from
        for name in segments(run_prefix):
            tail = name.rsplit("-", 1)[-1]
            if tail == f"{token}_h" or tail.startswith(f"{token}_p"):
                _unlink(name)
