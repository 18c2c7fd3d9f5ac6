"""``omni serve`` against its own OpenAPI schema: every operation the schema lists is fuzzed with
schema-valid and schema-invalid requests (the schema's coverage cases, random cases, and
stateful chains that reuse the video job ids the server hands out), and every answer must be a
documented status, of a documented content type, in the documented shape. Bad input is a
documented 4xx: never a 5xx, never the framework's raw 422, never its internals.

One real server process with tight limits, so that the requests the fuzzer makes valid stay a
few pixels, steps, frames and characters big. It serves a tiny image model, voice and video
model (the embedded defaults have no video model, and without one the video job routes could
only ever answer 404).

The fuzzing runs on schemathesis' engine (what ``schemathesis run`` drives) rather than its
pytest integration, whose fixture-loaded schemas need pytest internals this pytest no longer has.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server's tests need the serve extra (pip install 'omni-core[serve]')")
pytest.importorskip("torch", reason="the server's tests run tiny models, which need torch")
schemathesis = pytest.importorskip("schemathesis", reason="the fuzz test needs schemathesis (requirements-dev.txt)")
httpx = pytest.importorskip("httpx")

from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.core.result import Ok  # noqa: E402
from schemathesis.engine import events  # noqa: E402
from schemathesis.engine import from_schema as engine_for  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from serving import OMNI, ServerProcess, server_env, start_server  # noqa: E402

pytestmark = pytest.mark.slow

LIMITS = [
    "--max-pixels", "4096",
    "--max-steps", "2",
    "--max-images", "2",
    "--max-input-chars", "200",
    "--max-frames", "9",
    "--request-timeout", "30",
]  # fmt: skip

#: random cases per operation (the coverage phase adds its own, a hundred or so for a body);
#: OMNI_FUZZ_EXAMPLES=500 searches longer
MAX_EXAMPLES = int(os.environ.get("OMNI_FUZZ_EXAMPLES", "60"))

CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    # schema-invalid data must be refused with a 4xx, never served
    "negative_data_rejection",
    # a method the path does not take is a 405 whose Allow lists exactly the documented ones
    "unsupported_method",
    "allow_header_conformance",
    # stateful: a created video job is there to GET; a deleted one is gone
    "ensure_resource_availability",
    "use_after_free",
    # ignored_auth and missing_required_header: this server runs without --api-key and no
    # operation declares a security scheme or a required header, so they have nothing to test
    # positive_data_acceptance is left out on purpose: a schema cannot carry each model's own
    # rules (sizes a multiple of 16, a voice list) or this server's --max-* limits, so a
    # schema-valid request may rightly be a 400 that names the rule it breaks
]

#: what a crash or the framework's own validation answer would leak; none of it may reach a client
LEAKS = ("pydantic", "errors.pydantic.dev", "Traceback", 'File "')

MODELS = {"tiny-image": "flux1-schnell", "tiny-voice": "vits", "tiny-video": "wan2.1-t2v"}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("fuzz-models")
    makers = [
        subprocess.Popen(
            [str(OMNI), "models", "make-tiny", family, str(root / name)],
            env=server_env(root),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, family in MODELS.items()
    ]  # side by side: each is mostly the interpreter starting
    for maker in makers:
        output, _ = maker.communicate(timeout=600)
        assert maker.returncode == 0, output
    models = [arg for name in MODELS for arg in ("--model", f"{name}={root / name}")]
    proc = start_server([*models, *LIMITS], home=tmp_path_factory.mktemp("fuzz-home"))
    yield proc
    proc.kill()


def load_schema(server: ServerProcess, **generation: Any) -> Any:
    # an explicit config: no schemathesis.toml of the machine or the checkout applies
    config = schemathesis.Config.from_dict(
        {
            "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
            # nothing written into the checkout: no .hypothesis/ example database, no .schemathesis/ cache
            "generation": {"mode": "all", "database": "none", **generation},
            "cache": {"enabled": False},
            "request-timeout": 60,
        }
    )
    return schemathesis.openapi.from_url(server.url + "/openapi.json", config=config)


def leaks(text: str) -> list[str]:
    """The internals an answer shows: the leak words, or the framework's raw validation error."""
    found = [word for word in LEAKS if word in text]
    try:
        body = json.loads(text)
    except ValueError:
        return found
    # the framework's own errors are {"detail": ...} alone (the raw 422: {"detail": [{"loc": [...],
    # "msg": ...}]}); a substring test for loc would trip on words like "block", so the JSON key is
    # what is looked for
    if isinstance(body, dict) and set(body) == {"detail"}:
        found.append("a bare 'detail' body (the framework's error shape)")
    if '"loc":' in json.dumps(body):
        found.append('a "loc" key (a raw validation error)')
    return found


def problems_in(status: int, content_type: str, text: str) -> list[str]:
    found = []
    if status == 422:
        found.append("a raw 422 (this server answers 400 in its own error shape)")
    if status >= 500:
        found.append(f"a server error ({status})")
    if content_type.startswith(("application/json", "text/")):
        found += [f"leaks {leak}" for leak in leaks(text)]
    return found


def test_every_operation_answers_as_its_schema_says(fuzz_server: ServerProcess) -> None:
    schema = load_schema(fuzz_server, **{"max-examples": MAX_EXAMPLES})
    # an operation the schema holds but schemathesis cannot load is a NonFatalError below
    operations = {result.ok().label for result in schema.get_all_operations() if isinstance(result, Ok)}
    failures: list[str] = []
    tested: set[str] = set()
    answers = 0
    logged, stderr = len(fuzz_server.access_log()), len(fuzz_server.stderr)
    started = time.monotonic()
    for event in engine_for(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            for case_id, interaction in recorder.interactions.items():
                response = interaction.response
                if response is None:
                    continue
                answers += 1
                node = recorder.cases.get(case_id)
                if node is not None:
                    tested.add(node.value.operation.label)
                content_type = (response.headers.get("content-type") or [""])[0]
                text = response.content.decode("utf-8", "replace")
                for problem in problems_in(response.status_code, content_type, text):
                    request = interaction.request
                    failures.append(f"{request.method} {request.uri}: {problem}\n    {text[:500]}")
            for checks in recorder.checks.values():
                for check in checks:
                    if check.failure_info is not None:
                        failure = check.failure_info.failure
                        failures.append(
                            f"{recorder.label} [{event.phase.value}] {check.name}: {failure.title}\n"
                            f"    {failure.message[:800]}\n    {check.failure_info.code_sample}"
                        )
        elif isinstance(event, events.NonFatalError):
            failures.append(f"{event.label}: the fuzzer could not run it: {event.info.format()}")
        elif isinstance(event, events.FatalError):
            raise AssertionError(f"the fuzzer stopped: {event.exception!r}")
    elapsed = time.monotonic() - started
    unique = list(dict.fromkeys(failures))
    assert not unique, f"{len(unique)} problem(s) in {answers} answers:\n\n" + "\n\n".join(unique[:25])
    assert tested == operations, f"never tested: {sorted(operations - tested)}"
    assert answers > 20 * len(operations), (answers, elapsed)
    # the server's own log agrees: no request of the run, whoever sent it, was a 422 or a 5xx
    bad = [e for e in fuzz_server.access_log()[logged:] if str(e["status"]) == "422" or str(e["status"])[0] == "5"]
    assert not bad, f"answers that were a raw 422 or a server error: {bad[:10]}"
    assert "Traceback" not in fuzz_server.stderr[stderr:], fuzz_server.stderr[-4000:]


def test_the_success_answers_match_the_schema_too(fuzz_server: ServerProcess) -> None:
    """Random data seldom fits the models' rules and these limits, so each route's success
    answers (every audio format, streams, a finished video job) are asked for by name and
    checked by the same checks."""
    schema = load_schema(fuzz_server)
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

    def call(path: str, method: str, expect: int = 200, **case: Any) -> Any:
        response = schema[path][method].Case(**case).call_and_validate(checks=checks, timeout=60)
        assert response.status_code == expect, (path, case, response.content[:500])
        return response

    for path in ("/health", "/metrics", "/v1/models", "/v1/videos"):
        call(path, "GET")
    image = {"model": "tiny-image", "prompt": "a red fox", "size": "32x32", "n": 2, "num_inference_steps": 1}
    assert len(call("/v1/images/generations", "POST", body=image).json()["data"]) == 2
    speech = {"model": "tiny-voice", "input": "Hello there.", "voice": "default", "seed": 1}
    for fmt in ("wav", "pcm", "flac", "mp3"):
        call("/v1/audio/speech", "POST", body={**speech, "response_format": fmt})
    call("/v1/audio/speech", "POST", body={**speech, "stream": True})
    sse = call("/v1/audio/speech", "POST", body={**speech, "stream_format": "sse"})
    assert b"speech.audio.done" in sse.content

    video = {"model": "tiny-video", "prompt": "waves", "size": "32x32", "num_frames": 5, "num_inference_steps": 1}
    form = {k: str(v) for k, v in video.items()}
    as_form = call("/v1/videos", "POST", body=form, media_type="multipart/form-data").json()
    job = call("/v1/videos", "POST", body=video, media_type="application/json").json()
    path = {"video_id": job["id"]}
    deadline = time.monotonic() + 120
    while job["status"] in ("queued", "in_progress") and time.monotonic() < deadline:
        # before it is done the content is a 400 that says so, in the documented shape
        call("/v1/videos/{video_id}/content", "GET", expect=400, path_parameters=path)
        time.sleep(0.5)
        job = call("/v1/videos/{video_id}", "GET", path_parameters=path).json()
    assert job["status"] == "completed", job
    assert call("/v1/videos/{video_id}/content", "GET", path_parameters=path).content[4:8] == b"ftyp"
    for done in (job, as_form):
        call("/v1/videos/{video_id}", "DELETE", path_parameters={"video_id": done["id"]})
        call("/v1/videos/{video_id}", "GET", expect=404, path_parameters={"video_id": done["id"]})


JSON = {"content-type": "application/json"}


def test_requests_that_make_a_stock_app_answer_422_are_400s_here(fuzz_server: ServerProcess) -> None:
    url = fuzz_server.url
    requests = [
        ("POST", "/v1/images/generations", {"content": b"prompt=x", "headers": {"content-type": "text/plain"}}),
        ("POST", "/v1/images/generations", {"json": {"prompt": ["x"], "n": "many"}}),
        ("POST", "/v1/audio/speech", {"json": {"input": {"text": "hi"}, "speed": "fast"}}),
        ("POST", "/v1/audio/speech", {}),
        ("POST", "/v1/videos", {"data": {"model": "tiny-video", "prompt": "x", "seconds": "soon"}}),
        ("POST", "/v1/videos", {"files": {"extra": ("x.json", b"{", "application/json")}}),
        ("POST", "/v1/videos", {"content": b"\x00\xff", "headers": {"content-type": "multipart/form-data"}}),
        # NaN and Infinity are no JSON, but Python's parser reads them: never a number to run with
        ("POST", "/v1/videos", {"content": b'{"prompt": "x", "guidance_scale": NaN}', "headers": JSON}),
        ("POST", "/v1/images/generations", {"content": b'{"prompt": "x", "seed": 1, "n": Infinity}', "headers": JSON}),
        ("POST", "/v1/audio/speech", {"data": {"input": "hi"}}),
        # a JSON body's values are the schema's types: no true for a seed, no "yes" for a flag
        ("POST", "/v1/images/generations", {"json": {"prompt": "x", "size": "32x32", "seed": True}}),
        ("POST", "/v1/audio/speech", {"json": {"input": "hi", "stream": "yes"}}),
        ("POST", "/v1/videos", {"json": {"model": "tiny-video", "prompt": "x", "num_frames": "5"}}),
    ]
    for method, path, kwargs in requests:
        response = httpx.request(method, url + path, timeout=60, **kwargs)
        assert response.status_code == 400, (method, path, response.status_code, response.text)
        assert set(response.json()) == {"error"}, response.text
        assert not problems_in(response.status_code, response.headers["content-type"], response.text), response.text


def test_mp3_at_a_rate_mpeg_cannot_carry_is_a_400(fuzz_server: ServerProcess) -> None:
    body = {"model": "tiny-voice", "input": "hi", "response_format": "mp3", "sample_rate": 192000}
    response = httpx.post(fuzz_server.url + "/v1/audio/speech", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert "sample_rate" in response.json()["error"]["message"]
