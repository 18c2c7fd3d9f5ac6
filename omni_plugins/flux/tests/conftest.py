"""Shared fixtures: tiny FLUX checkpoints written once per session, and the plugins narrowed
to this one (the CPU platform and its attention backends always load)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def flux_plugins() -> Any:
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="flux"))


@pytest.fixture(scope="session")
def tiny_flux(tmp_path_factory: pytest.TempPathFactory, flux_plugins: Any) -> Callable[[str], Path]:
    """``tiny_flux("flux1-dev")``: that family's tiny checkpoint, made once per session."""
    from omni_core.testing.generation import tiny_checkpoints

    return tiny_checkpoints(flux_plugins, tmp_path_factory)


@pytest.fixture(scope="session")
def open_flux(flux_plugins: Any) -> Callable[..., Any]:
    """``open_flux(directory, **options)``: an :class:`omni_core.Omni` on a checkpoint."""
    from omni_core.testing.generation import omni_opener

    return omni_opener(flux_plugins)


@pytest.fixture(scope="session")
def transformer_calls() -> Callable[[Any], list[int]]:
    """``transformer_calls(omni)``: a live count of the transformer's forward passes."""
    from omni_core.testing.generation import count_transformer_calls

    return count_transformer_calls
