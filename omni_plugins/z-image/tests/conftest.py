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
    from omni_core.testing.generation import tiny_checkpoints

    return tiny_checkpoints(z_image_plugins, tmp_path_factory)


@pytest.fixture(scope="session")
def open_z_image(z_image_plugins: Any) -> Callable[..., Any]:
    """``open_z_image(directory, **options)``: an :class:`omni_core.Omni` on a checkpoint."""
    from omni_core.testing.generation import omni_opener

    return omni_opener(z_image_plugins)


@pytest.fixture(scope="session")
def transformer_batches() -> Callable[[Any], list[int]]:
    """``transformer_batches(omni)``: the batch size of every transformer forward pass (the
    pipeline passes the latents as a list: 2 items per image with CFG, 1 without)."""

    def watch(omni: Any) -> list[int]:
        batches: list[int] = []
        omni.generation.pipeline.transformer.register_forward_pre_hook(lambda _, args: batches.append(len(args[0])))
        return batches

    return watch
