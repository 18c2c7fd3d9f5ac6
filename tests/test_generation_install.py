"""Installing one image or video family adds only that family: real pip installs of the
repository's family plugins into a venv without torch, read through `omni plugins list`, and
the runtime's catalog naming the distribution to install for a checkpoint no family serves."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from omni_testenv import Venv

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def plugin_copies(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Copies of repository plugins, so pip's in-tree builds never write into the repo."""
    root = tmp_path_factory.mktemp("plugin-src")

    def copy(name: str) -> Path:
        dest = root / name
        if not dest.exists():
            shutil.copytree(
                REPO / "omni_plugins" / name, dest, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
            )
        return dest

    return copy


def models(venv: Venv) -> dict[str, list[str]]:
    result = venv.omni("plugins", "list", "--json")
    assert result.returncode == 0, result.stderr
    listing: dict[str, Any] = json.loads(result.stdout)
    return {
        p["distribution"]: sorted(x["name"] for x in p["provides"] if x["kind"] == "model")
        for p in listing["plugins"]
        if p["status"] == "ok"
    }


def test_one_family_adds_only_its_models(install_plugins: Callable[..., Venv], plugin_copies: Any) -> None:
    venv = install_plugins(plugin_copies("diffusion"), plugin_copies("sana"))
    found = models(venv)
    assert found["omni-plugin-sana"] == ["sana"]
    assert found["omni-plugin-diffusion"] == []  # the runtime registers no model itself
    every_model = [m for names in found.values() for m in names]
    assert every_model == ["sana"]


def test_a_second_family_adds_its_models_beside_the_first(
    install_plugins: Callable[..., Venv], plugin_copies: Any
) -> None:
    venv = install_plugins(plugin_copies("diffusion"), plugin_copies("sana"), plugin_copies("wan"))
    found = models(venv)
    assert found["omni-plugin-sana"] == ["sana"]
    assert found["omni-plugin-wan"] == ["wan2.1-i2v", "wan2.1-t2v", "wan2.2-i2v", "wan2.2-t2v"]


def test_an_unserved_checkpoint_names_the_distribution_to_install(
    install_plugins: Callable[..., Venv], plugin_copies: Any, tmp_path: Path
) -> None:
    venv = install_plugins(plugin_copies("diffusion"), plugin_copies("sana"))
    checkpoint = tmp_path / "flux-checkpoint"
    checkpoint.mkdir()
    (checkpoint / "model_index.json").write_text('{"_class_name": "FluxPipeline", "_diffusers_version": "0.42.1"}')
    result = venv.omni("generate", "a fox", "--model", str(checkpoint), "--no-progress")
    assert result.returncode == 1
    assert "Model class 'FluxPipeline'" in result.stderr and "pip install omni-plugin-flux" in result.stderr
    assert "Known: SanaPipeline, sana" in result.stderr and "Traceback" not in result.stderr
