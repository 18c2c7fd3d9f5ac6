"""End to end through omni's speech runtime (SpeechEngine) on the tiny checkpoint: real
detection, the runtime's order of hooks, real synthesis, encoding decoded by other readers."""

from __future__ import annotations

import io
import wave
from typing import Any

import numpy as np
import pytest
from omni_plugin_speecht5.adapter import DEFAULT_SAMPLING

from omni_core.speech import SpeechRequestError

HOP = 16  # samples per mel frame of the tiny vocoder
RATE = 16000
THREE = "One two. Three four five! Six?"


def _int16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype(np.int16)


def test_speecht5_detected_and_loaded(speecht5_engine: Any) -> None:
    assert speecht5_engine.adapter_name == "speecht5"
    assert speecht5_engine.explain().winner == "speecht5"
    caps = speecht5_engine.capabilities
    assert caps.native_sample_rate == RATE
    assert caps.voices == ("alba", "bram", "cleo")
    assert caps.default_voice == "alba"
    assert caps.streaming and not caps.voice_cloning and not caps.instructions
    assert not caps.native_speed_control


@pytest.mark.parametrize("fmt", ["wav", "pcm", "flac", "mp3"])
def test_speecht5_every_format_decodes_back(speecht5_engine: Any, fmt: str) -> None:
    import soundfile

    result = speecht5_engine.speak({"input": "Hi there.", "seed": 1, "response_format": fmt})
    audio = result.audio
    assert result.response_format == fmt
    assert audio.sample_rate == RATE and audio.frames > 0
    expected = _int16(audio.samples)
    if fmt == "wav":
        with wave.open(io.BytesIO(result.data)) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (RATE, 1, 2)
            decoded = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        np.testing.assert_array_equal(decoded, expected)
    elif fmt == "pcm":
        decoded = np.frombuffer(result.data, dtype="<i2")  # raw 16-bit little-endian, native rate
        np.testing.assert_array_equal(decoded, expected)
    elif fmt == "flac":
        decoded, rate = soundfile.read(io.BytesIO(result.data), dtype="int16")
        assert rate == RATE
        np.testing.assert_array_equal(decoded, expected)
    else:
        decoded, rate = soundfile.read(io.BytesIO(result.data), dtype="float32")
        assert rate == RATE
        # mp3 adds encoder delay and frame padding (a frame is 1152 samples) and is lossy
        assert abs(len(decoded) - audio.frames) <= 2 * 1152
        assert np.abs(decoded).max() > 0.05
    assert (
        result.content_type == {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg"}[fmt]
    )


def test_speecht5_sample_rate_resamples(speecht5_engine: Any) -> None:
    native = speecht5_engine.speak({"input": "Hi there.", "seed": 1})
    result = speecht5_engine.speak({"input": "Hi there.", "seed": 1, "sample_rate": 24000})
    assert result.audio.sample_rate == 24000
    assert result.audio.frames == (2 * native.audio.frames * 24000 + RATE) // (2 * RATE)  # soxr rounds halves up
    with wave.open(io.BytesIO(result.data)) as w:
        assert w.getframerate() == 24000
        assert w.getnframes() == result.audio.frames
    assert result.metadata["sample_rate"] == 24000


@pytest.mark.parametrize("speed", [2.0, 0.5])
def test_speecht5_speed_time_stretches(speecht5_engine: Any, speed: float) -> None:
    native = speecht5_engine.speak({"input": "Hi there.", "seed": 1})
    result = speecht5_engine.speak({"input": "Hi there.", "seed": 1, "speed": speed})
    assert result.audio.sample_rate == RATE
    assert result.audio.frames == round(native.audio.frames / speed)
    assert result.metadata["duration_s"] == pytest.approx(native.audio.duration / speed, abs=1e-3)


def test_speecht5_deterministic_for_a_seed(speecht5_engine: Any) -> None:
    a = speecht5_engine.speak({"input": THREE, "seed": 11})
    b = speecht5_engine.speak({"input": THREE, "seed": 11})
    c = speecht5_engine.speak({"input": THREE, "seed": 12})
    assert a.metadata["seed"] == 11
    np.testing.assert_array_equal(a.audio.samples, b.audio.samples)
    assert a.data == b.data
    # the decoder pre-net's dropout is on at inference, so another seed is another rendition
    assert a.audio.frames == c.audio.frames
    assert not np.array_equal(a.audio.samples, c.audio.samples)


def test_speecht5_voices_selectable_and_unknown_rejected(speecht5_engine: Any) -> None:
    _, prepared, _ = speecht5_engine.prepare({"input": "Hi there."})
    assert prepared.tts_params["voice"] == "alba"  # the default, filled in by normalize
    default = speecht5_engine.speak({"input": "Hi there.", "seed": 3})
    alba = speecht5_engine.speak({"input": "Hi there.", "seed": 3, "voice": "alba"})
    bram = speecht5_engine.speak({"input": "Hi there.", "seed": 3, "voice": "bram"})
    np.testing.assert_array_equal(default.audio.samples, alba.audio.samples)
    assert not np.array_equal(alba.audio.samples, bram.audio.samples)
    with pytest.raises(SpeechRequestError, match=r"unknown voice 'nobody'; available: alba, bram, cleo"):
        speecht5_engine.speak({"input": "Hi there.", "voice": "nobody"})


def test_speecht5_sampling_defaults_survive_max_new_tokens(speecht5_engine: Any) -> None:
    _, plain, _ = speecht5_engine.prepare({"input": "Hi there."})
    assert plain.sampling == {"threshold": 0.5, "minlenratio": 0.0, "maxlenratio": 20.0}
    assert speecht5_engine.adapter.default_sampling() == DEFAULT_SAMPLING
    _, budgeted, _ = speecht5_engine.prepare({"input": "Hi there.", "max_new_tokens": 7})
    # merged field by field: the stop rule and the ratios stay, the budget is added
    assert budgeted.sampling == {"threshold": 0.5, "minlenratio": 0.0, "maxlenratio": 20.0, "max_frames": 14}
    assert "max_new_tokens" not in budgeted.sampling


def test_speecht5_max_new_tokens_bounds_the_utterance(speecht5_engine: Any) -> None:
    _, prepared, _ = speecht5_engine.prepare({"input": THREE})
    first_steps = int(len(prepared.prompt["input_ids"][0]) * 20.0 / 2)
    # a budget inside the first sentence: one chunk, exactly that many decoder steps
    short = speecht5_engine.speak({"input": THREE, "seed": 5, "max_new_tokens": 4})
    assert short.audio.frames == 4 * 2 * HOP
    # the first sentence in full, then three steps of the second; the third is not spoken
    budget = first_steps + 3
    chunks = list(speecht5_engine.stream({"input": THREE, "seed": 5, "max_new_tokens": budget}))
    assert [c.frames for c in chunks] == [first_steps * 2 * HOP, 3 * 2 * HOP]
    whole = speecht5_engine.speak({"input": THREE, "seed": 5, "max_new_tokens": budget})
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), whole.audio.samples)


def test_speecht5_stream_concatenates_to_speak(speecht5_engine: Any) -> None:
    chunks = list(speecht5_engine.stream({"input": THREE, "seed": 21}))
    whole = speecht5_engine.speak({"input": THREE, "seed": 21})
    assert len(chunks) == 3  # one per sentence
    assert all(c.sample_rate == RATE for c in chunks)
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), whole.audio.samples)


def test_speecht5_stream_yields_before_the_utterance_is_done(
    speecht5_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = speecht5_engine.adapter
    calls: list[int] = []
    original = adapter._synthesize

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(adapter, "_synthesize", counting)
    stream = speecht5_engine.stream({"input": THREE, "seed": 21})
    first = next(stream)
    assert len(calls) == 1 and first.frames > 0  # two sentences still to come
    rest = list(stream)
    assert len(calls) == 3 and len(rest) == 2


def test_speecht5_stream_refuses_post_synthesis_speed(speecht5_engine: Any) -> None:
    with pytest.raises(SpeechRequestError, match="cannot stream"):
        list(speecht5_engine.stream({"input": THREE, "speed": 2.0}))


def test_speecht5_cloning_rejected_with_the_reason(speecht5_engine: Any) -> None:
    with pytest.raises(SpeechRequestError, match=r"cannot clone.*x-vector.*external.*Omit ref_audio") as info:
        speecht5_engine.speak({"input": "Hi there.", "ref_audio": "/tmp/someone.wav", "ref_text": "Hi."})
    assert "alba, bram, cleo" in str(info.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"instructions": "whisper"}, "does not take instructions"),
        ({"language": "fr"}, "unsupported language 'fr'; supported: en"),
        ({"input": "   "}, "input text cannot be empty"),
        ({"sample_rate": 24000, "stream": True}, "streaming returns the native 16000 Hz"),
    ],
)
def test_speecht5_unsupported_requests_rejected(speecht5_engine: Any, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpeechRequestError, match=message):
        speecht5_engine.prepare({"input": "Hi there.", **fields})


def test_speecht5_english_accepted(speecht5_engine: Any) -> None:
    request, _, _ = speecht5_engine.prepare({"input": "Hi there.", "language": "en"})
    assert request.language == "en"


def test_speecht5_long_sentences_fit_the_text_encoder(speecht5_engine: Any) -> None:
    limit = speecht5_engine.adapter.model.config.max_text_positions
    text = " ".join(["abcdefg"] * 120) + ". Short."
    _, prepared, _ = speecht5_engine.prepare({"input": text})
    assert len(prepared.prompt["segments"]) >= 3
    assert prepared.prompt["segments"][-1] == "Short."
    assert all(len(ids) <= limit for ids in prepared.prompt["input_ids"])


def test_speecht5_stop_rule_still_ends_sentences_under_a_budget(speecht5_engine: Any) -> None:
    """The merged threshold reaches the decoder: with a stop head that fires at once, every
    sentence ends after one step although max_new_tokens would allow many more."""
    import torch

    stop = speecht5_engine.adapter.model.speech_decoder_postnet.prob_out
    saved = stop.bias.detach().clone()
    with torch.no_grad():
        stop.bias.fill_(10.0)  # stop probability ~1 at every step
    try:
        chunks = list(speecht5_engine.stream({"input": THREE, "seed": 2, "max_new_tokens": 500}))
    finally:
        with torch.no_grad():
            stop.bias.copy_(saved)
    assert [c.frames for c in chunks] == [1 * 2 * HOP] * 3
