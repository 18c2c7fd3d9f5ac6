"""The voice through omni's runtime: parity with piper-tts, speed, streaming, formats, and
that the default voice speaks."""

from __future__ import annotations

import io
import wave
from typing import Any

import numpy as np
import pytest

from omni_core.speech.request import AUDIO_FORMATS

TWO = "The quick brown fox jumps over the lazy dog. Then it runs into the forest."


def _direct(piper_direct: Any, text: str, **settings: Any) -> list[np.ndarray]:
    from piper import SynthesisConfig

    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, **settings)
    return [chunk.audio_float_array for chunk in piper_direct.synthesize(text, syn_config=config)]


def test_parity_with_piper_tts(piper_engine: Any, piper_direct: Any) -> None:
    """omni's samples are piper-tts's, bit for bit, with the same settings (noise off, which
    is omni's default). The 16-bit encodings may differ by one step: omni rounds to the
    nearest step where piper-tts's ``audio_int16_array`` truncates toward zero."""
    for text, speed in ((TWO, 1.0), ("Hello, world.", 1.5)):
        result = piper_engine.speak({"input": text, "speed": speed, "response_format": "pcm"})
        direct = _direct(piper_direct, text, length_scale=1.0 / speed)
        assert np.array_equal(result.audio.samples, np.concatenate(direct))
        ours = np.frombuffer(result.data, "<i2").astype(np.int32)
        theirs = np.concatenate([np.clip(d * 32767.0, -32767, 32767).astype(np.int16) for d in direct])
        assert len(ours) == len(theirs) and np.abs(ours - theirs).max() <= 1


def test_the_same_audio_for_every_seed(piper_engine: Any) -> None:
    # Piper's noise cannot be seeded per request (onnxruntime draws it), so omni turns it off
    a = piper_engine.speak({"input": "Hello there.", "seed": 1}).audio.samples
    b = piper_engine.speak({"input": "Hello there.", "seed": 2}).audio.samples
    assert np.array_equal(a, b)


def test_speed_scales_the_duration_natively(piper_engine: Any) -> None:
    base = piper_engine.speak({"input": TWO}).audio.duration
    fast = piper_engine.speak({"input": TWO, "speed": 2.0}).audio.duration
    slow = piper_engine.speak({"input": TWO, "speed": 0.5}).audio.duration
    # about 1/speed, not exactly: Piper rounds each phoneme's duration up to whole frames
    # (2x gives about 0.62 of the duration, 0.5x about 1.76 here)
    assert 0.45 < fast / base < 0.7
    assert 1.6 < slow / base < 2.2


def test_streaming_concatenates_to_the_whole(piper_engine: Any) -> None:
    whole = piper_engine.speak({"input": TWO + " And that is all."}).audio
    chunks = list(piper_engine.stream({"input": TWO + " And that is all."}))
    assert len(chunks) == 3  # one per sentence
    assert all(c.sample_rate == 22050 for c in chunks)
    assert np.array_equal(np.concatenate([c.samples for c in chunks]), whole.samples)


@pytest.mark.parametrize("fmt", AUDIO_FORMATS)
def test_every_output_format(piper_engine: Any, fmt: str) -> None:
    import soundfile  # type: ignore[import-untyped]

    result = piper_engine.speak({"input": "Hello.", "response_format": fmt})
    frames = result.audio.frames
    if fmt == "pcm":
        assert len(result.data) == 2 * frames
        return
    if fmt == "wav":
        with wave.open(io.BytesIO(result.data)) as wav:
            assert (wav.getframerate(), wav.getnframes()) == (22050, frames)
        return
    decoded, rate = soundfile.read(io.BytesIO(result.data))
    assert rate == 22050
    assert abs(len(decoded) - frames) <= (0 if fmt == "flac" else 2400)  # mp3 pads with its encoder delay


def _band_share(samples: np.ndarray, rate: int, low: float = 80.0, high: float = 4000.0) -> float:
    spectrum = np.abs(np.fft.rfft(samples - samples.mean())) ** 2
    freqs = np.fft.rfftfreq(len(samples), 1.0 / rate)
    return float(spectrum[(freqs >= low) & (freqs <= high)].sum() / spectrum.sum())


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def test_the_default_voice_speaks(piper_engine: Any) -> None:
    """Speech, not just sound. Checked on the voice `omni speak` uses by default:

    * duration grows with the text: one short sentence < one long sentence < two sentences,
      and doubling the words at least 1.5x the duration (noise or a fixed-length output fails);
    * its energy sits in the speech band: over 90% of the spectral power lies in 80 Hz-4 kHz
      (white noise at 22.05 kHz would put about 36% there);
    * silences fall at sentence breaks: the last 50 ms of every sentence's chunk is under 5%
      of that sentence's RMS, while the middle of the sentence has no 50 ms frame that quiet
      in most of it (the median 50 ms frame is above 20% of the RMS).
    """
    texts = ["Hello.", "The quick brown fox jumps over the lazy dog.", TWO]
    durations = [piper_engine.speak({"input": t}).audio.duration for t in texts]
    assert durations[0] < durations[1] < durations[2]
    assert durations[2] > 1.5 * durations[1]

    chunks = list(piper_engine.stream({"input": TWO + " And that is all."}))
    rate = chunks[0].sample_rate
    whole = np.concatenate([c.samples for c in chunks])
    assert _band_share(whole, rate) > 0.9

    tail = int(0.05 * rate)
    for chunk in chunks:
        samples = np.asarray(chunk.samples, dtype=np.float64)
        level = _rms(samples)
        assert _rms(samples[-tail:]) < 0.05 * level, "a sentence break without a pause"
        middle = samples[len(samples) // 4 : 3 * len(samples) // 4]
        frames = [_rms(middle[i : i + tail]) for i in range(0, len(middle) - tail, tail)]
        assert np.median(frames) > 0.2 * level, "a sentence's middle that is mostly silence"
