"""Audio after synthesis: speed change, resampling and encoding to wav, pcm, flac or mp3.

numpy is imported when these run (never at ``import omni_core``); resampling needs the ``soxr``
package, flac and mp3 the ``soundfile`` package (libsndfile 1.1 or newer for mp3); the
``speech`` extra installs both.
"""

from __future__ import annotations

import io
import math
import wave
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omni_core.speech.request import SpeechRequestError

if TYPE_CHECKING:
    import numpy as np

#: MIME type of each response format
CONTENT_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg"}


@dataclass
class Audio:
    """Float samples in [-1, 1], shape ``(frames,)`` for mono or ``(frames, channels)``."""

    samples: np.ndarray[Any, Any]
    sample_rate: int

    @property
    def frames(self) -> int:
        return int(self.samples.shape[0])

    @property
    def channels(self) -> int:
        return 1 if self.samples.ndim == 1 else int(self.samples.shape[1])

    @property
    def duration(self) -> float:
        return self.frames / self.sample_rate

    @classmethod
    def concatenate(cls, parts: list[Audio]) -> Audio:
        import numpy as np

        if not parts:
            raise ValueError("nothing to concatenate")
        rates = {p.sample_rate for p in parts}
        if len(rates) != 1:
            raise ValueError(f"cannot concatenate audio of different sample rates {sorted(rates)}")
        return cls(np.concatenate([p.samples for p in parts], axis=0), parts[0].sample_rate)


def resample(audio: Audio, rate: int) -> Audio:
    """Resample to ``rate`` with soxr at its default (HQ) quality; a no-op at the same rate.

    Mono or multichannel; ``round(frames * rate / sample_rate)`` frames come back (halves round
    up). soxr is imported here, not at ``import omni_core``: it is a dependency of the
    ``speech`` extra. ``benchmarks/resample.py`` compares it with omni's earlier resampler."""
    if rate == audio.sample_rate:
        return audio
    import numpy as np

    try:
        import soxr  # type: ignore[import-untyped]
    except ImportError:
        raise SpeechRequestError(
            f"resampling to {rate} Hz needs the soxr package: pip install 'omni-core[speech]' (or pip install soxr)"
        ) from None
    # soxr reads C-contiguous frames x channels; float32 is what Audio holds and what it computes in at HQ
    samples = np.ascontiguousarray(audio.samples, dtype=np.float32)
    return Audio(soxr.resample(samples, audio.sample_rate, rate, quality="HQ"), rate)


def time_stretch(audio: Audio, speed: float) -> Audio:
    """Change speed without changing pitch (WSOLA); ``speed`` 2.0 halves the duration."""
    import numpy as np

    if speed == 1.0:
        return audio
    x = np.asarray(audio.samples, dtype=np.float64)
    mono = x if x.ndim == 1 else x.mean(axis=1)
    frame = max(64, int(0.03 * audio.sample_rate))
    hop_out = frame // 2
    hop_in = hop_out * speed
    tol = hop_out // 2
    pad = frame + 2 * tol
    xp = np.concatenate([np.zeros((pad, *x.shape[1:])), x, np.zeros((pad + frame, *x.shape[1:]))])
    mp = np.concatenate([np.zeros(pad), mono, np.zeros(pad + frame)])
    n_out = round(x.shape[0] / speed)
    n_frames = math.ceil(n_out / hop_out) + 1
    window = np.hanning(frame)
    out = np.zeros((n_frames * hop_out + frame, *x.shape[1:]))
    norm = np.zeros(n_frames * hop_out + frame)
    previous = None
    for k in range(n_frames):
        ideal = pad + round(k * hop_in)
        best = ideal
        if previous is not None:
            target = mp[previous + hop_out : previous + hop_out + frame]
            lo, hi = max(0, ideal - tol), min(mp.shape[0] - frame, ideal + tol)
            if hi > lo and target.shape[0] == frame:
                region = mp[lo : hi + frame]
                scores = np.correlate(region, target, mode="valid")
                best = lo + int(np.argmax(scores))
        segment = xp[best : best + frame]
        w = window if x.ndim == 1 else window[:, None]
        out[k * hop_out : k * hop_out + frame] += segment * w
        norm[k * hop_out : k * hop_out + frame] += window
        previous = best
    norm = np.where(norm > 1e-8, norm, 1.0)
    result = out / (norm if x.ndim == 1 else norm[:, None])
    # output frame k was read from input position k * hop_in, so output 0 is input 0
    result = result[:n_out]
    return Audio(result.astype(np.float32), audio.sample_rate)


def _int16(audio: Audio) -> np.ndarray[Any, Any]:
    import numpy as np

    clipped = np.clip(np.asarray(audio.samples, dtype=np.float32), -1.0, 1.0)
    return (clipped * 32767.0).round().astype("<i2")


def _pcm16(audio: Audio) -> bytes:
    return _int16(audio).tobytes()


def wav_stream_header(sample_rate: int, channels: int) -> bytes:
    """The header of a 16-bit PCM WAV whose length is not known yet (a stream): the size
    fields hold the largest value, which players read as "until the data ends"."""
    import struct

    block = channels * 2
    return b"RIFF" + struct.pack(
        "<I4s4sIHHIIHH4sI",
        0xFFFFFFFF,
        b"WAVE",
        b"fmt ",
        16,
        1,
        channels,
        sample_rate,
        sample_rate * block,
        block,
        16,
        b"data",
        0xFFFFFFFF,
    )


def check_format(fmt: str) -> None:
    """Raise :class:`SpeechRequestError` unless this install can encode ``fmt``."""
    if fmt in ("wav", "pcm"):
        return
    if fmt not in ("flac", "mp3"):
        raise SpeechRequestError(f"unknown response_format {fmt!r}; choose wav, pcm, flac or mp3")
    try:
        import soundfile  # type: ignore[import-untyped]
    except ImportError:
        raise SpeechRequestError(
            f"response_format {fmt!r} needs the soundfile package: pip install soundfile"
        ) from None
    if fmt.upper() not in {k.upper() for k in soundfile.available_formats()}:
        raise SpeechRequestError(
            f"response_format {fmt!r} is not supported by this libsndfile "
            f"({soundfile.__libsndfile_version__}); use wav, pcm or flac"
        )


def encode(audio: Audio, fmt: str) -> bytes:
    """Encode to ``wav`` (16-bit PCM), ``pcm`` (raw 16-bit little-endian), ``flac`` or ``mp3``."""
    check_format(fmt)
    if fmt == "pcm":
        return _pcm16(audio)
    if fmt == "wav":
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as out:
            out.setnchannels(audio.channels)
            out.setsampwidth(2)
            out.setframerate(audio.sample_rate)
            out.writeframes(_pcm16(audio))
        return buffer.getvalue()
    import soundfile

    buffer = io.BytesIO()
    subtype = "PCM_16" if fmt == "flac" else "MPEG_LAYER_III"
    container = "FLAC" if fmt == "flac" else "MP3"
    # FLAC gets the very 16-bit samples WAV and PCM carry (libsndfile would scale floats its own way)
    data = _int16(audio) if fmt == "flac" else audio.samples
    soundfile.write(buffer, data, audio.sample_rate, format=container, subtype=subtype)
    return buffer.getvalue()
