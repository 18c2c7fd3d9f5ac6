#!/usr/bin/env python3
"""Multi-stage pipeline benchmark: what the connectors cost against a memory copy, what the
orchestrator adds per hop, and what streaming edges buy, on the test pipeline.

Run with the repo's venv (it needs torch, omni-plugin-connectors and, for ``tcp``, omni-plugin-zmq)::

    .venv/bin/python benchmarks/pipeline.py                 # about 1 minute on 2 CPUs (make bench-pipeline)
    .venv/bin/python benchmarks/pipeline.py --quick         # about 35 seconds
    .venv/bin/python benchmarks/pipeline.py --json /tmp/pipeline.json --connectors shm,tcp

What it does, in one run:

1. **Connector throughput**, for payloads of 1 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB and 256 MiB
   (one uint8 torch tensor; a numpy array without torch). For every installed connector
   (``inprocess``, ``shm``, ``tcp``; one that is not installed is skipped, saying why), a
   producer puts the payload and this process gets it: ``get`` (the handle's payload decoded)
   and one byte of it read. For ``shm`` and ``tcp`` the producer is a spawned process, sent
   each handle over a ``multiprocessing`` pipe; for ``inprocess`` (one process only) it is a
   second instance in this process. Lockstep, one payload in flight: the producer times its
   ``put``, sends the handle and its time, and waits; this process times its ``get``, drops the
   payload and asks for the next. Each side times itself (no clock crosses a process), and
   neither competes with the other for the CPUs. total = put + get. Beside it, in this
   process and in the same run, interleaved with the connectors rep by rep, two copies of the
   same bytes, the two baselines: **memcpy (warm)**, into a preallocated, already touched
   buffer: the memory bandwidth, the hardware's ceiling, which no move to another process
   reaches; and **alloc+copy (new)**, ``bytearray(src)``: a new buffer, as a new Python object
   gets one, paying the kernel's page faults and zeroing, as every move to another process
   does (the receiving side, or the shared segment, needs new pages), so the fair floor of a
   transfer. Below glibc's mmap threshold, 32 MiB at most, the allocator hands back the memory
   just freed, so it is a warm copy there too. Ratios are speeds, connector / copy (0.5x: half
   as fast). ``read pages`` is informational: the time to
   then read one byte of every 4 KiB page of what ``get`` returned, which zero-copy connectors
   defer to the first reader.
   Medians over ``reps`` (fewer for large payloads), after warm-up reps.
2. **Orchestrator overhead per hop**: the test pipeline (``tokens -> hidden -> wave``,
   tests/fixtures/plugins/omni-fixture-pipeline) with tiny work (``max_tokens`` 4), all
   stages in this process (``inprocess``: threads, the inprocess connector) and each stage in
   its own spawned process (``process``: the shm connector), edges handing over at the end
   (window -1: the stages run one after the other) and streaming (window 1). Beside them, the
   same three stage classes called directly in this process (``stages.reference``'s recipe,
   with the stages built once): their compute. Rounds interleave every variant, the order
   rotating. Per request: latency p50 / p99, the overhead (latency minus that round's direct
   compute; p50), the hops (``Pipeline.hops``: the stage messages the orchestrator handled for
   the request) and the overhead per hop. With window 1 the stages overlap, so subtracting the
   sum of their compute understates the overhead (here the compute is tiny).
3. **Streaming against hand-over-at-end**: the same pipelines, ``max_tokens`` 32 with a
   ``delay_s`` of 0.02 per token in the tokens stage, audio only: time to the first audio item
   (``first_output_s``) and to the last (``total_s``); beside them, the stage classes called
   directly, chained as generators (streaming) and one after the other (lists). Ratios
   at-the-end / streaming.

The test pipeline is installed (``pip install --no-deps --target``, as the tests do) into
``.bench/pipeline/site-<hash of its files>`` (git ignores ``.bench``), once; its checkpoint
is made in a temporary directory. Every process runs torch with ``--threads`` intra-op
threads (1 by default: see benchmarks/serve.py; the copies here are single-threaded anyway).

It is a measurement, not a test: the exit code is 0 whatever the figures (non-zero only when
something fails). The table ends with the issue's goal and PASS or FAIL; the figures vary with
the load on the machine, which the header reports.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_common import finish, load_average, pct, say, stats_ms

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "plugins" / "omni-fixture-pipeline"
DEFAULT_CACHE = REPO / ".bench" / "pipeline"
KIB, MIB = 1 << 10, 1 << 20
SIZES = (1 * KIB, 64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
#: timed reps per size (full run, quick run); warm-up reps come on top
REPS = {
    1 * KIB: (200, 50),
    64 * KIB: (200, 50),
    1 * MIB: (100, 30),
    16 * MIB: (30, 8),
    64 * MIB: (12, 4),
    256 * MIB: (6, 3),
}
CONNECTORS = ("inprocess", "shm", "tcp")
PROMPT = "a short answer"
#: the bytes one "read pages" step reads apart
PAGE = 4096

#: the two copies the connectors are compared with: a memcpy into a warm buffer (the hardware's
#: ceiling) and an allocating copy (new pages, as a move to another process needs)
WARM, NEW = "memcpy (warm)", "alloc+copy (new)"

#: goal from the issue: shm at least this fast, relative to memcpy, from GOAL_FROM bytes up
GOAL_SHM_RATIO = 0.5
GOAL_FROM = 64 * MIB


# --------------------------------------------------------------------------- helpers


def size_name(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def ratio(value: float, width: int) -> str:
    """``0.52x``; a small ratio with two significant digits (``0.0031x``), not ``0.00x``."""
    text = f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"
    return f"{text}x".rjust(width)


def ms(value: float) -> str:
    """Milliseconds in 9 columns, with the digits a sub-microsecond copy needs."""
    return f"{value:9.3f}" if value >= 0.01 else f"{value:9.5f}"


def version_of(module: str) -> str:
    try:
        return str(__import__(module).__version__)
    except Exception:
        return "absent"


def thp_mode() -> str:
    """Transparent huge pages for anonymous memory: ``always``, ``madvise`` or ``never``."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "unknown"
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else text.strip()


def shm_size() -> str:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return "absent"
    return f"{st.f_blocks * st.f_frsize / 2**30:.1f} GiB"


# --------------------------------------------------------------------------- 1. connectors

#: the edge every connector measurement uses
EDGE_SOURCE, EDGE_TARGET = "producer", "consumer"


def make_payload(n: int) -> Any:
    """A uint8 tensor of ``n`` bytes (every page written), numpy without torch; the first and
    last byte are 1 and 2, for the consumer's check."""
    try:
        import torch

        payload: Any = torch.full((n,), 0x5A, dtype=torch.uint8)
    except ImportError:
        import numpy

        payload = numpy.full(n, 0x5A, dtype=numpy.uint8)
    payload[0], payload[-1] = 1, 2
    return payload


def byte_view(payload: Any) -> memoryview:
    """A 1-D byte view of a payload tensor or array (no copy)."""
    if hasattr(payload, "data_ptr"):  # a tensor: torch has no buffer protocol (and numpy may be absent)
        import ctypes

        memory = (ctypes.c_char * payload.numel()).from_address(payload.data_ptr())
        memory._bench_owner = payload  # keeps the tensor alive as long as the view
        return memoryview(memory).cast("B")
    return memoryview(payload).cast("B")


def touch_one(obj: Any) -> int:
    return int(obj[-1])


def read_pages(obj: Any) -> int:
    """Read one byte of every 4 KiB page (a strided sum: the pages, not the bytes)."""
    return int(obj[::PAGE].sum())


class LocalProducer:
    """The producer of the inprocess connector: a second instance in this process, driven as a
    :class:`~omni_core.testing.connectors.ConnectorProcess` is (the producer of the others)."""

    def __init__(self, cls: Any, run_id: str, extra: dict[str, Any]) -> None:
        from omni_core.pipeline.connector import ConnectorContext

        self.instance = cls(extra, ConnectorContext(run_id=run_id, owner=EDGE_SOURCE))
        self.kept: tuple[int, Any] | None = None

    def ready(self) -> int:
        return os.getpid()

    def put(self, edge: Any, rid: str, n: int, *, timeout: float) -> tuple[Any, float]:
        if self.kept is None or self.kept[0] != n:
            self.kept = None  # free the previous size first
            self.kept = (n, make_payload(n))
        start = time.perf_counter()
        handle = self.instance.put(edge, rid, self.kept[1], timeout=timeout)
        return handle, time.perf_counter() - start

    def stop(self) -> None:
        self.kept = None
        self.instance.close()


class Transport:
    """One connector under test: its producer (a spawned process, or for ``inprocess`` a second
    instance here) and this process's consumer instance."""

    def __init__(self, name: str, cls: Any, extra: dict[str, Any]) -> None:
        from omni_core.pipeline.connector import ConnectorContext, Edge
        from omni_core.testing.connectors import ConnectorProcess

        self.name = name
        self.run_id = f"bench{uuid.uuid4().hex[:8]}"
        self.same_process = bool(getattr(cls, "same_process_only", False))
        # never forked: this process has imported torch; the producer builds each size once
        # (make_payload) and keeps it while the size repeats
        self.producer: LocalProducer | ConnectorProcess = (
            LocalProducer(cls, self.run_id, extra)
            if self.same_process
            else ConnectorProcess(
                cls, self.run_id, extra, owner=EDGE_SOURCE, payloads=make_payload, answer_timeout=300, wait=False
            )
        )
        # this side owns the run: its close reclaims anything a producer left behind
        self.consumer = cls(extra, ConnectorContext(run_id=self.run_id, owner=EDGE_TARGET, is_owner=True))
        self.edge = Edge(EDGE_SOURCE, EDGE_TARGET)

    def wait_ready(self) -> None:
        try:
            self.producer.ready()
        except AssertionError as exc:
            raise SystemExit(f"the {self.name} producer failed to start: {exc}") from None

    def once(self, n: int, rid: str) -> dict[str, Any]:
        try:
            handle, put_s = self.producer.put(self.edge, rid, n, timeout=60.0)
        except AssertionError as exc:
            raise SystemExit(f"{self.name} put of {n:,} bytes failed: {exc}") from None
        start = time.perf_counter()
        payload = self.consumer.get(self.edge, rid, handle, timeout=60.0)
        last = touch_one(payload)
        get_s = time.perf_counter() - start
        start = time.perf_counter()
        read_pages(payload)
        read_s = time.perf_counter() - start
        if len(payload) != n or int(payload[0]) != 1 or last != 2:
            raise SystemExit(f"{self.name}: the payload of {n:,} bytes came back wrong")
        del payload
        return {"put": put_s, "get": get_s, "read": read_s, "nbytes": handle["nbytes"], "inline": "inline" in handle}

    def close(self) -> None:
        self.producer.stop()
        self.consumer.close()


def copy_times(src: memoryview, inner: int) -> tuple[float, float]:
    """Seconds per copy of ``src``: into a preallocated, touched buffer (memcpy), and into a new
    ``bytearray`` (alloc + copy); ``inner`` copies per timing, for payloads too small to time one."""
    dst = bytearray(len(src))
    target = memoryview(dst)
    target[:] = src  # touched once before timing
    start = time.perf_counter()
    for _ in range(inner):
        target[:] = src
    memcpy = (time.perf_counter() - start) / inner
    del target, dst
    start = time.perf_counter()
    for _ in range(inner):
        fresh = bytearray(src)
        del fresh
    fresh_s = (time.perf_counter() - start) / inner
    return memcpy, fresh_s


def connector_throughput(
    transports: list[Transport], sizes: tuple[int, ...], quick: bool, rep_override: int | None
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for n in sizes:
        reps = rep_override or REPS.get(n, (10, 3))[1 if quick else 0]
        warmup = 1 if n >= 64 * MIB else 2
        inner = max(1, min(200, 4 * MIB // n))
        src_payload = make_payload(n)
        src = byte_view(src_payload)
        samples: dict[str, list[dict[str, Any]]] = {t.name: [] for t in transports}
        copies: list[tuple[float, float]] = []
        labels = ["copy", *(t.name for t in transports)]
        started = time.perf_counter()
        for rep in range(warmup + reps):
            order = labels[rep % len(labels) :] + labels[: rep % len(labels)]
            for label in order:
                if label == "copy":
                    timed = copy_times(src, inner)
                    if rep >= warmup:
                        copies.append(timed)
                    continue
                transport = next(t for t in transports if t.name == label)
                sample = transport.once(n, f"s{n}r{rep}")
                if rep >= warmup:
                    samples[label].append(sample)
        memcpy = statistics.median(c[0] for c in copies)
        fresh = statistics.median(c[1] for c in copies)
        row: dict[str, Any] = {
            "bytes": n,
            "reps": reps,
            "memcpy_ms": memcpy * 1000,
            "alloc_copy_ms": fresh * 1000,
            "memcpy_mib_s": n / memcpy / MIB,
            "alloc_copy_mib_s": n / fresh / MIB,
            "connectors": {},
        }
        for transport in transports:
            done = samples[transport.name]
            totals = [s["put"] + s["get"] for s in done]
            total = statistics.median(totals)
            row["connectors"][transport.name] = {
                "put_ms": statistics.median(s["put"] for s in done) * 1000,
                "get_ms": statistics.median(s["get"] for s in done) * 1000,
                "total_ms": total * 1000,
                "total_p90_ms": pct(totals, 0.9) * 1000,
                "read_pages_ms": statistics.median(s["read"] for s in done) * 1000,
                "mib_s": n / total / MIB,
                "vs_memcpy": memcpy / total,
                "vs_alloc_copy": fresh / total,
                "encoded_bytes": done[0]["nbytes"],
                "inline": done[0]["inline"],
            }
        results[size_name(n)] = row
        del src, src_payload
        shares = ", ".join(f"{t.name} {ratio(row['connectors'][t.name]['vs_memcpy'], 0)}" for t in transports)
        say(f"  {size_name(n):>7}: {reps} reps in {time.perf_counter() - started:5.1f} s; vs memcpy: {shares}")
    return results


def open_transports(plugins: Any, wanted: list[str]) -> tuple[list[Transport], dict[str, str]]:
    transports: list[Transport] = []
    skipped: dict[str, str] = {}
    for name in wanted:
        if name not in plugins.connectors:
            skipped[name] = plugins.connectors.why_missing(name)
            continue
        try:
            cls = plugins.connectors.load(name)
        except Exception as exc:  # installed but its import fails (pyzmq missing)
            skipped[name] = f"cannot be loaded: {exc}"
            continue
        extra: dict[str, Any] = {}
        if name == "tcp":
            extra = {"max_buffered_bytes": 2 * max(SIZES)}  # one payload in flight; room for the largest
        transports.append(Transport(name, cls, extra))
    for transport in transports:
        transport.wait_ready()
    return transports, skipped


# --------------------------------------------------------------------------- the test pipeline


def fixture_site(cache: Path) -> Path:
    """The test pipeline installed into a site directory of its own and put on ``sys.path``
    (spawned stage processes get it too), once per version of its files."""
    from omni_core.testing import plugin_site

    try:
        return plugin_site(FIXTURE, cache)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"cannot install the test pipeline into {cache}:\n{exc.stdout}\n{exc.stderr}") from None


def placement(where: str, window: int) -> dict[str, Any]:
    return {"defaults": {"placement": where}, "edge_defaults": {"window": window}}


#: the pipelines parts 2 and 3 run: (label, placement, window)
VARIANTS = (
    ("inprocess, at the end", "inprocess", -1),
    ("inprocess, streaming", "inprocess", 1),
    ("process, at the end", "process", -1),
    ("process, streaming", "process", 1),
)


class Direct:
    """The three stage classes, built once in this process and called directly."""

    def __init__(self, model_dir: Path) -> None:
        from omni_fixture_pipeline.model import FixturePipeline
        from omni_fixture_pipeline.stages import HiddenStage, TokenStage, WaveStage

        defs = {s.name: s for s in FixturePipeline.topology_for(model_dir).stages}
        self.tokens = TokenStage(model_dir, defs["tokens"], {})
        self.hidden = HiddenStage(model_dir, defs["hidden"], {})
        self.wave = WaveStage(model_dir, defs["wave"], {})

    def one_after_the_other(self, params: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Each stage over the whole of the previous one's items (hand-over-at-end)."""
        start = time.perf_counter()
        tokens = list(self.tokens.run(iter([PROMPT]), params.get("tokens", {})))
        t1 = time.perf_counter()
        hidden = list(self.hidden.run(iter(tokens), params.get("hidden", {})))
        t2 = time.perf_counter()
        first = None
        wave = []
        for item in self.wave.run(iter(hidden), params.get("wave", {})):
            if first is None:
                first = time.perf_counter() - start
            wave.append(item)
        end = time.perf_counter()
        return {
            "total": end - start,
            "first": first,
            "stages": {"tokens": t1 - start, "hidden": t2 - t1, "wave": end - t2},
            "text": [self.tokens.for_output(t) for t in tokens],  # what the pipeline answers a client
            "audio": wave,
        }

    def chained(self, params: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The stages chained as generators: each item goes through all three at once (streaming)."""
        start = time.perf_counter()
        tokens = self.tokens.run(iter([PROMPT]), params.get("tokens", {}))
        hidden = self.hidden.run(tokens, params.get("hidden", {}))
        first = None
        count = 0
        for _ in self.wave.run(hidden, params.get("wave", {})):
            if first is None:
                first = time.perf_counter() - start
            count += 1
        return {"total": time.perf_counter() - start, "first": first, "items": count}


def start_pipelines(model_dir: Path, plugins: Any) -> dict[str, Any]:
    from omni_core.pipeline.orchestrator import Pipeline
    from omni_core.pipeline.placement import plan_pipeline

    pipelines: dict[str, Any] = {}
    try:
        for label, where, window in VARIANTS:
            resolved = plan_pipeline(model_dir, recipe=placement(where, window), plugins=plugins)
            pipelines[label] = Pipeline(resolved, plugins=plugins).start()
    except BaseException:
        for pipeline in pipelines.values():
            pipeline.close()
        raise
    return pipelines


def connectors_of(pipeline: Any) -> str:
    return ", ".join(sorted({e.connector for e in pipeline.resolved.edges}))


# --------------------------------------------------------------------------- 2. overhead per hop


def overhead(pipelines: dict[str, Any], direct: Direct, tokens: int, rounds: int, warmup: int) -> dict[str, Any]:
    from omni_fixture_pipeline.compare import same_items

    params = {"tokens": {"max_tokens": tokens}}
    want = direct.one_after_the_other(params)
    for label, pipeline in pipelines.items():  # correctness once, as the tests check it
        result = pipeline.run(PROMPT, params=params)
        if not (
            same_items(result.outputs["text"], want["text"]) and same_items(result.outputs["audio"], want["audio"])
        ):
            raise SystemExit(f"pipeline {label!r}: its outputs differ from the stage classes called directly")
    labels = ["direct", *pipelines]
    latency: dict[str, list[float]] = {label: [] for label in labels}
    hops: dict[str, list[int]] = {label: [] for label in pipelines}
    compute: list[float] = []
    stage_compute: dict[str, list[float]] = {"tokens": [], "hidden": [], "wave": []}
    for round_ in range(warmup + rounds):
        shift = round_ % len(labels)
        for label in labels[shift:] + labels[:shift]:
            if label == "direct":
                done = direct.one_after_the_other(params)
                if round_ >= warmup:
                    compute.append(done["total"])
                    for stage, seconds in done["stages"].items():
                        stage_compute[stage].append(seconds)
                continue
            pipeline = pipelines[label]
            before = pipeline.hops
            start = time.perf_counter()
            pipeline.run(PROMPT, params=params)
            elapsed = time.perf_counter() - start
            if round_ >= warmup:
                latency[label].append(elapsed)
                hops[label].append(pipeline.hops - before)
    report: dict[str, Any] = {
        "max_tokens": tokens,
        "rounds": rounds,
        "direct": stats_ms(compute),
        "direct_stages_p50_ms": {k: pct(v, 0.5) * 1000 for k, v in stage_compute.items()},
        "pipelines": {},
    }
    for label in pipelines:
        diffs = [lat - comp for lat, comp in zip(latency[label], compute, strict=True)]
        per_request_hops = statistics.median(hops[label])
        over = pct(diffs, 0.5)
        report["pipelines"][label] = {
            "connectors": connectors_of(pipelines[label]),
            "latency": stats_ms(latency[label]),
            "overhead": stats_ms(diffs),
            "hops": per_request_hops,
            "hops_range": [min(hops[label]), max(hops[label])],
            "per_hop_us": over / per_request_hops * 1e6 if per_request_hops else None,
        }
    return report


# --------------------------------------------------------------------------- 3. streaming


def streaming(pipelines: dict[str, Any], direct: Direct, tokens: int, delay: float, rounds: int) -> dict[str, Any]:
    params = {"tokens": {"max_tokens": tokens, "delay_s": delay}}
    labels = ["direct, chained", "direct, one after the other", *pipelines]
    first: dict[str, list[float]] = {label: [] for label in labels}
    total: dict[str, list[float]] = {label: [] for label in labels}
    for round_ in range(rounds + 1):  # round 0: warm-up
        shift = round_ % len(labels)
        for label in labels[shift:] + labels[:shift]:
            if label == "direct, chained":
                done = direct.chained(params)
                f, t = done["first"], done["total"]
            elif label == "direct, one after the other":
                done = direct.one_after_the_other(params)
                f, t = done["first"], done["total"]
            else:
                result = pipelines[label].run(PROMPT, params=params, outputs=("audio",))
                if len(result.outputs.get("audio", [])) != tokens:
                    raise SystemExit(f"pipeline {label!r}: {len(result.outputs.get('audio', []))} audio items")
                f, t = result.first_output_s, result.total_s
            if round_ and f is not None:
                first[label].append(f)
                total[label].append(t)
    rows = {
        label: {"first_ms": statistics.median(first[label]) * 1000, "total_ms": statistics.median(total[label]) * 1000}
        for label in labels
    }
    ratios = {}
    for where in ("inprocess", "process"):
        end, stream = rows[f"{where}, at the end"], rows[f"{where}, streaming"]
        ratios[where] = {
            "first_end_over_stream": end["first_ms"] / stream["first_ms"],
            "total_end_over_stream": end["total_ms"] / stream["total_ms"],
        }
    ratios["direct"] = {
        "first_end_over_stream": rows["direct, one after the other"]["first_ms"] / rows["direct, chained"]["first_ms"],
        "total_end_over_stream": rows["direct, one after the other"]["total_ms"] / rows["direct, chained"]["total_ms"],
    }
    return {"max_tokens": tokens, "delay_s": delay, "rounds": rounds, "rows": rows, "ratios": ratios}


# --------------------------------------------------------------------------- report


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    big = {k: v for k, v in report["connectors"].items() if v["bytes"] >= GOAL_FROM}
    if "shm" not in report["transports"] or not big:
        return rows
    for key, what in (("vs_memcpy", WARM), ("vs_alloc_copy", NEW)):
        values = {size: row["connectors"]["shm"][key] for size, row in big.items()}
        rows.append(
            {
                "goal": f"shm >= {GOAL_SHM_RATIO}x of {what} from {size_name(GOAL_FROM)} up",
                "value": ", ".join(f"{size} {v:.2f}x" for size, v in values.items()),
                "pass": all(v >= GOAL_SHM_RATIO for v in values.values()),
                "informational": key != "vs_memcpy",
            }
        )
    return rows


def print_report(report: dict[str, Any]) -> None:
    say("")
    say(
        f"omni pipeline benchmark: {report['cpus']} CPUs ({report['cpus_usable']} usable), python {report['python']}, "
        f"torch {report['torch']} with {report['torch_threads']} thread(s) per process, numpy {report['numpy']}, "
        f"pyzmq {report['pyzmq']}"
    )
    say(
        f"machine: {report['platform']}; /dev/shm {report['dev_shm']}; transparent huge pages {report['thp']}; "
        f"load average {report['load_average']['before']} -> {report['load_average']['after']}"
    )
    say(f"command: {report['command']}")
    say("")
    names = report["transports"]
    say(
        "1. Connector throughput: put in a producer (spawned; inprocess: this process), get + decode + one byte "
        "read here, lockstep"
    )
    for name, why in report["skipped"].items():
        say(f"   {name}: skipped ({why})")
    say(
        f"   {'size':>7} {'':<16} {'put ms':>9} {'get ms':>9} {'total ms':>9} {'MiB/s':>9} {'vs memcpy':>10} "
        f"{'vs alloc+copy':>14} {'read pages ms':>14}"
    )
    for size, row in report["connectors"].items():
        say(
            f"   {size:>7} {WARM:<16} {'':>9} {'':>9} {ms(row['memcpy_ms'])} {row['memcpy_mib_s']:9.0f} "
            f"{ratio(1.0, 10)} {ratio(row['memcpy_ms'] / row['alloc_copy_ms'], 14)}"
        )
        say(
            f"   {'':>7} {NEW:<16} {'':>9} {'':>9} {ms(row['alloc_copy_ms'])} "
            f"{row['alloc_copy_mib_s']:9.0f} {ratio(row['memcpy_ms'] / row['alloc_copy_ms'], 10)} {ratio(1.0, 14)}"
        )
        for name in names:
            c = row["connectors"][name]
            label = name + (" (inline)" if c["inline"] else "")
            say(
                f"   {'':>7} {label:<16} {c['put_ms']:9.3f} {c['get_ms']:9.3f} {c['total_ms']:9.3f} {c['mib_s']:9.0f} "
                f"{ratio(c['vs_memcpy'], 10)} {ratio(c['vs_alloc_copy'], 14)} {c['read_pages_ms']:14.3f}"
            )
    reps = ", ".join(f"{size} {row['reps']}" for size, row in report["connectors"].items())
    say(f"   medians over reps ({reps}); vs: speed ratio, connector / copy; inline: the payload rode in the handle")
    say("   baselines: the same bytes copied in this process, interleaved with the connectors rep by rep")
    say(f"   {WARM:<16}  into a buffer already faulted in: the memory bandwidth, the hardware's ceiling")
    say(
        f"   {NEW:<16}  into a new buffer (bytearray(src)), paying page faults and zeroing: moving a payload to another"
    )
    say(f"   {'':<16}  process always needs new pages (the receiver's, or the shared segment's): any transfer pays it")
    say(f"   {'':<16}  (under glibc's mmap threshold, 32 MiB at most, freed memory is reused: a warm copy there too)")
    say("")
    o = report["overhead"]
    d = o["direct_stages_p50_ms"]
    say(
        f"2. Orchestrator overhead: the test pipeline, max_tokens {o['max_tokens']}, text and audio, "
        f"{o['rounds']} rounds interleaved"
    )
    say(
        f"   direct (the stage classes called here): p50 {o['direct']['p50_ms']:.3f} ms "
        f"(tokens {d['tokens']:.3f}, hidden {d['hidden']:.3f}, wave {d['wave']:.3f}), "
        f"p99 {o['direct']['p99_ms']:.3f} ms"
    )
    say(
        f"   {'pipeline':<24} {'connector':<10} {'p50 ms':>8} {'p99 ms':>8} {'overhead ms':>12} {'hops':>5} "
        f"{'per hop us':>11}"
    )
    for label, row in o["pipelines"].items():
        per_hop = f"{row['per_hop_us']:11.0f}" if row["per_hop_us"] is not None else f"{'-':>11}"
        say(
            f"   {label:<24} {row['connectors']:<10} {row['latency']['p50_ms']:8.2f} {row['latency']['p99_ms']:8.2f} "
            f"{row['overhead']['p50_ms']:12.2f} {row['hops']:5.0f} {per_hop}"
        )
    say(
        "   overhead: p50 of (latency - that round's direct compute); hops: stage messages the orchestrator "
        "handled per request"
    )
    say("")
    s = report["streaming"]
    say(
        f"3. Streaming (window 1) against hand-over-at-end (window -1): max_tokens {s['max_tokens']}, "
        f"delay_s {s['delay_s']:g} per token, audio only, medians of {s['rounds']} rounds"
    )
    floor = s["max_tokens"] * s["delay_s"] * 1000
    say(f"   (the tokens stage alone sleeps {s['delay_s'] * 1000:.0f} ms before each token, {floor:.0f} ms in all)")
    say(f"   {'':<30} {'first audio ms':>15} {'last audio ms':>14}")
    for label, row in s["rows"].items():
        say(f"   {label:<30} {row['first_ms']:15.1f} {row['total_ms']:14.1f}")
    say(f"   {'at the end / streaming':<30} {'first audio':>15} {'last audio':>14}")
    for where, row in s["ratios"].items():
        say(f"   {where:<30} {row['first_end_over_stream']:14.1f}x {row['total_end_over_stream']:13.2f}x")
    say("")
    say("Goals")
    for line in report["goals"]:
        mark = verdict(line["pass"]) + (" (informational)" if line["informational"] else "")
        say(f"   {line['goal']:<48} {line['value']:>28}  {mark}")
    if not report["goals"]:
        say("   shm not measured at 64 MiB or more: no goal to check")


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer reps and rounds (about 35 seconds)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument(
        "--connectors", default=",".join(CONNECTORS), help=f"connectors to measure ({','.join(CONNECTORS)})"
    )
    parser.add_argument(
        "--max-size", type=int, default=max(SIZES), help=f"largest payload in bytes ({max(SIZES)}): smaller sizes only"
    )
    parser.add_argument("--reps", type=int, help="timed reps for every payload size (default: by size)")
    parser.add_argument("--rounds", type=int, help="overhead rounds (default 200; --quick 50)")
    parser.add_argument("--stream-rounds", type=int, help="streaming rounds (default 5; --quick 2)")
    parser.add_argument("--overhead-tokens", type=int, default=4, help="max_tokens of the overhead requests (4)")
    parser.add_argument("--stream-tokens", type=int, default=32, help="max_tokens of the streaming requests (32)")
    parser.add_argument("--delay-s", type=float, default=0.02, help="the tokens stage's sleep per token (0.02)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of every process (1; 0: torch's default, one per CPU)"
    )
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help=f"where the test pipeline is installed ({DEFAULT_CACHE})"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (50 if args.quick else 200)
    stream_rounds = args.stream_rounds or (2 if args.quick else 5)
    sizes = tuple(n for n in SIZES if n <= args.max_size)

    home = Path(tempfile.mkdtemp(prefix="omni-bench-pipeline-"))
    os.environ["OMNI_CACHE_DIR"] = str(home / "cache")
    os.environ["OMNI_CONFIG_DIR"] = str(home / "config")
    if args.threads > 0:
        # read by torch when it starts, here and in every spawned process (they inherit this environment)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)

    started = time.perf_counter()
    load_before = load_average()
    fixture_site(args.cache.resolve())

    import torch
    from omni_fixture_pipeline.model import FixturePipeline

    from omni_core.plugins import load_plugins

    plugins = load_plugins()
    wanted = [c.strip() for c in args.connectors.split(",") if c.strip()]
    transports, skipped = open_transports(plugins, wanted)
    names = ", ".join(t.name for t in transports) or "none"
    say(f"[setup] connectors: {names}; ready after {time.perf_counter() - started:.1f} s")
    for name, why in skipped.items():
        say(f"[setup] skipping connector {name}: {why}")
    try:
        say("[1/3] connector throughput")
        throughput = connector_throughput(transports, sizes, args.quick, args.reps)
    finally:
        for transport in transports:
            transport.close()

    model_dir = home / "model"
    FixturePipeline.make_tiny(model_dir)
    direct = Direct(model_dir)
    say("[2/3] starting the test pipeline four ways (inprocess / process, at the end / streaming)")
    pipelines = start_pipelines(model_dir, plugins)
    try:
        say(f"[2/3] overhead per hop, {rounds} rounds")
        overhead_report = overhead(pipelines, direct, args.overhead_tokens, rounds, warmup=10)
        say(f"[3/3] streaming against hand-over-at-end, {stream_rounds} rounds")
        streaming_report = streaming(pipelines, direct, args.stream_tokens, args.delay_s, stream_rounds)
    finally:
        for pipeline in pipelines.values():
            pipeline.close()
    shutil.rmtree(home, ignore_errors=True)

    report: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": version_of("numpy"),
        "pyzmq": version_of("zmq"),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "threads_option": args.threads,
        "dev_shm": shm_size(),
        "thp": thp_mode(),
        "load_average": {"before": load_before, "after": load_average()},
        "transports": [t.name for t in transports],
        "skipped": skipped,
        "connectors": throughput,
        "overhead": overhead_report,
        "streaming": streaming_report,
    }
    report["goals"] = goals(report)
    report["seconds"] = time.perf_counter() - started
    print_report(report)
    finish(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
