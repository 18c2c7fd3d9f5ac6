"""The playground (``GET /`` of ``omni serve``) in a real browser against a real server.

Chromium is the system's (``/usr/bin/chromium``, apt), driven by playwright; playwright's own
browser download is never used. CI installs both (``scripts/bootstrap.sh``), so there the test
fails rather than skips when either is missing; a developer without chromium gets a skip.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi", reason="the server's tests need the serve extra (pip install 'omni-core[serve]')")
pytest.importorskip("torch", reason="the server's tests run tiny models, which need torch")

from serving import OMNI, ServerProcess, server_env, start_server

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.slow

CHROMIUM = Path(os.environ.get("OMNI_TEST_CHROMIUM", "/usr/bin/chromium"))
API_KEY = "playground-secret"
#: generous: the first request of a model on a slow CI machine
SLOW_MS = 120_000


# -- server and browser ----------------------------------------------------------------------------


def _make_tiny(family: str, directory: Path, home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(OMNI), "models", "make-tiny", family, str(directory)],
        env=server_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``--model`` arguments: a tiny image model, voice and video model (made side by side)."""
    root = tmp_path_factory.mktemp("playground-models")
    wanted = {"tiny-image": "flux1-schnell", "tiny-voice": "vits", "tiny-video": "wan2.1-t2v"}
    procs = {name: _make_tiny(family, root / name, root) for name, family in wanted.items()}
    args: list[str] = []
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"make-tiny {wanted[name]} failed:\n{err}"
        args += ["--model", f"{name}={root / name}"]
    return args


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, models: list[str]) -> Iterator[ServerProcess]:
    proc = start_server(models, home=tmp_path_factory.mktemp("playground-home"))
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        message = f"chromium is not installed at {CHROMIUM} (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must run the browser test: scripts/bootstrap.sh installs it")
        pytest.skip(message)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -r requirements-dev.txt")
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        yield launched
        launched.close()


@dataclass
class Sent:
    method: str
    url: str
    headers: dict[str, str]
    body: str | None

    @property
    def path(self) -> str:
        return urlsplit(self.url).path


@dataclass
class Session:
    """An open playground page and what it did: every request, console error and uncaught error."""

    page: Page
    origin: str
    requests: list[Sent] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)

    def foreign_requests(self) -> list[str]:
        """Requests that left the server's origin (data: and blob: URLs are the page's own)."""
        return [
            r.url
            for r in self.requests
            if urlsplit(r.url).scheme not in ("data", "blob") and _origin(r.url) != self.origin
        ]

    def posted(self, path: str) -> list[dict[str, Any]]:
        """The JSON bodies the page POSTed to ``path``."""
        return [json.loads(r.body or "null") for r in self.requests if r.method == "POST" and r.path == path]


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@contextmanager
def _open(browser: Browser, server: ServerProcess) -> Iterator[Session]:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(SLOW_MS)
        session = Session(page, _origin(server.url))
        page.on("request", lambda r: session.requests.append(Sent(r.method, r.url, r.headers, r.post_data)))
        page.on("console", lambda msg: session.console_errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: session.console_errors.append(f"uncaught: {exc}"))
        page.goto(server.url + "/")
        yield session
    finally:
        context.close()


@pytest.fixture
def session(browser: Browser, server: ServerProcess) -> Iterator[Session]:
    with _open(browser, server) as opened:
        yield opened


def _models_loaded(page: Page) -> None:
    page.wait_for_function("document.querySelectorAll('#video-model option[value]:not([value=\"\"])').length > 0")


def _metadata(page: Page, selector: str) -> dict[str, float]:
    """Duration (and video size) of a media element once the browser has read its metadata:
    proof that what the page was given is audio or video the browser can play."""
    return page.eval_on_selector(
        selector,
        """media => new Promise((resolve, reject) => {
               const facts = () => resolve({duration: media.duration, width: media.videoWidth || 0,
                                            height: media.videoHeight || 0});
               if (media.readyState >= 1) return facts();
               media.addEventListener('loadedmetadata', facts, {once: true});
               media.addEventListener('error', () => reject(new Error('media error ' + media.error.code)),
                                      {once: true});
           })""",
    )


def _pixels(b64_png: str) -> bytes:
    """The pixels of a PNG (its text chunks carry timings, which differ from run to run)."""
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(b64_png))) as image:
        return image.convert("RGB").tobytes()


def _api(session: Session, path: str, body: dict[str, Any], key: str | None = None) -> Any:
    """The same request, straight to the server (not through the page)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return session.page.request.post(session.origin + path, data=body, headers=headers)


# -- the page --------------------------------------------------------------------------------------


def test_page_loads_offline_without_errors(session: Session) -> None:
    page = session.page
    _models_loaded(page)
    assert page.title() == "omni playground"
    # each tab offers the models of its task, as /v1/models names them
    options = {
        tab: page.eval_on_selector_all(f"#{tab}-model option", "els => els.map(e => e.value)")
        for tab in ("image", "speech", "video")
    }
    assert options == {"image": ["tiny-image"], "speech": ["tiny-voice"], "video": ["tiny-video"]}
    assert page.eval_on_selector_all("#speech-voice option", "els => els.map(e => e.value)") == ["default"]
    # tabs by keyboard: arrow keys move between them and show their panel
    page.focus("#tab-image")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.id") == "tab-speech"
    assert page.is_visible("#speech-text") and not page.is_visible("#image-prompt")
    page.keyboard.press("ArrowRight")
    assert page.get_attribute("#tab-video", "aria-selected") == "true"
    assert page.is_visible("#video-prompt")
    # every control has a label
    unlabelled = page.evaluate(
        """() => [...document.querySelectorAll('input, select, textarea')]
                 .filter(e => !e.labels || e.labels.length === 0).map(e => e.id)"""
    )
    assert unlabelled == []
    assert session.console_errors == []
    assert session.foreign_requests() == []
    assert [r.path for r in session.requests] == ["/", "/v1/models"]


def test_image_generation_shows_the_image_and_its_seed(session: Session) -> None:
    page = session.page
    _models_loaded(page)
    page.fill("#image-prompt", "a red square")
    page.fill("#image-seed", "3")
    page.fill("#image-size", "64x64")
    page.click("#image-generate")
    page.wait_for_function("document.getElementById('image-result').naturalWidth > 0")
    size = page.evaluate(
        "(() => { const i = document.getElementById('image-result'); return [i.naturalWidth, i.naturalHeight] })()"
    )
    assert size == [64, 64]
    src = page.get_attribute("#image-result", "src")
    assert src is not None and src.startswith("data:image/png;base64,")
    assert page.text_content("#image-seed-result") == "3"
    # the page sent what the user typed, and nothing it did not (steps left to the model)
    assert session.posted("/v1/images/generations") == [
        {
            "model": "tiny-image",
            "prompt": "a red square",
            "n": 1,
            "response_format": "b64_json",
            "size": "64x64",
            "seed": 3,
        }
    ]
    # the same request straight to the server gives the same pixels: the page shows the server's image
    direct = _api(session, "/v1/images/generations", session.posted("/v1/images/generations")[0])
    assert direct.ok, direct.text()
    assert _pixels(src.split(",", 1)[1]) == _pixels(direct.json()["data"][0]["b64_json"])
    assert page.is_hidden("#image-error")
    assert session.console_errors == []
    assert session.foreign_requests() == []


def test_speech_plays_a_blob_of_audio(session: Session) -> None:
    page = session.page
    _models_loaded(page)
    page.click("#tab-speech")
    page.fill("#speech-text", "Hello from the playground.")
    page.click("#speech-go")
    page.wait_for_function("document.getElementById('speech-result').src.startsWith('blob:')")
    duration = _metadata(page, "#speech-result")["duration"]
    assert duration > 0
    assert session.posted("/v1/audio/speech") == [
        {"model": "tiny-voice", "input": "Hello from the playground.", "voice": "default", "response_format": "wav"}
    ]
    assert page.is_hidden("#speech-error")
    assert session.console_errors == []
    assert session.foreign_requests() == []


def test_video_job_is_polled_until_completed_and_shown(session: Session) -> None:
    page = session.page
    _models_loaded(page)
    page.click("#tab-video")
    page.fill("#video-prompt", "a cat")
    page.fill("#video-seed", "1")
    page.fill("#video-frames", "5")
    page.fill("#video-size", "64x64")
    page.fill("#video-steps", "2")
    page.click("#video-start")
    page.wait_for_function("document.getElementById('video-status').textContent.includes('completed')")
    page.wait_for_function("document.getElementById('video-result').src.startsWith('blob:')")
    # the system chromium plays H.264: the blob is the server's MP4
    video = _metadata(page, "#video-result")
    assert (video["width"], video["height"]) == (64, 64) and video["duration"] > 0
    (body,) = session.posted("/v1/videos")
    assert body == {
        "model": "tiny-video",
        "prompt": "a cat",
        "size": "64x64",
        "seed": 1,
        "num_frames": 5,
        "num_inference_steps": 2,
    }
    # the page's own blob: URLs aside, its GETs to the server
    paths = [r.path for r in session.requests if r.method == "GET" and r.url.startswith(session.origin)]
    job_polls = [p for p in paths if p.startswith("/v1/videos/video") and not p.endswith("/content")]
    assert job_polls, paths
    assert paths[-1] == job_polls[0] + "/content"
    assert page.is_hidden("#video-error")
    assert session.console_errors == []
    assert session.foreign_requests() == []


def test_an_error_shows_the_servers_message(session: Session) -> None:
    page = session.page
    _models_loaded(page)
    page.fill("#image-prompt", "a red square")
    page.fill("#image-size", "65x65")
    page.click("#image-generate")
    alert = page.locator("#panel-image .error[role=alert]")
    alert.wait_for(state="visible")
    direct = _api(session, "/v1/images/generations", session.posted("/v1/images/generations")[0])
    assert direct.status == 400
    message = direct.json()["error"]["message"]
    assert "65" in message
    assert alert.text_content() == message
    assert page.is_hidden("#image-figure")
    # the button is usable again: fixing the size clears the error
    page.fill("#image-size", "64x64")
    page.click("#image-generate")
    page.wait_for_function("document.getElementById('image-result').naturalWidth === 64")
    assert alert.is_hidden()


# -- an API key ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory, models: list[str]) -> Iterator[ServerProcess]:
    proc = start_server([*models, "--api-key", API_KEY], home=tmp_path_factory.mktemp("playground-keyed"))
    yield proc
    proc.kill()


def test_api_key_is_sent_on_every_request_and_remembered(browser: Browser, keyed_server: ServerProcess) -> None:
    with _open(browser, keyed_server) as session:
        page = session.page
        # without the key the server refuses the model list, and the page says so in its words
        page.locator("#models-error").wait_for(state="visible")
        refused = page.request.get(keyed_server.url + "/v1/models")
        assert refused.status == 401
        assert page.text_content("#models-error") == refused.json()["error"]["message"]
        page.fill("#api-key", API_KEY)
        page.press("#api-key", "Enter")
        _models_loaded(page)
        assert page.is_hidden("#models-error")
        page.fill("#image-prompt", "a key")
        page.fill("#image-size", "64x64")
        page.click("#image-generate")
        page.wait_for_function("document.getElementById('image-result').naturalWidth === 64")
        api_requests = [r for r in session.requests if r.path.startswith("/v1/")]
        assert api_requests[0].path == "/v1/models" and "authorization" not in api_requests[0].headers
        keyed = api_requests[1:]  # the first one went out before the key was typed
        assert {r.path for r in keyed} >= {"/v1/models", "/v1/images/generations"}
        assert all(r.headers.get("authorization") == f"Bearer {API_KEY}" for r in keyed), keyed
        # a new visit remembers the key
        page.reload()
        _models_loaded(page)
        assert page.input_value("#api-key") == API_KEY
        assert page.is_hidden("#models-error")
        assert session.foreign_requests() == []


# -- chat ------------------------------------------------------------------------------------------


def _chat_reference(model_dir: Path, messages: list[dict[str, str]], max_tokens: int, voice: str | None) -> Any:
    """The answer of the test pipeline's stage classes called in this process: its text, and its
    audio as the 16-bit PCM a chat stream sends."""
    import numpy as np
    from omni_fixture_pipeline.stages import reference

    from omni_core.speech.audio import Audio, encode

    want = reference(model_dir, messages, {"tokens": {"max_tokens": max_tokens}, "wave": {"voice": voice}})
    samples = np.concatenate([np.clip(np.asarray(a, dtype=np.float32), -1.0, 1.0) for a in want["audio"]])
    return "".join(want["text"]), encode(Audio(samples, 16000), "pcm")


def _chat_log(page: Page) -> list[list[str]]:
    return page.eval_on_selector_all("#chat-log li", "els => els.map(e => [e.className, e.lastChild.textContent])")


def _answered(page: Page, turns: int) -> None:
    page.wait_for_function(
        f"document.querySelectorAll('#chat-log li').length === {2 * turns} && "
        "document.getElementById('chat-status').textContent.startsWith('Answered')"
    )


def test_chat_streams_the_answer_speaks_it_and_keeps_the_conversation(
    browser: Browser, chat_server: ServerProcess, chat_model: Path
) -> None:
    """The chat tab against ``omni serve`` of the three-stage test pipeline: the streamed text
    and the spoken answer (a WAV the page builds from the stream's PCM chunks) are exactly what
    the stages make; a second turn sends the first one back; a new conversation forgets it."""
    from serving import CHAT_MODEL

    with _open(browser, chat_server) as session:
        page = session.page
        page.wait_for_function("document.querySelectorAll('#chat-model option[value]:not([value=\"\"])').length > 0")
        page.click("#tab-chat")
        assert page.eval_on_selector_all("#chat-model option", "els => els.map(e => e.value)") == [CHAT_MODEL]
        # the model speaks: its voices are offered, and speech can be asked for
        assert page.eval_on_selector_all("#chat-voice option", "els => els.map(e => e.value)") == ["high", "low"]
        assert page.is_enabled("#chat-speak") and not page.is_checked("#chat-speak")

        page.fill("#chat-system", "be brief")
        page.fill("#chat-text", "say something")
        page.fill("#chat-max-tokens", "5")
        page.check("#chat-speak")
        page.select_option("#chat-voice", "low")
        page.click("#chat-send")
        _answered(page, 1)
        page.wait_for_function("document.getElementById('chat-audio').src.startsWith('blob:')")
        first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say something"}]
        text, pcm = _chat_reference(chat_model, first, 5, "low")
        assert _chat_log(page) == [["user", "say something"], ["assistant", text]]
        wav_b64 = page.evaluate(
            """async () => {
                 const audio = await fetch(document.getElementById('chat-audio').src);
                 const bytes = new Uint8Array(await audio.arrayBuffer());
                 let s = ''; bytes.forEach((b) => { s += String.fromCharCode(b); }); return btoa(s);
               }"""
        )
        with wave.open(io.BytesIO(base64.b64decode(wav_b64))) as wav:
            assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (16000, 1, 2)
            assert wav.readframes(wav.getnframes()) == pcm
        assert _metadata(page, "#chat-audio")["duration"] > 0  # the browser plays it
        assert page.input_value("#chat-text") == ""

        # a second turn, text only: the first turn goes back to the model with it
        page.uncheck("#chat-speak")
        page.fill("#chat-text", "and again")
        page.click("#chat-send")
        _answered(page, 2)
        second = [*first, {"role": "assistant", "content": text}, {"role": "user", "content": "and again"}]
        again, _ = _chat_reference(chat_model, second, 5, None)
        assert _chat_log(page)[2:] == [["user", "and again"], ["assistant", again]]
        assert session.posted("/v1/chat/completions") == [
            {
                "model": CHAT_MODEL,
                "messages": first,
                "modalities": ["text", "audio"],
                "stream": True,
                "max_tokens": 5,
                "audio": {"voice": "low"},
            },
            {"model": CHAT_MODEL, "messages": second, "modalities": ["text"], "stream": True, "max_tokens": 5},
        ]

        page.click("#chat-new")
        assert _chat_log(page) == [] and page.is_hidden("#chat-audio")
        assert page.is_hidden("#chat-error")
        assert session.console_errors == []
        assert session.foreign_requests() == []
