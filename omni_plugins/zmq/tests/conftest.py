"""Shared fixtures: the installed connector class, loaded through the registry like the runtime,
connectors that are always closed, and producer processes serving commands."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from omni_core.testing.connectors import ConnectorProcess

# the kit is imported in the fixtures: it imports omni_core.testing, which pytest must import
# first, as a plugin, to rewrite its asserts
pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def tcp_plugins():  # type: ignore[no-untyped-def]
    """The installed plugins narrowed to this one (the hardware layer always loads)."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="zmq"))


@pytest.fixture
def make_conn() -> Iterator[Callable[..., Any]]:
    """Build connectors in this process (``make_conn(extra, owner=...)``); all closed afterwards."""
    from tcp_testkit import connector

    made: list[Any] = []

    def make(extra: dict[str, Any] | None = None, owner: str = "test") -> Any:
        conn = connector(extra, owner=owner)
        made.append(conn)
        return conn

    yield make
    for conn in made:
        conn.close()


@pytest.fixture(scope="module")
def producer() -> Iterator[ConnectorProcess]:
    """One producer process for a test module (default options: 64 KiB inline threshold)."""
    from tcp_testkit import producer

    with producer({}) as proc:
        yield proc


@pytest.fixture(scope="module")
def served_producer() -> Iterator[ConnectorProcess]:
    """One producer process for a test module that serves every payload (no inline)."""
    from tcp_testkit import producer

    with producer({"inline_threshold_bytes": 0}) as proc:
        yield proc
