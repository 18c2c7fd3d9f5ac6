"""Helpers for testing image and video family plugins, so each plugin's ``conftest.py`` is a
few lines: tiny checkpoints made once, ``Omni`` opened on them, transformer passes counted,
and a stand-in pipeline proving a refused request never reached compute. Torch-free itself.

    # tests/conftest.py of a family plugin
    @pytest.fixture(scope="session")
    def tiny_fam(tmp_path_factory, fam_plugins):
        return tiny_checkpoints(fam_plugins, tmp_path_factory)   # tiny_fam("fam-name") -> Path
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def tiny_checkpoints(plugins: Any, tmp_path_factory: Any) -> Callable[[str], Path]:
    """``make(family)``: the registered family's tiny checkpoint, made through the registry
    (as ``omni models make-tiny`` does, marker included) once per session."""
    from omni_core.tiny import write_marker

    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            directory = tmp_path_factory.mktemp(family) / f"tiny-{family}"
            entry = plugins.models.get(family)
            entry.load().make_tiny(directory, seed=0)
            write_marker(directory, family=entry.name, seed=0, provider=str(entry.provider))
            made[family] = directory
        return made[family]

    return make


def omni_opener(plugins: Any) -> Callable[..., Any]:
    """``open_(directory, **options)``: an :class:`omni_core.Omni` on a checkpoint, with these
    plugins and progress bars off unless asked for."""
    from omni_core import Omni

    def open_(directory: Path, **options: Any) -> Any:
        options.setdefault("progress", False)
        return Omni(directory, plugins=plugins, **options)

    return open_


def count_transformer_calls(omni: Any) -> list[int]:
    """A live one-item counter of the opened model's transformer forward passes."""
    count = [0]
    omni.generation.pipeline.transformer.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


class NoCompute:
    """Stands in for a loaded pipeline: any use of it means a request got past validation."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the pipeline ran for a request that should have been refused")

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the pipeline was consulted ({name}) for a request that should have been refused")


def refuse_compute(omni: Any, monkeypatch: Any) -> None:
    """Swap the opened model's pipeline for :class:`NoCompute` for the rest of one test."""
    monkeypatch.setattr(omni.generation, "pipeline", NoCompute())
