"""Shared fixtures: tiny Z-Image-Turbo and Z-Image checkpoints written once per session, and
the plugins narrowed to this one (the CPU platform and its attention backends always load)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def z_image_plugins() -> Any:
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="z_image"))


@pytest.fixture(scope="session")
def tiny_z_image(tmp_path_factory: pytest.TempPathFactory, z_image_plugins: Any) -> Callable[[str], Path]:
    """``tiny_z_image("z-image-turbo")``: that family's tiny checkpoint, made once per session
    through the registry, like ``omni models make-tiny``."""
    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            directory = tmp_path_factory.mktemp(family) / f"tiny-{family}"
            z_image_plugins.models.get(family).load().make_tiny(directory, seed=0)
            made[family] = directory
        return made[family]

    return make


@pytest.fixture(scope="session")
def open_z_image(z_image_plugins: Any) -> Callable[..., Any]:
    """``open_z_image(directory, **options)``: an :class:`omni_core.Omni` on a checkpoint."""
    from omni_core import Omni

    def open_(directory: Path, **options: Any) -> Any:
        options.setdefault("progress", False)
        return Omni(directory, plugins=z_image_plugins, **options)

    return open_


@pytest.fixture(scope="session")
def transformer_batches() -> Callable[[Any], list[int]]:
    """``transformer_batches(omni)``: the batch size of every transformer forward pass (the
    pipeline passes the latents as a list: 2 items per image with CFG, 1 without)."""

    def watch(omni: Any) -> list[int]:
        batches: list[int] = []
        omni.generation.pipeline.transformer.register_forward_pre_hook(lambda _, args: batches.append(len(args[0])))
        return batches

    return watch
