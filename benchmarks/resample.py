#!/usr/bin/env python3
"""Resampling: soxr (what ``omni_core.speech.audio.resample`` uses) against the windowed-sinc
resampler omni used before it, side by side in one run: quality and speed.

Run with the repo's venv (numpy and soxr)::

    .venv/bin/python benchmarks/resample.py                 # ~1 minute on 2 shared cores
    .venv/bin/python benchmarks/resample.py --quick         # shorter signals, fewer rounds
    .venv/bin/python benchmarks/resample.py --json /tmp/resample.json

Every signal is a sum of sinusoids, so its exact value is known at any rate (the analytic
signal) and every error is measured against it, not against another resampler's output:

* **chain SNR**: 16 kHz -> 22.05 kHz -> 24 kHz -> 48 kHz and back down the same rates to
  16 kHz, each hop fed the previous hop's output (float32, as omni's ``Audio`` holds it). After
  every hop, SNR in dB of the output against the analytic signal at that rate, 50 ms at each end
  left out (a resampler's edges have only half a filter of input). Two signals: a 1 kHz sine
  at half full scale, and band-limited noise (200 sines of random frequency up to 0.4 of the
  lowest rate in the chain, random phases, scaled to 0.5 peak).
* **single hops**: the same SNR for each conversion a speech request asks for most often
  (a model's native 16/22.05/24 kHz to 8/16/24/44.1/48 kHz), from the analytic input.
* **band edge**: a sine at 0.45 of the lower rate (90% of Nyquist, just inside the band a
  TTS model fills): SNR after one downward hop. Low figures mean the passband ends too soon.
* **aliasing rejection**: a sine above the lower rate's Nyquist (0.55, 0.6 and 0.75 of the
  lower rate) must vanish on the way down: output RMS relative to input RMS, in dB (more
  negative is better; -96 dB is below 16-bit quantisation). 0.55 is the hard one: it lies just
  past the band edge, inside any filter's transition band.
* **speed**: 10 s of mono float32 audio (``--seconds``) per conversion, median of
  ``--rounds`` interleaved calls each, and the ratio windowed-sinc / soxr (above 1: soxr is
  faster).

Output length is reported too: the old resampler returned ``floor(n * dst / src)`` frames,
soxr returns ``round(n * dst / src)`` (they differ by at most one frame).

A measurement, not a test: it exits 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import itertools
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import finish, load_average, say

CHAIN = (16000, 22050, 24000, 48000, 24000, 22050, 16000)
HOPS = ((16000, 8000), (16000, 24000), (16000, 48000), (22050, 16000), (22050, 44100), (24000, 16000), (24000, 48000))
EDGE_S = 0.05


def windowed_sinc(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """omni's resampler before soxr: Kaiser-windowed sinc (beta 8), 32 zero crossings each side
    at the lower rate, evaluated directly at every output time."""
    x = np.asarray(x, dtype=np.float64)
    n_out = math.floor(x.shape[0] * dst / src)
    cutoff = min(src, dst) / 2 / src
    half = 32
    width = math.ceil(half / (2 * cutoff))
    t = np.arange(n_out) * (src / dst)
    out = np.zeros((n_out, *x.shape[1:]), dtype=np.float64)
    block = 4096
    for start in range(0, n_out, block):
        tb = t[start : start + block]
        base = np.floor(tb).astype(np.int64)
        offsets = np.arange(-width + 1, width + 1)
        idx = base[:, None] + offsets[None, :]
        dist = tb[:, None] - idx
        kernel = 2 * cutoff * np.sinc(2 * cutoff * dist) * np.kaiser(2 * width, 8.0)[None, :]
        kernel = np.where((idx >= 0) & (idx < x.shape[0]), kernel, 0.0)
        out[start : start + block] = np.sum(kernel * x[np.clip(idx, 0, x.shape[0] - 1)], axis=1)
    return out.astype(np.float32)


def soxr_with(quality: str) -> Callable[[np.ndarray, int, int], np.ndarray]:
    import soxr

    def run(x: np.ndarray, src: int, dst: int) -> np.ndarray:
        return np.asarray(soxr.resample(x, src, dst, quality=quality), dtype=np.float32)

    return run


class Multisine:
    """A sum of sines, exactly known at any sample rate."""

    def __init__(self, freqs: np.ndarray, phases: np.ndarray, amps: np.ndarray) -> None:
        self.freqs, self.phases, self.amps = freqs, phases, amps

    @classmethod
    def tone(cls, hz: float, amplitude: float = 0.5) -> Multisine:
        return cls(np.array([hz]), np.array([0.3]), np.array([amplitude]))

    @classmethod
    def noise(cls, top_hz: float, count: int = 200, seed: int = 0) -> Multisine:
        rng = np.random.default_rng(seed)
        freqs = rng.uniform(20.0, top_hz, count)
        phases = rng.uniform(0, 2 * math.pi, count)
        probe = cls(freqs, phases, np.ones(count)).at(48000, 1.0)
        return cls(freqs, phases, np.full(count, 0.5 / float(np.max(np.abs(probe)))))

    def at(self, rate: int, seconds: float) -> np.ndarray:
        t = np.arange(int(seconds * rate)) / rate
        out = np.zeros_like(t)
        for f, p, a in zip(self.freqs, self.phases, self.amps, strict=True):
            out += a * np.sin(2 * math.pi * f * t + p)
        return out


def snr_db(got: np.ndarray, signal: Multisine, rate: int) -> float:
    n = got.shape[0]
    want = signal.at(rate, n / rate + 1.0)[:n]
    edge = int(EDGE_S * rate)
    err = got[edge:-edge].astype(np.float64) - want[edge:-edge]
    power = float(np.mean(want[edge:-edge] ** 2))
    return 10 * math.log10(power / max(float(np.mean(err**2)), 1e-30))


def rejection_db(got: np.ndarray, rate: int, input_rms: float) -> float:
    edge = int(EDGE_S * rate)
    rms = float(np.sqrt(np.mean(got[edge:-edge].astype(np.float64) ** 2)))
    return 20 * math.log10(max(rms, 1e-12) / input_rms)


def table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    say("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        say("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="audio length for the speed rows")
    parser.add_argument("--rounds", type=int, default=5, help="timed calls per resampler and conversion")
    parser.add_argument("--quick", action="store_true", help="3 s of audio, 3 rounds")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 3.0, 3
    import soxr

    started = time.perf_counter()
    resamplers: dict[str, Callable[[np.ndarray, int, int], np.ndarray]] = {
        "windowed-sinc": windowed_sinc,
        "soxr HQ": soxr_with("HQ"),
        "soxr VHQ": soxr_with("VHQ"),
    }
    names = list(resamplers)
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}, "
        f"soxr {soxr.__version__}",
        "load": load_average(),
    }
    say(f"resampling benchmark: {report['machine']}, load {report['load']}")
    say("omni uses: soxr HQ (soxr's default quality)\n")

    # -- chain
    seconds = 2.0
    signals = {"sine 1 kHz": Multisine.tone(1000.0), "noise to 6.4 kHz": Multisine.noise(0.4 * min(CHAIN))}
    report["chain"] = {}
    for label, signal in signals.items():
        say(f"chain SNR (dB), {label}, {' -> '.join(f'{r / 1000:g}k' for r in CHAIN)}")
        rows = []
        per: dict[str, list[float]] = {}
        for name in names:
            x = signal.at(CHAIN[0], seconds).astype(np.float32)
            figures = []
            for src, dst in itertools.pairwise(CHAIN):
                x = resamplers[name](x, src, dst)
                figures.append(snr_db(x, signal, dst))
            per[name] = figures
            rows.append([name, *(f"{v:.1f}" for v in figures)])
        table(["", *(f"->{r / 1000:g}k" for r in CHAIN[1:])], rows)
        report["chain"][label] = per
        say("")

    # -- single hops, band edge
    noise = Multisine.noise(0.4 * 8000)
    rows, report["hops"] = [], {}
    for src, dst in HOPS:
        edge_tone = Multisine.tone(0.45 * min(src, dst))
        row = [f"{src / 1000:g}k->{dst / 1000:g}k"]
        for name in names:
            x_noise = noise.at(src, seconds).astype(np.float32)
            x_edge = edge_tone.at(src, seconds).astype(np.float32)
            a = snr_db(resamplers[name](x_noise, src, dst), noise, dst)
            b = snr_db(resamplers[name](x_edge, src, dst), edge_tone, dst)
            report["hops"].setdefault(f"{src}->{dst}", {})[name] = {"noise_snr_db": a, "band_edge_snr_db": b}
            row += [f"{a:.1f}", f"{b:.1f}"]
        rows.append(row)
    say("single hops: SNR (dB) of band-limited noise (to 3.2 kHz) | of a sine at 0.45 x the lower rate")
    table(["hop", *(f"{n} {w}" for n in names for w in ("noise", "edge"))], rows)
    say("")

    # -- aliasing
    rows, report["aliasing"] = [], {}
    for src, dst in ((48000, 16000), (44100, 8000), (24000, 16000), (22050, 16000)):
        for share in (0.55, 0.6, 0.75):
            hz = share * dst
            x = Multisine.tone(hz).at(src, seconds).astype(np.float32)
            rms_in = float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))
            figures = {name: rejection_db(resamplers[name](x, src, dst), dst, rms_in) for name in names}
            report["aliasing"][f"{src}->{dst} {hz:.0f} Hz"] = figures
            rows.append([f"{src / 1000:g}k->{dst / 1000:g}k", f"{hz:.0f} Hz", *(f"{figures[n]:.1f}" for n in names)])
    say("aliasing rejection: output RMS / input RMS (dB) of a sine above the lower rate's Nyquist")
    table(["hop", "sine", *names], rows)
    say("")

    # -- speed
    rows, report["speed"] = [], {}
    for src, dst in (*HOPS, (48000, 16000), (44100, 24000)):
        x = Multisine.noise(0.4 * min(src, dst), count=20).at(src, args.seconds).astype(np.float32)
        times: dict[str, list[float]] = {n: [] for n in names}
        lengths = {n: resamplers[n](x, src, dst).shape[0] for n in names}  # warm-up
        for _ in range(args.rounds):
            for name in names:  # interleaved: a busy moment hits every resampler alike
                t0 = time.perf_counter()
                resamplers[name](x, src, dst)
                times[name].append(time.perf_counter() - t0)
        med = {n: statistics.median(times[n]) for n in names}
        report["speed"][f"{src}->{dst}"] = {"median_s": med, "frames": lengths}
        rows.append(
            [
                f"{src / 1000:g}k->{dst / 1000:g}k",
                *(f"{med[n] * 1000:.1f}" for n in names),
                f"{med['windowed-sinc'] / med['soxr HQ']:.0f}x",
                f"{med['windowed-sinc'] / med['soxr VHQ']:.0f}x",
                f"{lengths['windowed-sinc']}/{lengths['soxr HQ']}",
            ]
        )
    say(f"speed: ms per call on {args.seconds:g} s of mono float32, median of {args.rounds}")
    table(["hop", *(f"{n} ms" for n in names), "sinc/HQ", "sinc/VHQ", "frames sinc/soxr"], rows)
    say("")
    report["seconds"] = time.perf_counter() - started
    finish(report, args.json)


if __name__ == "__main__":
    main()
