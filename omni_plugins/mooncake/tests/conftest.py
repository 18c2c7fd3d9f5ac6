"""Shared fixtures: a run id per test, the plugin loaded through the registry, and a stage
process (spawned, as the runtime starts one) serving put/get commands.

The transport tests need ``mooncake.engine`` to import here: they skip, saying why, when it
does not (no Mooncake build installed, or the system lacks libibverbs.so.1; see the README)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from omni_core.testing.connectors import ConnectorProcess

# the kit is imported in the fixtures: it imports omni_core.testing, which pytest must import
# first, as a plugin, to rewrite its asserts
pytest_plugins = ["omni_core.testing"]


@pytest.fixture
def run_id() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def mooncake_plugins() -> Any:
    """The installed plugins narrowed to this one, loaded the way the runtime loads them."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="mooncake"))


@pytest.fixture(scope="module")
def stage_run_id() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def stage(stage_run_id: str) -> Iterator[ConnectorProcess]:
    """One stage process for a test module (every payload through the pool: no inline)."""
    from mooncake_testkit import stage

    with stage(stage_run_id, {"inline_threshold_bytes": 0}) as proc:
        yield proc
