"""Shared fixtures: tiny Qwen2.5-Omni checkpoints written once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="package", autouse=True)
def one_thread() -> Iterator[None]:
    """One CPU thread, here and in the stage processes the tests start: the tiny models gain
    nothing from more, and on a busy machine an OpenMP pool's spinning makes them tens of times
    slower. The reference and the stages then also sum in the same order everywhere."""
    torch = pytest.importorskip("torch")
    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"  # spawned stage processes read it when torch starts
    yield
    torch.set_num_threads(threads)
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = env


@pytest.fixture(scope="session")
def tiny_omni(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The family's tiny checkpoint (seed 0), as ``omni models make-tiny qwen2.5-omni`` writes it."""
    from omni_plugin_qwen_omni.model import QwenOmni

    directory = tmp_path_factory.mktemp("qwen-omni") / "tiny"
    QwenOmni.make_tiny(directory, seed=0)
    return directory


@pytest.fixture(scope="session")
def chain(tiny_omni: Path) -> Any:
    """The three stage engines on :func:`tiny_omni`, loaded once, run in this process."""
    from omni_plugin_qwen_omni.reference import StageChain

    return StageChain(tiny_omni)
