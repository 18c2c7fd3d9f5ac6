"""Shared fixtures: a tiny checkpoint written once per session and opened once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def sana_plugins() -> Any:
    """The installed plugins narrowed to this one (the hardware layer always loads)."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="sana"))


@pytest.fixture(scope="session")
def tiny_sana(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Sana checkpoint in the diffusers layout."""
    from omni_plugin_sana.family import Sana

    directory = tmp_path_factory.mktemp("sana") / "tiny-sana"
    Sana.make_tiny(directory, seed=0)
    return directory


@pytest.fixture(scope="session")
def sana_omni(tiny_sana: Path, sana_plugins: Any) -> Iterator[Any]:
    from omni_core import Omni

    with Omni(tiny_sana, plugins=sana_plugins, progress=False) as omni:
        yield omni


@pytest.fixture
def no_compute(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Swaps an engine's pipeline for a stand-in that fails the test if it is used at all."""
    from omni_core.testing.generation import refuse_compute

    return lambda omni: refuse_compute(omni, monkeypatch)
