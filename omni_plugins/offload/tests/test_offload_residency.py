"""What is on the device while each part of a real (tiny) FLUX pipeline runs."""

from __future__ import annotations

from typing import Any

from offload_testkit import BLOCKS, build_tiny_flux, make_plan, run_flux


def _params_state(module: Any) -> str:
    """'full' when every parameter and buffer holds its weights, 'empty' when none does."""
    tensors = [*module.parameters(), *module.buffers()]
    sizes = {t.numel() == 0 for t in tensors}
    assert len(sizes) == 1, "a unit is either fully resident or fully evicted"
    return "empty" if sizes.pop() else "full"


def _blocks(pipe: Any) -> dict[str, Any]:
    t = pipe.transformer
    out = {f"transformer.transformer_blocks.{i}": b for i, b in enumerate(t.transformer_blocks)}
    out.update({f"transformer.single_transformer_blocks.{i}": b for i, b in enumerate(t.single_transformer_blocks)})
    return out


def _probe(pipe: Any, watched: dict[str, Any], seen: list[tuple[str, dict[str, str]]]) -> None:
    """After the offloader's hook, note the state of every watched module as ``name`` runs."""
    for name, module in watched.items():

        def look(_m: Any, _a: Any, name: str = name) -> None:
            seen.append((name, {n: _params_state(m) for n, m in watched.items()}))

        module.register_forward_pre_hook(look)


def test_layerwise_keeps_the_running_block_and_the_next_one(strategy) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    shapes = {n: p.shape for n, p in pipe.transformer.named_parameters()}
    offloader = strategy("layerwise")(make_plan(pipe), "cpu", {"record": True})
    offloader.enable()
    blocks = _blocks(pipe)
    assert list(blocks) == list(BLOCKS)
    seen: list[tuple[str, dict[str, str]]] = []
    _probe(pipe, blocks, seen)

    run_flux(pipe, steps=3)

    order = [name for name, _ in seen]
    assert order == list(BLOCKS) * 3  # 3 steps, one transformer pass each (no CFG batch split)
    for name, states in seen:
        i = BLOCKS.index(name)
        window = {BLOCKS[i], BLOCKS[(i + 1) % len(BLOCKS)]}  # itself + the next; the last one's next is the first
        assert {n for n, s in states.items() if s == "full"} == window, (name, states)
    # the recorded events tell the same story, with the components that never move
    assert [e.module for e in offloader.events] == order
    for event in offloader.events:
        i = BLOCKS.index(event.module)
        assert event.resident == (
            "transformer",
            "text_encoder",
            "text_encoder_2",
            "vae",
            *sorted({BLOCKS[i], BLOCKS[(i + 1) % 3]}, key=BLOCKS.index),
        )
    last = offloader.events[-1]
    assert last.module == BLOCKS[-1] and BLOCKS[0] in last.resident  # the last block prefetched the first
    # the non-block parts of the transformer and the other components never lost a weight
    for name, param in pipe.transformer.named_parameters():
        if "transformer_blocks." not in name:
            assert param.shape == shapes[name]
    for comp in ("text_encoder", "text_encoder_2", "vae"):
        assert _params_state(getattr(pipe, comp)) == "full"
    offloader.disable()


def test_layerwise_window_of_two_over_five_blocks(strategy) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux(num_layers=3, num_single_layers=2)
    names = [f"transformer.transformer_blocks.{i}" for i in range(3)]
    names += [f"transformer.single_transformer_blocks.{i}" for i in range(2)]
    offloader = strategy("layerwise")(make_plan(pipe), "cpu", {"record": True, "window": 2})
    offloader.enable()
    assert [n for n in offloader.resident() if "blocks" in n] == names[:3]  # ready for block 0
    seen: list[tuple[str, dict[str, str]]] = []
    _probe(pipe, _blocks(pipe), seen)
    run_flux(pipe, steps=2)
    assert [n for n, _ in seen] == names * 2
    for name, states in seen:
        i = names.index(name)
        expected = {names[(i + k) % 5] for k in range(3)}  # two resident + one prefetched
        assert {n for n, s in states.items() if s == "full"} == expected
    offloader.disable()


def test_a_block_called_out_of_order_is_loaded(strategy) -> None:  # type: ignore[no-untyped-def]
    import torch

    pipe = build_tiny_flux()
    offloader = strategy("layerwise")(make_plan(pipe), "cpu", {"record": True})
    offloader.enable()
    single = pipe.transformer.single_transformer_blocks[0]
    assert _params_state(single) == "empty"
    hidden = torch.randn(1, 4, 16)
    temb = torch.randn(1, 16)
    encoder = torch.randn(1, 3, 16)
    single(hidden, encoder, temb)  # a miss: loaded synchronously, then the window moves on
    assert offloader.events[-1].module == BLOCKS[2]
    assert [n for n in offloader.resident() if "blocks" in n] == [BLOCKS[0], BLOCKS[2]]
    offloader.disable()


def test_model_cpu_encoders_and_transformer_take_turns(strategy) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    offloader = strategy("model_cpu")(make_plan(pipe), "cpu", {"record": True})
    offloader.enable()
    assert offloader.resident() == ("vae",)  # nothing runs yet: both groups are parked
    watched = {
        "transformer": pipe.transformer,
        "text_encoder": pipe.text_encoder,
        "text_encoder_2": pipe.text_encoder_2,
        "vae": pipe.vae.decoder,
    }
    seen: list[tuple[str, dict[str, str]]] = []
    _probe(pipe, watched, seen)

    run_flux(pipe, steps=2)
    run_flux(pipe, "a bowl of fruit", steps=2)

    encoders_on = {"text_encoder": "full", "text_encoder_2": "full", "transformer": "empty", "vae": "full"}
    dit_on = {"text_encoder": "empty", "text_encoder_2": "empty", "transformer": "full", "vae": "full"}
    expected_one_call = [
        ("text_encoder", encoders_on),
        ("text_encoder_2", encoders_on),
        ("transformer", dit_on),
        ("transformer", dit_on),
        ("vae", dit_on),  # the VAE decodes with the transformer still there; it never moves
    ]
    assert seen == expected_one_call * 2
    assert [(e.module, e.resident) for e in offloader.events] == [
        ("text_encoder", ("vae", "text_encoder", "text_encoder_2")),
        ("text_encoder_2", ("vae", "text_encoder", "text_encoder_2")),
        ("transformer", ("vae", "transformer")),
        ("transformer", ("vae", "transformer")),
    ] * 2
    offloader.disable()
    assert all(_params_state(m) == "full" for m in watched.values())


def test_model_cpu_leaves_undeclared_components_resident(strategy) -> None:  # type: ignore[no-untyped-def]
    pipe = build_tiny_flux()
    plan = make_plan(pipe, encoder_modules=("text_encoder",), block_attrs=())
    offloader = strategy("model_cpu")(plan, "cpu", {"record": True})
    offloader.enable()
    assert offloader.resident() == ("vae", "text_encoder_2")
    run_flux(pipe)
    assert _params_state(pipe.text_encoder_2) == "full"
    assert offloader.events[-1].resident == ("vae", "text_encoder_2", "transformer")
    offloader.disable()
