"""The server's fault fixture (``tests/fixtures/plugins/omni-fixture-serve-faults``) does what
the server tests rely on: it installs for real, makes its checkpoints through ``omni models
make-tiny``'s code, generates deterministic images and tones, refuses bad input as the real
families do, explodes and hangs on cue, stops at the next step once cancelled, batches by the
engine contract and logs every streamed chunk to ``OMNI_FIXTURE_SERVE_LOG``.

Everything runs in-process through the offline API, with the fixture pip-installed into a
site directory of this module's own and only it (and the platform) loaded; one row runs the
real ``omni`` command to see a runtime failure end without a traceback.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from omni_core.testing import install_plugin

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "plugins" / "omni-fixture-serve-faults"
OMNI = Path(sys.executable).parent / "omni"
PLUGIN = "fixture-serve-faults"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(FIXTURE, tmp_path_factory.mktemp("serve-faults") / "site")


@pytest.fixture(scope="module")
def plugins(site: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The process-wide plugin set with only the fixture (and the platform) loaded."""
    from omni_core.platforms import reset_platform
    from omni_core.plugins import get_plugins, reset_plugins
    from omni_core.testing.fixtures import FILTER_VARIABLES

    home = tmp_path_factory.mktemp("serve-faults-home")
    with pytest.MonkeyPatch.context() as mp:
        for name in FILTER_VARIABLES:
            mp.delenv(name, raising=False)
        mp.setenv("OMNI_CONFIG_DIR", str(home / "config"))
        mp.setenv("OMNI_CACHE_DIR", str(home / "cache"))
        mp.setenv("OMNI_PLUGINS", PLUGIN)
        mp.syspath_prepend(str(site))
        mp.setenv("PYTHONPATH", str(site))  # the conformance kit loads the plugin in a fresh interpreter too
        reset_plugins()
        reset_platform()
        try:
            yield get_plugins()
        finally:
            reset_plugins()
            reset_platform()
    importlib.invalidate_caches()


@pytest.fixture(scope="module")
def checkpoints(plugins: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny checkpoint per family, made by the code behind `omni models make-tiny`."""
    from omni_cli.commands.models import make_tiny

    root = tmp_path_factory.mktemp("serve-faults-tiny")
    return {
        "image": make_tiny(plugins, "fixture-serve-image", root / "image"),
        "voice": make_tiny(plugins, "fixture-serve-voice", root / "voice"),
    }


@pytest.fixture(scope="module")
def image(checkpoints: dict[str, Path]) -> Iterator[Any]:
    from omni_core import Omni

    with Omni(checkpoints["image"], progress=False) as omni:
        yield omni


@pytest.fixture(scope="module")
def voice(checkpoints: dict[str, Path]) -> Iterator[Any]:
    from omni_core import Omni

    with Omni(checkpoints["voice"]) as omni:
        yield omni


def in_thread(fn: Any, *, cancel_after: float | None = None, reason: str = "the client disconnected") -> Any:
    """Run ``fn`` in a worker thread inside a cancellable scope, as the server's worker does;
    cancel it after ``cancel_after`` seconds. Returns (outcome, exception, seconds)."""
    from omni_core.cancel import CancelToken, cancellable

    token = CancelToken()
    box: dict[str, Any] = {}

    def work() -> None:
        started = time.perf_counter()
        try:
            with cancellable(token):
                box["value"] = fn()
        except BaseException as exc:  # the row inspects whatever ended it
            box["error"] = exc
        box["seconds"] = time.perf_counter() - started

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    if cancel_after is not None:
        time.sleep(cancel_after)
        token.cancel(reason)
    thread.join(timeout=60)
    assert not thread.is_alive(), "the job did not stop"
    return box.get("value"), box.get("error"), box["seconds"]


# -- installed and declared --------------------------------------------------------------------


def test_the_fixture_registers_one_family_and_one_adapter_and_passes_the_conformance_checks(plugins):
    from omni_core.testing.checks import check_plugin

    assert "fixture-serve-image" in plugins.models
    assert "fixture-serve-voice" in plugins.tts_adapters
    assert {k: v for k, v in check_plugin(PLUGIN).items() if v} == {}


def test_make_tiny_writes_the_layouts_the_families_are_found_by(checkpoints):
    import json

    from omni_core.api import identify_model
    from omni_core.tiny import has_random_weights

    index = json.loads((checkpoints["image"] / "model_index.json").read_text(encoding="utf-8"))
    assert index["_class_name"] == "ServeFaultsPipeline" and "_diffusers_version" in index
    config = json.loads((checkpoints["voice"] / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["ServeFaultsTTS"]
    assert identify_model(checkpoints["image"]).name == "fixture-serve-image"
    assert identify_model(checkpoints["voice"]).name == "fixture-serve-voice"
    assert has_random_weights(checkpoints["image"]) and has_random_weights(checkpoints["voice"])


# -- the image family ---------------------------------------------------------------------------


def test_the_image_is_the_seeds_noise_with_full_metadata(image, tmp_path):
    import numpy as np

    from omni_core.generation.media import read_png_metadata

    result = image.generate("a cat", seed=1)
    pixels = result.images[0].pixels
    assert pixels.dtype == np.uint8 and pixels.shape == (32, 32, 3)
    expected = np.random.default_rng(1).integers(0, 256, size=(1, 32, 32, 3), dtype=np.uint8)[0]
    assert np.array_equal(pixels, expected)
    assert np.array_equal(image.generate("another prompt", seed=1).images[0].pixels, pixels)
    assert not np.array_equal(image.generate("a cat", seed=2).images[0].pixels, pixels)
    meta = result.metadata
    assert (meta.family, meta.request.seed, meta.request.num_inference_steps) == ("fixture-serve-image", 1, 4)
    assert meta.random_weights and meta.batch_size == 1
    (written,) = result.save(tmp_path / "cat.png")
    saved = read_png_metadata(written)
    assert saved["seed"] == 1 and saved["family"] == "fixture-serve-image" and saved["batch_size"] == 1


def test_num_outputs_and_size_follow_the_request(image):
    result = image.generate("a cat", seed=3, width=48, height=16, num_outputs=2)
    assert [img.pixels.shape for img in result.images] == [(16, 48, 3), (16, 48, 3)]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"width": 30}, "multiple of 8"),
        ({"num_inference_steps": 0}, "num_inference_steps 0"),
        ({"extra": {"colour": "red"}}, "unknown model option"),
        ({"extra": {"behaviour": "melt"}}, "explode, hang, hang-hard"),
        ({"extra": {"step_seconds": -1}}, "step_seconds"),
        ({"extra": {"step_seconds": "slow"}}, "step_seconds"),
        ({"num_frames": 9}, "video models only"),
    ],
)
def test_bad_input_is_a_generation_option_error(image, fields, words):
    from omni_core.errors import GenerationOptionError

    with pytest.raises(GenerationOptionError, match=words):
        image.generate("a cat", **fields)


@pytest.mark.parametrize("how", [{"prompt": "please explode now"}, {"extra": {"behaviour": "explode"}}])
def test_explode_is_the_runtimes_own_failure_not_an_omni_error(image, how):
    from omni_core.errors import OmniError

    with pytest.raises(RuntimeError, match="fixture: generation exploded") as caught:
        image.generate({"prompt": "a cat", **how})
    assert not isinstance(caught.value, OmniError)


def test_step_seconds_paces_every_step(image):
    started = time.perf_counter()
    image.generate("a cat", seed=0, num_inference_steps=5, extra={"step_seconds": 0.05})
    assert time.perf_counter() - started >= 0.25


def test_slow_generation_stops_at_the_next_step_once_cancelled(image):
    from omni_core.errors import RequestCancelled

    job = lambda: image.generate("a cat", num_inference_steps=50, extra={"step_seconds": 0.1})  # noqa: E731
    value, error, seconds = in_thread(job, cancel_after=0.25)
    assert value is None and isinstance(error, RequestCancelled) and "disconnected" in str(error)
    assert seconds < 1.5  # 50 steps would take 5 s


@pytest.mark.parametrize("how", [{"prompt": "hang"}, {"prompt": "a cat", "extra": {"behaviour": "hang"}}])
def test_hang_ends_only_when_cancelled(image, how):
    from omni_core.errors import RequestCancelled

    _value, error, seconds = in_thread(lambda: image.generate(how), cancel_after=0.6, reason="deadline passed")
    assert isinstance(error, RequestCancelled) and "deadline" in str(error)
    assert 0.5 <= seconds < 2


def test_hang_hard_ignores_cancellation_until_it_wakes(image, monkeypatch):
    import omni_fixture_serve_faults.image as family

    from omni_core.errors import RequestCancelled

    monkeypatch.setattr(family, "HARD_HANG_S", 0.8)  # the real one is 30 s
    _value, error, seconds = in_thread(lambda: image.generate("hang-hard"), cancel_after=0.1)
    assert isinstance(error, RequestCancelled)
    assert seconds >= 0.8  # deaf to the cancel at 0.1 s; noticed at the next step


def test_outside_a_cancellable_scope_nothing_is_cancelled(image):
    result = image.generate("a cat", seed=5, extra={"step_seconds": 0.01})
    assert result.images


# -- batching -----------------------------------------------------------------------------------


def test_batch_key_is_size_and_steps_and_validates(image):
    from omni_core.errors import GenerationOptionError
    from omni_core.generation.model import BatchingEngine
    from omni_core.generation.request import GenerationRequest

    engine = image.generation
    assert isinstance(engine, BatchingEngine)
    key = engine.batch_key(GenerationRequest(prompt="a", seed=1))
    assert key == (32, 32, 4)
    assert engine.batch_key(GenerationRequest(prompt="b", seed=9, extra={"step_seconds": 0.01})) == key
    assert engine.batch_key(GenerationRequest(prompt="a", width=64)) != key
    assert engine.batch_key(GenerationRequest(prompt="a", num_inference_steps=2)) != key
    with pytest.raises(GenerationOptionError):
        engine.batch_key(GenerationRequest(prompt="a", width=33))


def test_a_batch_gives_each_request_what_it_gets_alone(image):
    import numpy as np

    from omni_core.generation.request import GenerationRequest

    engine = image.generation
    requests = [GenerationRequest(prompt=f"p{i}", seed=seed) for i, seed in enumerate((7, 8, 7, 100))]
    results = engine.generate_batch(requests)
    assert [r.seed for r in results] == [7, 8, 7, 100]
    assert [r.metadata.request.prompt for r in results] == ["p0", "p1", "p2", "p3"]
    for request, result in zip(requests, results, strict=True):
        assert result.metadata.batch_size == 4
        assert np.array_equal(result.images[0].pixels, engine.generate(request).images[0].pixels)
    # the offline API's entry points reach the same engine methods
    assert image.batch_key({"prompt": "x", "seed": 7}) == engine.batch_key(requests[0])
    again = image.generate_batch([{"prompt": "x", "seed": 8}, {"prompt": "y", "seed": 100}])
    assert [r.metadata.batch_size for r in again] == [2, 2]
    assert np.array_equal(again[1].images[0].pixels, results[3].images[0].pixels)
    with pytest.raises(ValueError, match="different batch keys"):
        engine.generate_batch([GenerationRequest(prompt="a"), GenerationRequest(prompt="a", width=64)])


def test_one_exploding_member_fails_the_whole_batch(image):
    from omni_core.generation.request import GenerationRequest

    with pytest.raises(RuntimeError, match="exploded"):
        image.generation.generate_batch([GenerationRequest(prompt="a cat"), GenerationRequest(prompt="explode")])


# -- the voice ----------------------------------------------------------------------------------


def _peak_hz(audio: Any) -> float:
    import numpy as np

    spectrum = np.abs(np.fft.rfft(audio.samples))
    return float(np.argmax(spectrum) * audio.sample_rate / audio.frames)


def test_speak_is_half_a_second_of_the_voices_tone(voice):
    caps = voice.capabilities
    assert caps.voices == ("alto", "bass") and caps.streaming and caps.native_sample_rate == 16000
    alto = voice.speak("Hello", seed=0)
    bass = voice.speak("Hello", voice="bass", seed=0)
    assert alto.audio.sample_rate == 16000 and alto.audio.frames == 8000
    assert _peak_hz(alto.audio) == pytest.approx(440, abs=4)
    assert _peak_hz(bass.audio) == pytest.approx(110, abs=4)
    assert alto.data[:4] == b"RIFF"


def test_unknown_voice_is_a_request_error_naming_the_voices(voice):
    from omni_core.errors import SpeechRequestError

    with pytest.raises(SpeechRequestError, match="alto, bass"):
        voice.speak("Hello", voice="tenor")


def test_the_stream_is_ten_paced_chunks_that_make_up_speak_and_are_logged(voice, tmp_path, monkeypatch):
    import numpy as np

    log = tmp_path / "chunks.log"
    monkeypatch.setenv("OMNI_FIXTURE_SERVE_LOG", str(log))
    started = time.perf_counter()
    chunks = list(voice.stream_speech("Hello", seed=0))
    assert time.perf_counter() - started >= 9 * 0.2
    assert [c.frames for c in chunks] == [800] * 10
    whole = np.concatenate([c.samples for c in chunks])
    assert np.array_equal(whole, voice.speak("Hello", seed=0).audio.samples)
    assert log.read_text(encoding="utf-8").splitlines() == [f"chunk {n}" for n in range(1, 11)]


def test_a_hung_up_stream_stops_producing_chunks(voice, tmp_path, monkeypatch):
    from omni_core.errors import RequestCancelled

    log = tmp_path / "chunks.log"
    monkeypatch.setenv("OMNI_FIXTURE_SERVE_LOG", str(log))
    taken: list[Any] = []

    def consume() -> None:
        for chunk in voice.stream_speech("Hello"):
            taken.append(chunk)

    _value, error, seconds = in_thread(consume, cancel_after=0.3)  # between chunk 2 (0.2 s) and 3 (0.4 s)
    assert isinstance(error, RequestCancelled)
    assert len(taken) == 2 and seconds < 1
    time.sleep(0.5)  # nothing runs on after the cancel
    assert log.read_text(encoding="utf-8").splitlines() == ["chunk 1", "chunk 2"]


def test_explode_in_speech_is_a_named_runtime_error(voice):
    from omni_core.errors import ModelRuntimeError

    # the speech engine names an adapter's raw failure; streaming fails before the first chunk
    with pytest.raises(ModelRuntimeError, match="fixture: synthesis exploded"):
        voice.speak("please explode")
    with pytest.raises(ModelRuntimeError, match="fixture: synthesis exploded"):
        next(iter(voice.stream_speech("explode")))


def test_a_hung_synthesis_ends_when_cancelled(voice):
    from omni_core.errors import RequestCancelled

    _value, error, seconds = in_thread(lambda: voice.speak("hang"), cancel_after=0.3)
    assert isinstance(error, RequestCancelled) and seconds < 2


# -- the command line ---------------------------------------------------------------------------


def test_the_cli_generates_and_ends_an_explosion_without_a_traceback(site, checkpoints, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    env.update(
        PYTHONPATH=str(site),
        OMNI_PLUGINS=PLUGIN,
        OMNI_CONFIG_DIR=str(tmp_path / "config"),
        OMNI_CACHE_DIR=str(tmp_path / "cache"),
    )

    def omni(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(OMNI), *args], capture_output=True, text=True, env=env, timeout=120, check=False, cwd=tmp_path
        )

    good = omni("generate", "a cat", "--model", str(checkpoints["image"]), "--seed", "1", "--out", "cat.png")
    assert good.returncode == 0, good.stdout + good.stderr
    assert (tmp_path / "cat.png").is_file()
    bad = omni("generate", "explode", "--model", str(checkpoints["image"]), "--out", "boom.png")
    assert bad.returncode == 1
    assert "fixture: generation exploded" in bad.stderr and "Traceback" not in bad.stdout + bad.stderr
    assert not (tmp_path / "boom.png").exists()
