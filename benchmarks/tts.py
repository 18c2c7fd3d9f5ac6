#!/usr/bin/env python3
"""TTS benchmark: real-time factor of every installed TTS adapter on its tiny checkpoint, omni's
overhead against calling the transformers model directly, and time to the first streamed chunk.

Run with the repo's venv (it needs torch, transformers and the TTS plugins)::

    .venv/bin/python benchmarks/tts.py                       # every adapter with a make_tiny
    .venv/bin/python benchmarks/tts.py --families vits --rounds 9 --json /tmp/tts.json
    .venv/bin/python benchmarks/tts.py --quick               # fewer rounds, for a smoke run

What it measures, per adapter (``omni_core.plugins`` finds them; ``--families`` narrows):

* **Tiny RTF**: the adapter's own ``make_tiny`` checkpoint, opened with ``omni_core.Omni``; one
  sentence spoken ``--rounds`` times with the same seed after a warm-up call. RTF is the median
  wall time of ``Omni.speak`` divided by the duration of the audio it returns.
* **A checkpoint sized so one sentence takes about ``--target-s`` seconds (1.0)**. The tiny
  makers take no size parameters, so the benchmark runs the family's own maker with config
  overrides: while ``make_tiny`` runs, the family's transformers config class
  (``VitsConfig``, ``SpeechT5Config``, ``BarkConfig``) is replaced by a function that widens
  the layers by a scale factor (see ``SCALERS``), so the layout, tokenizer and any fix-ups the
  maker applies are kept. The scale starts at 1 (the tiny model) and is adjusted from the
  measured time (at most ``--calibrate`` tries) until a sentence takes 0.7x to 1.4x the target.
  A family without an entry in ``SCALERS`` is measured on its tiny checkpoint, and says so.
* **Overhead** on that checkpoint: ``Omni.speak(text, seed=S)`` (request validation,
  normalisation, the adapter's build, seeding, synthesis, WAV encoding) against the direct
  transformers call a user would write for the same text and seed (``DIRECT``: tokenise,
  ``torch.manual_seed(S)``, the model call with the same generation parameters, the waveform
  as a numpy array), both on the device omni selected. The two run side by side in one process,
  interleaved (omni, direct; then direct, omni; ...) after ``--warmup`` rounds, and the figure
  is ``median(omni) / median(direct) - 1`` (the limit is 3%). Beside it: ``paired`` (the
  median of the per-round ratios), ``best-of`` (``min(omni) / min(direct) - 1``), ``outside
  generate`` (the median share of an omni call spent outside the adapter's ``generate()``, timed
  inside the same call, so the noise between calls does not touch it: request parsing,
  validation, the adapter's build and tokenisation, seeding, encoding) and ``noise`` (``(p90 -
  p10) / median`` of the direct times: how far apart two identical calls land on this machine;
  an overhead smaller than that is within noise). The direct call's audio is compared with
  omni's (``same audio``): equal samples mean both did the same work.
* **Time to first chunk**: three sentences through ``Omni.stream_speech`` on the same
  checkpoint: time until the first chunk arrives against ``Omni.speak`` of the whole text.

Torch runs with ``--threads`` threads (default 1): on a small shared machine that keeps the
figures steady; pass 0 to leave torch's default. A measurement, not a test: it exits 0 whatever
the figures, and prints a table of ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: one sentence every tiny tokenizer takes in one piece (Bark's reads at most 48 tokens)
SENTENCE = "The quick brown fox jumps over the lazy dog."
#: three such sentences, for streaming
PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog. A bird sang in the old tall tree. We walked home as the sun set."
)
SEED = 1234
OVERHEAD_LIMIT = 0.03


# ---------------------------------------------------------------------------- sizing


def _even(value: float, multiple: int = 8) -> int:
    return max(multiple, round(value / multiple) * multiple)


def _vits(scale: float) -> dict[str, Any]:
    width = _even(16 * scale)
    return {
        "hidden_size": width,
        "ffn_dim": 2 * width,
        "flow_size": width,
        "upsample_initial_channel": _even(16 * scale, 16),
        "duration_predictor_filter_channels": width,
    }


def _speecht5(scale: float) -> dict[str, Any]:
    width = _even(32 * scale)
    return {
        "hidden_size": width,
        "encoder_ffn_dim": 2 * width,
        "decoder_ffn_dim": 2 * width,
        "speech_decoder_prenet_units": width,
        "speech_decoder_postnet_units": width,
    }


def _bark(scale: float) -> dict[str, Any]:
    gpt = {"hidden_size": _even(16 * scale)}
    return {"semantic_config": gpt, "coarse_acoustics_config": gpt, "fine_acoustics_config": gpt}


#: family -> (transformers config class its make_tiny builds, overrides for a width scale)
SCALERS: dict[str, tuple[str, Callable[[float], dict[str, Any]]]] = {
    "vits": ("VitsConfig", _vits),
    "speecht5": ("SpeechT5Config", _speecht5),
    "bark": ("BarkConfig", _bark),
}


@contextlib.contextmanager
def config_overrides(class_name: str, overrides: dict[str, Any]) -> Iterator[None]:
    """While active, ``from transformers import <class_name>`` builds configs with ``overrides``
    applied on top of what the caller passes (nested dicts are merged)."""
    import transformers

    original = getattr(transformers, class_name)

    def build(*args: Any, **kwargs: Any) -> Any:
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(kwargs.get(key), dict):
                kwargs[key] = {**kwargs[key], **value}
            else:
                kwargs[key] = value
        return original(*args, **kwargs)

    setattr(transformers, class_name, build)
    try:
        yield
    finally:
        setattr(transformers, class_name, original)


def make_checkpoint(adapter_cls: Any, family: str, directory: Path, scale: float) -> Path:
    shutil.rmtree(directory, ignore_errors=True)
    if scale == 1.0 or family not in SCALERS:
        return Path(adapter_cls.make_tiny(directory, seed=0))
    class_name, overrides = SCALERS[family]
    with config_overrides(class_name, overrides(scale)):
        return Path(adapter_cls.make_tiny(directory, seed=0))


# ---------------------------------------------------------------------------- direct calls


def _direct_vits(model_dir: Path, device: Any, sampling: dict[str, Any]) -> Callable[[str, int], Any]:
    import torch
    from transformers import VitsModel, VitsTokenizer

    tokenizer = VitsTokenizer.from_pretrained(model_dir)
    model = VitsModel.from_pretrained(model_dir).to(device).eval()

    def run(text: str, seed: int) -> Any:
        inputs = tokenizer(text, return_tensors="pt").to(device)
        torch.manual_seed(seed)
        with torch.inference_mode():
            waveform = model(**inputs).waveform
        return waveform[0].float().cpu().numpy()

    return run


def _direct_speecht5(model_dir: Path, device: Any, sampling: dict[str, Any]) -> Callable[[str, int], Any]:
    import torch
    from safetensors import safe_open
    from transformers import SpeechT5ForTextToSpeech, SpeechT5HifiGan, SpeechT5Processor

    processor = SpeechT5Processor.from_pretrained(model_dir)
    model = SpeechT5ForTextToSpeech.from_pretrained(model_dir).to(device).eval()
    vocoder = SpeechT5HifiGan.from_pretrained(model_dir, subfolder="vocoder").to(device).eval()
    with safe_open(str(model_dir / "voices.safetensors"), framework="pt") as f:
        order = json.loads((f.metadata() or {}).get("omni_voice_order", "null")) or sorted(f.keys())
        speaker = f.get_tensor(order[0]).float().reshape(1, -1).to(device)  # the default voice

    def run(text: str, seed: int) -> Any:
        input_ids = processor(text=text, return_tensors="pt")["input_ids"].to(device)
        torch.manual_seed(seed)
        with torch.inference_mode():
            spectrogram = model.generate_speech(
                input_ids,
                speaker,
                threshold=sampling["threshold"],
                minlenratio=sampling["minlenratio"],
                maxlenratio=sampling["maxlenratio"],
            )
            waveform = vocoder(spectrogram)
        return waveform.float().cpu().numpy().reshape(-1)

    return run


def _direct_bark(model_dir: Path, device: Any, sampling: dict[str, Any]) -> Callable[[str, int], Any]:
    import numpy as np
    import torch
    from transformers import BarkModel, BarkProcessor

    model = BarkModel.from_pretrained(model_dir, local_files_only=True).to(device).eval()
    processor = BarkProcessor.from_pretrained(model_dir, speaker_embeddings_dict_path=None)
    listing = json.loads((model_dir / "speaker_embeddings_path.json").read_text())
    voice = next(v for v in listing if v != "repo_or_path")  # the default voice
    preset = {key: np.load(model_dir / path) for key, path in listing[voice].items()}
    generation = json.loads((model_dir / "generation_config.json").read_text())
    max_length = generation["semantic_config"]["max_input_semantic_length"]

    def run(text: str, seed: int) -> Any:
        inputs = processor(text, voice_preset=preset, max_length=max_length, return_tensors="pt")
        history = {k: v.to(device) for k, v in inputs.pop("history_prompt").items()}
        torch.manual_seed(seed)
        with torch.inference_mode():
            waveform = model.generate(
                input_ids=inputs["input_ids"].to(device),
                attention_mask=inputs["attention_mask"].to(device),
                history_prompt=history,
                **sampling,
            )
        return np.clip(waveform[0].float().cpu().numpy(), -1.0, 1.0)

    return run


#: family -> builder of the direct transformers call, given the checkpoint, the device and the
#: adapter's default generation parameters (so both sides do the same work)
DIRECT: dict[str, Callable[[Path, Any, dict[str, Any]], Callable[[str, int], Any]]] = {
    "vits": _direct_vits,
    "speecht5": _direct_speecht5,
    "bark": _direct_bark,
}


# ---------------------------------------------------------------------------- measuring


@dataclass
class Row:
    family: str
    provider: str
    tiny_rtf: float | None = None
    tiny_speak_s: float | None = None
    scale: float = 1.0
    sized_note: str = ""
    sentence_s: float | None = None
    sized_rtf: float | None = None
    direct_s: float | None = None
    omni_s: float | None = None
    overhead: float | None = None
    paired_overhead: float | None = None
    #: min(omni) / min(direct) - 1
    best_overhead: float | None = None
    #: share of an omni call spent outside the adapter's generate() (runtime work)
    runtime_share: float | None = None
    #: (p90 - p10) / median of the direct times: the machine's noise
    spread: float | None = None
    same_audio: str = "-"
    ttfc_s: float | None = None
    full_s: float | None = None
    chunks: int | None = None
    calibration: list[tuple[float, float]] = field(default_factory=list)
    error: str = ""


def timed(call: Callable[[], Any], sync: Callable[[], None]) -> tuple[float, Any]:
    sync()
    start = time.perf_counter()
    result = call()
    sync()
    return time.perf_counter() - start, result


def speak_time(omni: Any, text: str, rounds: int, sync: Callable[[], None]) -> tuple[float, Any]:
    omni.speak(text, seed=SEED)  # warm-up
    times, result = [], None
    for _ in range(rounds):
        elapsed, result = timed(lambda: omni.speak(text, seed=SEED), sync)
        times.append(elapsed)
    return statistics.median(times), result


def bench(entry: Any, args: argparse.Namespace, workdir: Path) -> Row:
    import numpy as np

    from omni_core import Omni

    family = entry.name
    cls = entry.load()
    row = Row(family, f"{entry.provider.distribution} {entry.provider.version}")

    # tiny checkpoint: RTF
    tiny = make_checkpoint(cls, family, workdir / f"{family}-tiny", 1.0)
    with Omni(tiny) as omni:
        sync = omni.speech.platform.synchronize
        row.tiny_speak_s, result = speak_time(omni, SENTENCE, args.rounds, sync)
        row.tiny_rtf = row.tiny_speak_s / result.audio.duration
    print(f"  {family}: tiny RTF {row.tiny_rtf:.3f} ({row.tiny_speak_s * 1000:.1f} ms)", flush=True)

    # a checkpoint where one sentence takes about --target-s
    scale, model_dir, sentence_s = 1.0, tiny, row.tiny_speak_s
    row.calibration.append((1.0, sentence_s))
    if family not in SCALERS:
        row.sized_note = "no scaler: tiny checkpoint"
    for _ in range(args.calibrate if family in SCALERS else 0):
        if 0.7 * args.target_s <= sentence_s <= 1.4 * args.target_s or (scale == 1.0 and sentence_s > args.target_s):
            break
        # compute grows faster than linearly with width: step by the 1.5th root of the ratio
        scale = min(512.0, max(1.0, scale * (args.target_s / sentence_s) ** (1 / 1.5)))
        scale = round(scale, 2)
        model_dir = make_checkpoint(cls, family, workdir / f"{family}-x{scale:g}", scale)
        with Omni(model_dir) as omni:
            sentence_s, _ = speak_time(omni, SENTENCE, 2, omni.speech.platform.synchronize)
        row.calibration.append((scale, sentence_s))
        print(f"  {family}: scale {scale:g} -> {sentence_s:.2f} s per sentence", flush=True)
    row.scale = scale

    with Omni(model_dir) as omni:
        platform_ = omni.speech.platform
        sync = platform_.synchronize
        if family in DIRECT:
            direct = DIRECT[family](model_dir, platform_.device(), omni.speech.adapter.default_sampling())
            ours = omni.speak(SENTENCE, seed=SEED).audio.samples
            theirs = direct(SENTENCE, SEED)
            if ours.shape == theirs.shape:
                diff = float(np.max(np.abs(ours - theirs))) if ours.size else 0.0
                row.same_audio = "yes" if diff == 0.0 else f"max diff {diff:.1e}"
            else:
                row.same_audio = f"no: {ours.shape[0]} vs {theirs.shape[0]} samples"
            for _ in range(args.warmup):
                omni.speak(SENTENCE, seed=SEED)
                direct(SENTENCE, SEED)
            # time the adapter's generate() inside each omni call too: what omni does around it
            # (request, validation, build, seeding, encoding) is then measured within one call,
            # immune to the machine's noise between calls
            inner: list[float] = []
            generate = omni.speech.adapter.generate

            def timed_generate(prepared: Any, seed: int) -> Any:
                start = time.perf_counter()
                audio = generate(prepared, seed)
                sync()
                inner.append(time.perf_counter() - start)
                return audio

            omni.speech.adapter.generate = timed_generate  # type: ignore[method-assign]
            omni_times, direct_times = [], []
            for i in range(args.rounds):
                pair = [("omni", lambda: omni.speak(SENTENCE, seed=SEED)), ("direct", lambda: direct(SENTENCE, SEED))]
                for name, call in pair if i % 2 == 0 else reversed(pair):
                    elapsed, _ = timed(call, sync)
                    (omni_times if name == "omni" else direct_times).append(elapsed)
            omni.speech.adapter.generate = generate  # type: ignore[method-assign]
            row.omni_s, row.direct_s = statistics.median(omni_times), statistics.median(direct_times)
            row.overhead = row.omni_s / row.direct_s - 1
            row.paired_overhead = statistics.median([o / d - 1 for o, d in zip(omni_times, direct_times, strict=True)])
            row.best_overhead = min(omni_times) / min(direct_times) - 1
            row.runtime_share = statistics.median([(o - g) / o for o, g in zip(omni_times, inner, strict=True)])
            deciles = statistics.quantiles(direct_times, n=10)
            row.spread = (deciles[-1] - deciles[0]) / row.direct_s
            row.sentence_s = row.omni_s
        else:
            row.sentence_s, _ = speak_time(omni, SENTENCE, args.rounds, sync)
            row.same_audio = "no direct recipe"
        audio = omni.speak(SENTENCE, seed=SEED).audio
        row.sized_rtf = row.sentence_s / audio.duration

        # streaming: time to the first chunk against the whole utterance
        firsts, fulls = [], []
        for _ in range(max(2, args.rounds // 2)):
            start = time.perf_counter()
            stream = omni.stream_speech(PARAGRAPH, seed=SEED)
            next(stream)
            sync()
            firsts.append(time.perf_counter() - start)
            row.chunks = 1 + sum(1 for _ in stream)
            elapsed, _ = timed(lambda: omni.speak(PARAGRAPH, seed=SEED), sync)
            fulls.append(elapsed)
        row.ttfc_s, row.full_s = statistics.median(firsts), statistics.median(fulls)
    return row


# ---------------------------------------------------------------------------- report


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.2f}%"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [headers, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report(rows: list[Row]) -> str:
    out = [
        table(
            [
                "adapter",
                "tiny RTF",
                "tiny ms",
                "scale",
                "sentence ms",
                "RTF",
                "direct ms",
                "omni ms",
                "overhead",
                "paired",
                "best-of",
                "outside generate",
                "noise",
                "same audio",
            ],
            [
                [
                    r.family,
                    "-" if r.tiny_rtf is None else f"{r.tiny_rtf:.3f}",
                    _ms(r.tiny_speak_s),
                    f"{r.scale:g}" + (f" ({r.sized_note})" if r.sized_note else ""),
                    _ms(r.sentence_s),
                    "-" if r.sized_rtf is None else f"{r.sized_rtf:.3f}",
                    _ms(r.direct_s),
                    _ms(r.omni_s),
                    _pct(r.overhead),
                    _pct(r.paired_overhead),
                    _pct(r.best_overhead),
                    "-" if r.runtime_share is None else f"{r.runtime_share * 100:.2f}%",
                    "-" if r.spread is None else f"{r.spread * 100:.0f}%",
                    r.same_audio,
                ]
                for r in rows
                if not r.error
            ],
        ),
        "",
        table(
            ["adapter", "chunks", "first chunk ms", "whole ms", "first/whole"],
            [
                [
                    r.family,
                    str(r.chunks),
                    _ms(r.ttfc_s),
                    _ms(r.full_s),
                    "-" if not (r.ttfc_s and r.full_s) else f"{r.ttfc_s / r.full_s:.2f}",
                ]
                for r in rows
                if not r.error
            ],
        ),
    ]
    for r in rows:
        if r.error:
            out.append(f"{r.family}: failed: {r.error}")
    verdicts = []
    for r in rows:
        if r.overhead is not None:
            ok = r.overhead <= OVERHEAD_LIMIT
            verdicts.append(ok)
            out.append(
                f"{r.family}: omni overhead {_pct(r.overhead)} (medians) at {_ms(r.sentence_s)} ms per sentence "
                f"(limit +{OVERHEAD_LIMIT * 100:.0f}%): {'PASS' if ok else 'FAIL'}; omni's own work outside the "
                f"model call: {(r.runtime_share or 0) * 100:.2f}% of the call; noise between calls: "
                f"{(r.spread or 0) * 100:.0f}% of the direct median"
            )
    if verdicts:
        out.append(f"overall: {'PASS' if all(verdicts) else 'FAIL'}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="*", help="Adapters to measure (default: all with make_tiny).")
    parser.add_argument("--rounds", type=int, default=15, help="Timed rounds per figure (median).")
    parser.add_argument("--warmup", type=int, default=2, help="Untimed rounds before the overhead rounds.")
    parser.add_argument("--target-s", type=float, default=1.0, help="Seconds one sentence should take.")
    parser.add_argument("--calibrate", type=int, default=5, help="Tries to size the checkpoint.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default).")
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 warm-up: a smoke run.")
    parser.add_argument("--workdir", type=Path, help="Where checkpoints go (default: a temporary directory).")
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.warmup = 3, 1

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from omni_core.plugins import get_plugins
    from omni_core.speech.adapter import TTSAdapter

    if args.threads:
        torch.set_num_threads(args.threads)
    with contextlib.suppress(Exception):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    plugins = get_plugins()
    entries = []
    for entry in plugins.tts_adapters:
        if args.families and entry.name not in args.families:
            continue
        cls = entry.load()
        if getattr(cls.make_tiny, "__func__", None) is TTSAdapter.make_tiny.__func__:
            print(f"skipping {entry.name}: no make_tiny")
            continue
        entries.append(entry)
    print(
        f"python {platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; rounds {args.rounds}, target {args.target_s} s",
        flush=True,
    )
    rows = []
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="omni-tts-bench-")))
        for entry in entries:
            print(f"{entry.name} ...", flush=True)
            try:
                rows.append(bench(entry, args, workdir))
            except Exception as exc:  # one family failing must not hide the others
                rows.append(Row(entry.name, str(entry.provider), error=f"{type(exc).__name__}: {exc}"))
    print(f"\nload at the end {os.getloadavg()[0]:.2f}\n")
    print(report(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    sys.exit(main())
