"""``omni generate`` and ``omni models make-tiny`` for image families, end to end in the dev
environment (this interpreter's ``omni``), through the installed FLUX family plugin."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow

OMNI = Path(sys.executable).parent / "omni"
HAS_FLUX = importlib.util.find_spec("omni_plugin_flux") is not None and importlib.util.find_spec("torch") is not None
needs_flux = pytest.mark.skipif(
    not HAS_FLUX, reason="torch and the flux plugin (omni_plugins/flux) are not installed here"
)


def omni(home: Path, *args: str, **extra: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_") and k != "PYTHONPATH"}
    env.update(OMNI_CONFIG_DIR=str(home / "config"), OMNI_CACHE_DIR=str(home / "cache"), **extra)
    return subprocess.run([str(OMNI), *args], capture_output=True, text=True, env=env, cwd=home, timeout=600)


def check(proc: Any) -> Any:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gen-home")


@pytest.fixture(scope="module")
def tiny_dev(home: Path) -> Path:
    model = home / "flux-dev"
    out = check(omni(home, "models", "make-tiny", "flux1-dev", str(model)))
    assert "wrote a tiny flux1-dev checkpoint" in out.stdout and 'omni generate "a red fox in snow"' in out.stdout
    return model


@needs_flux
def test_embedded_default_draws_a_labelled_png_with_metadata(home: Path) -> None:
    from PIL import Image

    from omni_core.generation.media import read_png_metadata

    proc = check(omni(home, "generate", "a red fox in snow", "--seed", "0", "--out", "fox.png"))
    assert "embedded default" in proc.stdout and "RANDOM WEIGHTS" in proc.stdout
    assert "flux1-schnell denoising" in proc.stderr and "4/4" in proc.stderr  # the progress bar
    with Image.open(home / "fox.png") as img:
        assert img.size == (256, 256)
    meta = read_png_metadata(home / "fox.png")
    assert (meta["family"], meta["seed"], meta["steps"], meta["random_weights"]) == ("flux1-schnell", 0, 4, True)
    again = check(omni(home, "generate", "a red fox in snow", "--seed", "0", "--out", "again.png"))
    assert "making the embedded default" not in again.stdout  # made once, then reused
    assert np.array_equal(np.asarray(Image.open(home / "fox.png")), np.asarray(Image.open(home / "again.png")))


@needs_flux
def test_a_tiny_checkpoint_resolves_to_its_sibling_and_runs_the_chosen_backend(home: Path, tiny_dev: Path) -> None:
    proc = check(
        omni(
            home,
            "generate",
            "a red fox",
            "--model",
            str(tiny_dev),
            "--width",
            "32",
            "--height",
            "48",
            "--steps",
            "2",
            "--seed",
            "3",
            "-n",
            "2",
            "--attention-backend",
            "REFERENCE_ATTN",
            "--no-progress",
            "--out",
            "dev.png",
        )
    )
    assert "flux1-dev" in proc.stdout and "RANDOM WEIGHTS" in proc.stdout
    assert "flux.joint: REFERENCE_ATTN" in proc.stdout and "flux.single: REFERENCE_ATTN" in proc.stdout
    assert "denoising" not in proc.stderr
    from PIL import Image

    assert [Image.open(home / f"dev-{i}.png").size for i in (1, 2)] == [(32, 48), (32, 48)]


@needs_flux
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--width", "100"], "width 100 is not allowed: it must be a multiple of 16"),
        (["--frames", "9"], "num_frames applies to video models only"),
        (["--steps", "0"], "num_inference_steps 0 is not allowed"),
        (["--attention-backend", "FLASH_ATTN"], "FLASH_ATTN was chosen explicitly"),
        (["--offload", "model_cpu", "--offload", "layerwise"], "cannot be combined with"),
        (["--model-class-name", "NoSuchPipeline"], "Model class 'NoSuchPipeline'"),
        (["--format", "mp4"], "cannot write an image as 'mp4'"),
    ],
)
def test_bad_options_fail_with_the_rule_and_no_output(
    home: Path, tiny_dev: Path, args: list[str], message: str
) -> None:
    proc = omni(home, "generate", "a fox", "--model", str(tiny_dev), "--no-progress", "--out", "bad.png", *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (home / "bad.png").exists()


@needs_flux
def test_unknown_checkpoint_names_what_would_serve_it(home: Path) -> None:
    odd = home / "odd"
    odd.mkdir()
    (odd / "model_index.json").write_text('{"_class_name": "SanaPipeline", "_diffusers_version": "0.42.1"}')
    proc = omni(home, "generate", "x", "--model", str(odd), "--no-progress", OMNI_PLUGINS="flux,diffusion")
    assert proc.returncode == 1
    assert "pip install omni-plugin-sana" in proc.stderr or "omni-plugin-sana provides it" in proc.stderr


@needs_flux
def test_models_list_shows_image_families(home: Path) -> None:
    proc = check(omni(home, "models", "list"))
    for family in ("flux1-dev", "flux1-schnell", "vits"):
        assert family in proc.stdout


@needs_flux
def test_explain_model_shows_every_choice_before_loading(home: Path, tiny_dev: Path) -> None:
    import json

    proc = check(
        omni(home, "explain", "model", "--model", str(tiny_dev), "--attention-backend", "CHUNKED_ATTN", "--json")
    )
    data = json.loads(proc.stdout)
    assert data["family"] == "flux1-dev" and data["profile"]["default_steps"] == 28
    selections = data["selections"]
    assert selections["model"]["winner"] == "flux1-dev"
    assert {selections[f"attention:flux.{r}"]["winner"] for r in ("joint", "single")} == {"CHUNKED_ATTN"}
    assert selections["offload"]["winner"] is None
    text = check(omni(home, "explain", "model", "--model", str(tiny_dev), "--offload", "layerwise")).stdout
    assert "transformer.guidance_embeds matches" in text and "layerwise" in text and "28 steps" in text
    bad = omni(home, "explain", "model", "--model", str(tiny_dev), "--attention-backend", "FLASH_ATTN")
    assert bad.returncode == 1 and "FLASH_ATTN was chosen explicitly" in bad.stderr
