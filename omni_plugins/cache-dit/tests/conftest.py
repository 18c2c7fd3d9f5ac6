"""Tiny checkpoints of the families that declare Cache-DiT, made once per session through the
families' own makers (the standard diffusers layout, loaded back by ``from_pretrained``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    from omni_core.plugins import get_plugins

    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            directory = tmp_path_factory.mktemp(family) / "model"
            get_plugins().models.load(family).make_tiny(directory, seed=0)
            made[family] = directory
        return made[family]

    return make
