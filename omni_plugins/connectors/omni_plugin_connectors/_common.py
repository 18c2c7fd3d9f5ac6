"""What both connectors share: name-safe forms of run ids, request ids and edges, and raising
their ConnectorError. The handle and timeout checks are the core's (omni_core.pipeline.connector)."""

from __future__ import annotations

import hashlib
import re
from typing import NoReturn

from omni_core.errors import ConnectorError
from omni_core.kinds import Kind
from omni_core.pipeline.connector import check_handle as check_handle  # re-exported for both connectors
from omni_core.pipeline.connector import check_timeout as check_timeout

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
