"""Shared fixtures: tiny checkpoints written once per session, engines built on them."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def vits_plugins():  # type: ignore[no-untyped-def]
    """The installed plugins narrowed to this one (the hardware layer always loads)."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="vits"))


@pytest.fixture(scope="session")
def vits_platform(vits_plugins):  # type: ignore[no-untyped-def]
    from omni_core.platforms import select_platform

    return select_platform(vits_plugins).instantiate()


@pytest.fixture(scope="session")
def tiny_vits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A single-speaker tiny VITS checkpoint at 16 kHz."""
    from omni_plugin_vits.adapter import VitsAdapter

    return VitsAdapter.make_tiny(tmp_path_factory.mktemp("vits") / "tiny-vits", seed=0)


@pytest.fixture(scope="session")
def tiny_vits_multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A four-speaker tiny VITS checkpoint."""
    from omni_plugin_vits.adapter import VitsAdapter

    return VitsAdapter.make_tiny(tmp_path_factory.mktemp("vits") / "tiny-vits-multi", seed=0, num_speakers=4)


@pytest.fixture(scope="session")
def vits_engine(tiny_vits: Path, vits_plugins, vits_platform):  # type: ignore[no-untyped-def]
    from omni_core.speech.engine import SpeechEngine

    return SpeechEngine(tiny_vits, plugins=vits_plugins, platform=vits_platform)


@pytest.fixture(scope="session")
def vits_engine_multi(tiny_vits_multi: Path, vits_plugins, vits_platform):  # type: ignore[no-untyped-def]
    from omni_core.speech.engine import SpeechEngine

    return SpeechEngine(tiny_vits_multi, plugins=vits_plugins, platform=vits_platform)
