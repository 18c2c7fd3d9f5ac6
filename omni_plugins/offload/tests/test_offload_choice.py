"""Choosing a strategy through the installed plugin: the declarations in its registrations
decide, before any model is touched."""

from __future__ import annotations

import pytest

from omni_core.offload import OffloadConfigError, choose_offloader


def test_both_registered_with_their_declarations(offload_plugins) -> None:  # type: ignore[no-untyped-def]
    registry = offload_plugins.offloaders
    assert registry.names() == ["layerwise", "model_cpu"]
    assert registry.get("model_cpu").spec.incompatible_with == ("layerwise",)
    assert registry.get("layerwise").spec.incompatible_with == ("model_cpu",)
    assert registry.get("layerwise").provider.distribution == "omni-plugin-offload"


@pytest.mark.parametrize("name", ["model_cpu", "layerwise"])
def test_one_strategy_is_chosen(offload_plugins, name) -> None:  # type: ignore[no-untyped-def]
    choice, explanation = choose_offloader(offload_plugins, (name,), {"attention:TORCH_SDPA", "platform:cpu"})
    assert choice is not None and choice.name == name
    assert choice.offloader_class is offload_plugins.offloaders.load(name)
    assert choice.offloader_class.name == name
    assert explanation.winner == name


def test_none_requested(offload_plugins) -> None:  # type: ignore[no-untyped-def]
    assert choose_offloader(offload_plugins, (), set())[0] is None
    assert choose_offloader(offload_plugins, ("none",), set())[0] is None


def test_both_requested_names_the_declaration_and_who_made_it(offload_plugins) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OffloadConfigError) as info:
        choose_offloader(offload_plugins, ("model_cpu", "layerwise"), set())
    message = str(info.value)
    assert "offload strategy 'model_cpu' cannot be combined with layerwise" in message
    assert "declared by omni-plugin-offload" in message
    with pytest.raises(
        OffloadConfigError, match=r"'layerwise' cannot be combined with model_cpu \(declared by omni-plugin-offload\)"
    ):
        choose_offloader(offload_plugins, ("layerwise", "model_cpu"), set())


def test_unknown_name_lists_the_known_ones(offload_plugins) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OffloadConfigError, match=r"unknown offload strategy 'sequential'.*known: layerwise, model_cpu"):
        choose_offloader(offload_plugins, ("sequential",), set())
