"""Shared fixtures: one tiny Bark checkpoint per session and an engine built on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session", autouse=True)
def bark_single_thread() -> Iterator[None]:
    """The tiny checkpoint's matrices are 16 wide: intra-op threads only add synchronisation,
    which on a busy two-core machine costs seconds per sentence. Restored afterwards."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def bark_plugins():  # type: ignore[no-untyped-def]
    """The installed plugins narrowed to this one (the hardware layer always loads)."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="bark"))


@pytest.fixture(scope="session")
def bark_platform(bark_plugins):  # type: ignore[no-untyped-def]
    from omni_core.platforms import select_platform

    return select_platform(bark_plugins).instantiate()


@pytest.fixture(scope="session")
def tiny_bark(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omni_plugin_bark.adapter import BarkAdapter

    return BarkAdapter.make_tiny(tmp_path_factory.mktemp("bark") / "tiny-bark", seed=0)


@pytest.fixture(scope="session")
def bark_engine(tiny_bark: Path, bark_plugins, bark_platform):  # type: ignore[no-untyped-def]
    from omni_core.speech.engine import SpeechEngine

    return SpeechEngine(tiny_bark, plugins=bark_plugins, platform=bark_platform)
