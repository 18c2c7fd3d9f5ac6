"""Which FLUX family serves a checkpoint: siblings sharing a pipeline class are told apart by
their config predicates (never by load order), and naming a family outright overrides them."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from omni_core.generation.recipe import load_recipe
from omni_core.generation.request import GenerationOptionError
from omni_core.generation.resolve import ModelResolutionError, resolve_model

FOX = "a red fox in snow"
RECIPES = Path(__file__).resolve().parents[3] / "recipes"
FAMILIES = ("flux1-dev", "flux1-schnell", "flux2-dev", "flux2-klein", "flux2-klein-base")


@dataclass
class Reordered:
    """The same plugins with the model registry in another order."""

    models: list[Any]
    records: list[Any] = field(default_factory=list)


def _orders(plugins: Any) -> list[Any]:
    models = list(plugins.models)
    return [plugins, Reordered(models[::-1], list(plugins.records)), Reordered(sorted(models, key=lambda e: e.name))]


def _configs_only(tmp_path: Path, index: dict[str, Any], transformer: dict[str, Any] | None = None) -> Path:
    """A checkpoint directory with configs and no weights (resolution reads configs only)."""
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "model_index.json").write_text(json.dumps({"_diffusers_version": "0.42.1", **index}))
    if transformer is not None:
        (directory / "transformer").mkdir()
        (directory / "transformer" / "config.json").write_text(json.dumps(transformer))
    return directory


@pytest.mark.parametrize("family", ["flux1-dev", "flux1-schnell"])
def test_each_flux1_checkpoint_resolves_to_its_sibling_in_any_load_order(
    tiny_flux: Any, flux_plugins: Any, family: str
) -> None:
    directory = tiny_flux(family)
    config = json.loads((directory / "transformer" / "config.json").read_text())
    assert config["guidance_embeds"] is (family == "flux1-dev")
    for plugins in _orders(flux_plugins):
        resolution = resolve_model(plugins, directory)
        assert resolution.family == family
        assert resolution.rule == "model_index"
        outcomes = {c.name: c.outcome.value for c in resolution.explanation.candidates if c.name.startswith("flux")}
        sibling = "flux1-schnell" if family == "flux1-dev" else "flux1-dev"
        assert outcomes == {family: "selected", sibling: "rejected"}


def test_the_real_schnell_config_resolves_to_schnell(tmp_path: Path, flux_plugins: Any) -> None:
    """FLUX.1 [schnell]'s published transformer config (guidance_embeds false)."""
    directory = _configs_only(
        tmp_path,
        {"_class_name": "FluxPipeline"},
        {
            "_class_name": "FluxTransformer2DModel",
            "attention_head_dim": 128,
            "guidance_embeds": False,
            "in_channels": 64,
            "joint_attention_dim": 4096,
            "num_attention_heads": 24,
            "num_layers": 19,
            "num_single_layers": 38,
            "patch_size": 1,
            "pooled_projection_dim": 768,
        },
    )
    assert resolve_model(flux_plugins, directory).family == "flux1-schnell"


def test_a_flux1_checkpoint_that_says_neither_is_refused_with_the_fix(tmp_path: Path, flux_plugins: Any) -> None:
    directory = _configs_only(tmp_path, {"_class_name": "FluxPipeline"}, {"_class_name": "FluxTransformer2DModel"})
    with pytest.raises(ModelResolutionError, match="matches none of their config predicates") as info:
        resolve_model(flux_plugins, directory)
    assert "transformer.guidance_embeds is absent" in str(info.value)
    assert "--model-class-name" in str(info.value)


@pytest.mark.parametrize("family", ["flux1-dev", "flux1-schnell"])
def test_naming_a_family_overrides_the_predicates(tiny_flux: Any, flux_plugins: Any, family: str) -> None:
    other = "flux1-schnell" if family == "flux1-dev" else "flux1-dev"
    for plugins in _orders(flux_plugins):
        resolution = resolve_model(plugins, tiny_flux(family), model_class_name=other)
        assert (resolution.family, resolution.rule) == (other, "explicit")
        # naming the pipeline class instead still lets the predicates decide
        resolution = resolve_model(plugins, tiny_flux(family), model_class_name="fluxpipeline")
        assert (resolution.family, resolution.rule) == (family, "explicit")


def test_an_explicit_family_runs_with_that_familys_rules(tiny_flux: Any, open_flux: Any) -> None:
    """A [dev] checkpoint opened as [schnell] takes schnell's defaults and refuses guidance."""
    with open_flux(tiny_flux("flux1-dev"), model_class_name="flux1-schnell") as omni:
        assert omni.family == "flux1-schnell"
        with pytest.raises(GenerationOptionError, match="guidance_scale is not used"):
            omni.generate(FOX, width=32, height=32, guidance_scale=3.5)
        result = omni.generate(FOX, width=32, height=32, seed=0)
    assert result.metadata.family == "flux1-schnell"
    assert result.metadata.request.num_inference_steps == 4


def test_a_recipe_pin_overrides_the_predicates_and_an_explicit_name_beats_the_pin(
    tiny_flux: Any, open_flux: Any
) -> None:
    recipe = load_recipe(RECIPES / "flux1-schnell.yaml")
    with open_flux(tiny_flux("flux1-dev"), recipe=recipe) as omni:
        assert omni.family == "flux1-schnell"
        assert omni.explain().rule.startswith("the recipe's model_class_name pin")
    with open_flux(tiny_flux("flux1-dev"), recipe=recipe, model_class_name="flux1-dev") as omni:
        assert omni.family == "flux1-dev"
        # the recipe's generation settings still apply (4 steps) unless the call says otherwise
        result = omni.generate(FOX, width=32, height=32, seed=0, guidance_scale=3.5)
        assert result.metadata.request.num_inference_steps == 4


@pytest.mark.parametrize(
    ("index", "family"),
    [
        ({"_class_name": "Flux2KleinPipeline", "is_distilled": True}, "flux2-klein"),
        ({"_class_name": "Flux2KleinPipeline", "is_distilled": False}, "flux2-klein-base"),
        ({"_class_name": "Flux2KleinPipeline"}, "flux2-klein-base"),
        ({"_class_name": "Flux2Pipeline"}, "flux2-dev"),
    ],
)
def test_flux2_checkpoints_resolve_by_pipeline_and_distillation(
    tmp_path: Path, flux_plugins: Any, index: dict[str, Any], family: str
) -> None:
    directory = _configs_only(tmp_path, index)
    for plugins in _orders(flux_plugins):
        assert resolve_model(plugins, directory).family == family


def test_every_recipe_loads_and_pins_its_family(flux_plugins: Any) -> None:
    registered = {e.name: e for e in flux_plugins.models}
    for family in FAMILIES:
        recipe = load_recipe(RECIPES / f"{family}.yaml")
        assert recipe.model_class_name == family and family in registered
        assert recipe.model.startswith("black-forest-labs/")
        assert recipe.attention.default.backend == "TORCH_SDPA"
        # the recipe's settings pass the family's own rules
        profile = registered[family].load().profile
        from omni_core.generation.request import GenerationRequest

        resolved = profile.resolve(GenerationRequest(prompt=FOX, **recipe.generation))
        assert resolved.width == profile.default_width and resolved.num_inference_steps == profile.default_steps


def test_an_inactive_flux_plugin_is_named_when_its_class_is_unknown(tmp_path: Path) -> None:
    """With the family plugin filtered out, the runtime's catalog says which plugin serves FluxPipeline."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    plugins = load_plugins(isolated_settings(only="diffusion"))
    directory = _configs_only(tmp_path, {"_class_name": "FluxPipeline"})
    with pytest.raises(ModelResolutionError, match="omni-plugin-flux"):
        resolve_model(plugins, directory)


def test_a_copied_checkpoint_resolves_the_same(tiny_flux: Any, flux_plugins: Any, tmp_path: Path) -> None:
    """Resolution depends on the checkpoint's configs only, not its location or name."""
    copy = tmp_path / "renamed-flux1-dev-but-actually-schnell"
    shutil.copytree(tiny_flux("flux1-schnell"), copy)
    assert resolve_model(flux_plugins, copy).family == "flux1-schnell"
    assert json.loads((copy / "model_index.json").read_text())["transformer"] == ["diffusers", "FluxTransformer2DModel"]
