#!/usr/bin/env python3
"""GPU attention benchmark: each CUDA attention backend against TORCH_SDPA, on DiT shapes.

Run on a machine with an NVIDIA GPU, in an environment holding a CUDA build of torch,
``omni-core``, ``omni-plugin-cpu`` and ``omni-plugin-cuda`` (plus whichever kernel packages
you want measured: flash-attn, flashinfer-python, sageattention, sageattn3)::

    python benchmarks/gpu_attention.py [--warmup 5] [--iters 20] [--quick]
                                       [--backends FLASH_ATTN,CUDNN_ATTN] [--json OUT]

What it does:

1. Loads omni's plugins and selects the platform the way ``omni`` does. Without a CUDA GPU
   (no CUDA build of torch, no visible device, or another platform wins) it prints why and
   exits 0: there is nothing to measure.
2. For shapes batch 1-2, sequence 1k-8k (self-attention, q = k = v length), 24 heads,
   head_dim 64 and 128, bfloat16 (``--quick``: batch 1, sequences 1k and 4k), it runs every
   CUDA backend that the platform reports available and that supports the shape
   (``availability`` / ``unsupported_reason``, exactly what the selector asks), plus
   TORCH_SDPA as the reference, each through omni's attention contract: ``create()`` then
   ``forward()`` on ``(batch, seq, heads, head_dim)`` tensors.
3. Times ``--iters`` calls after ``--warmup`` discarded ones with ``torch.cuda.Event`` pairs
   (GPU time of each call) and reports the median, the speed-up over TORCH_SDPA (SDPA median
   / backend median, > 1 is faster), TFLOP/s, and the max abs difference from SDPA's output.
   Lossy backends (SAGE_ATTN, SAGE_ATTN_3) are expected to differ more.

It is a measurement, not a test: the exit code is 0 whatever the figures; a backend that
fails on a shape is reported on its row and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from typing import Any

CUDA_BACKENDS = ("FLASH_ATTN", "FLASHINFER_ATTN", "CUDNN_ATTN", "TRTLLM_ATTN", "SAGE_ATTN", "SAGE_ATTN_3")
REFERENCE = "TORCH_SDPA"
HEADS = 24
DTYPE = "bfloat16"


@dataclass
class Row:
    backend: str
    batch: int
    seq: int
    head_dim: int
    status: str  # "ok", "skipped" or "failed"
    median_ms: float | None = None
    speedup_vs_sdpa: float | None = None
    tflops: float | None = None
    max_abs_diff: float | None = None
    note: str = ""


def shapes(quick: bool) -> list[tuple[int, int, int]]:
    batches, seqs = ((1,), (1024, 4096)) if quick else ((1, 2), (1024, 2048, 4096, 8192))
    return [(b, s, d) for d in (64, 128) for b in batches for s in seqs]


def cuda_platform() -> tuple[Any, str]:
    """The selected platform when it is a CUDA one with a device, else (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if torch.version.cuda is None:
        return None, f"torch {torch.__version__} is not a CUDA build"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
    from omni_core.platforms import explain_platform
    from omni_core.plugins import load_plugins

    plugins = load_plugins()
    choice, explanation = explain_platform(plugins)
    if choice is None or choice.name != "cuda":
        return None, "omni does not select the cuda platform here:\n" + explanation.render()
    return (plugins, choice.instantiate()), ""


def time_call(fn: Any, warmup: int, iters: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run(args: argparse.Namespace) -> list[Row]:
    found, why = cuda_platform()
    if found is None:
        print(f"gpu_attention: no CUDA GPU to benchmark: {why}")
        return []
    import torch

    plugins, platform = found
    registry = plugins.attention_backends
    wanted = [b.strip().upper() for b in args.backends.split(",")] if args.backends else list(CUDA_BACKENDS)
    print(
        f"platform {platform.name}: {platform.device_name(0)}, sm_{''.join(map(str, platform.compute_capability()))}, "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    )
    classes: dict[str, Any] = {}
    for name in [REFERENCE, *wanted]:
        if name not in registry:
            print(f"  {name}: not registered ({registry.why_missing(name)})")
            continue
        cls = registry.get(name).load()
        available = cls.availability(platform)
        if not available.ok:
            print(f"  {name}: unavailable: {available.reason}")
            continue
        classes[name] = cls
    if REFERENCE not in classes:
        print("gpu_attention: TORCH_SDPA (omni-plugin-cpu) is needed as the reference")
        return []

    rows: list[Row] = []
    dtype = getattr(torch, DTYPE)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for batch, seq, head_dim in shapes(args.quick):
        q, k, v = (
            torch.randn(batch, seq, HEADS, head_dim, device="cuda", dtype=dtype, generator=gen) for _ in range(3)
        )
        flops = 4 * batch * HEADS * seq * seq * head_dim
        ref_impl = classes[REFERENCE].create(HEADS, head_dim)
        ref_out = ref_impl.forward(q, k, v).float()
        ref_ms = time_call(lambda impl=ref_impl, q=q, k=k, v=v: impl.forward(q, k, v), args.warmup, args.iters)
        rows.append(Row(REFERENCE, batch, seq, head_dim, "ok", ref_ms, 1.0, flops / ref_ms / 1e9, 0.0))
        for name, cls in classes.items():
            if name == REFERENCE:
                continue
            reason = cls.unsupported_reason(head_size=head_dim, dtype=DTYPE)
            if reason:
                rows.append(Row(name, batch, seq, head_dim, "skipped", note=reason))
                continue
            try:
                impl = cls.create(HEADS, head_dim)
                out = impl.forward(q, k, v)
                diff = (out.float() - ref_out).abs().max().item()
                ms = time_call(lambda impl=impl, q=q, k=k, v=v: impl.forward(q, k, v), args.warmup, args.iters)
            except Exception as exc:  # a kernel that fails on one shape must not end the run
                rows.append(Row(name, batch, seq, head_dim, "failed", note=f"{type(exc).__name__}: {exc}"[:200]))
                continue
            note = "lossy" if cls.lossy else ""
            kernel = getattr(impl, "kernel", None)
            note = ", ".join(filter(None, [note, f"kernel {kernel}" if kernel else ""]))
            rows.append(Row(name, batch, seq, head_dim, "ok", ms, ref_ms / ms, flops / ms / 1e9, diff, note))
        del q, k, v, ref_out
        torch.cuda.empty_cache()
    return rows


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'backend':<16} {'B':>2} {'seq':>5} {'D':>4} {'median ms':>10} {'vs SDPA':>8} {'TFLOP/s':>8} "
        f"{'max|diff|':>10}  note"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        if r.status != "ok":
            print(f"{r.backend:<16} {r.batch:>2} {r.seq:>5} {r.head_dim:>4} {r.status:>10}  {r.note}")
            continue
        print(
            f"{r.backend:<16} {r.batch:>2} {r.seq:>5} {r.head_dim:>4} {r.median_ms:>10.3f} {r.speedup_vs_sdpa:>7.2f}x "
            f"{r.tflops:>8.1f} {r.max_abs_diff:>10.2e}  {r.note}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=5, help="discarded calls per case (default 5)")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per case (default 20)")
    parser.add_argument("--quick", action="store_true", help="batch 1, sequences 1k and 4k only")
    parser.add_argument("--backends", default="", help="comma-separated subset of " + ", ".join(CUDA_BACKENDS))
    parser.add_argument("--json", default="", help="also write the rows to this file as JSON")
    args = parser.parse_args(argv)
    rows = run(args)
    if rows:
        print_table(rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([asdict(r) for r in rows], fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
