"""Which SD3 family serves a checkpoint: the releases share StableDiffusion3Pipeline and are
told apart by their transformer configs (never by load order); naming a family overrides."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from omni_core.generation.recipe import load_recipe
from omni_core.generation.request import GenerationRequest
from omni_core.generation.resolve import resolve_model

FOX = "a red fox in snow"
RECIPES = Path(__file__).resolve().parents[3] / "recipes"
FAMILIES = ("sd3.5-large", "sd3.5-medium", "sd3-medium")

_COMMON = {
    "_class_name": "SD3Transformer2DModel",
    "attention_head_dim": 64,
    "in_channels": 16,
    "joint_attention_dim": 4096,
    "out_channels": 16,
    "patch_size": 2,
    "pooled_projection_dim": 2048,
    "sample_size": 128,
}
#: the transformer configs the releases publish (SD 3 Medium predates qk_norm and dual attention)
PUBLISHED = {
    "sd3.5-large": {
        **_COMMON,
        "caption_projection_dim": 2432,
        "num_attention_heads": 38,
        "num_layers": 38,
        "pos_embed_max_size": 192,
        "qk_norm": "rms_norm",
    },
    "sd3.5-medium": {
        **_COMMON,
        "caption_projection_dim": 1536,
        "dual_attention_layers": list(range(13)),
        "num_attention_heads": 24,
        "num_layers": 24,
        "pos_embed_max_size": 384,
        "qk_norm": "rms_norm",
    },
    "sd3-medium": {
        **_COMMON,
        "caption_projection_dim": 1536,
        "num_attention_heads": 24,
        "num_layers": 24,
        "pos_embed_max_size": 192,
    },
}


@dataclass
class Reordered:
    models: list[Any]
    records: list[Any] = field(default_factory=list)


def _orders(plugins: Any) -> list[Any]:
    models = list(plugins.models)
    return [plugins, Reordered(models[::-1], list(plugins.records)), Reordered(sorted(models, key=lambda e: e.name))]


@pytest.mark.parametrize("family", FAMILIES)
def test_each_published_config_resolves_to_its_release_in_any_load_order(
    tmp_path: Path, sd3_plugins: Any, family: str
) -> None:
    (tmp_path / "transformer").mkdir()
    (tmp_path / "model_index.json").write_text(
        json.dumps({"_class_name": "StableDiffusion3Pipeline", "_diffusers_version": "0.31.0"})
    )
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(PUBLISHED[family]))
    for plugins in _orders(sd3_plugins):
        resolution = resolve_model(plugins, tmp_path)
        assert (resolution.family, resolution.rule) == (family, "model_index")


@pytest.mark.parametrize("family", FAMILIES)
def test_each_tiny_checkpoint_resolves_to_its_family(tiny_sd3: Any, sd3_plugins: Any, family: str) -> None:
    """Tiny checkpoints are saved by today's diffusers, which writes every config key
    (``qk_norm: null``, ``dual_attention_layers: []``): the predicates hold for them too."""
    for plugins in _orders(sd3_plugins):
        assert resolve_model(plugins, tiny_sd3(family)).family == family


def test_naming_a_family_overrides_the_predicates(tiny_sd3: Any, sd3_plugins: Any, open_sd3: Any) -> None:
    directory = tiny_sd3("sd3.5-large")
    resolution = resolve_model(sd3_plugins, directory, model_class_name="sd3-medium")
    assert (resolution.family, resolution.rule) == ("sd3-medium", "explicit")
    assert resolve_model(sd3_plugins, directory, model_class_name="StableDiffusion3Pipeline").family == "sd3.5-large"
    with open_sd3(directory, model_class_name="sd3-medium") as omni:
        result = omni.generate(FOX, width=32, height=32, num_inference_steps=1, seed=0)
    assert result.metadata.family == "sd3-medium" and result.metadata.request.guidance_scale == 7.0


def test_every_recipe_loads_and_pins_a_family_whose_rules_it_passes(sd3_plugins: Any) -> None:
    registered = {e.name: e for e in sd3_plugins.models}
    recipes = sorted(RECIPES.glob("sd3*.yaml"))
    assert {p.stem for p in recipes} >= set(FAMILIES)
    for path in recipes:
        recipe = load_recipe(path)
        assert recipe.model.startswith("stabilityai/") and recipe.attention.default.backend == "TORCH_SDPA"
        assert recipe.model_class_name in registered
        if path.stem in FAMILIES:
            assert recipe.model_class_name == path.stem
        profile = registered[recipe.model_class_name].load().profile
        resolved = profile.resolve(GenerationRequest(prompt=FOX, **recipe.generation))
        assert (resolved.width, resolved.height) == (1024, 1024)
        if path.stem in FAMILIES:
            assert (resolved.num_inference_steps, resolved.guidance_scale) == (
                profile.default_steps,
                profile.default_guidance,
            )


def test_a_turbo_recipe_runs_four_unguided_steps(tiny_sd3: Any, open_sd3: Any, transformer_batches: Any) -> None:
    with open_sd3(tiny_sd3("sd3.5-large"), recipe=RECIPES / "sd3.5-large-turbo.yaml") as omni:
        batches = transformer_batches(omni)
        result = omni.generate(FOX, width=32, height=32, seed=0)
    assert batches == [1, 1, 1, 1]
    assert result.metadata.request.num_inference_steps == 4 and result.metadata.request.guidance_scale == 0.0
