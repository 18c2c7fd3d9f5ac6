"""Shared fixtures: a tiny LTX-Video checkpoint written once per session, and the plugins that serve it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def ltx_plugins():  # type: ignore[no-untyped-def]
    """The installed plugins narrowed to this one (the hardware layer always loads)."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="ltx_video"))


@pytest.fixture(scope="session")
def tiny_ltx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omni_plugin_ltx_video.family import LTXVideo

    directory = tmp_path_factory.mktemp("ltx") / "tiny-ltx-video"
    LTXVideo.make_tiny(directory, seed=0)
    return directory
