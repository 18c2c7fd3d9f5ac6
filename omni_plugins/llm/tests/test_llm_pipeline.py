"""The model through omni's real pipeline runtime (``Omni.run``): the plugin found by its entry
point, the stage built by the runtime (its own process, or a thread), the text each token
becomes equal to the engine's called here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from llm_testkit import answer

pytest.importorskip("omni_plugin_connectors", reason="the pipeline runtime needs omni-plugin-connectors installed")

MESSAGES = [{"role": "user", "content": "Hi there"}]
#: the model's own engine, whatever stage engine plugins are installed
OWN_ENGINE = {"engine": "transformers"}


@pytest.fixture(scope="module")
def omni(tiny_llm: Path, llm_plugins: Any) -> Any:
    """The model opened as a user opens it: its stage in a process of its own (the default)."""
    from omni_core import Omni

    with Omni(tiny_llm, plugins=llm_plugins, stages={"generate": OWN_ENGINE}) as opened:
        yield opened


def test_it_opens_as_a_chat_model_of_the_causal_lm_family(omni: Any) -> None:
    assert omni.kind == "chat"
    assert (omni.identity.modality, omni.identity.name) == ("pipeline", "causal-lm")
    (stage,) = omni.pipeline.resolved.stages
    assert (stage.name, stage.placement, stage.engine_name) == ("generate", "process", "transformers")


def test_messages_answer_the_same_text_as_the_engine(omni: Any, llm_engine: Any) -> None:
    result = omni.run(MESSAGES, params={"generate": {"max_tokens": 12}})
    assert result.outputs["text"] == answer(llm_engine, MESSAGES, max_tokens=12)[1]
    prompt = omni.run("Hello", params={"generate": {"max_tokens": 8, "temperature": 0.9, "seed": 4}})
    assert prompt.outputs["text"] == answer(llm_engine, "Hello", max_tokens=8, temperature=0.9, seed=4)[1]


def test_a_stop_string_and_a_bad_part_through_the_runtime(omni: Any, llm_engine: Any) -> None:
    from omni_core.errors import StageFailedError

    full = "".join(answer(llm_engine, MESSAGES, max_tokens=20)[1])
    start = next(i for i in range(len(full) // 2, len(full) - 2) if "\ufffd" not in full[i : i + 2])
    stop = full[start : start + 2]
    text = "".join(omni.run(MESSAGES, params={"generate": {"max_tokens": 20, "stop": [stop]}}).outputs["text"])
    assert text == full[: full.find(stop)]
    bad = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": ""}}]}]
    with pytest.raises(StageFailedError, match="'input_audio' part; this model reads text only"):
        omni.run(bad)


def test_the_answer_says_how_it_ended_through_the_runtime(omni: Any, llm_engine: Any) -> None:
    cut = omni.run(MESSAGES, params={"generate": {"max_tokens": 4, "ignore_eos": True}})
    assert (cut.finish_reason, cut.finish_reasons) == ("length", {"generate": "length"})
    full = "".join(answer(llm_engine, MESSAGES, max_tokens=20, ignore_eos=True)[1])
    stop = next(full[i : i + 2] for i in range(4, len(full) - 2) if "\ufffd" not in full[i : i + 2])
    stream = omni.stream(MESSAGES, params={"generate": {"max_tokens": 20, "ignore_eos": True, "stop": stop}})
    assert list(stream) and stream.finish_reason == "stop"


def test_a_pipeline_planned_first_is_the_one_omni_starts(tiny_llm: Path, llm_plugins: Any) -> None:
    """``omni chat`` plans once, checks the request against the plan, then starts that plan."""
    from omni_core import Omni
    from omni_core.api import identify_model

    planned = identify_model(tiny_llm, plugins=llm_plugins).plan_pipeline(
        plugins=llm_plugins, stages={"generate": {**OWN_ENGINE, "placement": "inprocess"}}
    )
    with pytest.raises(TypeError, match="stages= or an already planned pipeline="):
        Omni(tiny_llm, plugins=llm_plugins, pipeline=planned, stages={"generate": OWN_ENGINE})
    with Omni(tiny_llm, plugins=llm_plugins, pipeline=planned) as omni:
        assert omni.pipeline.resolved is planned  # started as planned, not planned again
        assert omni.run("Hi", params={"generate": {"max_tokens": 2}}).outputs["text"]


def test_in_the_orchestrators_process_the_answer_is_the_same(tiny_llm: Path, llm_plugins: Any, llm_engine: Any) -> None:
    from omni_core import Omni

    with Omni(tiny_llm, plugins=llm_plugins, stages={"generate": {**OWN_ENGINE, "placement": "inprocess"}}) as omni:
        chunks = list(omni.stream(MESSAGES, params={"generate": {"max_tokens": 6}}))
    pieces = [item for chunk in chunks for item in chunk.items]
    assert pieces == answer(llm_engine, MESSAGES, max_tokens=6)[1]
