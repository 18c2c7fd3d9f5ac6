#!/usr/bin/env python3
"""Qwen2.5-Omni's three stages end to end: where the time of an answer goes, stage by stage, and
how much sooner the first audio comes when the thinker streams its tokens to the talker.

Run with the dev venv (omni-plugin-qwen-omni installed)::

    .venv/bin/python benchmarks/omni_stages.py              # about 2 minutes on 2 CPUs
    .venv/bin/python benchmarks/omni_stages.py --quick      # about 1 minute
    .venv/bin/python benchmarks/omni_stages.py --json /tmp/omni_stages.json

What it does: writes the family's tiny random-weight checkpoint (seed 0) under ``.bench/``, then,
in this one run, answers the same chat request (text and audio, greedy thinker, the talker's
seeded defaults) in three ways, one request at a time:

* **processes, streaming**: ``Omni(model)`` with recipes/qwen2.5-omni.yaml's placement (each
  stage in a process of its own, the thinker's tokens handed to the talker one by one);
* **processes, at the end**: the same with the thinker's whole answer handed over when it ends
  (``window: -1`` on the thinker -> talker edge);
* **one process**: recipes/qwen2.5-omni-single-process.yaml's placement (threads).

For each: the whole answer's latency, the time to its first text and to its first audio, and
each stage's time (from the stage beginning the request to finishing it: with streaming edges
the stages overlap, so they add up to more than the whole). Medians over ``--rounds`` rounds
after a warm-up, rounds interleaved. The answers are checked equal across the ways (text and
every sample). A measurement, not a test: the exit code is 0 whatever the figures; the tiny
model's steps are cheap, so per-item overheads weigh more than they would on a real one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import finish, load_average, say

REPO = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "user", "content": "Say something short about the sea."}]
PLACEMENTS: dict[str, dict[str, Any]] = {
    "processes, streaming": {
        "defaults": {"placement": "process"},
        "edges": [{"from": "thinker", "to": "talker", "window": 1}],
    },
    "processes, at the end": {
        "defaults": {"placement": "process"},
        "edges": [{"from": "thinker", "to": "talker", "window": -1}],
    },
    "one process": {
        "defaults": {"placement": "inprocess"},
        "edges": [{"from": "thinker", "to": "talker", "window": 1}],
    },
}


def through_omni(model_dir: Path, placement: dict[str, Any], max_tokens: int) -> tuple[Any, Any]:
    from omni_core.pipeline.orchestrator import Pipeline
    from omni_core.pipeline.placement import plan_pipeline
    from omni_core.plugins import get_plugins

    pipeline = Pipeline(plan_pipeline(model_dir, recipe=placement), plugins=get_plugins()).start()

    def run() -> dict[str, Any]:
        start = time.perf_counter()
        first: dict[str, float] = {}
        text: list[str] = []
        audio: list[Any] = []
        params = {"thinker": {"max_tokens": max_tokens}, "talker": {"seed": 0}}  # the talker samples: one seed
        stream = pipeline.submit(MESSAGES, params=params, outputs=("text", "audio"))
        for chunk in stream:
            first.setdefault(chunk.modality, time.perf_counter() - start)
            (text if chunk.modality == "text" else audio).extend(chunk.items)
        total = time.perf_counter() - start
        return {
            "total": total,
            "first_text": first.get("text", total),
            "first_audio": first.get("audio", total),
            "stages": stream.stage_seconds,
            "answer": ("".join(text), audio),
        }

    return run, pipeline


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=24, help="the thinker's budget")
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    began = time.perf_counter()

    import torch

    torch.set_num_threads(1)  # one thread per process: the stage processes do the same (OMP_NUM_THREADS)
    import os

    os.environ["OMP_NUM_THREADS"] = "1"
    from omni_plugin_qwen_omni.model import QwenOmni

    model_dir = REPO / ".bench" / "omni-stages" / "tiny"
    if not (model_dir / "config.json").is_file():
        QwenOmni.make_tiny(model_dir, seed=0)
    load_before = load_average()
    say(f"[setup] tiny Qwen2.5-Omni at {model_dir}")
    ways: dict[str, Any] = {}
    closers = []
    for name, placement in PLACEMENTS.items():
        say(f"[setup] starting {name}")
        ways[name], pipeline = through_omni(model_dir, placement, args.max_tokens)
        closers.append(pipeline)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ways}
    for n in range(rounds + 1):  # round 0 warms up
        order = list(ways)[n % len(ways) :] + list(ways)[: n % len(ways)]
        for name in order:
            result = ways[name]()
            if n:
                runs[name].append(result)
        say(f"  round {n}/{rounds}" + (" (warm-up)" if n == 0 else ""))
    for pipeline in closers:
        pipeline.close()

    answers = [runs[name][0]["answer"] for name in runs]
    same = all(a[0] == answers[0][0] and len(a[1]) == len(answers[0][1]) for a in answers) and all(
        all(torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(a[1], answers[0][1], strict=True))
        for a in answers
    )
    report: dict[str, Any] = {"rounds": rounds, "max_tokens": args.max_tokens, "same_answers": same, "ways": {}}
    say("")
    say(f"Qwen2.5-Omni (tiny), text + audio, thinker max_tokens {args.max_tokens}, median of {rounds} rounds")
    say(f"load {load_before} -> {load_average()}; python {sys.version.split()[0]}, torch {torch.__version__}")
    say("")
    header = (
        f"  {'way':<24}{'total s':>9}{'first text':>12}{'first audio':>13}   stages (s: thinker, talker, token2wav)"
    )
    say(header)
    for name, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in ("total", "first_text", "first_audio")}
        stages = {
            s: statistics.median(r["stages"].get(s, 0.0) for r in results) for s in ("thinker", "talker", "token2wav")
        }
        report["ways"][name] = {**med, "stages": stages}
        split = ", ".join(f"{v:.3f}" for v in stages.values())
        say(f"  {name:<24}{med['total']:>9.3f}{med['first_text']:>12.3f}{med['first_audio']:>13.3f}   {split}")
    stream, end = report["ways"]["processes, streaming"], report["ways"]["processes, at the end"]
    say("")
    say(
        f"first audio, streaming thinker -> talker against hand-over at the end: {stream['first_audio']:.3f} s vs "
        f"{end['first_audio']:.3f} s ({end['first_audio'] / max(stream['first_audio'], 1e-9):.2f}x sooner)"
    )
    say(f"same answers in every way: {'yes' if same else 'NO'}")
    report["seconds"] = time.perf_counter() - began
    finish(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
