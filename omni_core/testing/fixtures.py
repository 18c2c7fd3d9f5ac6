"""pytest fixtures of the conformance kit."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from omni_core.kinds import Kind

#: variables that change what loads; cleared so a developer's shell never leaks into tests
FILTER_VARIABLES = (
    "OMNI_STRICT_PLUGINS",
    "OMNI_SAFE_MODE",
    "OMNI_PLUGINS",
    "OMNI_DISABLE_PLUGINS",
    "OMNI_PLATFORM",
    *(k.allow_env for k in Kind),
    *(k.deny_env for k in Kind),
)


@pytest.fixture
def omni_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private OMNI_CONFIG_DIR/OMNI_CACHE_DIR and no filter variables; yields the directory."""
    from omni_core.platforms import reset_platform
    from omni_core.plugins import reset_plugins

    for name in FILTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMNI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path / "cache"))
    reset_plugins()
    reset_platform()
    yield tmp_path
    reset_plugins()
    reset_platform()
    assert os.environ.get("OMNI_CONFIG_DIR") == str(tmp_path / "config")
