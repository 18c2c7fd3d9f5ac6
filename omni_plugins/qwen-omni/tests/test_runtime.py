"""Qwen2.5-Omni through omni's pipeline runtime (``Omni(...).run``): real stage processes (spawned),
real connectors, streaming edges, on the tiny checkpoint, against transformers' ``generate``.

Tolerance: none, as in ``test_parity.py``: each stage runs the same operations on the same inputs
as the reference (payloads cross the processes bit for bit, and every process runs one CPU
thread, so sums are taken in the same order), so the text and every waveform sample are equal.
The codec codes do not leave the pipeline; the waveform, a function of them, equals generate's
and has one 480-sample stretch per code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("omni_plugin_connectors", reason="the pipeline runtime needs omni-plugin-connectors installed")

from omni_plugin_qwen_omni import reference  # noqa: E402

from omni_core.errors import StageFailedError  # noqa: E402

MESSAGES = [{"role": "user", "content": "Hello, how are you?"}]
GREEDY = {"thinker": {"max_tokens": 12}, "talker": {"temperature": 0, "max_tokens": 40}}


@pytest.fixture(scope="module")
def omni(tiny_omni: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The tiny checkpoint opened as omni opens any model: the thinker and the talker each in a
    process of its own, token2wav in the caller's; items stream over every edge in twos."""
    from omni_core import Omni

    recipe = tmp_path_factory.mktemp("recipe") / "recipe.yaml"
    recipe.write_text(
        "pipeline:\n"
        "  defaults: {placement: process, request_timeout: 120}\n"
        "  stages:\n"
        "    token2wav: {placement: inprocess}\n"
        "  edge_defaults: {window: 2}\n"
    )
    with Omni(tiny_omni, recipe=recipe) as model:
        yield model


def test_the_pipeline_answers_what_generate_answers(omni: Any, tiny_omni: Path, chain: Any) -> None:
    assert omni.identity.modality == "pipeline" and omni.identity.name == "qwen2.5-omni"
    want = reference.generate(tiny_omni, MESSAGES, thinker_max_tokens=12, talker_max_tokens=40)
    result = omni.run(MESSAGES, params=GREEDY, outputs=("text", "audio"))
    assert set(result.stage_seconds) == {"thinker", "talker", "token2wav"}
    text, audio = result.outputs["text"], result.outputs["audio"]
    assert text == chain(MESSAGES, GREEDY).pieces  # one piece per token of generate's, as the stage makes them
    assert len(text) == len(want.tokens) == 12
    assert "".join(text) == chain.thinker.tokenizer.decode(want.tokens, skip_special_tokens=True)
    assert len(audio) == 1 and audio[0].dtype == torch.float32 and audio[0].ndim == 1
    assert audio[0].shape == (len(want.codes) * 480,)
    assert torch.equal(audio[0], want.wave)


def test_streamed_chunks_are_the_answer_text_first(omni: Any) -> None:
    whole = omni.run(MESSAGES, params=GREEDY, outputs=("text", "audio"))
    chunks = list(omni.stream(MESSAGES, params=GREEDY, outputs=("text", "audio")))
    assert chunks[0].modality == "text"
    assert [i for c in chunks if c.modality == "text" for i in c.items] == whole.outputs["text"]
    audio = [i for c in chunks if c.modality == "audio" for i in c.items]
    assert len(audio) == 1 and torch.equal(audio[0], whole.outputs["audio"][0])


def test_a_text_only_request_stops_after_the_thinker(omni: Any, chain: Any) -> None:
    from omni_core.pipeline.stage import StageParams

    result = omni.run(MESSAGES, params={"thinker": {"max_tokens": 12}}, outputs=("text",))
    assert set(result.outputs) == {"text"} and set(result.stage_seconds) == {"thinker"}
    # the thinker knew only text was asked for: no speech system prompt, another answer
    text_only = StageParams({"max_tokens": 12}, outputs=("text",))
    items = list(chain.thinker.run(iter([MESSAGES]), text_only))
    assert result.outputs["text"] == [chain.thinker.for_output(item) for item in items]
    assert result.outputs["text"] != chain(MESSAGES, {"thinker": {"max_tokens": 12}}).pieces
    assert (result.finish_reason, result.finish_reasons) == ("length", {"thinker": "length"})


def test_a_stop_string_ends_the_text_and_the_speech(omni: Any, chain: Any) -> None:
    whole = omni.run(MESSAGES, params=GREEDY, outputs=("text", "audio"))
    assert whole.finish_reasons == {"thinker": "length", "talker": "length", "token2wav": "stop"}
    pieces = whole.outputs["text"]
    full = "".join(pieces)
    k = next(  # a stop string across two tokens' text
        i
        for i in range(2, len(pieces) - 2)
        if pieces[i] and pieces[i + 1] and "\ufffd" not in pieces[i][-1] + pieces[i + 1][0]
    )
    start = len("".join(pieces[:k])) + len(pieces[k]) - 1
    stop = full[start : start + 2]
    params = {**GREEDY, "thinker": {"max_tokens": 12, "stop": stop}}
    cut = omni.run(MESSAGES, params=params, outputs=("text", "audio"))
    assert "".join(cut.outputs["text"]) == full[: full.find(stop)]
    assert cut.finish_reasons["thinker"] == "stop"
    want = chain(MESSAGES, params)  # the same stages here: the talker read the reply up to the stop
    assert torch.equal(cut.outputs["audio"][0], want.wave)


def test_a_request_the_stages_refuse_fails_alone_saying_why(omni: Any) -> None:
    with pytest.raises(StageFailedError, match=r"stage 'talker'.*unknown voice 'Nobody'.*Chelsie, Ethan"):
        omni.run(MESSAGES, params={**GREEDY, "talker": {"voice": "Nobody"}})
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}]
    with pytest.raises(StageFailedError, match=r"stage 'thinker'.*not supported by this install.*torchvision"):
        omni.run(image, outputs=("text",))
    # the stages serve the next request
    result = omni.run(MESSAGES, params={**GREEDY, "talker": {"temperature": 0, "max_tokens": 8, "voice": "Ethan"}})
    assert len(result.outputs["text"]) == 12 and result.outputs["audio"][0].shape == (8 * 480,)
