"""What both connectors share: checking a handle's shape and a timeout, and name-safe forms of
run ids, request ids and edges."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, NoReturn

from omni_core.errors import ConnectorError
from omni_core.kinds import Kind
from omni_core.pipeline.connector import Edge

_SAFE = re.compile(r"[A-Za-z0-9_]+")
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def name_component(text: str, limit: int) -> str:
    """``text`` as one ``-``-free name component of at most ``limit`` characters.

    A text made only of ``[A-Za-z0-9_]`` and short enough is kept as it is; any other (a UUID
    with dashes, a long or non-ASCII id) becomes its sanitised head and a hash of the whole
    text, so two different texts practically never share a component, and since no component
    holds ``-``, ``omni-{run}-{request}-`` never prefixes another run's or request's names."""
    if len(text) <= limit and _SAFE.fullmatch(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    head = _UNSAFE.sub("_", text)[: max(0, limit - len(digest) - 1)]
    return f"{head}_{digest}" if head else digest


def fail(connector: str, message: str) -> NoReturn:
    raise ConnectorError(message, kind=Kind.CONNECTOR, name=connector)


def check_timeout(connector: str, edge: Edge, op: str, timeout: Any) -> float:
    """``timeout`` as seconds (a finite number >= 0): every wait is bounded."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
        fail(connector, f"{connector} {op} on edge {edge}: timeout must be a number of seconds >= 0, got {timeout!r}")
    if math.isinf(timeout):
        fail(connector, f"{connector} {op} on edge {edge}: timeout must be finite (every wait is bounded)")
    return float(timeout)


def check_handle(
    connector: str,
    edge: Edge,
    handle: Any,
    required: dict[str, type | tuple[type, ...]],
    shape: str | None = None,
) -> None:
    """Raise ConnectorError unless ``handle`` is a dict with exactly the ``required`` keys, each of
    its type (``nbytes`` is an int >= 0, never a bool). ``shape`` describes a valid handle."""
    what = f"{connector} get on edge {edge}: the handle"
    shape = shape or f"a {connector} handle has exactly {sorted(required)}"
    if not isinstance(handle, dict):
        kind = "None" if handle is None else f"a {type(handle).__name__}"
        fail(connector, f"{what} is {kind}, not a dict ({shape}): it was not made by a {connector} put")
    missing = [k for k in required if k not in handle]
    unknown = [k for k in handle if k not in required]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"lacks {', '.join(map(repr, missing))}")
        if unknown:
            parts.append(f"has unknown key(s) {', '.join(map(repr, unknown))}")
        fail(
            connector,
            f"{what} {' and '.join(parts)} ({shape}): it was not made by a {connector} put",
        )
    for key, types in required.items():
        value = handle[key]
        if isinstance(value, bool) or not isinstance(value, types):
            fail(connector, f"{what}'s {key!r} is {type(value).__name__} {_short(value)}: not a {connector} handle")
    nbytes = handle.get("nbytes")
    if isinstance(nbytes, int) and nbytes < 0:
        fail(connector, f"{what}'s 'nbytes' is negative ({nbytes}): not a {connector} handle")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
