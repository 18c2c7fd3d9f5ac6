"""Audio on the way out: every response format decodes back with an independent reader at the
right rate and channel count; resampling and time stretching keep what they should."""

from __future__ import annotations

import io
import math
import wave

import pytest

from omni_core.speech.audio import CONTENT_TYPES, Audio, encode, resample, time_stretch
from omni_core.speech.request import AUDIO_FORMATS, SpeechRequestError

# the torch-less ``core`` tox env has neither
np = pytest.importorskip("numpy")
soundfile = pytest.importorskip("soundfile")

MP3 = "MP3" in soundfile.available_formats()


def tone(frequency: float, seconds: float, rate: int, channels: int = 1, amplitude: float = 0.5) -> Audio:
    t = np.arange(int(seconds * rate)) / rate
    mono = amplitude * np.sin(2 * math.pi * frequency * t)
    if channels == 1:
        return Audio(mono.astype(np.float32), rate)
    # a different tone per channel, so swapped or merged channels show
    stereo = np.stack([mono, amplitude * np.sin(2 * math.pi * frequency * 1.5 * t)], axis=1)
    return Audio(stereo.astype(np.float32), rate)


def peak_hz(samples: np.ndarray, rate: int) -> float:
    x = samples if samples.ndim == 1 else samples[:, 0]
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[np.argmax(spectrum)])


def int16(audio: Audio) -> np.ndarray:
    return (np.clip(audio.samples, -1, 1) * 32767).round().astype(np.int16)


def decode(data: bytes, fmt: str, rate: int, channels: int) -> tuple[np.ndarray, int, int]:
    """(int16 or float samples as frames x channels, rate, channels) with a reader omni does not use."""
    if fmt == "wav":
        with wave.open(io.BytesIO(data)) as wav:
            assert wav.getsampwidth() == 2
            frames = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
            return frames.reshape(-1, wav.getnchannels()), wav.getframerate(), wav.getnchannels()
    if fmt == "pcm":  # headerless: the caller knows rate and channels
        return np.frombuffer(data, dtype="<i2").reshape(-1, channels), rate, channels
    samples, sr = soundfile.read(io.BytesIO(data), dtype="int16", always_2d=True)
    return samples, sr, samples.shape[1]


FORMATS = [
    pytest.param(f, marks=pytest.mark.skipif(f == "mp3" and not MP3, reason="no MP3 in libsndfile"))
    for f in AUDIO_FORMATS
]


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("rate", [16000, 22050, 24000, 44100, 48000])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_decodes_back_at_the_right_rate_and_channels(fmt, rate, channels):
    audio = tone(440, 0.5, rate, channels)
    samples, got_rate, got_channels = decode(encode(audio, fmt), fmt, rate, channels)
    assert (got_rate, got_channels) == (rate, channels)
    if fmt == "mp3":  # lossy with encoder delay: same rate, channels, length within a frame, same pitch
        assert abs(samples.shape[0] - audio.frames) <= 2 * 1152
        assert abs(peak_hz(samples.astype(np.float32), rate) - 440) < 10
    else:  # lossless 16-bit: exactly the quantised samples
        assert samples.shape == (audio.frames, channels)
        assert np.array_equal(samples, int16(audio).reshape(-1, channels))


def test_wav_header_is_exact():
    audio = tone(440, 0.25, 24000, 2)
    data = encode(audio, "wav")
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt "
    assert int.from_bytes(data[4:8], "little") == len(data) - 8
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getnchannels(), wav.getframerate(), wav.getnframes()) == (2, 24000, audio.frames)


def test_flac_and_mp3_carry_their_container_signatures():
    audio = tone(440, 0.25, 24000)
    assert encode(audio, "flac")[:4] == b"fLaC"
    if MP3:
        head = encode(audio, "mp3")[:3]
        assert head == b"ID3" or head[0] == 0xFF
    assert set(CONTENT_TYPES) == set(AUDIO_FORMATS)


def test_samples_beyond_full_scale_are_clipped_not_wrapped():
    audio = Audio(np.array([2.0, -2.0, 0.5], dtype=np.float32), 16000)
    assert np.frombuffer(encode(audio, "pcm"), "<i2").tolist() == [32767, -32767, 16384]


def test_unknown_format_is_refused():
    with pytest.raises(SpeechRequestError, match="unknown response_format 'ogg'"):
        encode(tone(440, 0.1, 16000), "ogg")


@pytest.mark.parametrize(
    ("src", "dst"), [(16000, 24000), (24000, 16000), (22050, 48000), (48000, 22050), (44100, 8000)]
)
@pytest.mark.parametrize("channels", [1, 2])
def test_resample_keeps_duration_and_pitch(src, dst, channels):
    audio = tone(440, 1.0, src, channels)
    out = resample(audio, dst)
    assert out.sample_rate == dst and out.channels == channels
    assert out.frames == math.floor(audio.frames * dst / src + 0.5)  # soxr's length: rounded, halves up
    assert abs(peak_hz(out.samples, dst) - 440) < 2
    # amplitude kept away from the edges (no gain error)
    middle = out.samples[dst // 4 : 3 * dst // 4]
    middle = middle if middle.ndim == 1 else middle[:, 0]
    assert np.max(np.abs(middle)) == pytest.approx(0.5, abs=0.02)


def test_resample_filters_what_the_new_rate_cannot_hold():
    # 6 kHz is above the 4 kHz Nyquist limit of 8 kHz audio: it must go, not alias to 2 kHz
    out = resample(tone(6000, 1.0, 44100), 8000)
    assert np.sqrt(np.mean(out.samples[800:-800] ** 2)) < 0.01


def test_resample_to_the_same_rate_is_a_no_op():
    audio = tone(440, 0.1, 16000)
    assert resample(audio, 16000) is audio


@pytest.mark.parametrize("speed", [0.5, 0.8, 1.25, 2.0, 3.0])
@pytest.mark.parametrize("channels", [1, 2])
def test_time_stretch_changes_duration_and_keeps_pitch(speed, channels):
    audio = tone(300, 2.0, 16000, channels)
    out = time_stretch(audio, speed)
    assert out.frames == round(audio.frames / speed)
    assert out.sample_rate == 16000 and out.channels == channels
    assert abs(peak_hz(out.samples, 16000) - 300) < 4
    if channels == 2:
        second = out.samples[:, 1]
        spectrum = np.abs(np.fft.rfft(second * np.hanning(len(second))))
        assert abs(np.fft.rfftfreq(len(second), 1 / 16000)[np.argmax(spectrum)] - 450) < 4


def test_time_stretch_at_normal_speed_is_a_no_op():
    audio = tone(300, 0.2, 16000)
    assert time_stretch(audio, 1.0) is audio


def test_concatenate_refuses_mixed_rates_and_nothing():
    with pytest.raises(ValueError, match="different sample rates"):
        Audio.concatenate([tone(440, 0.1, 16000), tone(440, 0.1, 24000)])
    with pytest.raises(ValueError, match="nothing"):
        Audio.concatenate([])
