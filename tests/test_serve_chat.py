"""``POST /v1/chat/completions``: a multi-stage model served by a real ``omni serve`` process,
through the same orchestrator as ``Omni.run``. The model is the three-stage test pipeline
(tests/fixtures/plugins/omni-fixture-pipeline: tokens -> hidden -> wave, pip-installed into a
private site), each stage in its own process; every answer is checked exactly against the same
stage classes called in this process, through the official ``openai`` client and raw
server-sent events. What a client gets when things go wrong: tests/test_faults_chat.py."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import time
import wave
from pathlib import Path
from typing import Any

from serving import (
    CHAT_MESSAGES,
    CHAT_MODEL,
    OMNI,
    ServerProcess,
    chat_events,
    chat_marks,
    client,
    post_chat,
    server_env,
    stage_processes,
    start_server,
)

pytestmark = chat_marks()


def reference(
    model_dir: Path, max_tokens: int, messages: list[dict[str, str]] = CHAT_MESSAGES, voice: str | None = None
) -> dict[str, Any]:
    """The answer of the same stage classes called here: the text, and the audio as the 16-bit
    PCM the server sends (the same clipping and rounding)."""
    import numpy as np
    from omni_fixture_pipeline.stages import reference as run_here

    from omni_core.speech.audio import Audio, encode

    want = run_here(model_dir, messages, {"tokens": {"max_tokens": max_tokens}, "wave": {"voice": voice}})
    frames = [np.clip(np.asarray(a, dtype=np.float32), -1.0, 1.0) for a in want["audio"]]
    return {
        "text": "".join(want["text"]),
        "pieces": want["text"],
        "pcm": encode(Audio(np.concatenate(frames), 16000), "pcm"),
        "frames": [encode(Audio(frame, 16000), "pcm") for frame in frames],
    }


def test_the_model_is_listed_as_a_chat_model_with_what_it_answers(chat_server: ServerProcess) -> None:
    import httpx

    card = next(m for m in httpx.get(chat_server.url + "/v1/models").json()["data"] if m["id"] == CHAT_MODEL)
    assert card["task"] == "chat"
    assert card["endpoints"] == ["/v1/chat/completions"]
    assert card["modalities"] == ["text", "audio"]
    assert card["voices"] == ["high", "low"]  # the wave stage's, its default first
    assert card["content_parts"] == ["text", "input_audio"]  # what its token stage reads
    assert card["status"] == "ready"


def test_a_text_answer_through_the_openai_client_equals_the_stages_run_here(
    chat_server: ServerProcess, chat_model: Path
) -> None:
    answer = client(chat_server).chat.completions.create(
        model=CHAT_MODEL,
        messages=CHAT_MESSAGES,  # type: ignore[arg-type]
        max_tokens=7,
    )
    assert answer.object == "chat.completion" and answer.model == CHAT_MODEL
    message = answer.choices[0].message
    assert message.content == reference(chat_model, 7)["text"]
    # the token stage has no end of its own: every answer spends max_tokens, and says so
    assert message.audio is None and answer.choices[0].finish_reason == "length"


def test_text_and_audio_the_wav_holds_exactly_the_stages_samples(chat_server: ServerProcess, chat_model: Path) -> None:
    body = {"messages": CHAT_MESSAGES, "max_tokens": 5, "modalities": ["text", "audio"], "audio": {"format": "wav"}}
    response = post_chat(chat_server, body)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    want = reference(chat_model, 5)
    assert message["content"] == want["text"] and message["audio"]["transcript"] == want["text"]
    with wave.open(io.BytesIO(base64.b64decode(message["audio"]["data"]))) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (16000, 1, 2)
        assert wav.readframes(wav.getnframes()) == want["pcm"]
    assert message["audio"]["sample_rate"] == 16000 and message["audio"]["expires_at"] > time.time()

    raw = post_chat(chat_server, {**body, "audio": {"format": "pcm16", "voice": "default"}}).json()
    assert base64.b64decode(raw["choices"][0]["message"]["audio"]["data"]) == want["pcm"]


def test_audio_voice_goes_to_the_stage_that_speaks(chat_server: ServerProcess, chat_model: Path) -> None:
    body = {"messages": CHAT_MESSAGES, "max_tokens": 3, "modalities": ["audio"], "audio": {"format": "pcm16"}}
    for voice in ("high", "low"):
        answer = post_chat(chat_server, {**body, "audio": {"format": "pcm16", "voice": voice}}).json()
        got = base64.b64decode(answer["choices"][0]["message"]["audio"]["data"])
        assert got == reference(chat_model, 3, voice=voice)["pcm"]
    assert reference(chat_model, 3, voice="low")["pcm"] != reference(chat_model, 3, voice="high")["pcm"]


def test_a_part_the_model_reads_reaches_its_entry_stage(chat_server: ServerProcess, chat_model: Path) -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "listen: "}, audio]}]
    answer = post_chat(chat_server, {"messages": messages, "max_tokens": 3})
    assert answer.status_code == 200, answer.text
    # the stage got the parts as they were sent (the fixture reads a message's content as its text)
    assert answer.json()["choices"][0]["message"]["content"] == reference(chat_model, 3, messages)["text"]


def test_an_audio_only_answer_has_no_text_content(chat_server: ServerProcess, chat_model: Path) -> None:
    answer = post_chat(chat_server, {"messages": CHAT_MESSAGES, "max_tokens": 3, "modalities": ["audio"]}).json()
    message = answer["choices"][0]["message"]
    assert message["content"] is None
    assert base64.b64decode(message["audio"]["data"])[44:] == reference(chat_model, 3)["pcm"]  # after the header


def test_the_finish_reason_is_how_the_stages_said_the_answer_ended(chat_server: ServerProcess) -> None:
    body = {"messages": CHAT_MESSAGES, "max_tokens": 3}
    assert post_chat(chat_server, body).json()["choices"][0]["finish_reason"] == "length"  # its budget ran out
    ended = {**body, "stage_params": {"tokens": {"finish_reason": "stop"}}}  # the token stage says it ended
    assert post_chat(chat_server, ended).json()["choices"][0]["finish_reason"] == "stop"
    _, got = chat_events(chat_server, {**ended, "stream": True})
    assert got[-1] == "[DONE]" and got[-2]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    # the speech stages report nothing (stop): with them too, the answer ended by itself
    speech = {**ended, "modalities": ["text", "audio"]}
    assert post_chat(chat_server, speech).json()["choices"][0]["finish_reason"] == "stop"


def test_a_stream_sends_text_pieces_and_audio_chunks_as_made_then_done(
    chat_server: ServerProcess, chat_model: Path
) -> None:
    body = {"messages": CHAT_MESSAGES, "max_tokens": 6, "modalities": ["text", "audio"]}
    response, got = chat_events(chat_server, body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-omni-sample-rate"] == "16000"
    assert got[-1] == "[DONE]"
    chunks = got[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length"}
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    texts = [d["content"] for d in deltas if "content" in d]
    audio = [base64.b64decode(d["audio"]["data"]) for d in deltas if "audio" in d]
    want = reference(chat_model, 6)
    # window 1: one event per item, each as the stages made it
    assert texts == want["pieces"] and audio == want["frames"]


def test_the_openai_client_reads_the_stream(chat_server: ServerProcess, chat_model: Path) -> None:
    stream = client(chat_server).chat.completions.create(
        model=CHAT_MODEL,
        messages=CHAT_MESSAGES,  # type: ignore[arg-type]
        max_tokens=4,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == reference(chat_model, 4)["text"]


def test_a_text_only_request_never_runs_the_speech_stages(chat_server: ServerProcess) -> None:
    # told to fail at its first item, the wave stage fails any request that reaches it
    body = {"messages": CHAT_MESSAGES, "max_tokens": 3, "stage_params": {"wave": {"fail_after": 0}}}
    assert post_chat(chat_server, body).status_code == 200
    assert post_chat(chat_server, {**body, "modalities": ["text", "audio"]}).status_code == 503


# -- placement from the command line --------------------------------------------------------------


def test_explain_shows_stage_overrides_from_the_command_line(chat_site: Path, chat_model: Path, tmp_path: Path) -> None:
    args = [OMNI, "explain", "pipeline", "--model", chat_model, "--json"]
    overrides = ["--stage", "hidden.placement=inprocess", "--stage", "tokens.engine_options.load_seconds=0.5"]
    result = subprocess.run(
        [*args, *overrides], env=server_env(tmp_path, sites=(chat_site,)), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    stages = {s["name"]: s for s in json.loads(result.stdout)["stages"]}
    assert stages["hidden"]["placement"] == "inprocess" and stages["hidden"]["sources"]["placement"] == "command line"
    assert stages["tokens"]["engine_options"] == {"load_seconds": 0.5}
    assert stages["wave"]["placement"] == "process"


def test_serve_places_stages_from_the_command_line(chat_site: Path, chat_model: Path, tmp_path: Path) -> None:
    overrides = ["--stage", "hidden.placement=inprocess", "--stage", "wave.placement=inprocess"]
    running = start_server(["--model", f"{CHAT_MODEL}={chat_model}", *overrides], home=tmp_path, sites=(chat_site,))
    try:
        # tokens in a process of its own; hidden and wave in the server's own process
        assert len(stage_processes(running.proc.pid)) == 1
        body = {"messages": CHAT_MESSAGES, "max_tokens": 3, "modalities": ["text", "audio"]}
        answer = post_chat(running, body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == reference(chat_model, 3)["text"]
    finally:
        assert running.stop() == 0
