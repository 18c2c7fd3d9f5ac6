"""Shared fixtures: a run id per test, and the check that no test leaves a segment behind."""

from __future__ import annotations

import multiprocessing
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(autouse=True)
def run_id() -> Iterator[str]:
    """A run id of this test's own; after the test no ``/dev/shm/omni-{run_id}-*`` may remain
    (other test runs on the machine have other run ids, so they never interfere)."""
    from omni_plugin_connectors.shm import SHM_DIR, segment_prefix, segments

    rid = f"t{uuid.uuid4().hex[:12]}"
    yield rid
    left = segments(segment_prefix(rid))
    for name in left:  # reclaim them, so a failing test leaks nothing either
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass
    assert left == [], f"segments of run {rid} left in {SHM_DIR}: {left}"


@pytest.fixture(scope="session")
def spawn() -> Any:
    """Stage processes are fresh interpreters: start test processes the same way."""
    return multiprocessing.get_context("spawn")


@pytest.fixture(scope="session")
def connector_plugins() -> Any:
    """The installed plugins narrowed to this one, loaded the way the runtime loads them."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="connectors"))
