#!/usr/bin/env python3
"""Image generation benchmark: ``Omni(...).generate`` against calling the diffusers pipeline
directly, on the same checkpoint, seed and attention kernel, side by side in one process.

Run with the repo's venv (it needs torch, diffusers and the family plugin)::

    .venv/bin/python benchmarks/generate.py                         # flux1-schnell, ~1 s per image
    .venv/bin/python benchmarks/generate.py --family sd3 --rounds 9 --json /tmp/gen.json
    .venv/bin/python benchmarks/generate.py --quick

What it measures:

* **The checkpoint**: the family's own tiny checkpoint (``make_tiny``), at an image size
  calibrated so one image takes about ``--target-s`` seconds (1.0) here: the size starts at
  128 px and is scaled from the measured time (at most ``--calibrate`` tries).
* **Direct**: the call a diffusers user writes: ``Pipeline.from_pretrained(dir)`` and
  ``pipe(**kwargs, generator=torch.Generator().manual_seed(S), output_type="np")`` with the
  same arguments omni passes (the family's ``call_kwargs``), progress bars off. Its attention
  is torch's SDPA, which is what omni's ``TORCH_SDPA`` backend calls: the same kernel.
* **omni**: ``Omni(dir, attention_backend="TORCH_SDPA", progress=False).generate(prompt,
  seed=S, width=W, height=H)``: request validation against the family's profile, seeding,
  the pipeline call with attention routed through omni's backend, conversion to uint8.
* Interleaved rounds (omni, direct; then direct, omni; ...) after ``--warmup`` rounds. The
  overhead is ``median(omni) / median(direct) - 1`` (limit 3%); beside it ``paired`` (median
  of per-round ratios), ``noise`` ((p90 - p10) / median of the direct times) and ``outside
  the pipeline call`` (wall time of ``generate`` minus the pipeline call it timed, per call,
  on the tiny checkpoint at its smallest size: limit 1 ms). ``same pixels`` compares the two
  outputs: equal means both did the same work.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPT = "a red fox in snow"


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="flux1-schnell")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--target-s", type=float, default=1.0)
    parser.add_argument("--calibrate", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 warm-up")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.warmup = 3, 1

    import numpy as np
    import torch

    from omni_core import Omni
    from omni_core.plugins import get_plugins

    plugins = get_plugins()
    family = plugins.models.load(args.family)
    workdir = Path(tempfile.mkdtemp(prefix="omni-bench-gen-"))
    ckpt = workdir / args.family
    family.make_tiny(ckpt, seed=0)
    (ckpt / "omni-tiny.json").write_text(json.dumps({"family": args.family, "random_weights": True}))
    multiple = family.profile.size_multiple

    pipe = family.pipeline_type().from_pretrained(str(ckpt), dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    omni = Omni(ckpt, attention_backend="TORCH_SDPA", progress=False, plugins=plugins)

    def direct(size: int) -> tuple[float, Any]:
        resolved = family.profile.resolve(_request(PROMPT, args.seed, size))
        kwargs = family.call_kwargs(resolved, pipe)
        start = time.perf_counter()
        with torch.inference_mode():
            out = pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(args.seed), output_type="np")
        pixels = (np.clip(out.images[0], 0, 1) * 255).round().astype(np.uint8)
        return time.perf_counter() - start, pixels

    def via_omni(size: int) -> tuple[float, Any, float]:
        start = time.perf_counter()
        result = omni.generate(PROMPT, seed=args.seed, width=size, height=size)
        wall = time.perf_counter() - start
        return wall, result.images[0].pixels, wall - result.metadata.seconds

    # the per-call cost outside the pipeline, on the tiny checkpoint at its smallest size
    small = max(multiple * 2, 32)
    for _ in range(args.warmup):
        via_omni(small)
    outside_tiny = [via_omni(small)[2] for _ in range(max(5, args.rounds))]

    size = max(multiple * 8, 128)
    for _ in range(args.calibrate):
        seconds = min(direct(size)[0] for _ in range(2))
        if 0.7 * args.target_s <= seconds <= 1.4 * args.target_s:
            break
        size = max(multiple, round(size * (args.target_s / seconds) ** 0.5 / multiple) * multiple)
    for _ in range(args.warmup):
        direct(size), via_omni(size)
    t_direct: list[float] = []
    t_omni: list[float] = []
    outside: list[float] = []
    same = True
    for i in range(args.rounds):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for which in order:
            if which == 0:
                wall, pixels, out = via_omni(size)
                t_omni.append(wall)
                outside.append(out)
                omni_pixels = pixels
            else:
                wall, pixels = direct(size)
                t_direct.append(wall)
                direct_pixels = pixels
        same = same and bool(np.array_equal(omni_pixels, direct_pixels))

    med_o, med_d = statistics.median(t_omni), statistics.median(t_direct)
    report = {
        "family": args.family,
        "size": f"{size}x{size}",
        "steps": family.profile.default_steps,
        "rounds": args.rounds,
        "direct_median_s": round(med_d, 4),
        "omni_median_s": round(med_o, 4),
        "overhead_pct": round((med_o / med_d - 1) * 100, 2),
        "paired_pct": round((statistics.median(o / d for o, d in zip(t_omni, t_direct, strict=True)) - 1) * 100, 2),
        "noise_pct": round((_quantile(t_direct, 0.9) - _quantile(t_direct, 0.1)) / med_d * 100, 2),
        "outside_pipeline_ms": round(statistics.median(outside) * 1e3, 3),
        "outside_pipeline_tiny_ms": round(statistics.median(outside_tiny) * 1e3, 3),
        "tiny_size": f"{small}x{small}",
        "same_pixels": same,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}",
        "torch": torch.__version__,
    }
    width = max(len(k) for k in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    omni.close()
    return 0


def _request(prompt: str, seed: int, size: int) -> Any:
    from omni_core.generation.request import GenerationRequest

    return GenerationRequest(prompt=prompt, seed=seed, width=size, height=size)


if __name__ == "__main__":
    sys.exit(main())
