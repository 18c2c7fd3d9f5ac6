"""Z-Image-Turbo and Z-Image end to end on tiny checkpoints: ``make_tiny``, then
``Omni(dir).generate`` through the shared diffusion runtime (from_pretrained, attention routed
through omni's backends, numpy outputs), plus the families' own rules: Turbo takes no guidance,
the base model's CFG options, sizes in multiples of 16, and which sibling a checkpoint is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omni_core.generation.request import GenerationOptionError, GenerationRequest

#: the repository's recipes folder (tests -> plugin -> omni_plugins -> repository root)
RECIPES = Path(__file__).resolve().parents[3] / "recipes"
FOX = "a red fox in snow"
SMALL = {"width": 32, "height": 32, "num_inference_steps": 2}


# -- Z-Image-Turbo -----------------------------------------------------------------------------


def test_turbo_generates_the_requested_size_deterministically(
    tiny_z_image: Any, open_z_image: Any, transformer_batches: Any
) -> None:
    with open_z_image(tiny_z_image("z-image-turbo")) as omni:
        batches = transformer_batches(omni)
        first = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=0)
        again = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=0)
        other = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=1)
    image = first.images[0]
    assert image.pixels.shape == (32, 64, 3) and image.pixels.dtype == np.uint8
    assert np.array_equal(image.pixels, again.images[0].pixels)
    assert not np.array_equal(image.pixels, other.images[0].pixels)
    meta = first.metadata
    assert meta.family == "z-image-turbo"
    assert meta.request.guidance_scale == 0.0  # no CFG: one single-image pass per step
    assert batches == [1, 1] * 3


def test_turbo_resolution_picks_turbo_over_the_base_predicate(tiny_z_image: Any, open_z_image: Any) -> None:
    with open_z_image(tiny_z_image("z-image-turbo")) as omni:
        explanation = omni.explain()
        assert omni.family == "z-image-turbo"
    outcomes = {c.name: c.outcome.value for c in explanation.candidates}
    assert explanation.winner == "z-image-turbo"
    assert (outcomes["z-image-turbo"], outcomes["z-image"]) == ("selected", "rejected")
    assert "scheduler.shift" in explanation.render()


def test_turbo_defaults_and_refusals(tiny_z_image: Any, open_z_image: Any, transformer_batches: Any) -> None:
    from omni_plugin_z_image.family import ZImageTurbo

    resolved = ZImageTurbo.profile.resolve(GenerationRequest(prompt=FOX, seed=0))
    assert (resolved.width, resolved.height, resolved.num_inference_steps) == (1024, 1024, 9)
    assert resolved.guidance_scale == 0.0
    assert ZImageTurbo.call_kwargs(resolved, None)["guidance_scale"] == 0.0  # the pipeline's default is 5.0
    with open_z_image(tiny_z_image("z-image-turbo")) as omni:
        batches = transformer_batches(omni)
        with pytest.raises(GenerationOptionError, match="guidance_scale is not used"):
            omni.generate(FOX, guidance_scale=4.0, seed=0, **SMALL)
        with pytest.raises(GenerationOptionError, match="negative_prompt is not supported"):
            omni.generate(FOX, negative_prompt="blurry", seed=0, **SMALL)
        with pytest.raises(GenerationOptionError, match="multiple of 16"):
            omni.generate(FOX, width=32, height=24, num_inference_steps=2, seed=0)
        with pytest.raises(GenerationOptionError, match="unknown model option"):
            omni.generate(FOX, extra={"cfg_normalization": True}, seed=0, **SMALL)
        assert batches == []


def test_the_attention_roles_name_the_real_modules(tiny_z_image: Any, open_z_image: Any) -> None:
    """Image-token refiner, caption refiner and joint blocks each run under their own role."""
    with open_z_image(tiny_z_image("z-image-turbo"), attention_backend="TORCH_SDPA") as omni:
        result = omni.generate(FOX, seed=0, **SMALL)
        calls = dict(omni.generation.router.calls)
    # 1 noise-refiner, 1 context-refiner and 2 joint blocks, 2 steps, one pass per step
    assert calls == {
        ("zimage.noise_refiner", "TORCH_SDPA"): 2,
        ("zimage.context_refiner", "TORCH_SDPA"): 2,
        ("zimage.joint", "TORCH_SDPA"): 4,
    }
    assert result.metadata.attention == {
        "zimage.noise_refiner": "TORCH_SDPA",
        "zimage.context_refiner": "TORCH_SDPA",
        "zimage.joint": "TORCH_SDPA",
    }


def test_the_tiny_checkpoints_have_the_real_layout(tiny_z_image: Any) -> None:
    for family, shift in (("z-image-turbo", 3.0), ("z-image", 6.0)):
        directory = tiny_z_image(family)
        index = json.loads((directory / "model_index.json").read_text())
        assert index["_class_name"] == "ZImagePipeline"
        assert index["text_encoder"] == ["transformers", "Qwen3Model"]
        assert index["tokenizer"] == ["transformers", "Qwen2Tokenizer"]
        assert index["vae"] == ["diffusers", "AutoencoderKL"]
        scheduler = json.loads((directory / "scheduler" / "scheduler_config.json").read_text())
        assert scheduler["_class_name"] == "FlowMatchEulerDiscreteScheduler"
        assert (scheduler["shift"], scheduler["use_dynamic_shifting"]) == (shift, False)
        transformer = json.loads((directory / "transformer" / "config.json").read_text())
        text_encoder = json.loads((directory / "text_encoder" / "config.json").read_text())
        assert transformer["cap_feat_dim"] == text_encoder["hidden_size"]
        assert transformer["dim"] // transformer["n_heads"] == sum(transformer["axes_dims"])


# -- Z-Image (base) ----------------------------------------------------------------------------


def test_base_resolution_picks_the_base_model_by_its_scheduler_shift(tiny_z_image: Any, open_z_image: Any) -> None:
    with open_z_image(tiny_z_image("z-image")) as omni:
        explanation = omni.explain()
        family = omni.family
    assert family == "z-image"
    outcomes = {c.name: c.outcome.value for c in explanation.candidates}
    assert (outcomes["z-image"], outcomes["z-image-turbo"]) == ("selected", "rejected")


def test_base_runs_cfg_deterministically(tiny_z_image: Any, open_z_image: Any, transformer_batches: Any) -> None:
    with open_z_image(tiny_z_image("z-image"), model_class_name="z-image") as omni:
        batches = transformer_batches(omni)
        first = omni.generate(FOX, width=32, height=64, num_inference_steps=2, seed=0)
        again = omni.generate(FOX, width=32, height=64, num_inference_steps=2, seed=0)
        other = omni.generate(FOX, width=32, height=64, num_inference_steps=2, seed=1)
        assert batches == [2, 2] * 3  # prompt and negative prompt batched in one pass per step
        del batches[:]
        plain = omni.generate(FOX, width=32, height=64, num_inference_steps=2, seed=0, guidance_scale=0.0)
        assert batches == [1, 1]  # guidance 0 turns CFG off
    image = first.images[0]
    assert image.pixels.shape == (64, 32, 3)
    assert np.array_equal(image.pixels, again.images[0].pixels)
    assert not np.array_equal(image.pixels, other.images[0].pixels)
    assert not np.array_equal(image.pixels, plain.images[0].pixels)
    assert first.metadata.family == "z-image" and first.metadata.request.guidance_scale == 4.0


def test_base_negative_prompt_and_cfg_options_reach_the_pipeline(tiny_z_image: Any, open_z_image: Any) -> None:
    with open_z_image(tiny_z_image("z-image"), model_class_name="z-image") as omni:
        base = omni.generate(FOX, seed=0, **SMALL).images[0].pixels
        negative = omni.generate(FOX, seed=0, negative_prompt="blurry, low quality", **SMALL).images[0].pixels
        # guidance only on the first step (normalised time 0), off after it
        truncated = omni.generate(FOX, seed=0, extra={"cfg_truncation": 0.0}, **SMALL).images[0].pixels
        untruncated = omni.generate(FOX, seed=0, extra={"cfg_truncation": 1.0}, **SMALL).images[0].pixels
    assert not np.array_equal(base, negative)
    assert not np.array_equal(base, truncated)
    assert np.array_equal(base, untruncated)  # 1.0 is the pipeline's default: never truncated


def test_base_defaults_and_refusals(tiny_z_image: Any, open_z_image: Any, transformer_batches: Any) -> None:
    from omni_plugin_z_image.family import ZImage

    resolved = ZImage.profile.resolve(GenerationRequest(prompt=FOX, seed=0))
    assert (resolved.width, resolved.height, resolved.num_inference_steps) == (1024, 1024, 50)
    assert resolved.guidance_scale == 4.0
    with open_z_image(tiny_z_image("z-image"), model_class_name="z-image") as omni:
        batches = transformer_batches(omni)
        with pytest.raises(GenerationOptionError, match="negative_prompt has no effect at guidance_scale 0"):
            omni.generate(FOX, negative_prompt="blurry", guidance_scale=0.0, seed=0, **SMALL)
        with pytest.raises(GenerationOptionError, match="cfg_truncation must be a number between 0 and 1"):
            omni.generate(FOX, extra={"cfg_truncation": 2}, seed=0, **SMALL)
        with pytest.raises(GenerationOptionError, match="cfg_normalization must be true, false or a number"):
            omni.generate(FOX, extra={"cfg_normalization": "yes"}, seed=0, **SMALL)
        with pytest.raises(GenerationOptionError, match="cfg_normalization has no effect"):
            omni.generate(FOX, extra={"cfg_normalization": True}, guidance_scale=0.0, seed=0, **SMALL)
        with pytest.raises(GenerationOptionError, match="multiple of 16"):
            omni.generate(FOX, width=40, height=32, num_inference_steps=2, seed=0)
        assert batches == []


# -- recipes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "hub_id", "family"),
    [("z-image-turbo", "Tongyi-MAI/Z-Image-Turbo", "z-image-turbo"), ("z-image", "Tongyi-MAI/Z-Image", "z-image")],
)
def test_the_recipes_pin_the_family_and_production_settings(
    name: str, hub_id: str, family: str, tiny_z_image: Any, open_z_image: Any, z_image_plugins: Any
) -> None:
    from omni_core.generation.recipe import load_recipe

    recipe = load_recipe(RECIPES / f"{name}.yaml")
    assert (recipe.model, recipe.model_class_name) == (hub_id, family)
    assert recipe.attention.default.backend == "TORCH_SDPA"
    profile = z_image_plugins.models.get(family).load().profile
    expected = {"width": profile.default_width, "height": profile.default_height}
    expected["num_inference_steps"] = profile.default_steps
    if profile.uses_guidance:
        expected["guidance_scale"] = profile.default_guidance
    assert recipe.generation == expected
    with open_z_image(tiny_z_image(family), recipe=RECIPES / f"{name}.yaml") as omni:
        result = omni.generate(FOX, seed=0, **SMALL)
        assert omni.generation.explain()["model"].winner == family
    assert result.metadata.family == family
    assert set(result.metadata.attention.values()) == {"TORCH_SDPA"}
