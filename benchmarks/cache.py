#!/usr/bin/env python3
"""Step caching against no cache: speed-up and similarity to the uncached output, per family,
at two thresholds, side by side in one run.

Run with the repo's venv (it needs the family plugins and a cache backend plugin)::

    .venv/bin/python benchmarks/cache.py                      # teacache, 3 rounds, 20 steps
    .venv/bin/python benchmarks/cache.py --backend cache_dit --json /tmp/cache.json
    .venv/bin/python benchmarks/cache.py --quick              # 1 round, for a smoke run

What it measures, for FLUX.1 (schnell), Wan 2.1 T2V and Qwen-Image:

* the checkpoint is the family's tiny one with a **wider, deeper transformer** (random weights,
  ``--layers`` blocks of ``--heads`` heads), so that the transformer is most of a step's time
  as it is in a real model, and one uncached image takes about a second here; it is written
  once under ``.bench/cache/`` (git ignores it) and loaded through ``from_pretrained``;
* per family, interleaved rounds of: no cache, the backend at the lower threshold, at the
  higher one (each its own ``Omni``, opened once); the median wall time of ``generate``;
* the speed-up (uncached median / cached median), the steps reused, and the cached output's
  similarity to the uncached one: PSNR (dB) and SSIM (mean over channels, 7x7 box windows).

Random weights change the picture of "similar": the outputs are noise-like, so a PSNR here is
a lower bound of what a trained model's smooth images give. The speed-up is the honest part:
it is bounded by the fraction of a step the blocks take (embeddings, the VAE and the text
encoders always run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / ".bench" / "cache"
FAMILIES = {
    # family -> (request fields, the transformer config keys that set its depth)
    "flux1-schnell": ({"width": 256, "height": 256}, ("num_layers", "num_single_layers")),
    "wan2.1-t2v": ({"width": 128, "height": 128, "num_frames": 9}, ("num_layers",)),
    "qwen-image": ({"width": 256, "height": 256}, ("num_layers",)),
}
#: each backend's threshold option, the two settings compared, and options both runs share
#: (cache-dit's default warmup, 8 steps, leaves little of 20 to reuse, and its default 8 always-computed
#: first blocks, shrunk to fit the 8-block lists here, leave one block to skip)
THRESHOLDS: dict[str, tuple[str, tuple[float, float], dict[str, Any]]] = {
    "teacache": ("rel_l1_thresh", (0.4, 1.0), {}),
    "cache_dit": ("residual_diff_threshold", (0.2, 0.6), {"max_warmup_steps": 2, "Fn_compute_blocks": 1}),
}


def say(text: str) -> None:
    print(text, flush=True)


def make_checkpoint(family: str, layers: int, heads: int) -> Path:
    """The family's tiny checkpoint with its transformer widened to ``heads`` heads and
    deepened to ``layers`` blocks (head size and everything else as the tiny one's)."""
    from omni_core.plugins import get_plugins
    from omni_core.quiet import quiet_libraries

    directory = ROOT / f"{family}-{layers}x{heads}"
    if (directory / "model_index.json").is_file():
        return directory
    scratch = directory.with_name(directory.name + ".partial")
    if scratch.exists():
        import shutil

        shutil.rmtree(scratch)
    get_plugins().models.load(family).make_tiny(scratch, seed=0)
    config_path = scratch / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    for key in FAMILIES[family][1]:
        config[key] = layers
    config["num_attention_heads"] = heads
    if "ffn_dim" in config:
        config["ffn_dim"] = 4 * heads * int(config["attention_head_dim"])
    import diffusers
    import torch

    torch.manual_seed(0)
    cls = getattr(diffusers, config["_class_name"])
    with quiet_libraries():
        transformer = cls.from_config({k: v for k, v in config.items() if not k.startswith("_")})
        transformer.save_pretrained(str(scratch / "transformer"), safe_serialization=True)
    scratch.rename(directory)
    return directory


def _box(x: Any, size: int) -> Any:
    """Mean over ``size`` x ``size`` windows (valid positions), by integral images."""
    import numpy as np

    c = np.cumsum(np.cumsum(np.pad(x, ((1, 0), (1, 0))), axis=0), axis=1)
    total = c[size:, size:] - c[:-size, size:] - c[size:, :-size] + c[:-size, :-size]
    return total / (size * size)


def ssim(a: Any, b: Any, size: int = 7) -> float:
    """Structural similarity of two stacks of uint8 images or frames (... x H x W x C), the mean
    over images and channels."""
    import numpy as np

    a = a.reshape((-1, *a.shape[-3:])).astype(np.float64)  # every image or frame, H x W x C
    b = b.reshape((-1, *b.shape[-3:])).astype(np.float64)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    scores = []
    for x, y in zip(a, b, strict=True):
        for ch in range(x.shape[-1]):
            p, q = x[..., ch], y[..., ch]
            mp, mq = _box(p, size), _box(q, size)
            vp, vq = _box(p * p, size) - mp**2, _box(q * q, size) - mq**2
            cov = _box(p * q, size) - mp * mq
            s = ((2 * mp * mq + c1) * (2 * cov + c2)) / ((mp**2 + mq**2 + c1) * (vp + vq + c2))
            scores.append(float(s.mean()))
    return float(np.mean(scores))


def psnr(a: Any, b: Any) -> float:
    import numpy as np

    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def pixels(result: Any) -> Any:
    import numpy as np

    if result.videos:
        return np.stack([v.frames for v in result.videos])
    return np.stack([image.pixels for image in result.images])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="teacache", choices=sorted(THRESHOLDS))
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="1 round")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    import torch

    from omni_core import Omni

    torch.set_num_threads(max(1, torch.get_num_threads()))
    option, thresholds, shared = THRESHOLDS[args.backend]
    began = time.perf_counter()
    report: dict[str, Any] = {"backend": args.backend, "steps": args.steps, "families": {}}
    rows = []
    for family in args.families.split(","):
        fields, _ = FAMILIES[family]
        model = make_checkpoint(family, args.layers, args.heads)
        request = {"prompt": "a red fox in snow", "seed": 0, "num_inference_steps": args.steps, **fields}
        variants: dict[str, Any] = {"no cache": Omni(model, progress=False)}
        for value in thresholds:
            variants[f"{option}={value}"] = Omni(
                model, progress=False, cache=args.backend, cache_config={option: value, **shared}
            )
        try:
            for omni in variants.values():  # warm up: first-call allocations, lazy imports
                omni.generate(request)
            times: dict[str, list[float]] = {name: [] for name in variants}
            outputs: dict[str, Any] = {}
            order = list(variants)
            for k in range(args.rounds):
                for name in order if k % 2 == 0 else order[::-1]:
                    start = time.perf_counter()
                    result = variants[name].generate(request)
                    times[name].append(time.perf_counter() - start)
                    outputs[name] = result
        finally:
            for omni in variants.values():
                omni.close()
        base = statistics.median(times["no cache"])
        reference = pixels(outputs["no cache"])
        family_report = {"model": str(model), "uncached_s": base, "variants": {}}
        rows.append((family, "no cache", base, 1.0, "-", "-", "-"))
        for name in order[1:]:
            med = statistics.median(times[name])
            cache = outputs[name].metadata.cache
            got = pixels(outputs[name])
            entry = {
                "median_s": med,
                "speedup": base / med,
                "reused": len(cache["reused"]),
                "psnr": psnr(got, reference),
                "ssim": ssim(got, reference),
                "times": times[name],
            }
            family_report["variants"][name] = entry
            rows.append(
                (family, name, med, base / med, f"{entry['reused']}/{args.steps}", f"{entry['psnr']:.1f}",
                 f"{entry['ssim']:.3f}")
            )  # fmt: skip
        report["families"][family] = family_report
    say("")
    say(f"{'family':14} {'setting':30} {'median s':>9} {'speed-up':>9} {'reused':>7} {'PSNR dB':>8} {'SSIM':>6}")
    for family, name, secs, speedup, reused, p, s in rows:
        say(f"{family:14} {name:30} {secs:9.3f} {speedup:8.2f}x {reused:>7} {p:>8} {s:>6}")
    report["seconds"] = time.perf_counter() - began
    say(f"(whole run: {report['seconds']:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
