"""HunyuanVideo and HunyuanVideo 1.5 end to end on tiny random weights, through omni's
production path: make_tiny -> model_index.json resolution -> Omni(...).generate."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omni_plugin_hunyuan_video.family import HunyuanVideo, HunyuanVideo15

from omni_core.generation.request import GenerationOptionError, GenerationRequest
from omni_core.generation.resolve import resolve_model

PROMPT = "a red fox in snow"
RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def _frames(result: Any) -> np.ndarray:
    assert not result.images and len(result.videos) == 1
    return result.videos[0].frames


# -- HunyuanVideo --------------------------------------------------------------------------------


def test_hv_profile_has_the_production_defaults() -> None:
    resolved = HunyuanVideo.profile.resolve(GenerationRequest(prompt=PROMPT, seed=0))
    assert (resolved.width, resolved.height, resolved.num_frames, resolved.fps) == (1280, 720, 129, 24)
    assert (resolved.num_inference_steps, resolved.guidance_scale) == (50, 6.0)
    assert HunyuanVideo.pipeline_type().__name__ == "HunyuanVideoPipeline"


def test_hv_generates_a_video_end_to_end(hv_omni: Any) -> None:
    fields = dict(width=48, height=32, num_frames=5, num_inference_steps=2)
    first = hv_omni.generate(PROMPT, seed=0, **fields)
    again = hv_omni.generate(PROMPT, seed=0, **fields)
    other = hv_omni.generate(PROMPT, seed=1, **fields)

    frames = _frames(first)
    assert frames.shape == (5, 32, 48, 3) and frames.dtype == np.uint8
    assert first.videos[0].fps == 24  # the family's default
    np.testing.assert_array_equal(frames, _frames(again))
    assert not np.array_equal(frames, _frames(other))
    meta = first.metadata
    assert meta.family == "hunyuan-video" and meta.random_weights is False
    assert meta.request.guidance_scale == 6.0  # embedded guidance default
    # every declared call site really went through omni's attention routing
    assert meta.attention == {
        "hunyuan.refiner": "TORCH_SDPA",
        "hunyuan.joint": "TORCH_SDPA",
        "hunyuan.single": "TORCH_SDPA",
    }
    assert hv_omni.generation.options.resolution.rule == "model_index"


def test_hv_embedded_guidance_changes_the_output(hv_omni: Any) -> None:
    fields = dict(width=32, height=32, num_frames=5, num_inference_steps=2, seed=3)
    low = _frames(hv_omni.generate(PROMPT, guidance_scale=1.0, **fields))
    high = _frames(hv_omni.generate(PROMPT, guidance_scale=6.0, **fields))
    assert not np.array_equal(low, high)


def test_hv_true_cfg_uses_the_negative_prompt(hv_omni: Any) -> None:
    fields = dict(width=32, height=32, num_frames=5, num_inference_steps=2, seed=0, extra={"true_cfg_scale": 3.0})
    plain = hv_omni.generate(PROMPT, **{**fields, "extra": {}})
    guided = hv_omni.generate(PROMPT, negative_prompt="blurry, low quality", num_outputs=2, **fields)
    empty_negative = hv_omni.generate(PROMPT, **fields)
    assert len(guided.videos) == 2
    assert all(v.frames.shape == (5, 32, 32, 3) for v in guided.videos)
    assert not np.array_equal(_frames(plain), guided.videos[0].frames)
    assert not np.array_equal(_frames(empty_negative), guided.videos[0].frames)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_frames": 6}, "4*k+1"),
        ({"num_frames": 133}, "at most 129"),
        ({"width": 40}, "multiple of 16"),
        ({"width": 1920, "height": 1088}, "between 16 and 1280"),
        ({"negative_prompt": "blurry"}, "true_cfg_scale"),
        ({"negative_prompt": "blurry", "extra": {"true_cfg_scale": 1.0}}, "true_cfg_scale"),
        ({"extra": {"true_cfg_scale": 0.5}}, "use 1 (off) or more"),
        ({"extra": {"true_cfg_scale": "high"}}, "must be a number"),
        ({"extra": {"flow_shift": 5.0}}, "unknown model option"),
        ({"image": np.zeros((32, 32, 3), np.uint8)}, "input image is not used"),
    ],
)
def test_hv_refuses_bad_options_before_compute(hv_omni: Any, no_compute: Any, fields: dict, message: str) -> None:
    no_compute(hv_omni)
    with pytest.raises(GenerationOptionError, match=re.escape(message)):
        hv_omni.generate(PROMPT, **{"width": 32, "height": 32, "num_inference_steps": 2, "seed": 0, **fields})


# -- HunyuanVideo 1.5 ----------------------------------------------------------------------------


def test_hv15_profile_has_the_production_defaults() -> None:
    resolved = HunyuanVideo15.profile.resolve(GenerationRequest(prompt=PROMPT, seed=0))
    assert (resolved.width, resolved.height, resolved.num_frames, resolved.fps) == (848, 480, 121, 24)
    assert (resolved.num_inference_steps, resolved.guidance_scale) == (50, 6.0)


def test_hv15_default_size_is_the_pipelines_own() -> None:
    """848x480 is what HunyuanVideo15Pipeline picks for the 480p checkpoints (target size 640, 16:9)."""
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    processor = HunyuanVideo15ImageProcessor(vae_scale_factor=16)
    height, width = processor.calculate_default_height_width(9, 16, 640)
    assert (width, height) == (HunyuanVideo15.profile.default_width, HunyuanVideo15.profile.default_height)


def test_hv15_generates_a_video_end_to_end(hv15_omni: Any, tiny_hv15: Path) -> None:
    fields = dict(width=48, height=32, num_frames=5, num_inference_steps=2)
    first = hv15_omni.generate(PROMPT, seed=0, **fields)
    again = hv15_omni.generate(PROMPT, seed=0, **fields)
    other = hv15_omni.generate(PROMPT, seed=1, **fields)

    frames = _frames(first)
    assert frames.shape == (5, 32, 48, 3) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames, _frames(again))
    assert not np.array_equal(frames, _frames(other))
    meta = first.metadata
    assert meta.family == "hunyuan-video-1.5"
    assert meta.attention == {"hunyuan.refiner": "TORCH_SDPA", "hunyuan.joint": "TORCH_SDPA"}
    assert hv15_omni.generation.options.resolution.rule == "model_index"


def test_hv15_guidance_scale_drives_the_guider(hv15_omni: Any) -> None:
    fields = dict(width=32, height=32, num_frames=5, num_inference_steps=2, seed=0)
    no_cfg = _frames(hv15_omni.generate(PROMPT, guidance_scale=1.0, **fields))
    assert hv15_omni.generation.pipeline.guider.guidance_scale == 1.0
    cfg = _frames(hv15_omni.generate(PROMPT, **fields))
    assert hv15_omni.generation.pipeline.guider.guidance_scale == 6.0
    negative = _frames(hv15_omni.generate(PROMPT, negative_prompt="blurry", **fields))
    assert not np.array_equal(no_cfg, cfg)
    assert not np.array_equal(cfg, negative)


def test_hv15_quoted_text_goes_through_the_glyph_encoder(hv15_omni: Any) -> None:
    fields = dict(width=32, height=32, num_frames=5, num_inference_steps=2, seed=0)
    plain = _frames(hv15_omni.generate("a shop sign that says hello", **fields))
    glyph = _frames(hv15_omni.generate('a shop sign that says "hello"', **fields))
    assert glyph.shape == (5, 32, 32, 3)
    assert not np.array_equal(plain, glyph)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_frames": 8}, "num_frames 8"),
        ({"num_frames": 125}, "at most 121"),
        ({"height": 24}, "multiple of 16"),
        ({"num_outputs": 2}, "num_outputs 2"),
        ({"fps": 0}, "fps 0"),
    ],
)
def test_hv15_refuses_bad_options_before_compute(hv15_omni: Any, no_compute: Any, fields: dict, message: str) -> None:
    no_compute(hv15_omni)
    with pytest.raises(GenerationOptionError, match=re.escape(message)):
        hv15_omni.generate(PROMPT, **{"width": 32, "height": 32, "num_inference_steps": 2, "seed": 0, **fields})


# -- resolution, recipes ------------------------------------------------------------------------


def test_each_checkpoint_resolves_to_its_generation(hv_plugins: Any, tiny_hv: Path, tiny_hv15: Path) -> None:
    assert resolve_model(hv_plugins, tiny_hv).family == "hunyuan-video"
    assert resolve_model(hv_plugins, tiny_hv15).family == "hunyuan-video-1.5"
    # the pipeline class names the family as well as the family name does
    by_class = resolve_model(hv_plugins, tiny_hv, model_class_name="HunyuanVideo15Pipeline")
    assert (by_class.family, by_class.rule) == ("hunyuan-video-1.5", "explicit")
    pinned = resolve_model(hv_plugins, tiny_hv15, recipe_pin="hunyuan-video")
    assert (pinned.family, pinned.rule) == ("hunyuan-video", "recipe")


@pytest.mark.parametrize(("name", "family"), [("hunyuan-video", HunyuanVideo), ("hunyuan-video-1.5", HunyuanVideo15)])
def test_recipes_pin_the_family_and_valid_settings(name: str, family: Any) -> None:
    from omni_core.generation.recipe import load_recipe

    recipe = load_recipe(RECIPES / f"{name}.yaml")
    assert recipe.model_class_name == name
    assert recipe.model.startswith("hunyuanvideo-community/")
    assert recipe.attention.default.backend == "TORCH_SDPA"
    resolved = family.profile.resolve(GenerationRequest(prompt=PROMPT, seed=0, **recipe.generation))
    assert resolved.num_frames == family.profile.default_frames


# -- declarations match the real module tree ----------------------------------------------------


@pytest.mark.parametrize("fixture", ["hv_omni", "hv15_omni"])
def test_declared_modules_exist_in_the_loaded_pipeline(fixture: str, request: pytest.FixtureRequest) -> None:
    import torch

    engine = request.getfixturevalue(fixture).generation
    family = engine.family_cls
    plan = engine.offload_plan()
    assert plan.dit_modules == family.dit_modules
    assert plan.encoder_modules == family.encoder_modules
    assert plan.resident_modules == family.resident_modules
    for dotted in family.block_attrs:
        node: Any = engine.pipeline
        for part in dotted.split("."):
            node = getattr(node, part)
        assert isinstance(node, torch.nn.ModuleList) and len(node) == 2, dotted
    # every attention module of the transformer has a declared role (none falls back to "self")
    from omni_plugin_diffusion.attention import is_attention_module

    declared = {role for role, _ in family.declared_roles()}
    sites = [p for p, m in engine.pipeline.transformer.named_modules() if p and is_attention_module(m)]
    assert sites and {family.role_for(f"transformer.{p}")[0] for p in sites} == declared


def test_hv15_defaults_follow_the_checkpoints_guider_and_target_size(tiny_hv15: Path, tmp_path: Path) -> None:
    """A CFG-distilled release saves guidance 1.0 in its guider and a 720p one target size 960:
    the profile for that checkpoint defaults to them, before anything loads."""
    import json
    import shutil

    from omni_plugin_hunyuan_video.family import HunyuanVideo15

    assert HunyuanVideo15.profile_for(tiny_hv15).default_guidance == 6.0
    assert (
        HunyuanVideo15.profile_for(tiny_hv15).default_width,
        HunyuanVideo15.profile_for(tiny_hv15).default_height,
    ) == (848, 480)
    variant = tmp_path / "hv15-distilled-720p"
    shutil.copytree(tiny_hv15, variant)
    guider = variant / "guider" / "guider_config.json"
    guider.write_text(json.dumps({**json.loads(guider.read_text()), "guidance_scale": 1.0}))
    transformer = variant / "transformer" / "config.json"
    transformer.write_text(json.dumps({**json.loads(transformer.read_text()), "target_size": 960}))
    profile = HunyuanVideo15.profile_for(variant)
    assert (profile.default_guidance, profile.default_width, profile.default_height) == (1.0, 1280, 720)
    assert HunyuanVideo15.profile.default_guidance == 6.0  # the family's own profile is untouched
