#!/usr/bin/env python3
"""Piper through omni against piper-tts called directly: real-time factor, time to the first
streamed chunk, and the start-up of ``omni speak`` with a Piper voice (named, and as the
default voice, without ``--model``).

Run with the repo's venv (it needs omni-plugin-piper and an installed voice package)::

    .venv/bin/python benchmarks/tts_piper.py                    # the joe voice, 9 rounds
    .venv/bin/python benchmarks/tts_piper.py --rounds 15 --json /tmp/piper.json
    .venv/bin/python benchmarks/tts_piper.py --quick            # fewer rounds, for a smoke run

What it measures, on the installed voice ``--voice`` (default ``joe``: en_US-joe-medium):

* **One sentence**: ``Omni.speak(text)`` (request validation, phonemes checked, the
  adapter's build, synthesis, WAV encoding) against what a user of piper-tts writes for the
  same text and settings: ``PiperVoice.synthesize(text, SynthesisConfig(...))`` with the
  settings omni runs (the voice's own ``length_scale``, the noise off), the chunks' float
  samples joined. Both use one ``PiperVoice`` each, loaded once; they run side by side in one
  process, interleaved (omni, direct; then direct, omni; ...) after a warm-up, and the figure
  is ``median(omni) / median(direct) - 1`` (the issue's limit: 3%). ``RTF`` is the median
  time over the audio's duration. ``same audio`` says whether both made the same samples.
* **Time to the first chunk** of three sentences: ``Omni.stream_speech`` against the direct
  ``synthesize`` generator's first chunk, interleaved the same way.
* **Start-up**: the whole ``omni speak TEXT --model VOICE -o FILE`` command as a user runs it
  (a new process each time: Python, omni, its plugins, the voice's load, one sentence,
  writing the file) against ``python -c`` doing the same with piper-tts directly (import,
  load, synthesize, write a WAV), interleaved.

onnxruntime keeps its default threads in both. A measurement, not a test: it exits 0 whatever
the figures, and prints a table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import finish, load_average, say

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
PARAGRAPH = (
    "Good morning, and welcome to the demonstration. "
    "This voice runs on the ONNX runtime, through a plugin. "
    "Each sentence is made and sent as soon as it is ready."
)
LIMIT = 0.03

DIRECT_SCRIPT = """
import sys, wave
import numpy as np
from piper import PiperVoice, SynthesisConfig
model, config, out, text, length_scale = sys.argv[1:6]
voice = PiperVoice.load(model, config_path=config)
syn = SynthesisConfig(length_scale=float(length_scale), noise_scale=0.0, noise_w_scale=0.0)
audio = np.concatenate([c.audio_float_array for c in voice.synthesize(text, syn_config=syn)])
pcm = (np.clip(audio, -1.0, 1.0) * 32767).round().astype("<i2").tobytes()
with wave.open(out, "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(voice.config.sample_rate); w.writeframes(pcm)
"""


def interleaved(pair: list[tuple[str, Callable[[], Any]]], rounds: int) -> dict[str, list[float]]:
    """Each call timed ``rounds`` times, the order swapped every round."""
    times: dict[str, list[float]] = {name: [] for name, _ in pair}
    for k in range(rounds):
        for name, call in pair if k % 2 == 0 else pair[::-1]:
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--voice", default="joe", help="an installed voice's name, or a .onnx file")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--startup-rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 start-up round")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.startup_rounds = 3, 1

    import numpy as np
    from piper import PiperVoice, SynthesisConfig

    from omni_core import Omni
    from omni_core.plugins import get_plugins
    from omni_core.speech.detection import locate_model

    began = time.perf_counter()
    identity = locate_model(get_plugins(), args.voice)
    model, config_path = Path(identity.config["piper_model"]), Path(identity.config["piper_config"])
    say(f"voice: {model.name} ({identity.claim}); load average {load_average()}")

    omni = Omni(model)
    voice = PiperVoice.load(str(model), config_path=str(config_path))
    length_scale = float(voice.config.length_scale)
    syn = SynthesisConfig(length_scale=length_scale, noise_scale=0.0, noise_w_scale=0.0)
    rate = voice.config.sample_rate

    def direct(text: str) -> Any:
        return np.concatenate([c.audio_float_array for c in voice.synthesize(text, syn_config=syn)])

    ours = omni.speak(SENTENCE).audio
    theirs = direct(SENTENCE)
    same = ours.sample_rate == rate and np.array_equal(ours.samples, theirs.astype(np.float32))
    seconds_of_audio = len(theirs) / rate

    say(f"one sentence ({seconds_of_audio:.2f} s of audio), {args.rounds} interleaved rounds ...")
    times = interleaved([("omni", lambda: omni.speak(SENTENCE)), ("direct", lambda: direct(SENTENCE))], args.rounds)
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = statistics.median(o / d for o, d in zip(times["omni"], times["direct"], strict=True))
    noise = (np.percentile(times["direct"], 90) - np.percentile(times["direct"], 10)) / med["direct"]

    def first_omni() -> None:
        next(iter(omni.stream_speech(PARAGRAPH)))  # the rest is dropped, as a client that stops would

    def first_direct() -> None:
        next(iter(voice.synthesize(PARAGRAPH, syn_config=syn)))

    say(f"time to the first chunk of three sentences, {args.rounds} rounds ...")
    ttfc = interleaved([("omni", first_omni), ("direct", first_direct)], args.rounds)
    ttfc_med = {k: statistics.median(v) for k, v in ttfc.items()}
    omni.close()

    say(f"start-up of a whole command, {args.startup_rounds} rounds each ...")
    omni_bin = Path(sys.executable).parent / "omni"
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
        env.update(OMNI_CONFIG_DIR=f"{tmp}/config", OMNI_CACHE_DIR=f"{tmp}/cache")
        out = f"{tmp}/x.wav"

        def run(cmd: list[str]) -> None:
            subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=tmp)

        cmd_omni = [str(omni_bin), "speak", "Hello there.", "--model", str(model), "-o", out]
        cmd_default = [str(omni_bin), "speak", "Hello there.", "-o", out]  # the default voice: found, then spoken
        cmd_direct = [sys.executable, "-c", DIRECT_SCRIPT, str(model), str(config_path), out, "Hello there.",
                      str(length_scale)]  # fmt: skip
        run(cmd_omni)  # warm the page cache and omni's plugin index
        startup = interleaved(
            [
                ("omni", lambda: run(cmd_omni)),
                ("default", lambda: run(cmd_default)),
                ("direct", lambda: run(cmd_direct)),
            ],
            2 * args.startup_rounds,
        )
        with wave.open(out) as w:
            assert w.getframerate() == rate
    start_med = {k: statistics.median(v) for k, v in startup.items()}

    overhead = med["omni"] / med["direct"] - 1
    rows = [
        ("one sentence: omni.speak", med["omni"], med["omni"] / seconds_of_audio),
        ("one sentence: piper-tts", med["direct"], med["direct"] / seconds_of_audio),
        ("first chunk: omni.stream_speech", ttfc_med["omni"], None),
        ("first chunk: piper-tts synthesize", ttfc_med["direct"], None),
        ("start-up: omni speak --model FILE", start_med["omni"], None),
        ("start-up: omni speak (default voice)", start_med["default"], None),
        ("start-up: python + piper-tts", start_med["direct"], None),
    ]
    say("")
    say(f"{'what':36} {'median s':>9} {'RTF':>7}")
    for what, secs, rtf in rows:
        say(f"{what:36} {secs:9.3f} {'' if rtf is None else f'{rtf:7.3f}':>7}")
    say("")
    say(
        f"overhead of omni.speak: {overhead * 100:+.1f}% (paired {100 * (paired - 1):+.1f}%, direct's own spread "
        f"p10-p90 {100 * noise:.1f}%); limit {100 * LIMIT:.0f}%: {'PASS' if overhead <= LIMIT else 'OVER'}"
    )
    say(f"first chunk: {100 * (ttfc_med['omni'] / ttfc_med['direct'] - 1):+.1f}% against piper-tts")
    say(
        f"start-up: omni speak {start_med['omni']:.2f} s, with the default voice {start_med['default']:.2f} s, "
        f"python + piper-tts {start_med['direct']:.2f} s ({start_med['omni'] / start_med['direct']:.2f}x, "
        f"{start_med['default'] / start_med['direct']:.2f}x)"
    )
    say(f"same audio: {same}")
    report = {
        "voice": model.name,
        "audio_s": seconds_of_audio,
        "speak": times,
        "first_chunk": ttfc,
        "startup": startup,
        "overhead": overhead,
        "same_audio": bool(same),
        "load_average": load_average(),
        "seconds": time.perf_counter() - began,
    }
    finish(report, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
