"""Offloading changes where weights live, never what the model computes: outputs are
bit-identical to an un-offloaded pipeline, over several calls, and after ``disable()``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from offload_testkit import all_hooks, build_tiny_flux, make_plan, run_flux, snapshot

CASES = [
    ("layerwise", {}),
    ("layerwise", {"window": 2}),
    ("model_cpu", {}),
]


def _check_outputs(pipe: Any, reference: dict[tuple[str, int], Any]) -> None:
    for (prompt, seed), expected in reference.items():
        assert torch.equal(run_flux(pipe, prompt, seed), expected), (prompt, seed)


@pytest.mark.parametrize(("name", "options"), CASES)
def test_outputs_identical_over_several_calls_and_after_disable(strategy, flux_reference, name, options) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    before = snapshot(pipe)
    offloader = strategy(name)(make_plan(pipe), "cpu", options)
    offloader.enable()
    assert offloader.is_enabled() and all_hooks(pipe) > 0
    _check_outputs(pipe, flux_reference)
    with torch.inference_mode():  # the second round starts from the state the first left
        _check_outputs(pipe, flux_reference)

    offloader.disable()
    assert not offloader.is_enabled()
    assert all_hooks(pipe) == 0
    after = snapshot(pipe)
    assert after.keys() == before.keys()
    for key, (tensor, _, values) in before.items():
        now = after[key][0]
        assert now is tensor, f"{key}: the parameter object was replaced"
        assert now.shape == values.shape and torch.equal(now, values), key
    _check_outputs(pipe, flux_reference)
    offloader.disable()  # a second disable is a no-op


@pytest.mark.parametrize(("name", "options"), CASES)
def test_the_copying_path_matches_too(strategy, flux_reference, name, options) -> None:  # type: ignore[no-untyped-def]
    """On an accelerator every materialisation copies the host store into fresh device buffers;
    the same code path runs here on the CPU. The copies never alias the store."""
    base = strategy(name)
    copying = type(f"Copying{base.__name__}", (base,), {"copy_on_cpu": True})
    pipe = build_tiny_flux()
    offloader = copying(make_plan(pipe), "cpu", options)
    offloader.enable()
    stores = {id(f) for u in offloader._units for f in u._flats.values()}
    store_ptrs = {f.untyped_storage().data_ptr() for u in offloader._units for f in u._flats.values()}
    assert stores
    with torch.inference_mode():  # how a serving runtime calls the pipeline
        _check_outputs(pipe, flux_reference)
    for unit in offloader._units:
        if unit.resident:
            for tensor in unit.tensors:
                assert tensor.untyped_storage().data_ptr() not in store_ptrs
    offloader.disable()
    _check_outputs(pipe, flux_reference)


def test_enable_again_after_disable(strategy, flux_reference) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    offloader = strategy("layerwise")(make_plan(pipe), "cpu")
    offloader.enable()
    offloader.disable()
    offloader.enable()
    _check_outputs(pipe, flux_reference)
    offloader.disable()
    other = strategy("model_cpu")(make_plan(pipe), "cpu")  # one strategy after another on one model
    other.enable()
    _check_outputs(pipe, flux_reference)
    other.disable()
    assert all_hooks(pipe) == 0
