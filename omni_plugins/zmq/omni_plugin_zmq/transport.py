"""The wire under the ``tcp`` connector: an outbox, the ROUTER server that serves it, and the
DEALER sockets consumers ask with.

Protocol (``omni-tcp/1``), every message a ZeroMQ multipart message (the ROUTER adds and strips
the peer's identity frame in front)::

    request  DEALER -> ROUTER   [PROTOCOL, b"GET", request_id, key]
    reply    ROUTER -> DEALER   [PROTOCOL, b"OK", request_id, frame]      the encoded payload
                                [PROTOCOL, b"GONE", request_id, message]  no such key (read, cleaned up)
                                [PROTOCOL, b"BAD", request_id, message]   a malformed request

``request_id`` is 8 random bytes the asker chooses; a reply whose id is not the one the asker
waits for (a late reply to an earlier, timed-out request) is dropped. The payload travels as one
frame: the producer encodes it once into a buffer of its own (a snapshot, so the producer may
reuse its tensors as soon as ``put`` returns) and ZeroMQ sends that buffer without copying it;
the consumer decodes the frame ZeroMQ received in place, without copying it again.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

import zmq

log = logging.getLogger(__name__)

PROTOCOL = b"omni-tcp/1"
GET = b"GET"
OK = b"OK"
GONE = b"GONE"
BAD = b"BAD"

#: how often (ms) the server thread looks at its stop flag while idle
_POLL_MS = 50
#: the largest request the server reads (a key and a few bytes); a larger one is dropped by ZeroMQ
MAX_REQUEST_BYTES = 8192
#: the longest key (UTF-8 bytes) a handle may name: it fits in a request
MAX_KEY_BYTES = 4096


# -- the outbox ----------------------------------------------------------------------------------


@dataclass
class Entry:
    """One stored payload: the frame (a snapshot, never changed again) and its request."""

    request_id: str
    #: bytes, a bytearray or a numpy uint8 array: anything with the buffer protocol
    data: Any

    @property
    def nbytes(self) -> int:
        return len(self.data)


class Outbox:
    """The payloads this process has put and nobody has read yet, at most ``max_bytes`` of them.

    Thread-safe. ``reserve`` counts a put's bytes before it copies anything, so concurrent puts
    never overshoot the limit. An entry the server takes stops counting at once (ZeroMQ holds
    its buffer until the reply is sent); if the reply cannot be sent, ``finish`` puts it back."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._cond = threading.Condition()
        self._entries: dict[str, Entry] = {}
        #: keys by request: stored entries and entries being served
        self._by_request: dict[str, set[str]] = {}
        #: bytes of stored entries and of puts in progress
        self._bytes = 0
        self._closed = False

    def reserve(self, nbytes: int, timeout: float) -> Literal["ok", "full", "closed"]:
        """Count ``nbytes`` against the limit, waiting up to ``timeout`` for room."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._bytes + nbytes <= self.max_bytes, max(timeout, 0.0))
            if self._closed:
                return "closed"
            if self._bytes + nbytes > self.max_bytes:
                return "full"
            self._bytes += nbytes
            return "ok"

    def release(self, nbytes: int) -> None:
        """Give back a reservation that was never stored."""
        with self._cond:
            self._bytes -= nbytes
            self._cond.notify_all()

    def add(self, key: str, entry: Entry) -> bool:
        """Store a reserved entry; False (and the reservation released) once closed."""
        with self._cond:
            if self._closed:
                self._bytes -= entry.nbytes
                self._cond.notify_all()
                return False
            self._entries[key] = entry
            self._by_request.setdefault(entry.request_id, set()).add(key)
            return True

    def take(self, key: str) -> Entry | None:
        """Remove ``key`` for serving; call :meth:`finish` once the reply is sent or not."""
        with self._cond:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.nbytes
                self._cond.notify_all()
            return entry

    def finish(self, key: str, entry: Entry, *, delivered: bool) -> None:
        """After serving: forget a delivered entry, or put an undelivered one back (unless its
        request was cleaned up meanwhile)."""
        with self._cond:
            keys = self._by_request.get(entry.request_id)
            if keys is None or key not in keys:
                return  # cleaned up while being served
            if delivered or self._closed:
                keys.discard(key)
                if not keys:
                    del self._by_request[entry.request_id]
                return
            self._entries[key] = entry  # may overshoot the limit by this entry: it was counted before
            self._bytes += entry.nbytes

    def drop_request(self, request_id: str) -> int:
        """Drop every stored entry of ``request_id``; how many were dropped."""
        with self._cond:
            dropped = 0
            for key in self._by_request.pop(request_id, ()):
                entry = self._entries.pop(key, None)
                if entry is not None:
                    self._bytes -= entry.nbytes
                    dropped += 1
            self._cond.notify_all()
            return dropped

    def stats(self) -> tuple[int, int]:
        """(stored payloads, bytes counted: stored and being put)."""
        with self._cond:
            return len(self._entries), self._bytes

    def close(self) -> None:
        """Drop everything and wake every waiting put."""
        with self._cond:
            self._closed = True
            self._entries.clear()
            self._by_request.clear()
            self._bytes = 0
            self._cond.notify_all()


# -- the server ----------------------------------------------------------------------------------


def endpoint(host: str, port: int | str) -> str:
    """``tcp://host:port``, an IPv6 literal in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


class Server:
    """A ROUTER socket bound to ``host:port`` (0: an ephemeral port), answering GETs from the
    outbox on a daemon thread. Raises ``zmq.ZMQError`` when it cannot bind."""

    def __init__(self, ctx: zmq.Context[Any], outbox: Outbox, host: str, port: int) -> None:
        self.outbox = outbox
        self.error: str | None = None
        self.served = 0
        self._stop = threading.Event()
        sock = ctx.socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
            # a reply to a peer that is gone (it timed out and closed its socket) raises instead of
            # vanishing, so the payload goes back to the outbox unread
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            if ":" in host:
                sock.setsockopt(zmq.IPV6, 1)
            sock.bind(endpoint(host, port or "*"))
            last = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            self.port = int(last.rsplit(":", 1)[1])
        except BaseException:
            sock.close(linger=0)
            raise
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name=f"omni-tcp-server:{self.port}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float) -> bool:
        """Ask the thread to stop and wait up to ``timeout``; True once it has (socket closed)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _serve(self) -> None:
        sock = self._sock
        try:
            while not self._stop.is_set():
                try:
                    if not sock.poll(_POLL_MS, zmq.POLLIN):
                        continue
                    parts = sock.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    continue
                except zmq.ContextTerminated:
                    break
                except zmq.ZMQError as exc:  # unexpected: note it, keep serving
                    self.error = f"receive failed: {exc}"
                    log.warning("tcp connector server on port %d: %s", self.port, self.error)
                    time.sleep(0.01)
                    continue
                try:
                    self._answer(parts)
                except zmq.ContextTerminated:
                    break
                except Exception as exc:  # a bug must not end the server: note it, keep serving
                    self.error = f"answering a request failed: {type(exc).__name__}: {exc}"
                    log.warning("tcp connector server on port %d: %s", self.port, self.error)
        except BaseException as exc:  # pragma: no cover - the loop catches what it expects
            self.error = f"server thread ended: {type(exc).__name__}: {exc}"
            raise
        finally:
            sock.close(linger=0)

    def _reply(self, identity: bytes, status: bytes, request_id: bytes, body: bytes) -> None:
        with contextlib.suppress(zmq.ZMQError):  # the asker is gone, or its queue is full: nothing to do
            self._sock.send_multipart([identity, PROTOCOL, status, request_id, body], flags=zmq.NOBLOCK)

    def _answer(self, parts: list[bytes]) -> None:
        if len(parts) < 4 or parts[1] != PROTOCOL:
            if len(parts) >= 4:
                self._reply(parts[0], BAD, parts[3], b"not an omni-tcp/1 request")
            return  # not ours and no id to answer with: ignore
        identity, _, verb, request_id = parts[:4]
        if verb != GET or len(parts) != 5:
            self._reply(identity, BAD, request_id, b"malformed request: expected GET with one key")
            return
        try:
            key = parts[4].decode("utf-8")
        except UnicodeDecodeError:
            self._reply(identity, BAD, request_id, b"malformed request: the key is not UTF-8")
            return
        entry = self.outbox.take(key)
        if entry is None:
            self._reply(identity, GONE, request_id, b"no such payload")
            return
        delivered = False
        try:
            # copy=False: ZeroMQ sends the stored snapshot itself (it holds a reference until sent)
            self._sock.send_multipart([identity, PROTOCOL, OK, request_id, entry.data], copy=False, flags=zmq.NOBLOCK)
            delivered = True
            self.served += 1
        except zmq.ContextTerminated:
            raise
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the asker left; EAGAIN: its queue is full
            log.debug("tcp connector: reply for %r not sent (%s); the payload stays unread", key, exc)
        finally:
            self.outbox.finish(key, entry, delivered=delivered)


# -- the askers ----------------------------------------------------------------------------------


class Dealers:
    """DEALER sockets by address, each used by one thread at a time: a get checks one out, and
    checks it back in when it got its answer, or has it closed (a timed-out socket may still
    receive a late reply, so it is never reused). Sockets move between threads only through the
    lock, which is the memory barrier ZeroMQ asks for."""

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._idle: dict[str, list[zmq.Socket[Any]]] = {}
        self._closed = False

    def checkout(self, addr: str) -> zmq.Socket[Any] | None:
        """An idle socket connected to ``addr``, or a new one; None once closed. Raises
        ``zmq.ZMQError`` for an address ZeroMQ refuses."""
        with self._lock:
            if self._closed:
                return None
            idle = self._idle.get(addr)
            if idle:
                return idle.pop()
            try:
                sock: zmq.Socket[Any] = self._ctx.socket(zmq.DEALER)
            except zmq.ContextTerminated:
                return None
        try:
            sock.setsockopt(zmq.LINGER, 0)
            if "[" in addr:
                sock.setsockopt(zmq.IPV6, 1)
            sock.connect(addr)
        except BaseException:
            sock.close(linger=0)
            raise
        return sock

    def checkin(self, addr: str, sock: zmq.Socket[Any], *, reusable: bool) -> None:
        with self._lock:
            if reusable and not self._closed:
                self._idle.setdefault(addr, []).append(sock)
                return
        sock.close(linger=0)

    def close(self) -> None:
        """Close the idle sockets; those in use are closed when checked back in."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for socks in idle.values():
            for sock in socks:
                sock.close(linger=0)


def request(sock: zmq.Socket[Any], key: str, deadline: float) -> tuple[bytes, zmq.Frame] | None:
    """Ask ``sock`` for ``key`` and wait until ``deadline`` (``time.monotonic()``) for the answer
    to this request: ``(status, body)``, body a ``zmq.Frame`` (its ``.buffer`` is the received
    memory), or None when none came in time. Raises ``zmq.ContextTerminated`` when the context
    is closed meanwhile, or another ``zmq.ZMQError``."""
    request_id = os.urandom(8)
    message = [PROTOCOL, GET, request_id, key.encode("utf-8")]
    while True:  # a DEALER with a connection pending queues the request: this rarely waits
        try:
            sock.send_multipart(message, flags=zmq.NOBLOCK)
            break
        except zmq.Again:
            if not sock.poll(_remaining_ms(deadline), zmq.POLLOUT):
                return None
    while True:
        if not sock.poll(_remaining_ms(deadline), zmq.POLLIN):
            return None
        parts = sock.recv_multipart(copy=False, flags=zmq.NOBLOCK)
        if len(parts) == 4 and parts[0].bytes == PROTOCOL and parts[2].bytes == request_id:
            return parts[1].bytes, parts[3]
        # a late reply to an earlier request, or garbage: not ours, keep waiting


def _remaining_ms(deadline: float) -> int:
    """Milliseconds to ``deadline``, rounded up (so a wait never ends before it)."""
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))
