"""The fault battery, part 4: ``omni serve`` under bad input, bad plugins and bad clients.

Every row runs a real server process and checks what a client gets: the status, the one error
shape naming the field and the fix, a request id, never a stack trace (a 5xx only for the
model's own failure, never for input) and a server that goes on serving afterwards.

Fault cases use the ``omni-fixture-serve-faults`` plugin (pip-installed into a private site
directory): an image family whose generation explodes or hangs on cue, and a streaming voice
that logs every chunk it makes (so a test can see synthesis stop when the client hangs up).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from serving import OMNI, ServerProcess, assert_error, client, free_port, server_env, start_server

#: what the rows need; without it they are collected (their ids are the troubleshooting page's
#: references) and skipped with this reason, as the torch-free core environment does
NEEDED = ("fastapi", "torch", "httpx", "openai")
MISSING = [m for m in NEEDED if importlib.util.find_spec(m) is None]
httpx: Any = None if MISSING else importlib.import_module("httpx")
openai: Any = None if MISSING else importlib.import_module("openai")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(MISSING), reason=f"needs {', '.join(MISSING)}: the serve extra and torch (the dev environment)"
    ),
    # the official client marks its video API deprecated; the server still speaks it
    pytest.mark.filterwarnings("ignore::DeprecationWarning:openai"),
    pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning"),
]


@pytest.mark.parametrize(
    ("body", "status", "mention", "param"),
    [
        pytest.param({"prompt": "x", "size": "65x64"}, 400, "multiple of 16", "size", id="size-not-a-multiple"),
        pytest.param({"prompt": "x", "size": "big"}, 400, "size", "size", id="size-not-wxh"),
        pytest.param({"prompt": "   "}, 400, "blank", "prompt", id="prompt-blank"),
        pytest.param({}, 400, "prompt: Field required", "prompt", id="prompt-missing"),
        pytest.param({"prompt": "x", "quality": "hd"}, 400, "unknown field 'quality' (accepted: model, n, size",
                     "quality", id="unknown-field"),
        pytest.param({"prompt": "x", "n": 5}, 400, "--max-images", "n", id="n-over-limit"),
        pytest.param({"prompt": "x", "seed": -1}, 400, "seed", "seed", id="seed-negative"),
        pytest.param({"prompt": "x", "size": "2048x2048"}, 400, "--max-pixels", "size", id="size-over-limit"),
        pytest.param({"prompt": "x", "num_inference_steps": 1000}, 400, "--max-steps", "num_inference_steps",
                     id="steps-over-limit"),
        pytest.param({"prompt": "x", "extra": {"nope": 1}}, 400, "unknown model option", None,
                     id="unknown-model-option"),
        pytest.param({"prompt": "x", "response_format": "url"}, 400, "b64_json", "response_format",
                     id="url-format"),
        pytest.param({"prompt": "x", "model": "nope"}, 404, "'nope' is not served", "model", id="unknown-model"),
        pytest.param({"prompt": "x", "model": "tiny-voice"}, 404, "not an image model", "model",
                     id="speech-model-on-images"),
    ],
)  # fmt: skip
def test_bad_image_requests_are_4xx_naming_the_field(
    default_server: ServerProcess, body: dict, status: int, mention: str, param: str | None
) -> None:
    response = httpx.post(default_server.url + "/v1/images/generations", json=body, timeout=60)
    assert_error(response, status, mention, param=param)


def test_malformed_bodies_are_400_never_422(default_server: ServerProcess) -> None:
    url = default_server.url + "/v1/images/generations"
    for content in (b"{", b"[1, 2]", b"null", b"\xff\xfe"):
        response = httpx.post(url, content=content, headers={"content-type": "application/json"})
        assert_error(response, 400)
    assert_error(httpx.post(url, json={"prompt": 5}), 400, "prompt", param="prompt")
    assert_error(httpx.get(default_server.url + "/v1/nothing-here"), 404, "no route")
    assert_error(httpx.delete(default_server.url + "/v1/models"), 405)


def test_oversized_body_and_text_are_413(default_server: ServerProcess) -> None:
    huge = {"prompt": "x" * (17 * 1024 * 1024)}
    assert_error(httpx.post(default_server.url + "/v1/images/generations", json=huge, timeout=60), 413, "--max-body-mb")
    long_text = {"model": "tiny-voice", "input": "word " * 1000, "voice": "default"}
    assert_error(
        httpx.post(default_server.url + "/v1/audio/speech", json=long_text), 413, "--max-input-chars", param="input"
    )


def test_speech_voice_rules(default_server: ServerProcess) -> None:
    url = default_server.url + "/v1/audio/speech"
    assert_error(
        httpx.post(url, json={"model": "tiny-voice", "input": "Hi", "voice": "alloy"}), 400, '"default"', param="voice"
    )
    assert_error(
        httpx.post(url, json={"model": "tiny-voice", "input": "Hi", "response_format": "opus"}),
        400,
        "response_format",
        param="response_format",
    )
    assert_error(httpx.post(url, json={"model": "tiny-voice", "input": "  "}), 400, "empty")


# -- faults ----------------------------------------------------------------------------------------


def test_a_generation_that_raises_is_a_500_with_the_request_id_and_the_server_goes_on(
    fault_server: ServerProcess,
) -> None:
    url = fault_server.url + "/v1/images/generations"
    failed = httpx.post(url, json={"model": "faulty", "prompt": "please explode", "seed": 1})
    error = assert_error(failed, 500, failed.headers["x-request-id"])
    assert "exploded" not in error["message"], "the cause stays in the server log"
    assert "exploded" in fault_server.stderr
    assert "Traceback" not in fault_server.stderr, "tracebacks only with OMNI_DEBUG=1"
    after = httpx.post(url, json={"model": "faulty", "prompt": "a calm cat", "seed": 1})
    assert after.status_code == 200
    assert httpx.get(fault_server.url + "/health").status_code == 200


def test_a_hanging_generation_is_cancelled_at_the_deadline(fault_server: ServerProcess) -> None:
    url = fault_server.url + "/v1/images/generations"
    started = time.monotonic()
    hung = httpx.post(url, json={"model": "faulty", "prompt": "hang", "seed": 1}, timeout=60)
    assert_error(hung, 504, "--request-timeout")
    assert time.monotonic() - started < 30
    # the hung job saw its cancellation at its next step, so the model is free again
    after = httpx.post(url, json={"model": "faulty", "prompt": "fine", "seed": 2}, timeout=60)
    assert after.status_code == 200, after.text


def test_a_full_queue_answers_429_with_retry_after(fault_server: ServerProcess) -> None:
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as http:
            body = {"model": "faulty", "prompt": "slow", "extra": {"step_seconds": 0.2}, "num_inference_steps": 4}
            return await asyncio.gather(
                *(http.post(fault_server.url + "/v1/images/generations", json={**body, "seed": i}) for i in range(8))
            )

    answers = asyncio.run(burst())
    codes = sorted(a.status_code for a in answers)
    assert 429 in codes and 200 in codes, codes
    assert set(codes) <= {200, 429}
    for refused in (a for a in answers if a.status_code == 429):
        assert int(refused.headers["retry-after"]) >= 1
        assert_error(refused, 429, "--queue-size")


def test_a_client_hanging_up_mid_stream_stops_synthesis(fault_server: ServerProcess) -> None:
    log = fault_server.chunk_log  # type: ignore[attr-defined]
    log.write_text("")
    with httpx.stream(
        "POST",
        fault_server.url + "/v1/audio/speech",
        json={
            "model": "faulty-voice",
            "input": "count slowly",
            "voice": "alto",
            "stream": True,
            "response_format": "pcm",
        },
        timeout=60,
    ) as response:
        assert response.status_code == 200
        next(response.iter_bytes())  # one chunk, then hang up
    time.sleep(2.5)  # ten chunks would take 2 s more
    made = log.read_text().splitlines()
    assert 1 <= len(made) < 10, made
    # and the model serves the next request
    ok = httpx.post(
        fault_server.url + "/v1/audio/speech", json={"model": "faulty-voice", "input": "again", "voice": "bass"}
    )
    assert ok.status_code == 200


def test_a_stream_whose_client_hangs_up_while_queued_never_runs(fault_server: ServerProcess) -> None:
    log = fault_server.chunk_log  # type: ignore[attr-defined]
    url = fault_server.url + "/v1/audio/speech"
    body = {"model": "faulty-voice", "input": "count slowly", "voice": "alto", "stream": True, "response_format": "pcm"}

    async def scenario() -> int:
        async with httpx.AsyncClient(timeout=60) as http:
            first = asyncio.ensure_future(http.post(url, json=body))
            await asyncio.sleep(0.3)
            queued = asyncio.ensure_future(http.post(url, json=body))
            await asyncio.sleep(0.3)
            queued.cancel()  # hangs up before its stream started
            return (await first).status_code

    log.write_text("")
    assert asyncio.run(scenario()) == 200
    time.sleep(1.0)
    assert len(log.read_text().splitlines()) == 10, "only the first stream made its ten chunks"


def test_a_client_hanging_up_while_queued_frees_its_place(fault_server: ServerProcess) -> None:
    url = fault_server.url + "/v1/images/generations"
    slow = {"model": "faulty", "prompt": "slow", "extra": {"step_seconds": 0.5}, "num_inference_steps": 4}

    async def scenario() -> tuple[int, int]:
        async with httpx.AsyncClient(timeout=60) as http:
            first = asyncio.ensure_future(http.post(url, json={**slow, "seed": 1}))
            await asyncio.sleep(0.3)
            queued = asyncio.ensure_future(http.post(url, json={**slow, "seed": 2, "prompt": "queued then gone"}))
            await asyncio.sleep(0.3)
            queued.cancel()  # hangs up while waiting behind the first
            done = await first
            again = await http.post(url, json={"model": "faulty", "prompt": "next", "seed": 3})
            return done.status_code, again.status_code

    assert asyncio.run(scenario()) == (200, 200)
    time.sleep(0.3)
    entries = fault_server.access_log()
    gone = [e for e in entries if e.get("status") == 499]
    assert gone, "the hang-up is logged as 499"
    assert all(e["run_ms"] == 0 for e in gone), "the abandoned request never ran"


def test_video_json_body_and_bad_video_requests(fault_server: ServerProcess) -> None:
    url = fault_server.url + "/v1/videos"
    created = httpx.post(
        url, json={"model": "tiny-video", "prompt": "x", "size": "64x64", "seconds": 0.2, "num_inference_steps": 1}
    )
    assert created.status_code == 200, created.text
    assert created.json()["seconds"] in ("0.3125", "0.3", "0.5625") or float(created.json()["seconds"]) > 0
    assert_error(httpx.post(url, json={"model": "tiny-video", "prompt": "x", "num_frames": 6}), 400, "num_frames")
    assert_error(httpx.post(url, json={"model": "faulty", "prompt": "x"}), 404, "not a video model")
    assert_error(httpx.post(url, data={"model": "tiny-video", "prompt": "x", "extra": "{bad"}), 400, "extra")
    assert_error(httpx.get(url + "/video_nope"), 404, "no video job")
    assert_error(httpx.get(url + "/video_nope/content"), 404)


# -- auth, start-up, shutdown ------------------------------------------------------------------------


def test_api_key_is_required_when_set(tmp_path: Path, serve_cache: Path) -> None:
    server = start_server(["--api-key", "s3cret"], home=tmp_path, cache=serve_cache)
    try:
        url = server.url + "/v1/models"
        assert_error(httpx.get(url), 401, "no API key was sent")
        wrong = httpx.get(url, headers={"Authorization": "Bearer nope"})
        assert_error(wrong, 401, "wrong")
        assert wrong.headers["www-authenticate"] == "Bearer"
        assert httpx.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(server.url + "/health").status_code == 200, "probes need no key"
        with pytest.raises(openai.AuthenticationError):
            client(server, "nope").models.list()
        assert [m.id for m in client(server, "s3cret").models.list().data] == ["tiny-image", "joe"]
    finally:
        server.kill()


def test_a_taken_port_is_a_clear_error(tmp_path: Path, serve_cache: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = subprocess.run(
            [str(OMNI), "serve", "--port", str(port)],
            env=server_env(tmp_path, serve_cache),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr and "--port" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_a_model_directory_nothing_serves_fails_before_listening(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = subprocess.run(
        [str(OMNI), "serve", "--port", str(free_port()), "--model", f"x={tmp_path / 'empty'}"],
        env=server_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "model 'x'" in result.stderr and "listening" not in result.stdout
    assert "Traceback" not in result.stderr


def test_an_engine_fault_takes_that_model_out_of_service_and_health_says_so(
    tmp_path: Path, fault_site: Path, fault_models: dict[str, Path]
) -> None:
    args = ["--model", f"breaks={fault_models['image']}", "--model", f"voice={fault_models['voice']}"]
    server = start_server(args, home=tmp_path, env=server_env(tmp_path, sites=(fault_site,)))
    try:
        url = server.url
        broke = httpx.post(
            url + "/v1/images/generations", json={"model": "breaks", "prompt": "x", "extra": {"behaviour": "break"}}
        )
        assert_error(broke, 503, "device is lost")
        health = httpx.get(url + "/health")
        assert health.status_code == 503
        assert health.json()["status"] == "failed" and health.json()["models"] == {"breaks": "failed", "voice": "ready"}
        assert "breaks" in health.json()["detail"]
        assert_error(
            httpx.post(url + "/v1/images/generations", json={"model": "breaks", "prompt": "x"}), 503, "out of service"
        )
        spoken = httpx.post(url + "/v1/audio/speech", json={"model": "voice", "input": "still here"})
        assert spoken.status_code == 200, "the other model keeps serving"
        cards = {m["id"]: m["status"] for m in httpx.get(url + "/v1/models").json()["data"]}
        assert cards == {"breaks": "failed", "voice": "ready"}
    finally:
        server.kill()
