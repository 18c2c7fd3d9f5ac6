"""The fault battery, part 6: a multi-stage model behind ``omni serve`` (``POST
/v1/chat/completions``) and ``--stage`` overrides. Every row runs a real server process (the
test pipeline, tests/fixtures/plugins/omni-fixture-pipeline, each stage in its own process) or
the real ``omni`` command, and checks what a client or an operator gets: the status, the one
error shape naming the field and the fix, never a stack trace, and a pipeline that goes on
serving afterwards."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from faults import assert_clean_failure
from serving import (
    CHAT_MESSAGES,
    OMNI,
    ServerProcess,
    assert_error,
    chat_events,
    chat_marks,
    make_tiny,
    post_chat,
    server_env,
)

pytestmark = chat_marks()


@pytest.mark.parametrize(
    ("body", "status", "mention", "param"),
    [
        pytest.param({"modalities": ["image"]}, 400, "cannot answer with 'image'", "modalities", id="chat-modality"),
        pytest.param({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                     400, "reads text and input_audio parts only", "messages[0].content", id="chat-image-part"),
        pytest.param({"audio": {"voice": "alloy"}, "modalities": ["audio"]}, 400,
                     "has no voice 'alloy'; its voices are high, low", "audio.voice", id="chat-voice"),
        pytest.param({"audio": {"format": "mp3"}}, 400, "audio.format", "audio.format", id="chat-audio-format"),
        pytest.param({"stage_params": {"talker": {}}}, 400, "this model's stages are tokens, hidden, wave",
                     "stage_params", id="chat-unknown-stage"),
        pytest.param({"messages": []}, 400, "messages", "messages", id="chat-no-messages"),
        pytest.param({"max_tokens": 0}, 400, "max_tokens", "max_tokens", id="chat-max-tokens-zero"),
        pytest.param({"logprobs": True}, 400, "unknown field 'logprobs'", "logprobs", id="chat-unknown-field"),
        pytest.param({"model": "nope"}, 404, "'nope' is not served", "model", id="chat-unknown-model"),
        pytest.param({"stage_params": {"tokens": {"refuse": "x"}}}, 400, "stage 'tokens' refused the request",
                     "refuse", id="chat-refused-by-a-stage"),
    ],
)  # fmt: skip
def test_bad_chat_requests_are_4xx_naming_the_field(
    chat_server: ServerProcess, body: dict[str, Any], status: int, mention: str, param: str
) -> None:
    assert_error(post_chat(chat_server, {"messages": CHAT_MESSAGES, **body}), status, mention, param=param)


def test_a_stage_failing_before_the_answer_is_an_error_naming_it(chat_server: ServerProcess) -> None:
    body = {"messages": CHAT_MESSAGES, "max_tokens": 3, "stage_params": {"tokens": {"fail_after": 0}}}
    assert_error(post_chat(chat_server, body), 503, "stage 'tokens' failed", "told to fail after 0 item(s)")
    assert post_chat(chat_server, {"messages": CHAT_MESSAGES, "max_tokens": 2}).status_code == 200


def test_a_stage_that_says_no_finish_reason_fails_the_request_naming_it(chat_server: ServerProcess) -> None:
    body = {"messages": CHAT_MESSAGES, "max_tokens": 2, "stage_params": {"tokens": {"finish_reason": "eos"}}}
    assert_error(post_chat(chat_server, body), 503, "stage 'tokens'", "returned 'eos'", "one of stop, length")
    assert post_chat(chat_server, {"messages": CHAT_MESSAGES, "max_tokens": 2}).status_code == 200


def test_a_stage_failing_mid_stream_ends_the_stream_with_an_error_event(chat_server: ServerProcess) -> None:
    body = {"messages": CHAT_MESSAGES, "max_tokens": 8, "modalities": ["text", "audio"]}
    response, got = chat_events(chat_server, {**body, "stage_params": {"wave": {"fail_after": 2}}})
    assert response.status_code == 200  # the answer had started: its end says what happened
    assert "[DONE]" not in got
    assert "stage 'wave' failed" in got[-1]["error"]["message"]
    assert sum("audio" in c["choices"][0]["delta"] for c in got[:-1]) == 2
    assert post_chat(chat_server, body).status_code == 200  # and the pipeline goes on serving


def test_a_client_hanging_up_mid_stream_lets_the_request_go(chat_server: ServerProcess) -> None:
    import httpx

    slow = {"messages": CHAT_MESSAGES, "max_tokens": 40, "stage_params": {"tokens": {"delay_s": 0.5}}}
    url = chat_server.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json={**slow, "stream": True}, timeout=60) as response:
        for line in response.iter_lines():
            if '"content":"' in line and '"role"' not in line:
                break  # the first piece of text: hang up
    # max_requests is 1: the next request is refused (429) until the pipeline let the first go,
    # which it does at its next item (0.5 s), not after the 20 s the whole answer takes
    deadline = time.monotonic() + 10
    while (answer := post_chat(chat_server, {"messages": CHAT_MESSAGES, "max_tokens": 2})).status_code == 429:
        assert time.monotonic() < deadline, "the hung-up request still holds the pipeline"
        time.sleep(0.2)
    assert answer.status_code == 200, answer.text


def test_a_full_pipeline_answers_429(chat_server: ServerProcess) -> None:
    import httpx

    # The slow request is admitted once its first event arrives; only then is the second sent,
    # so which of the two holds the one slot is never a race.
    slow = {"messages": CHAT_MESSAGES, "max_tokens": 12, "stream": True, "stage_params": {"tokens": {"delay_s": 0.5}}}
    with httpx.stream("POST", chat_server.url + "/v1/chat/completions", json=slow, timeout=60) as held:
        lines = held.iter_lines()
        assert held.status_code == 200
        assert next(line for line in lines if line.startswith("data: "))
        assert_error(post_chat(chat_server, {"messages": CHAT_MESSAGES, "max_tokens": 1}), 429, "max_requests")
        assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
    assert post_chat(chat_server, {"messages": CHAT_MESSAGES, "max_tokens": 1}).status_code == 200


@pytest.mark.parametrize(
    ("stage", "mentions"),
    [
        pytest.param("talker.placement=inprocess", ("--stage talker: no such stage", "'tokens', 'hidden', 'wave'"),
                     id="stage-unknown-stage"),
        pytest.param("hidden.kind=ar", ("'kind' is the model's to declare",), id="stage-field-of-the-model"),
        pytest.param("hidden.engine=turbo", ("--stage hidden.engine: no stage engine 'turbo'", "can run on ['model']"),
                     id="stage-unknown-engine"),
        pytest.param("hidden.placement=nowhere", ("placement", "nowhere"), id="stage-unknown-placement"),
        pytest.param("hidden", ("is not STAGE.FIELD=VALUE",), id="stage-not-field-value"),
        pytest.param("hidden.placement=[a", ("does not read as YAML",), id="stage-value-not-yaml"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["serve", "explain", "chat"])
def test_a_bad_stage_override_is_refused_before_anything_starts(
    chat_site: Path, chat_model: Path, tmp_path: Path, stage: str, mentions: tuple[str, ...], command: str
) -> None:
    args = {
        "serve": ["serve", "--model", chat_model, "--port", "1"],
        "explain": ["explain", "pipeline", "--model", chat_model],
        "chat": ["chat", "--model", chat_model, "hi"],
    }[command]
    result = subprocess.run(
        [OMNI, *args, "--stage", stage],
        env=server_env(tmp_path, sites=(chat_site,)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode in (1, 2), result.stdout + result.stderr
    for mention in mentions:
        assert mention in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "listening" not in result.stdout


@pytest.fixture(scope="module")
def not_a_chat_model(chat_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("not-chat")
    return make_tiny("vits", home / "vits", home)


@pytest.fixture(scope="module")
def text_only_model(chat_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("text-only")
    return make_tiny("causal-lm", home / "llm", home)


#: an engine option on which the fixture's token stage fails to load: a chat that names this
#: failure got as far as starting a stage, one that names the user's mistake did not
LOAD_FAILS = ("--stage", "tokens.engine_options.fail_load=true")
LOADED = "was told to fail while loading"


def omni_chat(model: Path, site: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OMNI, "chat", "--model", str(model), "hi", *args],
        env=server_env(tmp_path, sites=(site,)),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_a_chat_that_gets_as_far_as_loading_names_the_stage_that_failed(
    chat_site: Path, chat_model: Path, tmp_path: Path
) -> None:
    """The observable the rows below rely on: with LOAD_FAILS, starting the stages fails."""
    result = omni_chat(chat_model, chat_site, tmp_path, "--voice", "low", "--audio-out", "r.wav", *LOAD_FAILS)
    assert_clean_failure(result, 1, "stage 'tokens'", LOADED)


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        pytest.param(("--audio-out", "reply.mp3"), ("--audio-out reply.mp3: name a .wav file",),
                     id="chat-audio-out-not-wav"),
        pytest.param(("--audio-out", "nowhere/reply.wav"), ("nowhere",), id="chat-audio-out-no-directory"),
        pytest.param(("--voice", "alto", "--audio-out", "r.wav"), ("--voice alto: the voices are high, low",),
                     id="chat-unknown-voice"),
        pytest.param(("--voice", "low"), ("--voice low picks the voice of the spoken answer", "--audio-out"),
                     id="chat-voice-without-audio-out"),
        pytest.param(("--max-tokens", "0"), ("--max-tokens",), id="chat-max-tokens-zero"),
        pytest.param(("--temperature", "-1"), ("--temperature",), id="chat-negative-temperature"),
    ],
)  # fmt: skip
def test_a_chat_mistake_is_named_before_anything_loads(
    chat_site: Path, chat_model: Path, tmp_path: Path, args: tuple[str, ...], mentions: tuple[str, ...]
) -> None:
    result = omni_chat(chat_model, chat_site, tmp_path, *args, *LOAD_FAILS)
    usage = args[0].startswith(("--max", "--temp")) or "--audio-out" not in args  # a usage mistake: exit 2
    assert_clean_failure(result, 2 if usage else 1, *mentions)
    assert LOADED not in result.stderr, result.stderr  # refused before any stage started
    assert not list(tmp_path.glob("*.wav")) and not result.stdout.strip()


def test_speech_from_a_text_only_model_is_refused_before_anything_loads(
    chat_site: Path, text_only_model: Path, tmp_path: Path
) -> None:
    # an engine option the language model's own engine refuses when its stage loads: named in
    # the output only if the stage got that far
    loads = ("--stage", "generate.engine=transformers", "--stage", "generate.engine_options.bogus=1")
    result = omni_chat(text_only_model, chat_site, tmp_path, "--audio-out", "r.wav", *loads)
    assert_clean_failure(result, 1, "answers in text only, so there is no speech for --audio-out", "drop --audio-out")
    assert "bogus" not in result.stderr, result.stderr
    assert not list(tmp_path.glob("*.wav")) and not result.stdout.strip()
    loaded = omni_chat(text_only_model, chat_site, tmp_path, *loads)  # the marker is real
    assert_clean_failure(loaded, 1, "bogus")


def test_chat_with_a_model_that_does_not_chat_names_the_command_that_runs_it(
    chat_site: Path, not_a_chat_model: Path, tmp_path: Path
) -> None:
    result = subprocess.run(
        [OMNI, "chat", "--model", str(not_a_chat_model), "hi"],
        env=server_env(tmp_path, sites=(chat_site,)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_clean_failure(result, 1, "not a chat model", "omni speak TEXT --model DIR")


def test_explain_model_on_a_pipeline_model_points_at_explain_pipeline(
    chat_site: Path, chat_model: Path, tmp_path: Path
) -> None:
    result = subprocess.run(
        [OMNI, "explain", "model", "--model", str(chat_model)],
        env=server_env(tmp_path, sites=(chat_site,)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_clean_failure(result, 1, "a multi-stage model", f"omni explain pipeline --model {chat_model}")
