"""What several benchmarks share: quantiles and millisecond summaries of timings, the machine's
load, progress lines, the end of a run.

The scripts run as ``python benchmarks/X.py``: this directory is on ``sys.path`` (and on that
of the processes they spawn), so they import it as ``from bench_common import pct``."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1), linear between samples; p99 of a few dozen or hundred samples is near the max."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def stats_ms(seconds: list[float]) -> dict[str, float]:
    """p50, p99 and mean of timings in seconds, as milliseconds, and their count."""
    ms = [s * 1000 for s in seconds]
    return {"p50_ms": pct(ms, 0.5), "p99_ms": pct(ms, 0.99), "mean_ms": statistics.fmean(ms), "n": len(ms)}


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (none where the system has no such figure)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def say(text: str) -> None:
    print(text, flush=True)


def finish(report: dict[str, Any], json_path: Path | None) -> None:
    """The end of a run: its whole time (``report["seconds"]``), and the report written as JSON
    where ``--json`` asked for it."""
    say(f"(whole run: {report['seconds']:.0f} s)")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        say(f"wrote {json_path}")
