"""FLUX.2 [dev] (Mistral3 text encoder) and [klein] distilled and base (Qwen3) end to end on
tiny checkpoints through ``Omni(dir).generate``."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from omni_core.generation.request import GenerationOptionError

FOX = "a red fox in snow"
CAT = "a photo of a cat sitting on a wooden table"


@pytest.mark.parametrize("family", ["flux2-dev", "flux2-klein", "flux2-klein-base"])
def test_generates_the_requested_size_deterministically(tiny_flux: Any, open_flux: Any, family: str) -> None:
    with open_flux(tiny_flux(family)) as omni:
        assert omni.family == family
        first = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=0)
        again = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=0)
        other = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=1)
        cat = omni.generate(CAT, width=64, height=32, num_inference_steps=2, seed=0)
        calls = dict(omni.generation.router.calls)
    pixels = first.images[0].pixels
    assert pixels.shape == (32, 64, 3) and pixels.dtype == np.uint8
    assert np.array_equal(pixels, again.images[0].pixels)
    assert not np.array_equal(pixels, other.images[0].pixels)
    # the prompt goes through the LLM text encoder's stacked hidden states
    assert not np.array_equal(pixels, cat.images[0].pixels)
    assert first.metadata.family == family
    # the last call's attention: 2 double + 2 single blocks per transformer pass
    passes = 4 if family == "flux2-klein-base" else 2
    assert calls == {("flux2.joint", "TORCH_SDPA"): 2 * passes, ("flux2.single", "TORCH_SDPA"): 2 * passes}


def test_flux2_dev_embeds_the_guidance_scale(tiny_flux: Any, open_flux: Any, transformer_calls: Any) -> None:
    with open_flux(tiny_flux("flux2-dev")) as omni:
        count = transformer_calls(omni)
        low = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0, guidance_scale=1.0)
        default = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0)
        with pytest.raises(GenerationOptionError, match="negative_prompt is not supported"):
            omni.generate(FOX, width=32, height=32, negative_prompt="blurry")
    assert count[0] == 4  # guidance is embedded: one pass per step, whatever the scale
    assert default.metadata.request.guidance_scale == 4.0
    assert not np.array_equal(low.images[0].pixels, default.images[0].pixels)


def test_klein_distilled_takes_four_steps_and_no_guidance(
    tiny_flux: Any, open_flux: Any, transformer_calls: Any
) -> None:
    directory = tiny_flux("flux2-klein")
    assert json.loads((directory / "model_index.json").read_text())["is_distilled"] is True
    with open_flux(directory) as omni:
        count = transformer_calls(omni)
        result = omni.generate(FOX, width=32, height=32, seed=0)
        assert count[0] == 4
        with pytest.raises(GenerationOptionError, match="guidance_scale is not used"):
            omni.generate(FOX, width=32, height=32, guidance_scale=4.0)
        with pytest.raises(GenerationOptionError, match="max_sequence_length 0 is not allowed"):
            omni.generate(FOX, width=32, height=32, extra={"max_sequence_length": 0})
        assert count[0] == 4
    assert result.metadata.request.num_inference_steps == 4


def test_klein_base_runs_classifier_free_guidance(tiny_flux: Any, open_flux: Any, transformer_calls: Any) -> None:
    directory = tiny_flux("flux2-klein-base")
    assert json.loads((directory / "model_index.json").read_text())["is_distilled"] is False
    with open_flux(directory) as omni:
        count = transformer_calls(omni)
        guided = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0)
        assert count[0] == 4  # conditional and unconditional pass per step
        unguided = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0, guidance_scale=1.0)
        assert count[0] == 4 + 2
    assert guided.metadata.request.guidance_scale == 4.0
    assert not np.array_equal(guided.images[0].pixels, unguided.images[0].pixels)


def test_bad_sizes_are_refused_before_compute(tiny_flux: Any, open_flux: Any, transformer_calls: Any) -> None:
    with open_flux(tiny_flux("flux2-klein")) as omni:
        count = transformer_calls(omni)
        with pytest.raises(GenerationOptionError, match="height 40 is not allowed"):
            omni.generate(FOX, width=32, height=40)
        with pytest.raises(GenerationOptionError, match="width 4096 is not allowed"):
            omni.generate(FOX, width=4096, height=32)
        assert count[0] == 0


@pytest.mark.parametrize("family", ["flux1-dev", "flux2-dev", "flux2-klein"])
def test_offload_declarations_name_real_modules(tiny_flux: Any, open_flux: Any, family: str) -> None:
    with open_flux(tiny_flux(family)) as omni:
        plan = omni.generation.offload_plan()
        family_cls = omni.generation.family_cls
    assert plan.dit_modules == ("transformer",)
    assert plan.encoder_modules == family_cls.encoder_modules  # every declared encoder is a loaded component
    assert plan.block_attrs == ("transformer.transformer_blocks", "transformer.single_transformer_blocks")
    for dotted in plan.block_attrs:
        blocks = plan.module(dotted)
        assert type(blocks).__name__ == "ModuleList" and len(blocks) == 2


@pytest.mark.parametrize("strategy", ["model_cpu", "layerwise"])
def test_offload_gives_the_same_pixels(tiny_flux: Any, strategy: str) -> None:
    """The recipes' offload strategies run FLUX.2 [dev] through the declared groups and blocks."""
    import dataclasses

    from omni_core import Omni
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    settings = dataclasses.replace(isolated_settings(), allow_plugins=frozenset({"flux", "offload"}))
    plugins = load_plugins(settings)
    directory = tiny_flux("flux2-dev")
    with Omni(directory, plugins=plugins, progress=False) as omni:
        plain = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0)
    with Omni(directory, plugins=plugins, progress=False, offload=strategy) as omni:
        offloaded = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0)
    assert offloaded.metadata.offload == strategy
    assert np.array_equal(plain.images[0].pixels, offloaded.images[0].pixels)
