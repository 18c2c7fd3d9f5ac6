"""Cancellation on tiny real checkpoints: a request whose token is cancelled (its client hung
up, its deadline passed) stops at the next denoising step with RequestCancelled, and the engine
serves the next request as if nothing happened.

The runtime's test family's pipeline calls back through the older ``callback`` argument; the
shipped FLUX.1 [schnell] family's (run where its plugin is installed) through
``callback_on_step_end``. Both are checked, each with a step callback of the family's own."""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytest

from omni_core.cancel import CancelToken, cancellable
from omni_core.errors import RequestCancelled
from omni_core.generation.model import EngineOptions
from omni_core.generation.request import GenerationRequest, ResolvedGeneration

FOX = "a red fox in snow"
STEPS = 6

#: (family name, module, class, the pipeline's step-callback argument)
FAMILIES = [
    pytest.param(("tiny-pixart", "runtime_family", "TinyPixArt", "callback"), id="tiny-pixart"),
    pytest.param(
        ("flux1-schnell", "omni_plugin_flux.family", "Flux1Schnell", "callback_on_step_end"),
        id="flux1-schnell",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("omni_plugin_flux") is None, reason="omni-plugin-flux is not installed"
        ),
    ),
]


def _recording(family_cls: type, argument: str) -> type:
    """``family_cls`` with a step callback of its own (as a family may set one) that records
    the steps it saw."""

    class Recording(family_cls):  # type: ignore[misc, valid-type]
        steps_seen: ClassVar[list[int]] = []

        @classmethod
        def call_kwargs(cls, request: ResolvedGeneration, pipeline: Any) -> dict[str, Any]:
            kwargs: dict[str, Any] = super().call_kwargs(request, pipeline)
            if argument == "callback":
                kwargs["callback"] = lambda step, timestep, latents: cls.steps_seen.append(step)
                kwargs["callback_steps"] = 2  # every other step: the runtime must keep that
            else:

                def record(pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
                    assert "latents" in callback_kwargs
                    cls.steps_seen.append(step)
                    return callback_kwargs

                kwargs["callback_on_step_end"] = record
            return kwargs

    return Recording


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, diffusion_plugins: Any) -> Any:
    """``(open_, argument)``: ``open_(recording=False)`` loads the family (or its recording
    variant) on its tiny checkpoint, made once per module."""
    name, module, cls_name, argument = request.param
    family_cls = getattr(importlib.import_module(module), cls_name)
    directory = tmp_path_factory.mktemp(name) / f"tiny-{name}"
    family_cls.make_tiny(directory, seed=0)

    def open_(recording: bool = False) -> Any:
        cls = _recording(family_cls, argument) if recording else family_cls
        return cls.open(directory, EngineOptions(family=name, plugins=diffusion_plugins, progress=False))

    return open_, argument


@pytest.fixture
def engine(family: Any) -> Iterator[Any]:
    opened = family[0]()
    yield opened
    opened.close()


def _request(steps: int = STEPS) -> GenerationRequest:
    return GenerationRequest(prompt=FOX, seed=0, width=32, height=32, num_inference_steps=steps)


def _count_passes(engine: Any) -> list[int]:
    count = [0]
    engine.pipeline.transformer.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


def test_the_pipelines_step_callback_is_found(engine: Any, family: Any) -> None:
    assert engine.step_callback == family[1]


def test_a_token_cancelled_before_the_call_runs_nothing(engine: Any) -> None:
    passes = _count_passes(engine)
    token = CancelToken()
    token.cancel("the client disconnected")
    with cancellable(token), pytest.raises(RequestCancelled, match="the client disconnected"):
        engine.generate(_request())
    with cancellable(token), pytest.raises(RequestCancelled):
        engine.generate_batch([_request(), _request().model_copy(update={"prompt": "cat", "seed": 1})])
    assert passes[0] == 0


def test_a_token_cancelled_from_another_thread_stops_at_the_next_step(engine: Any) -> None:
    expected = engine.generate(_request()).images[0].pixels
    passes = _count_passes(engine)
    token = CancelToken()
    first_pass, cancelled = threading.Event(), threading.Event()

    def hold_the_first_step(*_: Any) -> None:
        # the first step waits until the other thread has cancelled, so where it stops is certain
        first_pass.set()
        assert cancelled.wait(30), "the cancelling thread never ran"

    engine.pipeline.transformer.register_forward_pre_hook(hold_the_first_step)

    def cancel_when_running() -> None:
        first_pass.wait(30)
        token.cancel("deadline passed")
        cancelled.set()

    canceller = threading.Thread(target=cancel_when_running)
    canceller.start()
    try:
        with cancellable(token), pytest.raises(RequestCancelled, match="deadline passed"):
            engine.generate(_request())
    finally:
        cancelled.set()
        canceller.join(30)
    assert passes[0] == 1, f"ran {passes[0]} of {STEPS} steps; it should stop after the step that was running"
    # the engine is unharmed: the same request, uncancelled, gives the same pixels as before
    again = engine.generate(_request())
    assert np.array_equal(again.images[0].pixels, expected)
    assert passes[0] == 1 + STEPS


def test_the_familys_own_step_callback_still_runs(family: Any) -> None:
    open_, argument = family
    engine = open_(recording=True)
    try:
        engine.family_cls.steps_seen.clear()
        with cancellable(CancelToken()):
            engine.generate(_request(steps=4))
        # the family asked the older callback for every other step; the new one runs every step
        assert engine.family_cls.steps_seen == ([0, 2] if argument == "callback" else [0, 1, 2, 3])
        token = CancelToken()
        token.cancel("gone")
        engine.family_cls.steps_seen.clear()
        with cancellable(token), pytest.raises(RequestCancelled):
            engine.generate(_request(steps=4))
        assert engine.family_cls.steps_seen == []
    finally:
        engine.close()
