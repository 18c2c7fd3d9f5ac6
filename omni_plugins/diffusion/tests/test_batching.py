"""Batching (the optional ``BatchingEngine`` methods) on tiny real checkpoints: requests that
differ in prompt and seed run as one pipeline call, and each gets the pixels it gets alone.

The runtime's own test family always runs; the shipped FLUX.1 [schnell] (the embedded default
image model) and SD3 families run where their plugins are installed (the development
environment has every plugin)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from omni_core.generation.model import BatchingEngine, EngineOptions
from omni_core.generation.request import GenerationOptionError, GenerationRequest

#: (family name, module, class): the runtime's test family and two shipped ones
FAMILIES = [
    pytest.param(("tiny-pixart", "runtime_family", "TinyPixArt"), id="tiny-pixart"),
    pytest.param(
        ("flux1-schnell", "omni_plugin_flux.family", "Flux1Schnell"),
        id="flux1-schnell",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("omni_plugin_flux") is None, reason="omni-plugin-flux is not installed"
        ),
    ),
    pytest.param(
        ("sd3-medium", "omni_plugin_sd3.family", "SD3Medium"),
        id="sd3-medium",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("omni_plugin_sd3") is None, reason="omni-plugin-sd3 is not installed"
        ),
    ),
]

#: three requests: the first two share a seed (so their prompts alone tell them apart), the
#: third has its own seed and prompt
PROMPTS = ("a red fox in snow", "a lighthouse on a cliff at dusk, waves breaking below", "cat")
SEEDS = (0, 0, 7)
#: width and height of every request (every family here takes multiples of 16)
SIZE = 32


@pytest.fixture(scope="module", params=FAMILIES)
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, diffusion_plugins: Any
) -> Iterator[Any]:
    """A loaded engine of one family, on its tiny checkpoint (made once per module)."""
    name, module, cls_name = request.param
    family_cls = getattr(importlib.import_module(module), cls_name)
    directory = tmp_path_factory.mktemp(name) / f"tiny-{name}"
    family_cls.make_tiny(directory, seed=0)
    opened = family_cls.open(directory, EngineOptions(family=name, plugins=diffusion_plugins, progress=False))
    yield opened
    opened.close()


@pytest.fixture
def transformer_calls(engine: Any) -> Iterator[list[int]]:
    """A live count of the engine's transformer forward passes during one test."""
    count = [0]
    handle = engine.pipeline.transformer.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    yield count
    handle.remove()


def _requests(**fields: Any) -> list[GenerationRequest]:
    base = {"width": SIZE, "height": SIZE, "num_inference_steps": 2, **fields}
    return [GenerationRequest(prompt=p, seed=s, **base) for p, s in zip(PROMPTS, SEEDS, strict=True)]


def test_the_engine_is_a_batching_engine(engine: Any) -> None:
    assert isinstance(engine, BatchingEngine)


def test_a_batch_gives_each_request_the_pixels_it_gets_alone(engine: Any, transformer_calls: list[int]) -> None:
    requests = _requests()
    keys = [engine.batch_key(r) for r in requests]
    assert keys[0] is not None and keys.count(keys[0]) == 3, "prompt and seed are not part of the key"
    calls = transformer_calls
    batch = engine.generate_batch(requests)
    batched_calls = calls[0]
    alone = [engine.generate(r) for r in requests]
    # one pipeline call: as many transformer passes as one request alone makes
    assert batched_calls * 3 == calls[0] - batched_calls
    assert len(batch) == 3
    for i, (together, single) in enumerate(zip(batch, alone, strict=True)):
        assert len(together.images) == 1 and together.images[0].index == 0
        a, b = together.images[0].pixels, single.images[0].pixels
        assert a.shape == b.shape == (SIZE, SIZE, 3)
        assert int(np.abs(a.astype(int) - b.astype(int)).max()) <= 1, f"request {i} changed when batched"
        assert (together.seed, together.metadata.request.prompt) == (SEEDS[i], PROMPTS[i])
        assert together.metadata.batch_size == 3 and single.metadata.batch_size == 1
        assert together.metadata.to_dict()["batch_size"] == 3
    # each result is its own request's: the prompt alone (same seed) and the seed both change pixels
    pixels = [r.images[0].pixels for r in alone]
    assert not np.array_equal(pixels[0], pixels[1]) and not np.array_equal(pixels[0], pixels[2])


def test_keys_differ_for_size_steps_and_guidance_not_for_prompt_or_seed(engine: Any) -> None:
    def key(**fields: Any) -> Any:
        return engine.batch_key(GenerationRequest(**{"prompt": "x", "width": SIZE, "height": SIZE, **fields}))

    base = key(num_inference_steps=2, seed=1)
    assert base == key(num_inference_steps=2, seed=2, prompt="something else entirely")
    assert base != key(num_inference_steps=2, seed=1, width=SIZE * 2)
    assert base != key(num_inference_steps=2, seed=1, height=SIZE * 2)
    assert base != key(num_inference_steps=3, seed=1)
    profile = engine.family_cls.profile
    if profile.uses_guidance:
        assert base != key(num_inference_steps=2, seed=1, guidance_scale=profile.default_guidance + 1.5)
    if profile.supports_negative_prompt:
        with_negative = key(num_inference_steps=2, seed=1, negative_prompt="blurry")
        assert base != with_negative, "a negative prompt changes the call"
        assert with_negative == key(num_inference_steps=2, seed=5, negative_prompt="low quality")


def test_generate_batch_refuses_mixed_keys_before_any_compute(engine: Any, transformer_calls: list[int]) -> None:
    requests = _requests()
    other = _requests(num_inference_steps=3)[0]
    with pytest.raises(ValueError, match="one batch_key only"):
        engine.generate_batch([*requests[:2], other])
    assert transformer_calls[0] == 0


def test_what_never_batches_has_no_key(engine: Any) -> None:
    several = GenerationRequest(prompt="x", width=SIZE, height=SIZE, num_outputs=2)
    assert engine.batch_key(several) is None
    with pytest.raises(ValueError, match="cannot run in a batch"):
        engine.generate_batch([several, several])


def test_a_family_that_does_not_batch_has_no_key(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.family_cls, "batchable", False)
    assert engine.batch_key(_requests()[0]) is None


def test_batch_key_validates_like_generate(engine: Any) -> None:
    with pytest.raises(GenerationOptionError, match="width 33 is not allowed"):
        engine.batch_key(GenerationRequest(prompt="x", width=33))
    with pytest.raises(GenerationOptionError, match="width 33 is not allowed"):
        engine.generate_batch([GenerationRequest(prompt="x", width=33)])


# -- through the offline API ----------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("omni_plugin_flux") is None, reason="omni-plugin-flux is not installed")
def test_omni_batches_with_the_recipes_settings(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``Omni.batch_key`` / ``Omni.generate_batch`` apply the recipe's settings as ``generate``
    does, so a batch of dicts gives what ``Omni.generate`` gives each alone."""
    from omni_core import Omni
    from omni_core.generation.recipe import Recipe
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings
    from omni_core.testing.generation import tiny_checkpoints

    plugins = load_plugins(isolated_settings(only="flux"))
    directory = tiny_checkpoints(plugins, tmp_path_factory)("flux1-schnell")
    recipe = Recipe(generation={"width": 32, "height": 32, "num_inference_steps": 2})
    with Omni(directory, plugins=plugins, recipe=recipe, progress=False) as omni:
        requests = [{"prompt": p, "seed": s} for p, s in zip(PROMPTS, SEEDS, strict=True)]
        keys = {omni.batch_key(r) for r in requests}
        assert len(keys) == 1 and None not in keys
        assert omni.batch_key({"prompt": "x", "num_inference_steps": 3}) not in keys
        batch = omni.generate_batch(requests)
        alone = [omni.generate(r) for r in requests]
    for together, single in zip(batch, alone, strict=True):
        assert (together.images[0].width, together.metadata.request.num_inference_steps) == (32, 2)
        diff = np.abs(together.images[0].pixels.astype(int) - single.images[0].pixels.astype(int)).max()
        assert int(diff) <= 1
        assert together.metadata.batch_size == 3


def test_a_batch_of_one_and_an_empty_batch(open_engine: Any) -> None:
    """A batch of one is one pipeline call like ``generate`` (batch_size 1); an empty batch is empty."""
    engine = open_engine()
    assert engine.generate_batch([]) == []
    (only,) = engine.generate_batch([GenerationRequest(prompt="x", seed=3)])
    alone = engine.generate(GenerationRequest(prompt="x", seed=3))
    assert only.metadata.batch_size == 1 and only.seed == 3
    assert int(np.abs(only.images[0].pixels.astype(int) - alone.images[0].pixels.astype(int)).max()) <= 1
