"""Shared fixtures: tiny Wan checkpoints written once per session, and the plugins that serve them."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def wan_plugins():  # type: ignore[no-untyped-def]
    """The installed plugins narrowed to this one (the hardware layer always loads)."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="wan"))


def _tiny(factory: pytest.TempPathFactory, family: str) -> Path:
    from omni_plugin_wan import family as fam

    directory = factory.mktemp("wan") / family
    getattr(fam, family).make_tiny(directory, seed=0)
    return directory


@pytest.fixture(scope="session")
def tiny_wan21_t2v(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "Wan21TextToVideo")


@pytest.fixture(scope="session")
def tiny_wan22_t2v(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "Wan22TextToVideo")


@pytest.fixture(scope="session")
def tiny_wan21_i2v(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "Wan21ImageToVideo")


@pytest.fixture(scope="session")
def tiny_wan22_i2v(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "Wan22ImageToVideo")


@pytest.fixture(scope="session")
def wan_offload_plugins():  # type: ignore[no-untyped-def]
    """This plugin and omni's offload strategies (the Wan 2.2 recipes name model_cpu)."""
    import dataclasses

    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    settings = dataclasses.replace(isolated_settings(), allow_plugins=frozenset({"wan", "offload"}))
    return load_plugins(settings)
