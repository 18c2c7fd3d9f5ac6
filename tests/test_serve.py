"""``omni serve`` as its users meet it: a real server process on a loopback port, driven by the
official ``openai`` client and by plain HTTP (httpx), on tiny models omni makes locally.

The servers and checkpoints shared with the fault battery (tests/test_faults_serve.py) are
session fixtures of tests/conftest.py; the helpers are tests/serving.py's.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import signal
import socket
import time
import wave
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server's tests need the serve extra (pip install 'omni-core[serve]')")
pytest.importorskip("torch", reason="the server's tests run tiny models, which need torch")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
np = pytest.importorskip("numpy")

from serving import (  # noqa: E402
    ServerProcess,
    assert_error,
    client,
    launch,
    make_tiny,
    pixels,
    server_env,
    start_server,
)

pytestmark = [
    pytest.mark.slow,
    # the official client marks its video API deprecated; the server still speaks it
    pytest.mark.filterwarnings("ignore::DeprecationWarning:openai"),
    pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning"),
]


# -- the embedded defaults -------------------------------------------------------------------------


def test_start_prints_url_and_ready_line_and_lists_the_defaults(default_server: ServerProcess) -> None:
    assert f"listening on {default_server.url}" in default_server.stdout
    assert (
        "omni serve: tiny-voice is the fallback voice, as no real voice is installed: a tiny vits model with "
        "RANDOM WEIGHTS (it makes sound, not speech); pip install 'omni-plugin-piper[voice]'"
    ) in default_server.stdout
    assert "ready" in default_server.stdout and "tiny-image, tiny-voice" in default_server.stdout
    health = httpx.get(default_server.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ready"
    models = {m.id: m for m in client(default_server).models.list().data}
    assert set(models) == {"tiny-image", "tiny-voice"}
    assert models["tiny-image"].model_extra["task"] == "text-to-image"
    assert models["tiny-voice"].model_extra["endpoints"] == ["/v1/audio/speech"]


def test_with_a_real_voice_installed_omni_serve_serves_it_under_its_own_name(tmp_path: Path, serve_cache: Path) -> None:
    """The default voice `omni speak` uses (Piper's joe, installed with omni-plugin-piper[voice])
    is what `omni serve` serves without --model, under its name, answering to the voice name the
    official client sends, with the same samples as the offline API gives."""
    from omni_core import Omni

    server = start_server([], home=tmp_path, cache=serve_cache)
    try:
        assert "omni serve: joe is the default voice: Piper voice en_US-joe-medium" in server.stdout
        assert "ready" in server.stdout and "tiny-image, joe" in server.stdout
        models = {m.id: m for m in client(server).models.list().data}
        assert set(models) == {"tiny-image", "joe"}
        assert models["joe"].owned_by == "omni-plugin-piper"
        assert models["joe"].model_extra["voices"] == []  # one speaker: "default" is its voice
        text = "Hello there. This is the default voice."
        answer = client(server).audio.speech.create(model="joe", input=text, voice="default", response_format="pcm")
        assert answer.response.headers["x-omni-sample-rate"] == "22050"
    finally:
        server.kill()
    with Omni("joe") as offline:
        expected = offline.speak(text, response_format="pcm").data
    assert answer.content == expected and len(expected) > 22050 * 2  # over a second of 16-bit samples


def test_images_with_the_official_client_are_pngs_of_the_size_and_seed_asked(default_server: ServerProcess) -> None:
    answer = client(default_server).images.generate(
        model="tiny-image", prompt="a red fox", size="64x32", n=2, extra_body={"seed": 7, "num_inference_steps": 2}
    )
    assert len(answer.data) == 2
    first = pixels(answer.data[0].b64_json)
    assert first.shape == (32, 64, 3)
    assert answer.data[0].model_extra["seed"] == 7
    again = client(default_server).images.generate(
        model="tiny-image", prompt="a red fox", size="64x32", n=2, extra_body={"seed": 7, "num_inference_steps": 2}
    )
    assert np.array_equal(first, pixels(again.data[0].b64_json)), "the same seed must give the same pixels"
    other = client(default_server).images.generate(
        prompt="a red fox", size="64x32", extra_body={"seed": 8, "num_inference_steps": 2}
    )  # the only image model may be left unnamed
    assert not np.array_equal(first, pixels(other.data[0].b64_json))


def _wav(data: bytes) -> tuple[int, np.ndarray]:
    with wave.open(io.BytesIO(data)) as w:
        return w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def test_speech_in_every_format_with_the_official_client(default_server: ServerProcess) -> None:
    import soundfile

    c = client(default_server)
    wav = c.audio.speech.create(model="tiny-voice", input="Hello there.", voice="default", extra_body={"seed": 1})
    rate, samples = _wav(wav.content)
    assert rate > 0 and samples.size > 0
    assert wav.response.headers["content-type"] == "audio/wav"
    assert wav.response.headers["x-omni-seed"] == "1"
    pcm = c.audio.speech.create(
        model="tiny-voice", input="Hello there.", voice="default", response_format="pcm", extra_body={"seed": 1}
    )
    assert np.array_equal(np.frombuffer(pcm.content, dtype="<i2"), samples), "pcm is the wav's samples"
    for fmt in ("flac", "mp3"):
        encoded = c.audio.speech.create(
            model="tiny-voice", input="Hello there.", voice="default", response_format=fmt, extra_body={"seed": 1}
        )
        decoded, decoded_rate = soundfile.read(io.BytesIO(encoded.content))
        assert decoded_rate == rate and abs(len(decoded) - samples.size) < rate // 10, fmt


def test_streamed_speech_concatenates_to_the_whole_clip(default_server: ServerProcess) -> None:
    url = default_server.url + "/v1/audio/speech"
    text = "First sentence here. And a second one follows it."
    whole = httpx.post(url, json={"model": "tiny-voice", "input": text, "seed": 4, "response_format": "pcm"})
    assert whole.status_code == 200
    with httpx.stream(
        "POST", url, json={"model": "tiny-voice", "input": text, "seed": 4, "stream": True, "response_format": "pcm"}
    ) as streamed:
        assert streamed.status_code == 200 and streamed.headers.get("transfer-encoding") == "chunked"
        pieces = list(streamed.iter_bytes())
    assert b"".join(pieces) == whole.content

    events = []
    with httpx.stream(
        "POST", url, json={"model": "tiny-voice", "input": text, "seed": 4, "stream_format": "sse"}
    ) as sse:
        assert sse.headers["content-type"].startswith("text/event-stream")
        for line in sse.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert audio == whole.content

    with httpx.stream(
        "POST", url, json={"model": "tiny-voice", "input": text, "seed": 4, "stream": True}
    ) as wav_stream:
        body = b"".join(wav_stream.iter_bytes())
    assert body[:4] == b"RIFF" and body[44:] == whole.content


def test_openapi_schema_has_no_422_and_the_shared_request_fields(default_server: ServerProcess) -> None:
    schema = httpx.get(default_server.url + "/openapi.json").json()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (method, path)
    image_body = schema["components"]["schemas"]["ImageGenerationBody"]["properties"]
    # the generation fields come from GenerationRequest itself: one schema, not two
    assert {"prompt", "negative_prompt", "num_inference_steps", "guidance_scale", "seed", "extra"} <= set(image_body)
    assert "multipart/form-data" in schema["paths"]["/v1/videos"]["post"]["requestBody"]["content"]


def test_metrics_count_requests_by_endpoint_and_never_by_request_id(default_server: ServerProcess) -> None:
    httpx.post(default_server.url + "/v1/images/generations", json={"prompt": "x", "size": "3x3"})
    text = httpx.get(default_server.url + "/metrics").text
    assert 'omni_requests_total{endpoint="/v1/images/generations",model="tiny-image",status="400"}' in text
    assert "omni_request_seconds_bucket" in text and 'omni_queue_depth{model="tiny-image"}' in text
    assert "omni_batch_size_bucket" in text
    assert "req_" not in text


def test_one_log_line_per_request(default_server: ServerProcess) -> None:
    response = httpx.post(
        default_server.url + "/v1/images/generations",
        json={"prompt": "log me", "size": "32x32", "num_inference_steps": 1},
    )
    request_id = response.headers["x-request-id"]
    time.sleep(0.2)
    lines = [e for e in default_server.access_log() if e.get("id") == request_id]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line["model"] == "tiny-image" and line["status"] == 200
    assert line["endpoint"] == "/v1/images/generations"
    assert line["run_ms"] > 0 and "queue_ms" in line
    assert "log me" not in default_server.stderr, "user text stays out of the log"


def test_videos_are_jobs_with_the_official_client(fault_server: ServerProcess) -> None:
    c = client(fault_server)
    job = c.videos.create(
        model="tiny-video", prompt="waves", size="64x64", extra_body={"num_frames": 5, "num_inference_steps": 2}
    )
    assert job.status in ("queued", "in_progress") and job.id.startswith("video_")
    deadline = time.monotonic() + 120
    while job.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.3)
        job = c.videos.retrieve(job.id)
    assert job.status == "completed", job
    assert job.progress == 100 and job.completed_at and job.expires_at
    content = c.videos.download_content(job.id).content
    assert content[4:8] == b"ftyp"
    assert job.id in [v.id for v in c.videos.list().data]
    assert c.videos.delete(job.id).deleted
    with pytest.raises(openai.NotFoundError):
        c.videos.retrieve(job.id)


def test_deleting_a_running_video_job_cancels_it(fault_server: ServerProcess) -> None:
    url = fault_server.url + "/v1/videos"
    job = httpx.post(
        url, json={"model": "tiny-video", "prompt": "x", "size": "64x64", "num_frames": 5, "num_inference_steps": 50}
    ).json()
    assert httpx.delete(f"{url}/{job['id']}").json() == {"id": job["id"], "object": "video.deleted", "deleted": True}
    assert_error(httpx.get(f"{url}/{job['id']}"), 404)
    # the worker is free soon: a small image request on another model is unaffected, and a new video runs
    quick = httpx.post(
        url, json={"model": "tiny-video", "prompt": "y", "size": "64x64", "num_frames": 5, "num_inference_steps": 1}
    ).json()
    deadline = time.monotonic() + 60
    status = quick["status"]
    while status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.3)
        status = httpx.get(f"{url}/{quick['id']}").json()["status"]
    assert status == "completed", httpx.get(f"{url}/{quick['id']}").json()


def test_health_answers_while_a_long_generation_runs(fault_server: ServerProcess) -> None:
    import threading

    url = fault_server.url
    body = {"model": "faulty", "prompt": "slow", "extra": {"step_seconds": 0.5}, "num_inference_steps": 4}
    worker = threading.Thread(target=lambda: httpx.post(url + "/v1/images/generations", json=body, timeout=60))
    worker.start()
    time.sleep(0.2)
    waits = []
    while worker.is_alive():
        started = time.perf_counter()
        assert httpx.get(url + "/health").status_code == 200
        waits.append(time.perf_counter() - started)
        time.sleep(0.02)
    assert len(waits) > 10
    # not a speed figure (benchmarks/serve.py measures it): health is never stuck behind the 2 s generation
    assert max(waits) < 1.0, max(waits)


def test_sigterm_drains_in_flight_work_then_exits_0(
    tmp_path: Path, fault_site: Path, fault_models: dict[str, Path]
) -> None:
    server = start_server(
        ["--model", f"faulty={fault_models['image']}"], home=tmp_path, env=server_env(tmp_path, sites=(fault_site,))
    )
    body = {"model": "faulty", "prompt": "slow", "extra": {"step_seconds": 0.5}, "num_inference_steps": 4, "seed": 5}
    results: list[httpx.Response] = []
    import threading

    worker = threading.Thread(
        target=lambda: results.append(httpx.post(server.url + "/v1/images/generations", json=body, timeout=60))
    )
    worker.start()
    time.sleep(0.5)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health", timeout=2)  # no longer accepting
    assert server.stop(timeout=60) == 0
    worker.join(30)
    assert results and results[0].status_code == 200, "the in-flight request finished"
    assert "stopped" in server.stdout


def test_batched_images_equal_unbatched_ones(tmp_path: Path, serve_cache: Path) -> None:
    """Four requests of one shape arriving together run as one pipeline call, and each image is
    what that request gets alone (within 1/255)."""
    shape = {"size": "64x64", "num_inference_steps": 2}
    prompts = [("a red fox", 11), ("a blue bird", 12), ("a green frog", 13), ("a grey cat", 14)]

    async def together(url: str) -> list[dict]:
        async with httpx.AsyncClient(timeout=120) as http:
            answers = await asyncio.gather(
                *(http.post(url + "/v1/images/generations", json={"prompt": p, "seed": s, **shape}) for p, s in prompts)
            )
        return [a.json() for a in answers]

    batched_server = start_server(
        ["--max-batch", "8", "--batch-wait-ms", "300"], home=tmp_path / "b", cache=serve_cache
    )
    try:
        batched = asyncio.run(together(batched_server.url))
        time.sleep(0.2)
        sizes = [e.get("batch") for e in batched_server.access_log() if e.get("status") == 200]
        metrics = httpx.get(batched_server.url + "/metrics").text
    finally:
        batched_server.kill()
    assert max(sizes) >= 2, sizes
    assert 'omni_batch_size_count{model="tiny-image"}' in metrics
    single_server = start_server(["--max-batch", "1"], home=tmp_path / "s", cache=serve_cache)
    try:
        alone = [
            httpx.post(
                single_server.url + "/v1/images/generations", json={"prompt": p, "seed": s, **shape}, timeout=120
            ).json()
            for p, s in prompts
        ]
    finally:
        single_server.kill()
    for (prompt, seed), b, a in zip(prompts, batched, alone, strict=True):
        assert b["data"][0]["seed"] == seed == a["data"][0]["seed"]
        diff = np.abs(pixels(b["data"][0]["b64_json"]).astype(int) - pixels(a["data"][0]["b64_json"]).astype(int))
        assert diff.max() <= 1, (prompt, diff.max())


def test_64_concurrent_clients_every_accepted_request_completes_once(tmp_path: Path, serve_cache: Path) -> None:
    server = start_server(["--queue-size", "48"], home=tmp_path, cache=serve_cache)

    async def crowd() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(timeout=300, limits=limits) as http:
            return await asyncio.gather(
                *(
                    http.post(
                        server.url + "/v1/images/generations",
                        json={"prompt": f"client {i}", "seed": 1000 + i, "size": "32x32", "num_inference_steps": 1},
                    )
                    for i in range(64)
                )
            )

    try:
        answers = asyncio.run(crowd())
        time.sleep(0.3)
        metrics = httpx.get(server.url + "/metrics").text
        log = server.access_log()
    finally:
        server.kill()
    accepted = [(i, a) for i, a in enumerate(answers) if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(accepted) + len(refused) == 64, sorted({a.status_code for a in answers})
    assert len(accepted) >= 48
    for i, answer in accepted:
        assert [d["seed"] for d in answer.json()["data"]] == [1000 + i], "each answer is its own request's"
    ok_lines = [e for e in log if e.get("endpoint") == "/v1/images/generations" and e.get("status") == 200]
    assert len(ok_lines) == len(accepted), "every accepted request was answered exactly once"
    assert len({e["id"] for e in ok_lines}) == len(ok_lines)
    line = f'omni_requests_total{{endpoint="/v1/images/generations",model="tiny-image",status="200"}} {len(accepted)}.0'
    assert line in metrics


def test_health_is_503_while_loading_then_200(tmp_path: Path, fault_site: Path, fault_models: dict[str, Path]) -> None:
    slow = tmp_path / "slow"
    shutil.copytree(fault_models["image"], slow)
    index = json.loads((slow / "model_index.json").read_text())
    (slow / "model_index.json").write_text(json.dumps({**index, "load_seconds": 3}))
    server = launch(["--model", f"slow={slow}"], home=tmp_path, env=server_env(tmp_path, sites=(fault_site,)))
    try:
        seen: list[tuple[int, str]] = []
        refused_while_loading = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not server.ready.is_set():
            try:
                response = httpx.get(server.url + "/health", timeout=2)
                seen.append((response.status_code, response.json()["status"]))
                if response.status_code == 503:
                    answer = httpx.post(server.url + "/v1/images/generations", json={"model": "slow", "prompt": "x"})
                    if answer.status_code == 503:
                        assert_error(answer, 503, "still loading")
                        assert answer.headers["retry-after"]
                        refused_while_loading += 1
                    else:  # the model finished loading between the two requests
                        assert answer.status_code == 200, answer.text
                        assert httpx.get(server.url + "/health").status_code == 200
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        assert server.ready.is_set()
        assert (503, "loading") in seen, seen
        assert refused_while_loading > 0, "requests to a model that is loading are refused with 503"
        assert httpx.get(server.url + "/health").json()["status"] == "ready"
    finally:
        server.kill()


def test_ctrl_c_drains_and_exits_130(tmp_path: Path, serve_cache: Path) -> None:
    server = start_server([], home=tmp_path, cache=serve_cache)
    assert server.stop(signal.SIGINT) == 130
    assert "stopped" in server.stdout
    assert "Traceback" not in server.stderr


def test_usage_headers_on_speech_from_an_autoregressive_model(tmp_path: Path) -> None:
    model = make_tiny("speecht5", tmp_path / "t5", tmp_path)
    server = start_server(["--model", f"t5={model}"], home=tmp_path / "home")
    try:
        spoken = httpx.post(server.url + "/v1/audio/speech", json={"model": "t5", "input": "Hello there.", "seed": 0})
        assert spoken.status_code == 200, spoken.text
        usage = {k: int(v) for k, v in spoken.headers.items() if k.startswith("x-omni-") and k.endswith("-tokens")}
        assert set(usage) == {
            "x-omni-input-tokens",
            "x-omni-output-tokens",
            "x-omni-total-tokens",
            "x-omni-input-text-tokens",
            "x-omni-input-audio-tokens",
        }
        assert usage["x-omni-input-text-tokens"] > 0 and usage["x-omni-output-tokens"] > 0
        assert usage["x-omni-total-tokens"] == usage["x-omni-input-tokens"] + usage["x-omni-output-tokens"]
    finally:
        server.kill()


def test_finished_video_jobs_are_kept_for_a_bounded_time_and_count(tmp_path: Path, video_model: Path) -> None:
    server = start_server(["--model", f"v={video_model}", "--max-jobs", "1", "--job-ttl", "4"], home=tmp_path)
    url = server.url + "/v1/videos"
    small = {"model": "v", "size": "64x64", "num_frames": 5, "num_inference_steps": 1}

    def finished(job_id: str) -> dict:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job = httpx.get(f"{url}/{job_id}").json()
            if job["status"] not in ("queued", "in_progress"):
                return job
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} did not finish")

    try:
        first = httpx.post(url, json={**small, "prompt": "one"}).json()
        assert finished(first["id"])["status"] == "completed"
        second = httpx.post(url, json={**small, "prompt": "two"}).json()
        assert finished(second["id"])["status"] == "completed"
        # one finished job is kept: the older one and its file are gone
        assert_error(httpx.get(f"{url}/{first['id']}"), 404, "no video job")
        assert httpx.get(f"{url}/{second['id']}/content").status_code == 200
        job = httpx.get(f"{url}/{second['id']}").json()
        assert job["expires_at"] - job["completed_at"] == 4
        time.sleep(5)
        assert_error(httpx.get(f"{url}/{second['id']}/content"), 404)
        assert httpx.get(url).json()["data"] == []
    finally:
        server.kill()


def test_the_listening_socket_lets_asyncio_turn_nagle_off() -> None:
    """asyncio sets TCP_NODELAY on accepted connections only when the listening socket was made
    with IPPROTO_TCP; without it every response's body waits for the client's delayed ACK."""
    from omni_core.server.runner import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_a_cache_backend_serves_and_a_request_may_ask_for_lossless(tmp_path: Path) -> None:
    """`omni serve --cache-backend teacache`: requests reuse steps unless one asks for
    `cache_quality: lossless`, which gives the pixels of the model without a cache."""
    from omni_core import Omni

    model = make_tiny("flux1-schnell", tmp_path / "flux", tmp_path)
    args = ["--model", f"img={model}", "--cache-backend", "teacache", "--cache-config", '{"rel_l1_thresh": 50}']
    server = start_server(args, home=tmp_path / "home")
    body = {"model": "img", "prompt": "a red fox", "size": "64x64", "seed": 3, "num_inference_steps": 20}
    try:
        cached = httpx.post(server.url + "/v1/images/generations", json=body, timeout=120)
        lossless = httpx.post(
            server.url + "/v1/images/generations", json={**body, "cache_quality": "lossless"}, timeout=120
        )
        bad = httpx.post(server.url + "/v1/images/generations", json={**body, "cache_quality": "best"}, timeout=120)
    finally:
        server.kill()
    assert cached.status_code == lossless.status_code == 200
    assert_error(bad, 400, "cache_quality", param="cache_quality")
    with Omni(model, progress=False) as offline:
        reference = offline.generate("a red fox", width=64, height=64, seed=3, num_inference_steps=20)
    want = reference.images[0].pixels
    assert np.array_equal(pixels(lossless.json()["data"][0]["b64_json"]), want)
    assert not np.array_equal(pixels(cached.json()["data"][0]["b64_json"]), want), "the cache reused steps"
