"""Cache-DiT through the real runtime (``Omni``, the diffusion engine, installed plugins, the
cache-dit package) on tiny checkpoints of each family that declares it: FLUX.1, Wan 2.1 and
Qwen-Image."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cachedit_testkit import EAGER, FAMILIES, REQUESTS, PassCounter, middle_block, own_attributes, pixels

from omni_core import Omni
from omni_core.errors import CacheConfigError

PROMPT = "a red fox in snow"


def run(omni: Any, family: str, **fields: Any) -> Any:
    request, _ = REQUESTS[family]
    return omni.generate(PROMPT, seed=0, **{**request, **fields})


def declared_blocks(family: str, model: Path) -> list[str]:
    from omni_core.plugins import get_plugins

    return list(get_plugins().models.load(family).cache_declarations_for(model)["cache_dit"]["blocks"])


@pytest.fixture(scope="module")
def uncached(tiny: Callable[[str], Path]) -> dict[str, Any]:
    """Each family's output without a cache backend, and how often the block counted below ran."""
    out = {}
    for family in FAMILIES:
        with Omni(tiny(family), progress=False) as omni:
            blocks = getattr(omni.generation.pipeline.transformer, declared_blocks(family, tiny(family))[0])
            counter = PassCounter(blocks[1])
            result = run(omni, family)
            counter.close()
        assert result.metadata.cache is None
        out[family] = (pixels(result), counter.count)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_lossless_gives_the_pixels_of_no_cache(family: str, tiny: Callable[[str], Path], uncached: Any) -> None:
    with Omni(tiny(family), progress=False, cache="cache_dit", cache_config=EAGER) as omni:
        counter = PassCounter(middle_block(omni))
        result = run(omni, family, cache_quality="lossless")
        counter.close()
    assert np.array_equal(pixels(result), uncached[family][0])
    steps = REQUESTS[family][0]["num_inference_steps"]
    assert result.metadata.cache["computed"] == list(range(steps)) and result.metadata.cache["reused"] == []
    assert result.metadata.cache["quality"] == "lossless"
    assert counter.count == uncached[family][1]  # every block ran on every call


@pytest.mark.parametrize("family", FAMILIES)
def test_caching_computes_fewer_block_passes_counted(family: str, tiny: Callable[[str], Path], uncached: Any) -> None:
    request, calls_per_step = REQUESTS[family]
    with Omni(tiny(family), progress=False, cache="cache_dit", cache_config=EAGER) as omni:
        counter = PassCounter(middle_block(omni))
        result = run(omni, family)
        counter.close()
    cache = result.metadata.cache
    steps = request["num_inference_steps"]
    assert cache["backend"] == "cache_dit"
    assert sorted(cache["computed"] + cache["reused"]) == list(range(steps))
    # the profile's rhythm: two warmup steps, then at most three reused in a row
    assert cache["computed"] == [0, 1, 5, 9, 13, 17] and len(cache["reused"]) == 14
    # counted, not inferred: every computed step ran the skippable block once per call (both
    # guidance branches decide alike here), and no reused step ran it
    assert counter.count == len(cache["computed"]) * calls_per_step
    assert counter.count < uncached[family][1] == steps * calls_per_step
    assert not np.array_equal(pixels(result), uncached[family][0]), "reuse changed the output"
    assert pixels(result).shape == uncached[family][0].shape
    assert cache["settings"].startswith("Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=0.9")


@pytest.mark.parametrize("family", FAMILIES)
def test_disable_restores_the_model_exactly(family: str, tiny: Callable[[str], Path], uncached: Any) -> None:
    with Omni(tiny(family), progress=False) as plain:
        transformer = plain.generation.pipeline.transformer
        names = declared_blocks(family, tiny(family))
        run(plain, family, num_inference_steps=2)  # what running adds by itself (diffusers' hook registry)
        before = [own_attributes(m) for m in (transformer, *(getattr(transformer, n) for n in names))]
        hooks = len(transformer._forward_pre_hooks)
    with Omni(tiny(family), progress=False, cache="cache_dit", cache_config=EAGER) as omni:
        engine = omni.generation
        transformer = engine.pipeline.transformer
        lists = [getattr(transformer, n) for n in names]
        assert "forward" in transformer.__dict__  # cache-dit's wrapper, on the instance
        assert len(transformer._forward_pre_hooks) == hooks + 1  # the guidance detector
        cached = run(omni, family)
        engine.cache.disable()
        assert not engine.cache.is_enabled()
        assert "forward" not in transformer.__dict__
        assert len(transformer._forward_pre_hooks) == hooks
        assert [own_attributes(m) for m in (transformer, *lists)] == before
        engine.cache.disable()  # twice is harmless
        engine.cache = None
        restored = run(omni, family)
    assert not np.array_equal(pixels(cached), uncached[family][0])
    assert np.array_equal(pixels(restored), uncached[family][0])


@pytest.mark.parametrize("family", FAMILIES)
def test_no_request_reuses_another_requests_steps(family: str, tiny: Callable[[str], Path]) -> None:
    """A request's output does not depend on what ran before it: a different prompt, size or
    seed after a first request gives what it gives on a freshly opened model."""
    others = [{"prompt": "a bowl of fruit"}, {"seed": 7}, {"width": 80}]
    request, _ = REQUESTS[family]
    with Omni(tiny(family), progress=False, cache="cache_dit", cache_config=EAGER) as omni:
        run(omni, family)
        after = [omni.generate({"prompt": PROMPT, "seed": 0, **request, **o}) for o in others]
    for other, got in zip(others, after, strict=True):
        with Omni(tiny(family), progress=False, cache="cache_dit", cache_config=EAGER) as fresh:
            alone = fresh.generate({"prompt": PROMPT, "seed": 0, **request, **other})
        assert np.array_equal(pixels(got), pixels(alone)), other
        assert got.metadata.cache == alone.metadata.cache, other


def test_high_quality_reuses_less_than_the_startup_profile(tiny: Callable[[str], Path]) -> None:
    with Omni(tiny("flux1-schnell"), progress=False, cache="cache_dit", cache_config=EAGER) as omni:
        default = run(omni, "flux1-schnell").metadata.cache
        high = run(omni, "flux1-schnell", cache_quality="high").metadata.cache
        again = run(omni, "flux1-schnell").metadata.cache
    assert len(high["reused"]) < len(default["reused"])
    assert high["computed"][:4] == [0, 1, 2, 3]  # twice the warmup
    assert again == default, "an unset quality is the startup profile again"


def test_guidance_as_a_second_call_is_found_per_request(tiny: Callable[[str], Path]) -> None:
    """Wan runs guidance as a second transformer call per step only above guidance_scale 1: the
    same open model serves both kinds of request, each counted in denoising steps."""
    family = "wan2.1-t2v"
    with Omni(tiny(family), progress=False, cache="cache_dit", cache_config=EAGER) as omni:
        counted = []
        for guidance in (1.0, 5.0, 1.0):
            counter = PassCounter(middle_block(omni))
            cache = run(omni, family, guidance_scale=guidance).metadata.cache
            counter.close()
            counted.append((counter.count, cache["computed"]))
    rhythm = [0, 1, 5, 9, 13, 17]
    assert counted == [(len(rhythm), rhythm), (2 * len(rhythm), rhythm), (len(rhythm), rhythm)]


def test_two_open_models_of_one_class_keep_their_own_cache(tiny: Callable[[str], Path], uncached: Any) -> None:
    """Transformer-only mode: closing one model leaves another of the same pipeline class cached,
    and it computes as before (cache-dit's pipeline mode patches the class)."""
    family = "flux1-schnell"
    second = Omni(tiny(family), progress=False, cache="cache_dit", cache_config=EAGER)
    try:
        with Omni(tiny(family), progress=False, cache="cache_dit", cache_config=EAGER) as first:
            one = run(first, family)
            two = run(second, family)
        three = run(second, family)
    finally:
        second.close()
    assert np.array_equal(pixels(one), pixels(two)) and np.array_equal(pixels(two), pixels(three))
    assert one.metadata.cache == two.metadata.cache == three.metadata.cache
    assert three.metadata.cache["reused"]


@pytest.mark.parametrize("offload", ["layerwise", "model_cpu"])
def test_offload_strategies_leave_the_cache_alone(offload: str, tiny: Callable[[str], Path]) -> None:
    """Skipped blocks are simply not called: an offloader that moves blocks on their pre-hooks
    gives the same pixels and the same reuse as without it."""
    family = "flux1-schnell"
    with Omni(tiny(family), progress=False, cache="cache_dit", cache_config=EAGER) as omni:
        alone = run(omni, family)
    with Omni(tiny(family), progress=False, cache="cache_dit", cache_config=EAGER, offload=offload) as omni:
        offloaded = run(omni, family)
    assert np.array_equal(pixels(alone), pixels(offloaded))
    assert alone.metadata.cache == offloaded.metadata.cache and alone.metadata.cache["reused"]


def test_cache_dit_says_nothing_on_the_command_line(tiny: Callable[[str], Path], tmp_path: Path) -> None:
    """cache-dit logs at INFO on stdout; omni's output stays its own."""
    omni_cli = Path(sys.executable).with_name("omni")
    env = {k: v for k, v in os.environ.items() if k != "CACHE_DIT_LOG_LEVEL"}
    model, out = str(tiny("flux1-schnell")), str(tmp_path / "fox.png")
    command = [str(omni_cli), "generate", PROMPT, "--model", model, "--steps", "12", "--seed", "0", "--width", "64"]
    command += ["--height", "64", "--cache-backend", "cache_dit", "--no-progress", "--out", out]
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    output = proc.stdout + proc.stderr
    assert "Cache-DiT" not in output and "cache_dit." not in output, output
    assert "cache_dit (Fn_compute_blocks=1" in proc.stdout, proc.stdout


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
        ("cache_dit", {"residual_diff_threshold": -1}, "residual_diff_threshold must be a number >= 0"),
        ("cache_dit", {"residual_diff_threshold": "high"}, "residual_diff_threshold must be a number >= 0"),
        ("cache_dit", {"residual_diff_threshold": float("nan")}, "residual_diff_threshold must be a number >= 0"),
        ("cache_dit", {"Fn_compute_blocks": 0}, "Fn_compute_blocks must be an integer >= 1"),
        ("cache_dit", {"Bn_compute_blocks": 1.5}, "Bn_compute_blocks must be an integer >= 0"),
        ("cache_dit", {"max_warmup_steps": True}, "max_warmup_steps must be an integer >= 0"),
        (
            "cache_dit",
            {"max_cached_steps": -2},
            "max_cached_steps must be an integer >= -1 (at most this many reused steps per request, -1 for no limit; "
            "default -1), not -2",
        ),
        (
            "cache_dit",
            {"fn_compute_blocks": 4},
            "unknown option(s) 'fn_compute_blocks' (did you mean 'Fn_compute_blocks' for 'fn_compute_blocks'?",
        ),
        (
            "cache_dit",
            {"threshold": 0.1},
            "unknown option(s) 'threshold'; cache_dit takes Fn_compute_blocks (an integer >= 1), Bn_compute_blocks",
        ),
        ("cachedit", {}, "unknown cache backend 'cachedit'"),
        (None, {"residual_diff_threshold": 0.1}, "--cache-config was given without a cache backend"),
    ],
    ids=[
        "negative-threshold",
        "text-threshold",
        "nan-threshold",
        "no-Fn-block",
        "fractional-Bn",
        "boolean-warmup",
        "cached-steps-below-minus-one",
        "wrong-case",
        "unknown-option",
        "misspelt-backend",
        "config-without-backend",
    ],
)
def test_bad_cache_requests_are_refused_before_loading(
    tiny: Callable[[str], Path], no_loading: None, cache: str | None, config: dict[str, Any], words: str
) -> None:
    with pytest.raises(CacheConfigError) as info:
        Omni(tiny("flux1-schnell"), progress=False, cache=cache, cache_config=config)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("declaration", "words"),
    [
        ({"blocks": ["transformer_blocks"]}, "it lacks 'forward_patterns'"),
        ({"forward_patterns": ["Pattern_1"]}, "it lacks 'blocks'"),
        ({"blocks": ["transformer_blocks"], "forward_patterns": ["Pattern_9"]}, "'Pattern_9' are not cache-dit's"),
        (
            {"blocks": ["transformer_blocks", "single_transformer_blocks"], "forward_patterns": ["Pattern_1"]},
            "one pattern per block list: 2 block list(s), 1 pattern(s)",
        ),
        ({"blocks": [], "forward_patterns": []}, "blocks must list the names"),
        ({"blocks": ["model.blocks"], "forward_patterns": ["Pattern_2"]}, "not dotted paths (model.blocks)"),
    ],
    ids=["no-patterns", "no-blocks", "unknown-pattern", "pattern-count", "no-block-list", "dotted-path"],
)
def test_bad_declarations_are_refused_before_loading(
    tiny: Callable[[str], Path],
    no_loading: None,
    monkeypatch: pytest.MonkeyPatch,
    declaration: dict[str, Any],
    words: str,
) -> None:
    from omni_core.plugins import get_plugins

    family_cls = get_plugins().models.load("flux1-schnell")
    monkeypatch.setattr(family_cls, "cache_declarations", {"cache_dit": declaration})
    with pytest.raises(CacheConfigError) as info:
        Omni(tiny("flux1-schnell"), progress=False, cache="cache_dit")
    assert "family 'flux1-schnell' declares cache_dit settings that cannot be served" in str(info.value)
    assert words in str(info.value)


def test_a_family_that_declares_nothing_for_it_is_refused(tmp_path: Path, no_loading: None) -> None:
    from omni_core.plugins import get_plugins

    get_plugins().models.load("sana").make_tiny(tmp_path / "sana", seed=0)
    with pytest.raises(CacheConfigError, match=r"cache backend 'cache_dit' has nothing to hook in family 'sana'"):
        Omni(tmp_path / "sana", progress=False, cache="cache_dit")


# -- refused after loading, with nothing left installed ----------------------------------------------


@pytest.fixture(scope="module")
def loaded_flux(tiny: Callable[[str], Path]) -> Any:
    """An uncached FLUX.1 pipeline, for building the backend by hand."""
    with Omni(tiny("flux1-schnell"), progress=False) as omni:
        yield omni.generation.pipeline


def backend_on(pipeline: Any, options: dict[str, Any], **declaration: Any) -> Any:
    from omni_plugin_cache_dit.backend import CacheDitBackend

    from omni_core.cache import CacheTarget

    declared = {
        "blocks": ["transformer_blocks", "single_transformer_blocks"],
        "forward_patterns": ["Pattern_1", "Pattern_1"],
        **declaration,
    }
    assert CacheDitBackend.declaration_problems("flux1-schnell", declared) == []
    assert CacheDitBackend.option_problems(options) == []
    return CacheDitBackend(CacheTarget("flux1-schnell", pipeline, pipeline.transformer, declared), options)


def untouched(transformer: Any) -> tuple[Any, ...]:
    lists = (transformer.transformer_blocks, transformer.single_transformer_blocks)
    return (
        "forward" in transformer.__dict__,
        len(transformer._forward_pre_hooks),
        [own_attributes(m) for m in (transformer, *lists)],
        [type(b).__name__ for b in transformer.transformer_blocks],
    )


@pytest.mark.parametrize(
    ("options", "declaration", "words"),
    [
        ({"Fn_compute_blocks": 2}, {}, "Fn_compute_blocks + Bn_compute_blocks must stay under 2"),
        ({"Bn_compute_blocks": 1}, {}, "they are 8 + 1"),
        (
            {},
            {"forward_patterns": ["Pattern_2", "Pattern_1"]},
            "do not take ('hidden_states', 'encoder_hidden_states')",
        ),
        ({}, {"blocks": ["transformer_blocks", "norm_out"]}, "has no block list 'norm_out'"),
    ],
    ids=["Fn-too-large", "Bn-too-large", "wrong-pattern", "not-a-block-list"],
)
def test_what_the_loaded_model_cannot_serve_is_refused_untouched(
    loaded_flux: Any, options: dict[str, Any], declaration: dict[str, Any], words: str
) -> None:
    before = untouched(loaded_flux.transformer)
    backend = backend_on(loaded_flux, options, **declaration)
    with pytest.raises(CacheConfigError) as info:
        backend.enable()
    assert words in str(info.value)
    assert not backend.is_enabled()
    assert untouched(loaded_flux.transformer) == before


def test_the_default_Fn_shrinks_to_a_short_block_list(loaded_flux: Any) -> None:
    backend = backend_on(loaded_flux, {"Bn_compute_blocks": 0})
    backend.enable()
    try:
        assert (backend.profile.Fn_compute_blocks, backend.profile.Bn_compute_blocks) == (1, 0)
        assert backend.describe() == (
            "Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=0.08, max_warmup_steps=8, "
            "2 block lists (flux1-schnell)"
        )
    finally:
        backend.disable()


def test_a_failure_inside_cache_dit_leaves_nothing_installed(loaded_flux: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from cache_dit.caching.cache_adapters.cache_adapter import CachedAdapter

    real = CachedAdapter.mock_transformer.__func__

    def half_done(cls: Any, *args: Any, **kwargs: Any) -> Any:
        real(cls, *args, **kwargs)  # the transformer's forward is replaced: then it fails
        raise RuntimeError("cache-dit failed half-way")

    monkeypatch.setattr(CachedAdapter, "mock_transformer", classmethod(half_done))
    before = untouched(loaded_flux.transformer)
    backend = backend_on(loaded_flux, {})
    with pytest.raises(RuntimeError, match="half-way"):
        backend.enable()
    assert not backend.is_enabled()
    assert untouched(loaded_flux.transformer) == before


def test_the_forward_patterns_are_cache_dits() -> None:
    import cache_dit
    from omni_plugin_cache_dit.backend import FORWARD_PATTERNS, OPTIONS

    assert FORWARD_PATTERNS == tuple(p.name for p in cache_dit.ForwardPattern)
    assert set(OPTIONS) <= {f.name for f in dataclasses.fields(cache_dit.DBCacheConfig)}
