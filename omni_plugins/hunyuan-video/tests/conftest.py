"""Shared fixtures: tiny checkpoints written once per session, opened once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def hv_plugins() -> Any:
    """The installed plugins narrowed to this one (the hardware layer always loads)."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="hunyuan_video"))


@pytest.fixture(scope="session")
def tiny_hv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight HunyuanVideo checkpoint in the diffusers layout."""
    from omni_plugin_hunyuan_video.family import HunyuanVideo

    directory = tmp_path_factory.mktemp("hv") / "tiny-hunyuan-video"
    HunyuanVideo.make_tiny(directory, seed=0)
    return directory


@pytest.fixture(scope="session")
def tiny_hv15(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight HunyuanVideo 1.5 checkpoint in the diffusers layout."""
    from omni_plugin_hunyuan_video.family import HunyuanVideo15

    directory = tmp_path_factory.mktemp("hv15") / "tiny-hunyuan-video-1.5"
    HunyuanVideo15.make_tiny(directory, seed=0)
    return directory


@pytest.fixture(scope="session")
def hv_omni(tiny_hv: Path, hv_plugins: Any) -> Iterator[Any]:
    from omni_core import Omni

    with Omni(tiny_hv, plugins=hv_plugins, progress=False) as omni:
        yield omni


@pytest.fixture(scope="session")
def hv15_omni(tiny_hv15: Path, hv_plugins: Any) -> Iterator[Any]:
    from omni_core import Omni

    with Omni(tiny_hv15, plugins=hv_plugins, progress=False) as omni:
        yield omni


@pytest.fixture
def no_compute(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Swaps an engine's pipeline for a stand-in that fails the test if it is used at all."""
    from omni_core.testing.generation import refuse_compute

    return lambda omni: refuse_compute(omni, monkeypatch)
