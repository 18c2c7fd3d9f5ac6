"""A bad plan or option fails before anything is touched; a failure part-way through
``enable()`` leaves nothing behind; tied weights stay resident; a model may own its offload."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from offload_testkit import all_hooks, build_tiny_flux, make_plan, snapshot

from omni_core.offload import OffloadConfigError, OffloadPlan


def _untouched(pipe: Any, before: dict[str, tuple[Any, Any, Any]]) -> None:
    after = snapshot(pipe)
    assert after.keys() == before.keys()
    for key, (tensor, ptr, values) in before.items():
        now, now_ptr, _ = after[key]
        assert now is tensor and now_ptr == ptr and torch.equal(now, values), key
    assert all_hooks(pipe) == 0


BAD_PLANS = [
    ({"encoder_modules": ("text_encoder", "text_encoder_3")}, r"'text_encoder_3' in encoder_modules.*no component"),
    ({"dit_modules": ("transformer", "unet")}, r"'unet' in dit_modules"),
    ({"resident_modules": ("vae", "audio_vae")}, r"'audio_vae' in resident_modules"),
    ({"block_attrs": ("transformer.blocks",)}, r"'transformer\.blocks' does not resolve.*no attribute 'blocks'"),
    ({"block_attrs": ("transformer.transformer_blocks", "transformer.single_blocks")}, r"'transformer\.single_blocks'"),
    ({"block_attrs": ("transformer.x_embedder",)}, r"'transformer\.x_embedder' is a Linear, not a ModuleList"),
    ({"block_attrs": ("text_encoder.text_model.encoder.layers",)}, r"not under a dit_modules component"),
    ({"block_attrs": ("dit.blocks",)}, r"no component 'dit'"),
    ({"block_attrs": ("transformer",)}, r"must be '<component>\.<attribute>'"),
    ({"dit_modules": ("transformer",), "resident_modules": ("vae", "transformer")}, r"both dit_modules and resident"),
]


@pytest.mark.parametrize("name", ["layerwise", "model_cpu"])
@pytest.mark.parametrize(("overrides", "message"), BAD_PLANS)
def test_bad_plan_fails_before_any_module_is_touched(strategy, name, overrides, message) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    before = snapshot(pipe)
    offloader = strategy(name)(make_plan(pipe, **overrides), "cpu", {"record": True})
    with pytest.raises(OffloadConfigError, match=message):
        offloader.check()
    with pytest.raises(OffloadConfigError, match=message):
        offloader.enable()
    assert not offloader.is_enabled()
    _untouched(pipe, before)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("layerwise", {"window": 0}, r"window must be an integer >= 1, not 0"),
        ("layerwise", {"window": "2"}, r"window must be an integer"),
        ("layerwise", {"windw": 2}, r"unknown option\(s\) \['windw'\]; known: record .*window"),
        ("model_cpu", {"window": 2}, r"unknown option\(s\) \['window'\]"),
        ("model_cpu", {"record": "yes"}, r"'record' must be true or false"),
    ],
)
def test_bad_options_fail_before_any_module_is_touched(strategy, name, options, message) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    before = snapshot(pipe)
    with pytest.raises(OffloadConfigError, match=message):
        strategy(name)(make_plan(pipe), "cpu", options).enable()
    _untouched(pipe, before)


def test_layerwise_needs_block_lists(strategy) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    before = snapshot(pipe)
    with pytest.raises(OffloadConfigError, match=r"declares none \(block_attrs\); use model_cpu"):
        strategy("layerwise")(make_plan(pipe, block_attrs=()), "cpu").enable()
    with pytest.raises(OffloadConfigError, match=r"lists block 'transformer\.transformer_blocks\.0' twice"):
        plan = make_plan(pipe, block_attrs=("transformer.transformer_blocks", "transformer.transformer_blocks"))
        strategy("layerwise")(plan, "cpu").enable()
    _untouched(pipe, before)


def test_model_cpu_needs_something_to_offload(strategy) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    plan = make_plan(pipe, dit_modules=(), encoder_modules=(), block_attrs=())
    with pytest.raises(OffloadConfigError, match="names no loaded denoiser"):
        strategy("model_cpu")(plan, "cpu").enable()


def test_absent_optional_components_are_skipped(strategy) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    components = {**pipe.components, "image_encoder": None}
    plan = OffloadPlan(components, encoder_modules=("text_encoder", "text_encoder_2", "image_encoder"))
    offloader = strategy("model_cpu")(plan, "cpu")
    offloader.enable()
    assert offloader.is_enabled()
    offloader.disable()


@pytest.mark.parametrize("name", ["layerwise", "model_cpu"])
def test_failure_part_way_rolls_back(strategy, monkeypatch, name) -> None:  # type: ignore[no-untyped-def]
    """The second unit fails to park (say, out of host memory): the first unit's weights come
    back, no hook stays installed, and the offloader is not enabled."""
    from omni_plugin_offload.store import Unit

    pipe = build_tiny_flux()
    before = snapshot(pipe)
    real_park, calls = Unit.park, []

    def flaky_park(self: Unit, **kwargs: Any) -> None:
        calls.append(self.name)
        if len(calls) == 2:
            raise MemoryError("pinned host memory exhausted")
        real_park(self, **kwargs)

    monkeypatch.setattr(Unit, "park", flaky_park)
    offloader = strategy(name)(make_plan(pipe), "cpu", {"record": True})
    with pytest.raises(MemoryError):
        offloader.enable()
    assert len(calls) == 2
    assert not offloader.is_enabled() and offloader._units == [] and offloader._handles == []
    after = snapshot(pipe)
    for key, (tensor, _, values) in before.items():
        assert after[key][0] is tensor and torch.equal(after[key][0], values), key
    assert all_hooks(pipe) == 0


class TiedDiT(torch.nn.Module):
    """Blocks that share one rotary table with each other and with the model."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 4)
        self.register_buffer("rope", torch.arange(4.0))
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        for block in self.blocks:
            block.register_buffer("rope", self.rope)  # the same tensor object, in every block
        self.blocks[2].weight = self.blocks[1].weight  # and two blocks tie a weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x) + block.rope
        return x


def test_tied_weights_stay_resident(strategy) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = TiedDiT()
    x = torch.randn(2, 4)
    expected = model(x)
    plan = OffloadPlan(
        {"transformer": model}, encoder_modules=(), resident_modules=(), block_attrs=("transformer.blocks",)
    )
    offloader = strategy("layerwise")(plan, "cpu", {"record": True})
    offloader.enable()
    assert model.blocks[0].weight.numel() == 16 and model.blocks[2].bias.numel() == 0  # window of block 0
    assert model.blocks[2].weight.numel() == 16  # tied to block 1: stays resident
    assert model.rope.numel() == 4
    for _ in range(3):
        assert torch.equal(model(x), expected)
    offloader.disable()
    assert model.blocks[2].weight is model.blocks[1].weight and model.blocks[0].rope is model.rope
    assert torch.equal(model(x), expected)


class OwnOffload(torch.nn.Module):
    """A model object that runs model-level offload itself."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(2, 2)
        self.calls: list[tuple[str, Any]] = []

    def enable_omni_model_cpu_offload(self, device: Any) -> None:
        self.calls.append(("enable", device))

    def disable_omni_model_cpu_offload(self) -> None:
        self.calls.append(("disable", None))


def test_model_cpu_delegates_to_a_model_that_owns_its_offload(strategy) -> None:  # type: ignore[no-untyped-def]
    from omni_plugin_offload.protocols import OwnsModelCpuOffload

    owner = OwnOffload()
    assert isinstance(owner, OwnsModelCpuOffload)
    assert not isinstance(torch.nn.Linear(2, 2), OwnsModelCpuOffload)
    vae = torch.nn.Linear(2, 2)
    plan = OffloadPlan({"transformer": owner, "vae": vae}, block_attrs=())
    offloader = strategy("model_cpu")(plan, "cpu")
    offloader.enable()
    assert owner.calls == [("enable", torch.device("cpu"))]
    assert all_hooks_of(owner) == 0 and all_hooks_of(vae) == 0  # it installs nothing itself
    assert offloader.resident() == ("transformer", "vae")  # read off where the weights are
    offloader.disable()
    assert owner.calls[-1] == ("disable", None)


def all_hooks_of(module: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) for m in module.modules())


def test_enable_twice_is_refused(strategy) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    offloader = strategy("model_cpu")(make_plan(pipe), "cpu")
    offloader.enable()
    hooks = all_hooks(pipe)
    with pytest.raises(OffloadConfigError, match="already enabled"):
        offloader.enable()
    assert all_hooks(pipe) == hooks
    offloader.disable()


def test_bad_device(strategy) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    with pytest.raises(OffloadConfigError, match="bad compute device 'gpu0'"):
        strategy("layerwise")(make_plan(pipe), "gpu0").check()
