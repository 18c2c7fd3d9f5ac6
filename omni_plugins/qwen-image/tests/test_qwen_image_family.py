"""Qwen-Image end to end on a tiny checkpoint: ``make_tiny``, then ``Omni(dir).generate``
through the shared diffusion runtime (from_pretrained, attention routed through omni's
backends, numpy outputs), plus the family's own rules: guidance is true CFG with a blank
negative prompt, sizes are multiples of 16."""

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


def test_generates_the_requested_size_deterministically(tiny_qwen_image: Path, open_qwen_image: Any) -> None:
    with open_qwen_image(tiny_qwen_image) as omni:
        first = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=0)
        again = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=0)
        other = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=1)
    image = first.images[0]
    assert image.pixels.shape == (32, 64, 3) and image.pixels.dtype == np.uint8
    assert np.array_equal(image.pixels, again.images[0].pixels)
    assert not np.array_equal(image.pixels, other.images[0].pixels)
    meta = first.metadata
    assert meta.family == "qwen-image"
    assert meta.request.guidance_scale == 4.0  # the family's default (true CFG scale)
    assert meta.request.seed == 0 and meta.request.num_inference_steps == 2


def test_resolution_reads_model_index(tiny_qwen_image: Path, open_qwen_image: Any) -> None:
    with open_qwen_image(tiny_qwen_image) as omni:
        explanation = omni.explain()
        assert omni.family == "qwen-image"
    assert explanation.winner == "qwen-image"
    assert "model_index.json names QwenImagePipeline" in explanation.render()


def test_production_defaults() -> None:
    from omni_plugin_qwen_image.family import QwenImage

    resolved = QwenImage.profile.resolve(GenerationRequest(prompt=FOX, seed=0))
    assert (resolved.width, resolved.height) == (1328, 1328)
    assert resolved.num_inference_steps == 50 and resolved.guidance_scale == 4.0
    assert QwenImage.profile.size_multiple == 16


def test_the_attention_role_names_the_real_module(
    tiny_qwen_image: Path, open_qwen_image: Any, transformer_calls: Any
) -> None:
    """Every attention call is the blocks' joint attention, served under ``qwen.joint``."""
    with open_qwen_image(tiny_qwen_image, attention_backend="TORCH_SDPA") as omni:
        passes = transformer_calls(omni)
        result = omni.generate(FOX, seed=0, **SMALL)
        calls = dict(omni.generation.router.calls)
    # 2 blocks x 2 steps x 2 passes (prompt and negative prompt: CFG is not batched)
    assert passes[0] == 4
    assert calls == {("qwen.joint", "TORCH_SDPA"): 8}
    assert result.metadata.attention == {"qwen.joint": "TORCH_SDPA"}


def test_guidance_is_true_cfg(tiny_qwen_image: Path, open_qwen_image: Any, transformer_calls: Any) -> None:
    """Above 1 every step runs the prompt and a (blank) negative prompt; at 1 CFG is off and each
    step is one pass; the scale changes the image."""
    with open_qwen_image(tiny_qwen_image) as omni:
        passes = transformer_calls(omni)
        guided = omni.generate(FOX, seed=0, **SMALL)
        assert passes[0] == 4
        passes[0] = 0
        plain = omni.generate(FOX, seed=0, guidance_scale=1.0, **SMALL)
        assert passes[0] == 2
        passes[0] = 0
        stronger = omni.generate(FOX, seed=0, guidance_scale=7.0, **SMALL)
        assert passes[0] == 4
    assert not np.array_equal(guided.images[0].pixels, plain.images[0].pixels)
    assert not np.array_equal(guided.images[0].pixels, stronger.images[0].pixels)


def test_a_negative_prompt_replaces_the_blank_one(tiny_qwen_image: Path, open_qwen_image: Any) -> None:
    with open_qwen_image(tiny_qwen_image) as omni:
        blank = omni.generate(FOX, seed=0, **SMALL)
        negative = omni.generate(FOX, seed=0, negative_prompt="blurry, low quality", **SMALL)
    assert not np.array_equal(blank.images[0].pixels, negative.images[0].pixels)
    assert negative.metadata.request.negative_prompt == "blurry, low quality"


def test_call_kwargs_map_guidance_to_true_cfg_scale() -> None:
    from omni_plugin_qwen_image.family import BLANK_NEGATIVE_PROMPT, QwenImage

    def kwargs(**fields: Any) -> dict[str, Any]:
        return QwenImage.call_kwargs(QwenImage.profile.resolve(GenerationRequest(prompt=FOX, seed=0, **fields)), None)

    default = kwargs()
    assert "guidance_scale" not in default  # the pipeline's own guidance_scale is for distilled transformers
    assert default["true_cfg_scale"] == 4.0 and default["negative_prompt"] == BLANK_NEGATIVE_PROMPT
    assert kwargs(negative_prompt="blurry")["negative_prompt"] == "blurry"
    off = kwargs(guidance_scale=1.0)
    assert off["true_cfg_scale"] == 1.0 and "negative_prompt" not in off


def test_bad_options_are_refused_before_compute(
    tiny_qwen_image: Path, open_qwen_image: Any, transformer_calls: Any
) -> None:
    with open_qwen_image(tiny_qwen_image) as omni:
        passes = transformer_calls(omni)
        with pytest.raises(GenerationOptionError, match="multiple of 16"):
            omni.generate(FOX, width=40, height=32, num_inference_steps=2, seed=0)
        with pytest.raises(GenerationOptionError, match="negative_prompt has no effect at guidance_scale 1"):
            omni.generate(FOX, negative_prompt="blurry", guidance_scale=1.0, seed=0, **SMALL)
        with pytest.raises(GenerationOptionError, match="video models only"):
            omni.generate(FOX, num_frames=5, seed=0, **SMALL)
        with pytest.raises(GenerationOptionError, match="unknown model option"):
            omni.generate(FOX, extra={"max_sequence_length": 64}, seed=0, **SMALL)
        assert passes[0] == 0


def test_the_tiny_checkpoint_has_the_real_layout(tiny_qwen_image: Path) -> None:
    from omni_plugin_qwen_image.family import SCHEDULER_CONFIG

    index = json.loads((tiny_qwen_image / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImagePipeline"
    assert index["text_encoder"] == ["transformers", "Qwen2_5_VLForConditionalGeneration"]
    assert index["tokenizer"] == ["transformers", "Qwen2Tokenizer"]
    assert index["vae"] == ["diffusers", "AutoencoderKLQwenImage"]
    assert index["transformer"] == ["diffusers", "QwenImageTransformer2DModel"]
    scheduler = json.loads((tiny_qwen_image / "scheduler" / "scheduler_config.json").read_text())
    assert {k: scheduler[k] for k in SCHEDULER_CONFIG} == SCHEDULER_CONFIG
    transformer = json.loads((tiny_qwen_image / "transformer" / "config.json").read_text())
    text_encoder = json.loads((tiny_qwen_image / "text_encoder" / "config.json").read_text())
    assert transformer["joint_attention_dim"] == text_encoder["text_config"]["hidden_size"]
    assert transformer["guidance_embeds"] is False
    assert list((tiny_qwen_image / "transformer").glob("*.safetensors"))


def test_the_tokenizer_keeps_the_prompt_after_the_system_prefix_is_dropped(tiny_qwen_image: Path) -> None:
    """The pipeline drops its system prompt by count (34 tokens with Qwen's real vocabulary);
    the tiny vocabulary spends more tokens on it, so no token of the user's prompt is lost."""
    from diffusers import QwenImagePipeline

    pipeline = QwenImagePipeline.from_pretrained(tiny_qwen_image)
    tokenizer = pipeline.tokenizer
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert len(tokenizer) <= pipeline.text_encoder.config.text_config.vocab_size
    ids = tokenizer(pipeline.prompt_template_encode.format(FOX)).input_ids
    kept = tokenizer.decode(ids[pipeline.prompt_template_encode_start_idx :])
    assert kept.endswith(f"user\n{FOX}<|im_end|>\n<|im_start|>assistant\n")


def test_the_recipe_pins_the_family_and_production_settings(tiny_qwen_image: Path, open_qwen_image: Any) -> None:
    from omni_plugin_qwen_image.family import QwenImage

    from omni_core.generation.recipe import load_recipe

    recipe = load_recipe(RECIPES / "qwen-image.yaml")
    assert recipe.model == "Qwen/Qwen-Image"
    assert recipe.model_class_name == "qwen-image"
    assert recipe.attention.default.backend == "TORCH_SDPA"
    profile = QwenImage.profile
    assert recipe.generation == {
        "width": profile.default_width,
        "height": profile.default_height,
        "num_inference_steps": profile.default_steps,
        "guidance_scale": profile.default_guidance,
    }
    with open_qwen_image(tiny_qwen_image, recipe=RECIPES / "qwen-image.yaml") as omni:
        result = omni.generate(FOX, seed=0, **SMALL)
        assert omni.generation.explain()["model"].winner == "qwen-image"
    assert result.metadata.attention == {"qwen.joint": "TORCH_SDPA"}
