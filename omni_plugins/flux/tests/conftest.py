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
    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            (entry,) = [e for e in flux_plugins.models if e.name == family]
            directory = tmp_path_factory.mktemp(family) / f"tiny-{family}"
            entry.load().make_tiny(directory, seed=0)
            made[family] = directory
        return made[family]

    return make


@pytest.fixture(scope="session")
def open_flux(flux_plugins: Any) -> Callable[..., Any]:
    """``open_flux(directory, **options)``: an :class:`omni_core.Omni` on a checkpoint."""
    from omni_core import Omni

    def open_(directory: Path, **options: Any) -> Any:
        options.setdefault("progress", False)
        return Omni(directory, plugins=flux_plugins, **options)

    return open_


@pytest.fixture(scope="session")
def transformer_calls() -> Callable[[Any], list[int]]:
    """``transformer_calls(omni)``: a live count of the transformer's forward passes."""

    def count_(omni: Any) -> list[int]:
        count = [0]
        omni.generation.pipeline.transformer.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
        return count

    return count_
