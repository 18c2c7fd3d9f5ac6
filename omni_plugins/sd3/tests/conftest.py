"""Shared fixtures: tiny SD3 checkpoints written once per session, and the plugins narrowed
to this one (the CPU platform and its attention backends always load)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def sd3_plugins() -> Any:
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="sd3"))


@pytest.fixture(scope="session")
def tiny_sd3(tmp_path_factory: pytest.TempPathFactory, sd3_plugins: Any) -> Callable[[str], Path]:
    """``tiny_sd3("sd3.5-large")``: that family's tiny checkpoint, made once per session."""
    from omni_core.testing.generation import tiny_checkpoints

    return tiny_checkpoints(sd3_plugins, tmp_path_factory)


@pytest.fixture(scope="session")
def open_sd3(sd3_plugins: Any) -> Callable[..., Any]:
    """``open_sd3(directory, **options)``: an :class:`omni_core.Omni` on a checkpoint."""
    from omni_core.testing.generation import omni_opener

    return omni_opener(sd3_plugins)


@pytest.fixture(scope="session")
def transformer_batches() -> Callable[[Any], list[int]]:
    """``transformer_batches(omni)``: the batch size of every transformer forward pass."""

    def watch(omni: Any) -> list[int]:
        sizes: list[int] = []
        omni.generation.pipeline.transformer.register_forward_pre_hook(
            lambda module, args, kwargs: sizes.append(int(kwargs["hidden_states"].shape[0])), with_kwargs=True
        )
        return sizes

    return watch
