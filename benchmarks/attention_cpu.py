#!/usr/bin/env python3
"""CPU attention benchmark: wall time and peak memory of every CPU attention backend, as
ratios to TORCH_SDPA, side by side in one run.

Run with the repo's venv (it needs torch and the CPU plugin)::

    .venv/bin/python benchmarks/attention_cpu.py            # default sweep (a few minutes on 2 cores)
    .venv/bin/python benchmarks/attention_cpu.py --quick    # smaller sweep (about a minute)
    .venv/bin/python benchmarks/attention_cpu.py --json /tmp/attention_cpu.json

What it measures:

* **Backends**: discovered through ``omni_core.plugins.load_plugins()`` and the platform this
  machine selects: every registered attention backend that is available here and not lossy
  (TORCH_SDPA, REFERENCE_ATTN, CHUNKED_ATTN with the CPU plugin alone). ``--backends`` narrows
  the list; TORCH_SDPA is always kept as the baseline.
* **Shapes** (float32, ``(batch, seq, heads, head_dim)``, non-causal, no mask): diffusion-like
  self-attention with 24 heads, head_dim 64 and 128, seq 1024 to 8192, batch 1 (batch 2 up to
  seq 2048), and decode-like calls with one query against 1k to 8k keys (24 query heads over
  8 kv heads, GQA).
* **Peak memory**: each (shape, backend) pair runs once in a *fresh* subprocess. It builds the
  inputs, runs the backend once on a tiny input (so lazy imports, kernels and the thread pool
  are set up), then resets the kernel's peak-RSS counter (``echo 5 > /proc/self/clear_refs``,
  Linux >= 4.0) and runs the real call. The figure is ``VmHWM - VmRSS`` from
  ``/proc/self/status``: how far resident memory rose above what the process held just before
  the call (inputs included there, so the figure is the call's own working memory plus its
  output). This is memory the OS really handed out, whatever allocator torch uses. Where
  ``clear_refs`` cannot be written it falls back to the ``ru_maxrss`` increase, which can only
  under-report (the watermark may already be higher), and says so.
* **Wall time**: one more subprocess per shape holds every backend and times them interleaved
  (A, B, C, A, B, C, ...; the order rotates each round) after a warm-up round, so machine noise
  hits all backends alike. The figure is the median over the rounds: ``--repeats`` rounds
  (default 5), fewer for shapes whose calls are slow (at least 3, so that one shape takes about
  ``--seconds-per-case`` seconds), and no warm-up round for those. For the slowest shapes
  (three rounds would take over twice that budget) there are two rounds, and the memory run's
  call is the third sample. The fastest sample is shown too: on a busy machine it is the
  steadier figure. ``--threads N`` sets torch's threads in the workers (default: torch's own
  choice, one per core).
* **REFERENCE_ATTN** materialises the whole ``(batch, heads, seq_q, seq_k)`` score matrix a few
  times over (the product, the scaled scores, the probabilities); shapes where 3 float32 copies
  exceed ``--reference-budget-gib`` (default 6) are skipped with "skipped: would need N GiB".

It is a measurement, not a test: the exit code is 0 whatever the figures. The load average at
the start and the end is printed: on a shared 2-core machine other processes make the times
(and CHUNKED_ATTN's many short parallel regions in particular) noisy.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BASELINE = "TORCH_SDPA"
#: float32 copies of the score matrix REFERENCE_ATTN holds at its peak (product, scaled, probabilities)
REFERENCE_COPIES = 3
GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class Case:
    kind: str  # "diffusion" or "decode"
    batch: int
    seq_q: int
    seq_k: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def label(self) -> str:
        seq = f"S{self.seq_q}" if self.seq_q == self.seq_k else f"q{self.seq_q} kv{self.seq_k}"
        heads = f"H{self.heads}" if self.heads == self.kv_heads else f"H{self.heads}/{self.kv_heads}"
        return f"{self.kind:9} B{self.batch} {seq} {heads} D{self.head_dim}"

    @property
    def score_bytes(self) -> int:
        """One float32 (batch, heads, seq_q, seq_k) score matrix."""
        return self.batch * self.heads * self.seq_q * self.seq_k * 4


def sweep(quick: bool) -> list[Case]:
    if quick:
        diffusion = [(1, s, d) for d in (64,) for s in (1024, 2048, 4096)] + [(2, 1024, 128)]
        decode = [1024, 4096]
    else:
        diffusion = [(1, s, d) for d in (64, 128) for s in (1024, 2048, 4096, 8192)]
        diffusion += [(2, s, d) for d in (64, 128) for s in (1024, 2048)]
        decode = [1024, 2048, 4096, 8192]
    cases = [Case("diffusion", b, s, s, 24, 24, d) for b, s, d in diffusion]
    cases += [Case("decode", 1, 1, kv, 24, 8, 128) for kv in decode]
    return cases


# --- worker side (runs in fresh subprocesses) ----------------------------------------------------


def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _inputs(case: Case) -> tuple[Any, Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(case.batch, case.seq_q, case.heads, case.head_dim, generator=gen)
    k = torch.randn(case.batch, case.seq_k, case.kv_heads, case.head_dim, generator=gen)
    v = torch.randn(case.batch, case.seq_k, case.kv_heads, case.head_dim, generator=gen)
    return q, k, v


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def worker_memory(case: Case, ref: str) -> dict[str, Any]:
    """One call in this fresh process: how far resident memory rose, and how long it took."""
    import resource

    import torch

    backend = _load(ref)
    impl = backend.create(case.heads, case.head_dim, num_kv_heads=case.kv_heads)
    tiny = Case(case.kind, 1, min(case.seq_q, 8), 8, case.heads, case.kv_heads, case.head_dim)
    impl.forward(*_inputs(tiny))  # lazy imports, kernels and the thread pool, outside the figure
    q, k, v = _inputs(case)
    torch.set_grad_enabled(False)
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    exact = _reset_peak()
    rss_before = _status_kib("VmRSS")
    start = time.perf_counter()
    out = impl.forward(q, k, v)
    seconds = time.perf_counter() - start
    if exact and rss_before is not None:
        peak_kib = (_status_kib("VmHWM") or 0) - rss_before
        method = "VmHWM-VmRSS"
    else:
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - maxrss_before
        method = "ru_maxrss"
    assert tuple(out.shape) == tuple(q.shape)
    return {"peak_bytes": max(0, peak_kib) * 1024, "method": method, "cold_seconds": seconds}


def worker_time(case: Case, refs: dict[str, str], rounds: int, warmup: bool) -> dict[str, Any]:
    """Every backend in one process, timed interleaved; the order rotates each round."""
    import torch

    torch.set_grad_enabled(False)
    impls = {n: _load(r).create(case.heads, case.head_dim, num_kv_heads=case.kv_heads) for n, r in refs.items()}
    q, k, v = _inputs(case)
    names = list(impls)
    if warmup:
        for name in names:
            impls[name].forward(q, k, v)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            impls[name].forward(q, k, v)
            times[name].append(time.perf_counter() - start)
    return {"times": times}


def _worker_main(mode: str, payload: str) -> None:
    spec = json.loads(payload)
    case = Case(**spec["case"])
    if spec.get("threads"):
        import torch

        torch.set_num_threads(spec["threads"])
    if mode == "memory":
        result = worker_memory(case, spec["ref"])
    else:
        result = worker_time(case, spec["refs"], spec["rounds"], spec["warmup"])
    print(json.dumps(result))


# --- driver side ---------------------------------------------------------------------------------


def discover(only: list[str] | None) -> tuple[dict[str, str], dict[str, str]]:
    """(backend name -> class reference, name -> why left out) for the backends runnable here."""
    from omni_core.platforms import select_platform
    from omni_core.plugins import load_plugins

    plugins = load_plugins()
    machine = select_platform(plugins).instantiate()
    runnable: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for entry in plugins.attention_backends:
        if only and entry.name.upper() not in only and entry.name.upper() != BASELINE:
            continue
        try:
            cls = entry.load()
            availability = cls.availability(machine)
        except Exception as exc:
            left_out[entry.name] = f"failed to load: {exc}"
            continue
        if not availability.ok:
            left_out[entry.name] = availability.reason
        elif cls.lossy:
            left_out[entry.name] = "lossy"
        elif cls.unsupported_reason(dtype="float32", gqa=True):
            left_out[entry.name] = cls.unsupported_reason(dtype="float32", gqa=True)
        else:
            runnable[entry.name] = f"{cls.__module__}:{cls.__qualname__}"
    if BASELINE not in runnable:
        raise SystemExit(
            f"{BASELINE} is not runnable here ({left_out.get(BASELINE, 'not installed')}); nothing to compare"
        )
    ordered = {BASELINE: runnable.pop(BASELINE)}
    ordered.update(sorted(runnable.items()))
    return ordered, left_out


def _run_worker(mode: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, f"--worker-{mode}", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(case: Case, backends: dict[str, str], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    timed: dict[str, str] = {}
    for name, ref in backends.items():
        need = REFERENCE_COPIES * case.score_bytes
        if name == "REFERENCE_ATTN" and need > args.reference_budget_gib * GIB:
            results[name] = {"skipped": f"skipped: would need {need / GIB:.1f} GiB"}
            continue
        spec = {"case": asdict(case), "ref": ref, "threads": args.threads}
        results[name] = _run_worker("memory", spec, args.timeout)
        timed[name] = ref
    cold = sum(r["cold_seconds"] for r in results.values() if "cold_seconds" in r)
    rounds = max(3, min(args.repeats, int(args.seconds_per_case / max(cold, 1e-3))))
    # Very slow shapes: two timed rounds, and the memory run's call counts as the third sample.
    heavy = 3 * cold > 2 * args.seconds_per_case
    if heavy:
        rounds = 2
    warmup = cold * (rounds + 1) <= args.seconds_per_case
    spec = {"case": asdict(case), "refs": timed, "rounds": rounds, "warmup": warmup, "threads": args.threads}
    times = _run_worker("time", spec, args.timeout)["times"]
    for name, samples in times.items():
        if heavy:
            samples = [results[name]["cold_seconds"], *samples]
        results[name].update(seconds=statistics.median(samples), best_seconds=min(samples), samples=len(samples))
    return results


def growth(rows: list[tuple[Case, dict[str, dict[str, Any]]]]) -> str:
    """Each backend's peak memory above TORCH_SDPA's as the sequence grows, per shape family."""
    families: dict[tuple[str, int, int, int, int], list[tuple[int, dict[str, dict[str, Any]]]]] = {}
    for case, results in rows:
        key = (case.kind, case.batch, case.heads, case.kv_heads, case.head_dim)
        families.setdefault(key, []).append((case.seq_k, results))
    lines = ["peak memory above TORCH_SDPA's (MiB) as the sequence grows; flat means bounded by blocks, not seq^2:"]
    for (kind, batch, heads, kv_heads, dim), series in families.items():
        if len(series) < 2:
            continue
        seqs = " ".join(str(s) for s, _ in series)
        for name in series[0][1]:
            if name == BASELINE:
                continue
            cells = []
            for _, results in series:
                r, base = results[name], results[BASELINE]
                cells.append("skip" if "skipped" in r else f"{(r['peak_bytes'] - base['peak_bytes']) / MIB:.0f}")
            family = f"{kind} B{batch} H{heads}{'' if heads == kv_heads else f'/{kv_heads}'} D{dim}"
            lines.append(f"  {name:15} {family:24} seq {seqs}: {' '.join(cells)}")
    return "\n".join(lines)


def _fmt_ratio(value: float, base: float) -> str:
    return f"{value / base:7.2f}x" if base > 0 else "      -"


def render(rows: list[tuple[Case, dict[str, dict[str, Any]]]]) -> str:
    header = (
        f"{'shape':30} {'scores':>9}  {'backend':15} {'time ms':>10} {'x SDPA':>8} {'min ms':>10} "
        f"{'peak MiB':>9} {'x SDPA':>8} {'n':>3}"
    )
    lines = [header, "-" * len(header)]
    for case, results in rows:
        base = results[BASELINE]
        for i, (name, r) in enumerate(results.items()):
            shape = case.label if i == 0 else ""
            scores = f"{case.score_bytes / MIB:7.0f}Mi" if i == 0 else ""
            if "skipped" in r:
                lines.append(f"{shape:30} {scores:>9}  {name:15} {r['skipped']}")
                continue
            time_ratio = _fmt_ratio(r["seconds"], base["seconds"])
            peak_ratio = _fmt_ratio(r["peak_bytes"], base["peak_bytes"])
            lines.append(
                f"{shape:30} {scores:>9}  {name:15} {r['seconds'] * 1e3:10.1f} {time_ratio} "
                f"{r['best_seconds'] * 1e3:10.1f} "
                f"{r['peak_bytes'] / MIB:9.1f} {peak_ratio} {r['samples']:3}"
            )
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller sweep (seq up to 4096, head_dim 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per shape for fast shapes (default 5)")
    parser.add_argument(
        "--seconds-per-case", type=float, default=20.0, help="time budget that lowers the rounds of slow shapes"
    )
    parser.add_argument("--reference-budget-gib", type=float, default=6.0, help="skip REFERENCE_ATTN above this")
    parser.add_argument("--backends", help="comma-separated backend names to run besides TORCH_SDPA")
    parser.add_argument("--threads", type=int, help="torch threads in the workers (default: torch's own choice)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a worker is given up on")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--worker-memory", help=argparse.SUPPRESS)
    parser.add_argument("--worker-time", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_memory:
        _worker_main("memory", args.worker_memory)
        return 0
    if args.worker_time:
        _worker_main("time", args.worker_time)
        return 0

    import torch

    only = [b.strip().upper() for b in args.backends.split(",")] if args.backends else None
    backends, left_out = discover(only)
    cases = sweep(args.quick)
    threads = args.threads or torch.get_num_threads()
    print(f"{_cpu_model()}, {os.cpu_count()} logical CPUs; torch {torch.__version__} with {threads} threads")
    print(f"python {platform.python_version()}; load average {os.getloadavg()[0]:.2f} at the start")
    print(f"backends: {', '.join(backends)}")
    if left_out:
        print("left out: " + "; ".join(f"{n} ({why})" for n, why in left_out.items()))
    print("float32, non-causal, no mask; 'scores' is one float32 (B, H, Sq, Sk) score matrix; time = median of n")
    print("interleaved rounds (min ms: the fastest of them); peak = resident memory a fresh process gained during")
    print("one call (inputs excluded, output included)\n")
    rows = []
    started = time.perf_counter()
    for case in cases:
        print(f"  measuring {case.label} ...", file=sys.stderr, flush=True)
        rows.append((case, measure(case, backends, args)))
    print(render(rows))
    print()
    print(growth(rows))
    method = {r.get("method") for _, res in rows for r in res.values()} - {None}
    print(
        f"\nmemory method: {', '.join(sorted(method))}; load average {os.getloadavg()[0]:.2f} at the end; "
        f"{time.perf_counter() - started:.0f} s in all"
    )
    if args.json:
        args.json.write_text(
            json.dumps([{"case": asdict(c), "results": r} for c, r in rows], indent=2) + "\n", encoding="utf-8"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
