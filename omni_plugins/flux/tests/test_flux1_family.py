"""FLUX.1 [dev] and [schnell] end to end on tiny checkpoints: ``make_tiny``, then
``Omni(dir).generate`` through the shared diffusion runtime (from_pretrained, attention routed
through omni's backends, numpy outputs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from omni_core.generation.request import GenerationOptionError

FOX = "a red fox in snow"


def test_dev_generates_the_requested_size_deterministically(tiny_flux: Any, open_flux: Any) -> None:
    with open_flux(tiny_flux("flux1-dev")) as omni:
        first = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=0)
        again = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=0)
        other = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=1)
    image = first.images[0]
    assert image.pixels.shape == (32, 64, 3) and image.pixels.dtype == np.uint8
    assert np.array_equal(image.pixels, again.images[0].pixels)
    assert not np.array_equal(image.pixels, other.images[0].pixels)
    meta = first.metadata
    assert meta.family == "flux1-dev"
    assert meta.request.guidance_scale == 3.5  # the family's default, embedded by the transformer
    assert meta.request.seed == 0 and meta.request.num_inference_steps == 2


def test_dev_resolution_picked_the_guidance_distilled_sibling(tiny_flux: Any, open_flux: Any) -> None:
    with open_flux(tiny_flux("flux1-dev")) as omni:
        explanation = omni.explain()
        assert omni.family == "flux1-dev"
    outcomes = {c.name: c.outcome.value for c in explanation.candidates if c.name.startswith("flux")}
    assert explanation.winner == "flux1-dev"
    assert outcomes["flux1-dev"] == "selected" and outcomes["flux1-schnell"] == "rejected"
    assert "transformer.guidance_embeds" in explanation.render()


def test_the_attention_roles_name_the_real_modules(tiny_flux: Any, open_flux: Any) -> None:
    """Every attention call in the transformer is served under a declared FLUX role: the
    double-stream blocks' joint attention and the single-stream blocks' attention."""
    with open_flux(tiny_flux("flux1-dev"), attention_backend="TORCH_SDPA") as omni:
        result = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0)
        calls = dict(omni.generation.router.calls)
    # 2 double + 2 single blocks, 2 steps, one transformer pass per step
    assert calls == {("flux.joint", "TORCH_SDPA"): 4, ("flux.single", "TORCH_SDPA"): 4}
    assert result.metadata.attention == {"flux.joint": "TORCH_SDPA", "flux.single": "TORCH_SDPA"}


def test_dev_guidance_scale_changes_the_image(tiny_flux: Any, open_flux: Any) -> None:
    with open_flux(tiny_flux("flux1-dev")) as omni:
        low = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0, guidance_scale=1.0)
        high = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0, guidance_scale=8.0)
    assert not np.array_equal(low.images[0].pixels, high.images[0].pixels)


def test_dev_negative_prompt_turns_on_true_cfg(tiny_flux: Any, open_flux: Any, transformer_calls: Any) -> None:
    """FluxPipeline ignores a negative prompt unless true CFG is on; the family turns it on,
    so a negative prompt changes the image and each step runs the transformer twice."""
    with open_flux(tiny_flux("flux1-dev")) as omni:
        count = transformer_calls(omni)
        plain = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0)
        assert count[0] == 2
        negative = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0, negative_prompt="blurry")
        assert count[0] == 2 + 4
        scaled = omni.generate(
            FOX,
            width=32,
            height=32,
            num_inference_steps=2,
            seed=0,
            negative_prompt="blurry",
            extra={"true_cfg_scale": 2.0},
        )
    assert not np.array_equal(plain.images[0].pixels, negative.images[0].pixels)
    assert not np.array_equal(negative.images[0].pixels, scaled.images[0].pixels)


def test_schnell_takes_four_steps_and_no_guidance(tiny_flux: Any, open_flux: Any, transformer_calls: Any) -> None:
    with open_flux(tiny_flux("flux1-schnell")) as omni:
        assert omni.family == "flux1-schnell"
        count = transformer_calls(omni)
        result = omni.generate(FOX, width=48, height=32, seed=3)
        assert count[0] == 4  # the family's default step count
        with pytest.raises(GenerationOptionError, match="guidance_scale is not used"):
            omni.generate(FOX, width=32, height=32, guidance_scale=3.5)
        with pytest.raises(GenerationOptionError, match="negative_prompt is not supported"):
            omni.generate(FOX, width=32, height=32, negative_prompt="blurry")
        with pytest.raises(GenerationOptionError, match="max_sequence_length 300"):
            omni.generate(FOX, width=32, height=32, extra={"max_sequence_length": 300})
        assert count[0] == 4  # nothing ran for the refused requests
    assert result.images[0].pixels.shape == (32, 48, 3)
    assert result.metadata.family == "flux1-schnell"
    assert result.metadata.request.num_inference_steps == 4 and result.metadata.request.seed == 3


def test_bad_options_are_refused_before_compute(tiny_flux: Any, open_flux: Any, transformer_calls: Any) -> None:
    with open_flux(tiny_flux("flux1-dev")) as omni:
        count = transformer_calls(omni)
        with pytest.raises(GenerationOptionError, match="width 72 is not allowed: it must be a multiple of 16"):
            omni.generate(FOX, width=72, height=64)
        with pytest.raises(GenerationOptionError, match="true_cfg_scale applies only with a negative_prompt"):
            omni.generate(FOX, width=32, height=32, extra={"true_cfg_scale": 4.0})
        with pytest.raises(GenerationOptionError, match=r"true_cfg_scale 0\.5 is not allowed"):
            omni.generate(FOX, width=32, height=32, negative_prompt="x", extra={"true_cfg_scale": 0.5})
        with pytest.raises(GenerationOptionError, match="unknown model option"):
            omni.generate(FOX, width=32, height=32, extra={"strength": 0.5})
        with pytest.raises(GenerationOptionError, match="num_frames applies to video models only"):
            omni.generate(FOX, width=32, height=32, num_frames=9)
        assert count[0] == 0


def test_prompts_reach_the_transformer_through_both_encoders(tiny_flux: Any, open_flux: Any) -> None:
    with open_flux(tiny_flux("flux1-dev")) as omni:
        fox = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0)
        cat = omni.generate(
            "a photo of a cat sitting on a wooden table", width=32, height=32, num_inference_steps=2, seed=0
        )
        short = omni.generate(
            FOX, width=32, height=32, num_inference_steps=2, seed=0, extra={"max_sequence_length": 16}
        )
    assert not np.array_equal(fox.images[0].pixels, cat.images[0].pixels)
    # fewer T5 tokens (padding included) is a different text sequence for the joint attention
    assert not np.array_equal(fox.images[0].pixels, short.images[0].pixels)
