"""End to end through omni_core.speech.engine.SpeechEngine on tiny checkpoints."""

from __future__ import annotations

import io
import math
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from omni_core.speech.detection import ModelIdentity, explain_tts
from omni_core.speech.request import SpeechRequestError

HOP = 64  # samples per spectrogram frame of the tiny checkpoint (upsample_rates 8 x 8)
TEXT = "Hello world."
STORY = "Hello world. How are you today? I am fine, thank you! Goodbye."


def test_detection_picks_vits(tiny_vits: Path) -> None:
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    plugins = load_plugins(isolated_settings())  # every installed plugin, as `omni` sees them
    entry, explanation = explain_tts(plugins, ModelIdentity.from_dir(tiny_vits))
    assert entry is not None and entry.name == "vits"
    assert explanation.winner == "vits"
    assert explanation.rule == "first match in (detect_priority, name) order"


def test_engine_loads_the_tiny_checkpoint(vits_engine, tiny_vits: Path) -> None:  # type: ignore[no-untyped-def]
    assert vits_engine.adapter_name == "vits"
    assert vits_engine.explain().winner == "vits"
    assert vits_engine.capabilities.native_sample_rate == 16000
    assert str(vits_engine.adapter.device) == "cpu"


def test_wav_decodes_with_wave_and_soundfile(vits_engine) -> None:  # type: ignore[no-untyped-def]
    import soundfile

    result = vits_engine.speak({"input": TEXT, "seed": 1})
    assert result.content_type == "audio/wav"
    assert result.metadata["adapter"] == "vits"
    assert result.metadata["seed"] == 1
    assert result.audio.samples.dtype == np.float32
    assert result.audio.channels == 1
    assert result.audio.frames > 0 and result.audio.frames % HOP == 0
    assert np.abs(result.audio.samples).max() <= 1.0
    with wave.open(io.BytesIO(result.data)) as wav:
        assert wav.getnchannels() == 1
        assert wav.getsampwidth() == 2
        assert wav.getframerate() == 16000
        assert wav.getnframes() == result.audio.frames
    decoded, rate = soundfile.read(io.BytesIO(result.data), dtype="float32")
    assert rate == 16000
    assert decoded.shape == (result.audio.frames,)
    np.testing.assert_allclose(decoded, result.audio.samples, atol=1.5 / 32767)


@pytest.mark.parametrize("fmt", ["pcm", "flac"])
def test_other_formats_decode(vits_engine, fmt: str) -> None:  # type: ignore[no-untyped-def]
    import soundfile

    result = vits_engine.speak({"input": TEXT, "seed": 1, "response_format": fmt})
    if fmt == "pcm":
        assert len(result.data) == 2 * result.audio.frames
        return
    decoded, rate = soundfile.read(io.BytesIO(result.data), dtype="float32")
    assert rate == 16000 and decoded.shape == (result.audio.frames,)


@pytest.mark.parametrize("rate", [22050, 24000])
def test_resampled_output_has_the_requested_rate_and_duration(vits_engine, rate: int) -> None:  # type: ignore[no-untyped-def]
    native = vits_engine.speak({"input": TEXT, "seed": 2})
    result = vits_engine.speak({"input": TEXT, "seed": 2, "sample_rate": rate})
    assert result.audio.sample_rate == rate
    assert result.metadata["sample_rate"] == rate
    assert result.audio.frames == math.floor(native.audio.frames * rate / 16000 + 0.5)  # soxr rounds halves up
    assert abs(result.audio.duration - native.audio.duration) <= 1 / rate + 1 / 16000
    with wave.open(io.BytesIO(result.data)) as wav:
        assert wav.getframerate() == rate
        assert wav.getnframes() == result.audio.frames


def test_same_seed_same_samples_different_seed_different(vits_engine) -> None:  # type: ignore[no-untyped-def]
    a = vits_engine.speak({"input": TEXT, "seed": 11})
    b = vits_engine.speak({"input": TEXT, "seed": 11})
    c = vits_engine.speak({"input": TEXT, "seed": 12})
    assert np.array_equal(a.audio.samples, b.audio.samples)
    assert a.data == b.data
    assert c.audio.frames != a.audio.frames or not np.array_equal(a.audio.samples, c.audio.samples)
    assert a.data != c.data


def test_speed_uses_the_native_speaking_rate(vits_engine) -> None:  # type: ignore[no-untyped-def]
    normal = vits_engine.speak({"input": STORY, "seed": 3})
    fast = vits_engine.speak({"input": STORY, "seed": 3, "speed": 2.0})
    slow = vits_engine.speak({"input": STORY, "seed": 3, "speed": 0.5})
    assert fast.audio.frames < normal.audio.frames < slow.audio.frames
    # the model changed its durations (whole frames), the runtime did not time-stretch
    for result in (normal, fast, slow):
        assert result.audio.frames % HOP == 0
    assert vits_engine.adapter.model.speaking_rate == 1.0  # restored after the request


def test_speed_changes_durations_not_the_noise(vits_engine) -> None:  # type: ignore[no-untyped-def]
    # a faster rate is a shorter, different synthesis; the same request repeats exactly
    a = vits_engine.speak({"input": TEXT, "seed": 4, "speed": 1.5})
    b = vits_engine.speak({"input": TEXT, "seed": 4, "speed": 1.5})
    assert np.array_equal(a.audio.samples, b.audio.samples)


def test_multi_speaker_voices_are_selectable(vits_engine_multi) -> None:  # type: ignore[no-untyped-def]
    caps = vits_engine_multi.capabilities
    assert caps.voices == ("speaker_0", "speaker_1", "speaker_2", "speaker_3")
    assert caps.default_voice == "speaker_0"
    default = vits_engine_multi.speak({"input": TEXT, "seed": 5})
    first = vits_engine_multi.speak({"input": TEXT, "seed": 5, "voice": "speaker_0"})
    second = vits_engine_multi.speak({"input": TEXT, "seed": 5, "voice": "speaker_1"})
    third = vits_engine_multi.speak({"input": TEXT, "seed": 5, "voice": "speaker_3"})
    assert np.array_equal(default.audio.samples, first.audio.samples)
    assert second.data != first.data
    assert third.data != second.data


def test_unknown_voice_is_rejected_listing_the_voices(vits_engine_multi) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(
        SpeechRequestError, match="unknown voice 'alice'; available: speaker_0, speaker_1, speaker_2, speaker_3"
    ):
        vits_engine_multi.speak({"input": TEXT, "voice": "alice"})
    with pytest.raises(SpeechRequestError, match="unknown voice 'speaker_4'"):
        vits_engine_multi.speak({"input": TEXT, "voice": "speaker_4"})


def test_single_speaker_model_has_no_voices(vits_engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpeechRequestError, match="has no selectable voices"):
        vits_engine.speak({"input": TEXT, "voice": "speaker_0"})


def test_stream_concatenates_to_speak_bit_for_bit(vits_engine) -> None:  # type: ignore[no-untyped-def]
    chunks = list(vits_engine.stream({"input": STORY, "seed": 6}))
    assert len(chunks) == 4  # one per sentence
    assert all(c.sample_rate == 16000 and c.frames > 0 and c.samples.dtype == np.float32 for c in chunks)
    whole = vits_engine.speak({"input": STORY, "seed": 6})
    assert np.array_equal(np.concatenate([c.samples for c in chunks]), whole.audio.samples)


def test_stream_chunk_i_is_sentence_i_seeded_with_the_segment_seed(vits_engine) -> None:  # type: ignore[no-untyped-def]
    from omni_core.speech.seeding import segment_seed

    chunks = list(vits_engine.stream({"input": STORY, "seed": 6}))
    second = vits_engine.speak({"input": "How are you today?", "seed": segment_seed(6, 1)})
    assert np.array_equal(chunks[1].samples, second.audio.samples)


def test_stream_honours_native_speed_and_voice(vits_engine_multi) -> None:  # type: ignore[no-untyped-def]
    request = {"input": STORY, "seed": 8, "speed": 2.0, "voice": "speaker_2"}
    chunks = list(vits_engine_multi.stream(request))
    whole = vits_engine_multi.speak(request)
    assert len(chunks) == 4
    assert np.array_equal(np.concatenate([c.samples for c in chunks]), whole.audio.samples)


def test_stream_refuses_a_resampled_rate(vits_engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpeechRequestError, match="streaming returns the native 16000 Hz"):
        list(vits_engine.stream({"input": STORY, "sample_rate": 24000}))
    with pytest.raises(SpeechRequestError, match=r"use SpeechEngine\.stream\(\)"):
        vits_engine.speak({"input": STORY, "stream": True})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("instructions", "speak softly", "does not take instructions"),
        ("ref_audio", "/tmp/reference.wav", "cannot clone a voice"),
        ("language", "en", "unsupported language 'en'; supported: none"),
        ("max_new_tokens", 100, "does not support 'max_new_tokens'"),
    ],
)
def test_unsupported_fields_are_refused(vits_engine, field: str, value: object, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpeechRequestError, match=message):
        vits_engine.speak({"input": TEXT, field: value})


def test_a_declared_language_is_accepted_and_others_refused(tmp_path: Path, vits_plugins, vits_platform) -> None:  # type: ignore[no-untyped-def]
    from omni_plugin_vits.adapter import VitsAdapter

    from omni_core.speech.engine import SpeechEngine

    engine = SpeechEngine(
        VitsAdapter.make_tiny(tmp_path / "eng", language="eng"), plugins=vits_plugins, platform=vits_platform
    )
    assert engine.capabilities.languages == ("eng",)
    assert engine.speak({"input": TEXT, "language": "eng", "seed": 0}).audio.frames > 0
    with pytest.raises(SpeechRequestError, match="unsupported language 'fra'; supported: eng"):
        engine.speak({"input": TEXT, "language": "fra"})


def test_unpronounceable_input_is_a_client_error(vits_engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpeechRequestError, match="no characters this model can pronounce"):
        vits_engine.speak({"input": "?! ..."})
    with pytest.raises(SpeechRequestError, match="input text cannot be empty"):
        vits_engine.speak({"input": "   "})


def test_one_sentence_is_fast_on_cpu(vits_engine) -> None:  # type: ignore[no-untyped-def]
    vits_engine.speak({"input": TEXT, "seed": 0})  # warm
    start = time.perf_counter()
    result = vits_engine.speak({"input": TEXT, "seed": 0})
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"one sentence took {elapsed:.3f}s on the tiny checkpoint"
    assert result.metadata["rtf"] is not None
