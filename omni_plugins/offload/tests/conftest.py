"""Shared fixtures: the installed plugin, loaded the way the runtime loads it, and reference
outputs of an un-offloaded tiny FLUX pipeline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from offload_testkit import build_tiny_flux, run_flux

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def offload_plugins():  # type: ignore[no-untyped-def]
    """The installed plugins narrowed to this one (the hardware layer always loads)."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="offload"))


@pytest.fixture(scope="session")
def flux_reference() -> dict[tuple[str, int], Any]:
    """Outputs of an un-offloaded pipeline: (prompt, seed) -> images, two calls in a row."""
    pipe = build_tiny_flux(seed=0)
    return {
        ("a red fox in snow", 0): run_flux(pipe, "a red fox in snow", 0),
        ("a bowl of fruit", 1): run_flux(pipe, "a bowl of fruit", 1),
    }


@pytest.fixture
def strategy(offload_plugins) -> Callable[[str], Any]:  # type: ignore[no-untyped-def]
    """The installed strategy class by name, through the registry like the runtime."""
    return lambda name: offload_plugins.offloaders.load(name)
