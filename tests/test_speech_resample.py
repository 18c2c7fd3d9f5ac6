"""Resampling with soxr: the analytic signal comes back at the new rate to within soxr's HQ
precision, lengths are soxr's, and an install without soxr is told how to get it.
``benchmarks/resample.py`` holds the full side-by-side measurement."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_core.speech.audio import Audio, resample

np = pytest.importorskip("numpy")
import soxr  # noqa: E402,F401  (a dependency of omni-core[speech]: a missing one is a failure, not a skip)


def sines(rate: int, seconds: float, freqs: tuple[float, ...]) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return sum(0.5 / len(freqs) * np.sin(2 * math.pi * f * t + 0.3 * i) for i, f in enumerate(freqs))


def snr_db(got: np.ndarray, want: np.ndarray, rate: int) -> float:
    edge = rate // 20  # 50 ms: a resampler's edges see only half its filter
    err = got[edge:-edge].astype(np.float64) - want[edge:-edge]
    return 10 * math.log10(np.mean(want[edge:-edge] ** 2) / np.mean(err**2))


@pytest.mark.parametrize(("src", "dst"), [(16000, 22050), (22050, 24000), (24000, 48000), (48000, 16000)])
def test_a_band_limited_signal_comes_back_exactly_at_the_new_rate(src, dst):
    freqs = (220.0, 1000.0, 3100.0)  # inside every rate's band
    out = resample(Audio(sines(src, 1.0, freqs).astype(np.float32), src), dst)
    assert out.sample_rate == dst and out.samples.dtype == np.float32
    # soxr HQ is good to about 130 dB here; the windowed-sinc resampler it replaced reached 60-75
    assert snr_db(out.samples, sines(dst, 1.0, freqs)[: out.frames], dst) > 110


def test_a_round_trip_through_the_common_rates_keeps_the_signal():
    audio = Audio(sines(16000, 1.0, (440.0, 2500.0)).astype(np.float32), 16000)
    for rate in (22050, 24000, 48000, 24000, 22050, 16000):
        audio = resample(audio, rate)
    assert audio.frames == 16000
    assert snr_db(audio.samples, sines(16000, 1.0, (440.0, 2500.0)), 16000) > 100


@pytest.mark.parametrize(
    ("frames", "src", "dst", "expected"), [(3, 16000, 24000, 5), (1, 16000, 8000, 1), (4, 16000, 22050, 6)]
)
def test_lengths_round_halves_up(frames, src, dst, expected):
    assert resample(Audio(np.zeros(frames, np.float32), src), dst).frames == expected


def test_any_layout_and_dtype_of_samples_is_taken():
    stereo = np.stack([sines(24000, 0.5, (300.0,)), sines(24000, 0.5, (450.0,))], axis=1)  # float64
    columns = np.asfortranarray(stereo)  # not C-contiguous
    out = resample(Audio(columns, 24000), 16000)
    assert out.samples.shape == (8000, 2) and out.samples.dtype == np.float32
    assert snr_db(out.samples[:, 1], sines(16000, 0.5, (450.0,)), 16000) > 100


def test_empty_audio_stays_empty():
    assert resample(Audio(np.zeros((0, 2), np.float32), 16000), 48000).samples.shape == (0, 2)


def test_without_soxr_the_error_names_the_fix(tmp_path: Path):
    # a real interpreter in which soxr cannot be imported (None in sys.modules blocks the import)
    code = (
        "import sys; sys.modules['soxr'] = None\n"
        "import numpy as np\n"
        "from omni_core.speech.audio import Audio, resample\n"
        "from omni_core.errors import SpeechRequestError\n"
        "try:\n"
        "    resample(Audio(np.zeros(10, np.float32), 16000), 24000)\n"
        "except SpeechRequestError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "OMNI_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "resampling to 24000 Hz needs the soxr package" in proc.stdout
    assert "pip install 'omni-core[speech]'" in proc.stdout


def test_import_omni_core_does_not_import_soxr():
    code = "import sys, omni_core, omni_core.speech.audio; print('soxr' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr
