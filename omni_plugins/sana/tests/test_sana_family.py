"""Sana end to end on tiny random weights, through omni's production path:
make_tiny -> model_index.json resolution -> Omni(...).generate."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omni_plugin_sana.family import Sana

from omni_core.generation.request import GenerationOptionError, GenerationRequest
from omni_core.generation.resolve import ModelResolutionError, resolve_model

PROMPT = "a red fox in snow"
RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def test_profile_has_the_production_defaults() -> None:
    resolved = Sana.profile.resolve(GenerationRequest(prompt=PROMPT, seed=0))
    assert (resolved.width, resolved.height) == (1024, 1024)
    assert (resolved.num_inference_steps, resolved.guidance_scale) == (20, 4.5)
    assert resolved.task == "text-to-image" and resolved.num_frames is None
    assert Sana.pipeline_type().__name__ == "SanaPipeline"


def test_generates_images_end_to_end(sana_omni: Any) -> None:
    fields = dict(width=96, height=64, num_inference_steps=2)
    first = sana_omni.generate(PROMPT, seed=0, **fields)
    again = sana_omni.generate(PROMPT, seed=0, **fields)
    other = sana_omni.generate(PROMPT, seed=1, **fields)

    assert not first.videos and len(first.images) == 1
    pixels = first.images[0].pixels
    # resolution binning generates at a trained aspect ratio, then returns exactly the size asked for
    assert pixels.shape == (64, 96, 3) and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels, again.images[0].pixels)
    assert not np.array_equal(pixels, other.images[0].pixels)
    meta = first.metadata
    assert meta.family == "sana"
    assert sana_omni.generation.options.resolution.rule == "model_index"
    # only the cross attention reached an attention backend: attn1 is linear attention
    assert meta.attention == {"cross": "TORCH_SDPA"}
    assert sum(sana_omni.generation.router.calls.values()) > 0


def test_self_attention_is_linear_and_never_calls_sdpa(sana_omni: Any) -> None:
    """Every attn2 call goes through omni's router and no attn1 call does."""
    import torch

    engine = sana_omni.generation
    blocks = engine.pipeline.transformer.transformer_blocks
    assert all(type(b.attn1.processor).__name__ == "SanaLinearAttnProcessor2_0" for b in blocks)
    calls: list[str] = []
    handles = []
    for i, block in enumerate(blocks):
        for name in ("attn1", "attn2"):
            module = getattr(block, name)
            handles.append(module.register_forward_pre_hook(lambda m, a, tag=f"{i}.{name}": calls.append(tag)))
    try:
        engine.router.calls.clear()
        sana_omni.generate(PROMPT, width=64, height=64, num_inference_steps=1, seed=0)
    finally:
        for handle in handles:
            handle.remove()
    cross_calls = sum(1 for c in calls if c.endswith("attn2"))
    assert cross_calls > 0 and sum(1 for c in calls if c.endswith("attn1")) == cross_calls
    # one SDPA call per cross-attention call, all on the cross role: the linear attn1 made none
    assert dict(engine.router.calls) == {("cross", "TORCH_SDPA"): cross_calls}
    assert isinstance(blocks, torch.nn.ModuleList) and len(blocks) == 2


def test_guidance_and_negative_prompt_change_the_image(sana_omni: Any) -> None:
    fields = dict(width=64, height=64, num_inference_steps=2, seed=0)
    base = sana_omni.generate(PROMPT, **fields).images[0].pixels
    weak = sana_omni.generate(PROMPT, guidance_scale=1.0, **fields).images[0].pixels
    negative = sana_omni.generate(PROMPT, negative_prompt="blurry, low quality", **fields).images[0].pixels
    assert not np.array_equal(base, weak)
    assert not np.array_equal(base, negative)


def test_several_images_per_prompt(sana_omni: Any) -> None:
    result = sana_omni.generate(PROMPT, width=64, height=64, num_inference_steps=2, seed=0, num_outputs=2)
    assert [img.pixels.shape for img in result.images] == [(64, 64, 3), (64, 64, 3)]
    assert not np.array_equal(result.images[0].pixels, result.images[1].pixels)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"width": 80}, "width 80 is not allowed: it must be a multiple of 32"),
        ({"height": 16}, "height 16 is not allowed"),
        ({"width": 8192}, "between 32 and 4096"),
        ({"num_frames": 5}, "num_frames applies to video models only"),
        ({"num_inference_steps": 0}, "num_inference_steps 0"),
        ({"extra": {"use_resolution_binning": False}}, "unknown model option"),
    ],
)
def test_refuses_bad_options_before_compute(sana_omni: Any, no_compute: Any, fields: dict, message: str) -> None:
    no_compute(sana_omni)
    with pytest.raises(GenerationOptionError, match=re.escape(message)):
        sana_omni.generate(PROMPT, **{"width": 64, "height": 64, "num_inference_steps": 2, "seed": 0, **fields})


def test_declared_modules_exist_in_the_loaded_pipeline(sana_omni: Any) -> None:
    import torch

    engine = sana_omni.generation
    plan = engine.offload_plan()
    assert (plan.dit_modules, plan.encoder_modules, plan.resident_modules) == (
        ("transformer",),
        ("text_encoder",),
        ("vae",),
    )
    assert isinstance(engine.pipeline.transformer.transformer_blocks, torch.nn.ModuleList)
    assert Sana.role_for("transformer.transformer_blocks.0.attn2") == ("cross", "cross")
    assert Sana.declared_roles() == [("cross", "cross")]


def test_resolution(sana_plugins: Any, tiny_sana: Path, tmp_path: Path) -> None:
    assert resolve_model(sana_plugins, tiny_sana).family == "sana"
    assert resolve_model(sana_plugins, tiny_sana, model_class_name="SanaPipeline").rule == "explicit"
    # a sibling pipeline class this plugin does not serve is not taken for Sana
    index = (tiny_sana / "model_index.json").read_text().replace('"SanaPipeline"', '"SanaSprintPipeline"')
    (tmp_path / "model_index.json").write_text(index)
    with pytest.raises(ModelResolutionError, match="SanaSprintPipeline"):
        resolve_model(sana_plugins, tmp_path)


def test_recipe_pins_the_family_and_valid_settings() -> None:
    from omni_core.generation.recipe import load_recipe

    recipe = load_recipe(RECIPES / "sana.yaml")
    assert recipe.model_class_name == "sana"
    assert recipe.model.startswith("Efficient-Large-Model/")
    assert recipe.attention.default.backend == "TORCH_SDPA"
    resolved = Sana.profile.resolve(GenerationRequest(prompt=PROMPT, seed=0, **recipe.generation))
    assert (resolved.width, resolved.height, resolved.num_inference_steps, resolved.guidance_scale) == (
        1024,
        1024,
        20,
        4.5,
    )
