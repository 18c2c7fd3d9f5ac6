"""The connector contract: how a payload crosses from one stage to the next.

A connector is registered through ``omni_register_connectors`` (its ``ref`` is a subclass of
:class:`Connector`). It is **transport only**: the orchestrator decides where a payload goes;
a connector moves it there and says nothing about routing.

The lifecycle, driven by the pipeline runtime (:mod:`omni_core.pipeline`)::

    conn = cls(extra, context)        # every process of a pipeline builds its own instance
    handle = conn.put(edge, request_id, payload, timeout=...)   # producer side
    payload = conn.get(edge, request_id, handle, timeout=...)   # consumer side, another process
    conn.cleanup(request_id)          # a request failed or was cancelled: drop what it left
    conn.health()                     # {"ok": bool, ...} for `/health` and `omni doctor`
    conn.close()                      # idempotent; the owner also reclaims what it created

The handle a ``put`` returns is small and made of plain values only (str, int, float, bool,
None, bytes, lists and dicts of them: what the payload codec carries, which is how the control
channel sends it) and always has ``"nbytes"``, the encoded
size of the payload: the orchestrator forwards it to the consumer's process over its control
channel and counts the bytes. A handle may carry a small payload inline.

Rules every connector keeps:

* An instance may be called from several threads of its process at once (a stage's worker
  puts and gets while its control loop cleans up a cancelled request).
* ``get`` need not wait for a payload to appear: the orchestrator forwards a handle only after
  its ``put`` returned. A payload that is not there is gone (read, or cleaned up).

* Every wait is bounded: ``put`` and ``get`` take a ``timeout`` in seconds and raise
  :class:`~omni_core.errors.ConnectorError` naming the edge and the timeout when it passes.
* ``get`` of a handle that does not describe a payload of this connector (malformed
  metadata, a stored payload already taken) raises :class:`~omni_core.errors.ConnectorError`;
  it never returns a wrong object and never hangs. The orchestrator forwards each handle
  once, after ``put`` returned, to the consumer of the edge it was put on; a handle that
  carries its payload inline cannot know it was read before, and need not.
* A payload over ``max_payload_bytes`` (an ``extra`` field every connector accepts) is
  refused by ``put`` with :class:`~omni_core.errors.PayloadError` naming the size and the
  setting; nothing is left behind.
* Payloads are encoded with :mod:`omni_core.pipeline.payload` (no pickle): tensors, arrays,
  bytes and nested structures of them. A connector may map the bytes rather than copy them.
* ``cleanup(request_id)`` frees everything the request's payloads hold on this side (segments,
  buffers, keys) whether or not they were read; ``close()`` frees everything this instance
  created. Neither raises for what is already gone.

Helpers for a connector's author: :meth:`Connector.check_payload_size` (the size limit),
:func:`check_timeout` (a bounded wait) and :func:`check_handle` (a handle's keys and types),
each raising the error the rules above name.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

from pydantic import BaseModel, ConfigDict, Field

from omni_core.errors import ConnectorError
from omni_core.identity import DeclaredIdentity
from omni_core.kinds import Kind

#: what a put returns and a get takes: small, JSON/msgpack-safe values only
Handle = dict[str, Any]


@dataclass(frozen=True)
class Edge:
    """One directed link of a pipeline: payloads flow from stage ``source`` to stage ``target``.
    The orchestrator's own end (final outputs) is the target ``"output"``."""

    source: str
    target: str

    def __str__(self) -> str:
        return f"{self.source}->{self.target}"

    @property
    def key(self) -> str:
        """A name-safe form, unique per edge: ``thinker__talker`` (stage names never hold ``__``)."""
        return f"{self.source}__{self.target}"


@dataclass(frozen=True)
class ConnectorContext:
    """Where a connector instance lives. Built by the runtime and passed to every instance."""

    #: unique per running pipeline: names a connector creates (segments, keys) start with it,
    #: so a pipeline's leftovers are found and reclaimed, and two pipelines never collide
    run_id: str
    #: the process this instance serves: a stage's name, or ``"orchestrator"`` (not to be confused
    #: with ``is_owner``, which says whether this instance owns the run's lifetime)
    owner: str
    #: True in the process that owns the pipeline's lifetime (the orchestrator): its ``close``
    #: reclaims what any process of the run left behind (a crashed stage's segments)
    is_owner: bool = False


class ConnectorOptions(BaseModel):
    """The ``extra`` fields every connector accepts; a connector's own options subclass this
    (``options_type``), so an unknown option is an error naming the field, at startup."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: refuse payloads larger than this (encoded bytes); None: no limit
    max_payload_bytes: int | None = Field(default=None, ge=0)


class Connector(DeclaredIdentity, abc.ABC, identity_of=Kind.CONNECTOR):
    """One transport, instantiated once per process and pipeline run."""

    name: ClassVar[str]
    #: the pydantic model of this connector's ``extra`` options
    options_type: ClassVar[type[ConnectorOptions]] = ConnectorOptions
    #: True when producer and consumer must share one process (an in-process queue): the
    #: pipeline refuses it on an edge between two processes, before anything starts
    same_process_only: ClassVar[bool] = False

    def __init__(self, extra: dict[str, Any] | ConnectorOptions | None, context: ConnectorContext) -> None:
        if isinstance(extra, ConnectorOptions):
            extra = extra.model_dump(exclude_unset=True)
        self.options = self.options_type(**(extra or {}))
        self.context = context

    @classmethod
    def validate_options(cls, extra: dict[str, Any]) -> ConnectorOptions:
        """Check ``extra`` before any process starts (raises pydantic's ValidationError)."""
        return cls.options_type(**extra)

    @abc.abstractmethod
    def put(self, edge: Edge, request_id: str, payload: Any, *, timeout: float) -> Handle:
        """Make ``payload`` available to the consumer of ``edge``; return the handle it needs."""

    @abc.abstractmethod
    def get(self, edge: Edge, request_id: str, handle: Handle, *, timeout: float) -> Any:
        """The payload ``handle`` describes (each handle is read once)."""

    @abc.abstractmethod
    def cleanup(self, request_id: str) -> None:
        """Free whatever ``request_id``'s payloads still hold on this side."""

    def health(self) -> dict[str, Any]:
        """``{"ok": True}`` while the transport works, else ``{"ok": False, "reason": ...}``."""
        return {"ok": True}

    @abc.abstractmethod
    def close(self) -> None:
        """Free everything this instance created; idempotent."""

    def check_payload_size(self, nbytes: int, edge: Edge) -> None:
        """Refuse a payload over ``max_payload_bytes`` (call before allocating anything)."""
        from omni_core.errors import PayloadError

        limit = self.options.max_payload_bytes
        if limit is not None and nbytes > limit:
            raise PayloadError(
                f"payload of {nbytes:,} bytes on edge {edge} is over the {self.name!r} connector's "
                f"max_payload_bytes ({limit:,}); raise it in the recipe "
                "(pipeline.connectors.<name>.extra.max_payload_bytes) or send less per chunk"
            )


def _fail(connector: str, message: str) -> NoReturn:
    raise ConnectorError(message, kind=Kind.CONNECTOR, name=connector)


def check_timeout(connector: str, edge: Edge, op: str, timeout: Any) -> float:
    """``timeout`` as seconds; ConnectorError naming ``connector`` (its name), ``op`` (``"put"``
    or ``"get"``) and ``edge`` unless it is a finite number >= 0 (a bool is not): every wait is
    bounded. Call it before waiting for anything."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
        _fail(connector, f"{connector} {op} on edge {edge}: timeout must be a number of seconds >= 0, got {timeout!r}")
    if math.isinf(timeout):
        _fail(connector, f"{connector} {op} on edge {edge}: timeout must be finite (every wait is bounded)")
    return float(timeout)


def check_handle(
    connector: str,
    edge: Edge,
    handle: Any,
    required: dict[str, type | tuple[type, ...]],
    shape: str | None = None,
) -> None:
    """Raise ConnectorError unless ``handle`` is a dict with exactly the ``required`` keys, each
    value of its type (never a bool), and an ``nbytes``, where it has one, >= 0. ``shape``
    describes a valid handle for the message (default: its keys). Call it in ``get`` before
    using anything the handle says; a connector with several kinds of handle calls it for the
    kind the handle claims to be."""
    what = f"{connector} get on edge {edge}: the handle"
    shape = shape or f"a {connector} handle has exactly {sorted(required)}"
    if not isinstance(handle, dict):
        kind = "None" if handle is None else f"a {type(handle).__name__}"
        _fail(connector, f"{what} is {kind}, not a dict ({shape}): it was not made by a {connector} put")
    missing = [k for k in required if k not in handle]
    unknown = [k for k in handle if k not in required]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"lacks {', '.join(map(repr, missing))}")
        if unknown:
            parts.append(f"has unknown key(s) {', '.join(map(repr, unknown))}")
        _fail(connector, f"{what} {' and '.join(parts)} ({shape}): it was not made by a {connector} put")
    for key, types in required.items():
        value = handle[key]
        if isinstance(value, bool) or not isinstance(value, types):
            _fail(connector, f"{what}'s {key!r} is {type(value).__name__} {_short(value)}: not a {connector} handle")
    nbytes = handle.get("nbytes")
    if isinstance(nbytes, int) and nbytes < 0:
        _fail(connector, f"{what}'s 'nbytes' is negative ({nbytes}): not a {connector} handle")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
