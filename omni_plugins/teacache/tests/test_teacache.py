"""TeaCache through the real runtime (``Omni``, the diffusion engine, installed plugins) on
tiny checkpoints of each family that declares it: FLUX.1, Wan 2.1 and Qwen-Image."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from teacache_testkit import EAGER, FAMILIES, REQUESTS, PassCounter, first_block, pixels

from omni_core import Omni
from omni_core.errors import CacheConfigError

PROMPT = "a red fox in snow"


def run(omni: Any, family: str, **fields: Any) -> Any:
    request, _ = REQUESTS[family]
    return omni.generate(PROMPT, seed=0, **{**request, **fields})


@pytest.fixture(scope="module")
def uncached(tiny: Callable[[str], Path]) -> dict[str, Any]:
    """Each family's output without a cache backend, and how often its first block ran."""
    out = {}
    for family in FAMILIES:
        with Omni(tiny(family), progress=False) as omni:
            counter = PassCounter(omni)
            result = run(omni, family)
            counter.close()
        assert result.metadata.cache is None
        out[family] = (pixels(result), counter.count)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_lossless_gives_the_pixels_of_no_cache(family: str, tiny: Callable[[str], Path], uncached: Any) -> None:
    with Omni(tiny(family), progress=False, cache="teacache", cache_config=EAGER) as omni:
        result = run(omni, family, cache_quality="lossless")
    assert np.array_equal(pixels(result), uncached[family][0])
    steps = REQUESTS[family][0]["num_inference_steps"]
    assert result.metadata.cache["computed"] == list(range(steps)) and result.metadata.cache["reused"] == []
    assert result.metadata.cache["quality"] == "lossless"


@pytest.mark.parametrize("family", FAMILIES)
def test_caching_computes_fewer_block_passes_counted(family: str, tiny: Callable[[str], Path], uncached: Any) -> None:
    request, calls_per_step = REQUESTS[family]
    with Omni(tiny(family), progress=False, cache="teacache", cache_config=EAGER) as omni:
        counter = PassCounter(omni)
        result = run(omni, family)
        counter.close()
    cache = result.metadata.cache
    steps = request["num_inference_steps"]
    assert cache["backend"] == "teacache"
    assert sorted(cache["computed"] + cache["reused"]) == list(range(steps))
    assert cache["reused"], "a threshold this high reuses steps"
    assert 0 in cache["computed"]  # the first step always runs
    # counted, not inferred: every computed step ran the first block once per call (both
    # guidance branches decide alike here), and no reused step ran it
    assert counter.count == len(cache["computed"]) * calls_per_step
    assert counter.count < uncached[family][1] == steps * calls_per_step
    assert pixels(result).shape == uncached[family][0].shape


@pytest.mark.parametrize("family", FAMILIES)
def test_disable_restores_the_model_exactly(family: str, tiny: Callable[[str], Path], uncached: Any) -> None:
    with Omni(tiny(family), progress=False, cache="teacache", cache_config=EAGER) as omni:
        engine = omni.generation
        block = first_block(omni)
        assert "forward" in block.__dict__  # the hook is an instance-level wrapper
        hooks = len(engine.pipeline.transformer._forward_pre_hooks)  # the step counter among them
        cached = run(omni, family)
        engine.cache.disable()
        assert not engine.cache.is_enabled()
        assert "forward" not in block.__dict__
        assert len(engine.pipeline.transformer._forward_pre_hooks) == hooks - 1
        engine.cache = None
        restored = run(omni, family)
    assert not np.array_equal(pixels(cached), uncached[family][0]), "reuse changed the output"
    assert np.array_equal(pixels(restored), uncached[family][0])


@pytest.mark.parametrize("family", FAMILIES)
def test_no_request_reuses_another_requests_steps(family: str, tiny: Callable[[str], Path]) -> None:
    """A request's output does not depend on what ran before it: a different prompt, size or
    seed after a first request gives what it gives on a freshly opened model."""
    others = [
        {"prompt": "a bowl of fruit"},
        {"seed": 7},
        {"width": 80},
    ]
    request, _ = REQUESTS[family]
    with Omni(tiny(family), progress=False, cache="teacache", cache_config=EAGER) as omni:
        run(omni, family)
        after = [pixels(omni.generate({"prompt": PROMPT, "seed": 0, **request, **o})) for o in others]
    for other, got in zip(others, after, strict=True):
        with Omni(tiny(family), progress=False, cache="teacache", cache_config=EAGER) as fresh:
            alone = pixels(fresh.generate({"prompt": PROMPT, "seed": 0, **request, **other}))
        assert np.array_equal(got, alone), other


def test_high_quality_reuses_no_more_than_the_startup_profile(tiny: Callable[[str], Path]) -> None:
    with Omni(tiny("flux1-schnell"), progress=False, cache="teacache", cache_config={"rel_l1_thresh": 2.0}) as omni:
        default = run(omni, "flux1-schnell").metadata.cache
        high = run(omni, "flux1-schnell", cache_quality="high").metadata.cache
        again = run(omni, "flux1-schnell").metadata.cache
    assert len(high["reused"]) < len(default["reused"])
    assert again == default, "an unset quality is the startup profile again"


# -- refused before anything is hooked or loaded ----------------------------------------------------


@pytest.fixture
def no_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a pipeline fails the test: what is refused must be refused before it."""
    from omni_plugin_diffusion.engine import DiffusionEngine

    def refuse(self: Any) -> Any:
        raise AssertionError("the pipeline was loaded before the cache request was refused")

    monkeypatch.setattr(DiffusionEngine, "_load", refuse)


@pytest.mark.parametrize(
    ("cache", "config", "words"),
    [
        ("teacache", {"rel_l1_thresh": -1}, "rel_l1_thresh must be a number above 0, not -1"),
        ("teacache", {"threshold": 0.2}, "unknown option(s) 'threshold'"),
        ("teacache", {"coefficients": []}, "coefficients must be a non-empty list of numbers"),
        ("tea_cache", {}, "unknown cache backend 'tea_cache'"),
        (None, {"rel_l1_thresh": 0.2}, "--cache-config was given without a cache backend"),
    ],
    ids=["negative-threshold", "unknown-option", "no-coefficients", "misspelt-backend", "config-without-backend"],
)
def test_bad_cache_requests_are_refused_before_loading(
    tiny: Callable[[str], Path], no_loading: None, cache: str | None, config: dict[str, Any], words: str
) -> None:
    with pytest.raises(CacheConfigError) as info:
        Omni(tiny("flux1-schnell"), progress=False, cache=cache, cache_config=config)
    assert words in str(info.value)


def test_a_family_that_declares_nothing_for_it_is_refused(tmp_path: Path, no_loading: None) -> None:
    from omni_core.plugins import get_plugins

    get_plugins().models.load("sana").make_tiny(tmp_path / "sana", seed=0)
    with pytest.raises(CacheConfigError, match=r"cache backend 'teacache' has nothing to hook in family 'sana'"):
        Omni(tmp_path / "sana", progress=False, cache="teacache")
