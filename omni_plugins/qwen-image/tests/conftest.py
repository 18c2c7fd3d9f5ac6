"""Shared fixtures: the tiny Qwen-Image checkpoint written once per session, and the plugins
narrowed to this one (the CPU platform and its attention backends always load)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def qwen_image_plugins() -> Any:
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="qwen_image"))


@pytest.fixture(scope="session")
def tiny_qwen_image(tmp_path_factory: pytest.TempPathFactory, qwen_image_plugins: Any) -> Path:
    """The registered family's tiny checkpoint, made through the registry like ``omni models make-tiny``."""
    from omni_core.testing.generation import tiny_checkpoints

    return tiny_checkpoints(qwen_image_plugins, tmp_path_factory)("qwen-image")


@pytest.fixture(scope="session")
def open_qwen_image(qwen_image_plugins: Any) -> Callable[..., Any]:
    """``open_qwen_image(directory, **options)``: an :class:`omni_core.Omni` on a checkpoint."""
    from omni_core.testing.generation import omni_opener

    return omni_opener(qwen_image_plugins)


@pytest.fixture(scope="session")
def transformer_calls() -> Callable[[Any], list[int]]:
    """``transformer_calls(omni)``: a live count of the transformer's forward passes."""
    from omni_core.testing.generation import count_transformer_calls

    return count_transformer_calls
