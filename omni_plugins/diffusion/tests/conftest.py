"""Shared fixtures: the runtime's test family, made tiny once per session."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def diffusion_plugins() -> Any:
    """The installed plugins narrowed to the runtime (the CPU platform and its attention
    backends always load: they are the hardware layer)."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="diffusion"))


@pytest.fixture(scope="session")
def tiny_pixart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from runtime_family import TinyPixArt

    directory = tmp_path_factory.mktemp("pixart") / "tiny-pixart"
    TinyPixArt.make_tiny(directory, seed=0)
    return directory


@pytest.fixture(scope="session")
def open_engine(tiny_pixart: Path, diffusion_plugins: Any) -> Any:
    """Open the tiny checkpoint with an attention config (a backend name, dict or None)."""
    from runtime_family import TinyPixArt

    from omni_core.attention.config import AttentionConfig
    from omni_core.generation.model import EngineOptions

    def open_(attention: Any = None, family: type = TinyPixArt, **options: Any) -> Any:
        options.setdefault("progress", False)
        config = AttentionConfig.parse(attention)
        return family.open(
            tiny_pixart, EngineOptions(family="tiny-pixart", attention=config, plugins=diffusion_plugins, **options)
        )

    return open_
