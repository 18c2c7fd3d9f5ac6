#!/usr/bin/env python3
"""``omni serve`` benchmark: what the server adds per request, what batching buys, and whether
``/health`` stays quick under load, on the embedded tiny defaults.

Run with the repo's venv (it starts ``omni serve`` from the same ``bin/`` directory)::

    .venv/bin/python benchmarks/serve.py                      # about 2.5 minutes on 2 CPUs (make bench-serve)
    .venv/bin/python benchmarks/serve.py --quick              # about 1 minute
    .venv/bin/python benchmarks/serve.py --json /tmp/serve.json --shape 64x64:2

What it does, in one run:

* makes the embedded defaults once (cached under ``.bench/serve/cache``, which git ignores)
  and starts two real ``omni serve`` processes with no ``--model`` and the piper plugin
  disabled (so they serve ``tiny-image`` and the fallback voice ``tiny-voice``: the overhead is
  the server's, measured against a model that costs little), exactly as ``tests/serving.py``
  starts them: one with
  batching off (``--max-batch 1``), one with the defaults (``--max-batch 8 --batch-wait-ms 5``).
  The same two checkpoints are opened in this process with ``Omni(...)``, as an offline user
  would (the server's own options: ``progress=False``).
1. **Overhead per request**: the same request (``--overhead-shape``, fixed seed) N times,
   sequentially, round-robin between ``Omni.generate`` here and ``POST /v1/images/generations``
   on each server (one keep-alive ``httpx.Client``, the answer's JSON decoded), the order
   rotating every round; the same for speech (``Omni.speak`` vs ``POST /v1/audio/speech``,
   WAV both ways). The overhead is the p50 (and p99) of the per-round differences (HTTP
   minus offline): it holds everything the server adds (HTTP, validation, the worker hand-off,
   PNG and base64 encoding for images, the client's decoding). The server's own log splits it:
   ``total_ms - run_ms`` (the server's time outside the model job).
2. **Throughput**: 1, 8 and 32 concurrent closed-loop clients (asyncio, one ``httpx`` pool,
   each client sends its next request when its answer arrives, distinct seeds), a fixed number
   of requests per run, after a warm-up of one request per client. Each concurrency runs as a
   back-to-back pair, batching off and on (the order alternating), ``--load-rounds`` times
   (twice as many pairs at 1 client, whose runs are short); the on/off ratio is the median of
   the pairs' ratios. Beside it, the batch sizes the server's log reports. The request
   (``--shape``) is 128x128 with 4 steps by default: the schnell family's own step count at the
   smallest size a real thumbnail uses. Before that, in this process and without a server, the
   shape runs as 8 single ``generate`` calls and as one ``generate_batch`` of 8: the most
   batching can give on this model and machine (the full run probes three other shapes too).
3. **/health under load**: a separate process polls ``/health`` every ``--health-interval-ms``
   while the 8-client runs go (and, for reference, on an idle server): p50 and p99.

Every process (both servers and this one) runs torch with ``--threads`` intra-op threads, 1 by
default: on a 2-CPU machine shared by three processes (and whatever else runs), two-thread
parallel regions stall whenever one of their threads is descheduled, and the same request
then takes anywhere from 1x to 40x its time; one thread each keeps the comparison about the
server. ``--threads 0`` leaves torch's default (one per CPU).

It is a measurement, not a test: the exit code is 0 whatever the figures (non-zero only when a
server cannot start or a request fails). The table ends with each goal of the issue and PASS
or FAIL; the figures vary with the load on the machine, which the header reports.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import finish, load_average, say, stats_ms

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = REPO / ".bench" / "serve"
PROMPTS = ("a red fox in snow", "a lighthouse at dusk", "a bowl of ramen", "a cat on a windowsill")
SPEECH_TEXT = "Hello there, this is a test."
CONCURRENCY = (1, 8, 32)
#: shapes the full run probes at the pipeline level (in this process): which one batching helps
PROBE_SHAPES = ("64x64:2", "64x64:4", "128x128:2", "128x128:4")

#: goals from the issue
GOAL_OVERHEAD_MS = 5.0
GOAL_COST_1 = 0.97  # batching on / off at 1 client: costs at most 3%
GOAL_GAIN_8 = 1.5  # at 8 clients: at least 1.5x images/s


# --------------------------------------------------------------------------- helpers


def parse_shape(text: str) -> tuple[int, int, int]:
    """``WxH:STEPS`` -> (W, H, STEPS)."""
    size, _, steps = text.partition(":")
    width, _, height = size.partition("x")
    try:
        return int(width), int(height), int(steps or 2)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WxH:STEPS, like 128x128:4") from None


def shape_name(shape: tuple[int, int, int]) -> str:
    return f"{shape[0]}x{shape[1]}, {shape[2]} steps"


def image_body(shape: tuple[int, int, int], seed: int, prompt: str = PROMPTS[0]) -> dict[str, Any]:
    width, height, steps = shape
    return {
        "model": "tiny-image",
        "prompt": prompt,
        "size": f"{width}x{height}",
        "num_inference_steps": steps,
        "seed": seed,
    }


def speech_body(seed: int) -> dict[str, Any]:
    return {"model": "tiny-voice", "input": SPEECH_TEXT, "voice": "default", "seed": seed, "response_format": "wav"}


# --------------------------------------------------------------------------- servers


def start_servers(home: Path, cache: Path) -> dict[str, Any]:
    """Both servers, started at once and waited for (as tests/serving.py's start_server does)."""
    sys.path.insert(0, str(REPO / "tests"))
    from serving import launch, server_env  # the tests' own launcher: `omni serve --port P ARGS` in a fresh env

    flags = {"off": ["--max-batch", "1"], "on": ["--max-batch", "8", "--batch-wait-ms", "5"]}
    servers = {
        mode: launch(args, home=home / mode, env=server_env(home / mode, cache, OMNI_DISABLE_PLUGINS="piper"))
        for mode, args in flags.items()
    }
    deadline = time.monotonic() + 300
    for mode, server in servers.items():
        while not server.ready.wait(0.2):
            if server.proc.poll() is not None or time.monotonic() > deadline:
                for other in servers.values():
                    other.kill()
                raise SystemExit(
                    f"omni serve ({mode}) did not become ready (exit {server.proc.returncode}):\n"
                    f"{server.stdout}\n{server.stderr[-4000:]}"
                )
    return servers


def server_log(server: Any, endpoint: str) -> list[dict[str, Any]]:
    return [e for e in server.access_log() if e.get("endpoint") == endpoint]


# --------------------------------------------------------------------------- 1. overhead


def overhead(
    offline: Any, clients: dict[str, Any], servers: dict[str, Any], kind: str, rounds: int, warmup: int, shape: Any
) -> dict[str, Any]:
    """Sequential: each round runs offline, HTTP (off), HTTP (on) in a rotating order."""
    if kind == "image":
        endpoint = "/v1/images/generations"
        width, height, steps = shape
        fields = {"prompt": PROMPTS[0], "width": width, "height": height, "num_inference_steps": steps, "seed": 0}
        body = image_body(shape, 0)

        def run_offline() -> None:
            result = offline.generate(dict(fields))
            assert result.images and result.images[0].pixels.shape[:2] == (height, width)

        def check(answer: Any) -> None:
            data = answer.json()["data"]
            assert len(data) == 1 and data[0]["b64_json"], answer.text[:200]
    else:
        endpoint = "/v1/audio/speech"
        body = speech_body(0)

        def run_offline() -> None:
            result = offline.speak(SPEECH_TEXT, seed=0)
            assert result.data[:4] == b"RIFF"

        def check(answer: Any) -> None:
            assert answer.content[:4] == b"RIFF", answer.text[:200]

    def via(mode: str) -> Any:
        def run() -> None:
            answer = clients[mode].post(endpoint, json=body)
            if answer.status_code != 200:
                raise SystemExit(f"{endpoint} on the {mode} server: {answer.status_code} {answer.text[:500]}")
            check(answer)

        return run

    runs = {"offline": run_offline, "http_off": via("off"), "http_on": via("on")}
    labels = list(runs)
    times: dict[str, list[float]] = {label: [] for label in labels}
    logged = {mode: len(server_log(s, endpoint)) for mode, s in servers.items()}
    for round_ in range(warmup + rounds):
        order = labels[round_ % 3 :] + labels[: round_ % 3]
        for label in order:
            start = time.perf_counter()
            runs[label]()
            elapsed = time.perf_counter() - start
            if round_ >= warmup:
                times[label].append(elapsed)
    # the server's own split: its time outside the model job, per request (warm-up excluded)
    time.sleep(0.2)  # the server writes a request's log line just after its answer
    inside: dict[str, Any] = {}
    for mode, server in servers.items():
        entries = server_log(server, endpoint)[logged[mode] + warmup :]
        outside = [(e["total_ms"] - e["run_ms"]) / 1000 for e in entries if e.get("status") == 200]
        run = [e["run_ms"] / 1000 for e in entries if e.get("status") == 200]
        queue = [e["queue_ms"] / 1000 for e in entries if e.get("status") == 200]
        inside[mode] = {"outside_job": stats_ms(outside), "run": stats_ms(run), "queue": stats_ms(queue)}
    diffs = {
        mode: [h - o for h, o in zip(times[f"http_{mode}"], times["offline"], strict=True)] for mode in ("off", "on")
    }
    return {
        "rounds": rounds,
        "times": {label: stats_ms(samples) for label, samples in times.items()},
        "difference": {mode: stats_ms(d) for mode, d in diffs.items()},
        "difference_of_medians_ms": {
            mode: (statistics.median(times[f"http_{mode}"]) - statistics.median(times["offline"])) * 1000
            for mode in ("off", "on")
        },
        "server_log": inside,
        "samples_ms": {label: [t * 1000 for t in samples] for label, samples in times.items()},
    }


def png_cost(offline: Any, shape: tuple[int, int, int], rounds: int = 50) -> float:
    """Median ms to PNG- and base64-encode one image of ``shape`` (what the server adds per image)."""
    import base64

    from omni_core.generation.media import png_bytes

    width, height, steps = shape
    result = offline.generate(PROMPTS[0], width=width, height=height, num_inference_steps=steps, seed=0)
    meta = result.metadata.to_dict()
    pixels = result.images[0].pixels
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        base64.b64encode(png_bytes(pixels, meta))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


# --------------------------------------------------------------------------- pipeline-level batching


def pipeline_gain(offline: Any, shape: tuple[int, int, int], rounds: int) -> dict[str, float]:
    """8 single generate calls vs one generate_batch of 8, in this process: the ceiling of what
    the server's batching can give for this shape (medians over ``rounds``, after a warm-up)."""
    width, height, steps = shape
    requests = [
        {"prompt": PROMPTS[i % len(PROMPTS)], "width": width, "height": height, "num_inference_steps": steps, "seed": i}
        for i in range(8)
    ]
    offline.generate(dict(requests[0]))
    offline.generate_batch(requests)
    singles, batches = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for request in requests:
            offline.generate(dict(request))
        singles.append((time.perf_counter() - start) / 8)
        start = time.perf_counter()
        offline.generate_batch(requests)
        batches.append((time.perf_counter() - start) / 8)
    single, batched = statistics.median(singles), statistics.median(batches)
    return {"single_ms": single * 1000, "batched_ms_per_image": batched * 1000, "gain": single / batched}


# --------------------------------------------------------------------------- 2 and 3. load


HEALTH_POLLER = """
import json, sys, time, httpx
url, interval = sys.argv[1], float(sys.argv[2])
samples = []
stop = []
import threading
threading.Thread(target=lambda: (sys.stdin.read(), stop.append(1)), daemon=True).start()
with httpx.Client(timeout=30) as client:
    client.get(url)
    print("polling", flush=True)
    while not stop:
        start = time.perf_counter()
        answer = client.get(url)
        samples.append(time.perf_counter() - start)
        if answer.status_code != 200:
            print(json.dumps({"error": answer.status_code}), flush=True)
            sys.exit(1)
        time.sleep(max(0.0, interval - (time.perf_counter() - start)))
print(json.dumps(samples), flush=True)
"""


class HealthPoller:
    """``/health`` polled from its own process (its timing is not the load generator's)."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HEALTH_POLLER, url + "/health", str(interval_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if first.strip() != "polling":
            raise SystemExit(f"/health poller failed to start: {first}")

    def stop(self) -> list[float]:
        out, _ = self.proc.communicate(input="", timeout=60)
        samples = json.loads(out.strip().splitlines()[-1])
        if not isinstance(samples, list):
            raise SystemExit(f"/health answered {samples}")
        return [float(s) for s in samples]


async def load_run(
    url: str, clients: int, requests: int, shape: tuple[int, int, int], seed0: int, poll_health_s: float | None
) -> dict[str, Any]:
    """``clients`` closed-loop clients share ``requests`` requests; images/s over the whole run."""
    import httpx

    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:

        async def one(i: int) -> float:
            start = time.perf_counter()
            answer = await client.post("/v1/images/generations", json=image_body(shape, seed0 + i, PROMPTS[i % 4]))
            if answer.status_code != 200:
                raise SystemExit(f"images on {url}: {answer.status_code} {answer.text[:500]}")
            if not answer.json()["data"][0]["b64_json"]:
                raise SystemExit("an image answer without an image")
            return time.perf_counter() - start

        # warm-up: every connection opened, the batched path run at this concurrency
        await asyncio.gather(*(one(10_000 + i) for i in range(clients)))
        poller = HealthPoller(url, poll_health_s) if poll_health_s else None
        counter = itertools.count()
        latencies: list[float] = []

        async def client_loop() -> None:
            while (i := next(counter)) < requests:
                latencies.append(await one(i))

        start = time.perf_counter()
        await asyncio.gather(*(client_loop() for _ in range(clients)))
        elapsed = time.perf_counter() - start
        health = poller.stop() if poller else None
    return {
        "clients": clients,
        "requests": requests,
        "seconds": elapsed,
        "images_per_s": requests / elapsed,
        "latency": stats_ms(latencies),
        "health_s": health,
    }


def throughput(
    servers: dict[str, Any], shape: tuple[int, int, int], requests_per_run: dict[int, int], rounds: int, health_s: float
) -> dict[str, Any]:
    """Every concurrency, off and on back to back (a pair; the order alternates), ``rounds``
    times; twice per round at 1 client, where a run is short and the ratio is all noise."""
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {mode: {c: [] for c in CONCURRENCY} for mode in ("off", "on")}
    batches: dict[str, dict[int, list[int]]] = {mode: {c: [] for c in CONCURRENCY} for mode in ("off", "on")}
    seed = 0
    for round_ in range(rounds):
        for clients in CONCURRENCY:
            for pair in range(2 if clients == 1 else 1):
                modes = ("off", "on") if (round_ + pair + clients) % 2 == 0 else ("on", "off")
                for mode in modes:
                    server = servers[mode]
                    before = len(server_log(server, "/v1/images/generations"))
                    requests = requests_per_run[clients]
                    result = asyncio.run(
                        load_run(server.url, clients, requests, shape, seed, health_s if clients == 8 else None)
                    )
                    seed += requests
                    time.sleep(0.2)  # the server writes a request's log line just after its answer
                    entries = server_log(server, "/v1/images/generations")[before + clients :]  # minus the warm-up
                    batches[mode][clients] += [int(e.get("batch", 1)) for e in entries]
                    runs[mode][clients].append(result)
                    say(
                        f"  [{mode:>3}] {clients:>2} client(s): {result['images_per_s']:6.2f} images/s "
                        f"({requests} requests in {result['seconds']:.1f} s), "
                        f"p50 latency {result['latency']['p50_ms']:.0f} ms"
                    )
    summary: dict[str, Any] = {}
    for clients in CONCURRENCY:
        row: dict[str, Any] = {}
        for mode in ("off", "on"):
            done = runs[mode][clients]
            sizes = batches[mode][clients]
            calls = sum(1 / b for b in sizes) if sizes else 0
            row[mode] = {
                "images_per_s": sum(r["requests"] for r in done) / sum(r["seconds"] for r in done),
                "per_run_images_per_s": [r["images_per_s"] for r in done],
                "latency_p50_ms": statistics.median([r["latency"]["p50_ms"] for r in done]),
                "latency_p99_ms": max(r["latency"]["p99_ms"] for r in done),
                "mean_batch": (len(sizes) / calls) if calls else 1.0,
                "batch_histogram": {str(k): round(v) for k, v in sorted(_calls_by_size(sizes).items())},
            }
        pairs = [
            on["images_per_s"] / off["images_per_s"]
            for on, off in zip(runs["on"][clients], runs["off"][clients], strict=True)
        ]
        # the median of the back-to-back pairs: a disturbed moment on the machine spoils one pair, not the figure
        row["ratio"] = statistics.median(pairs)
        row["pair_ratios"] = pairs
        row["ratio_of_totals"] = row["on"]["images_per_s"] / row["off"]["images_per_s"]
        summary[str(clients)] = row
    health = {mode: stats_ms([s for r in runs[mode][8] for s in (r["health_s"] or [])]) for mode in ("off", "on")}
    return {
        "shape": shape_name(shape),
        "rounds": rounds,
        "requests": requests_per_run,
        "by_clients": summary,
        "health": health,
    }


def _calls_by_size(sizes: list[int]) -> dict[int, float]:
    """Pipeline calls of each batch size, from each request's logged batch size."""
    calls: dict[int, float] = {}
    for size in sizes:
        calls[size] = calls.get(size, 0) + 1 / size
    return calls


def idle_health(url: str, seconds: float, interval_s: float) -> list[float]:
    poller = HealthPoller(url, interval_s)
    time.sleep(seconds)
    return poller.stop()


# --------------------------------------------------------------------------- report


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _row(label: str, stats: dict[str, float], digits: int = 1, extra: str = "") -> str:
    return f"   {label:<46} {stats['p50_ms']:8.{digits}f} {stats['p99_ms']:8.{digits}f}{extra}"


def print_report(report: dict[str, Any]) -> None:
    o, t, h = report["overhead"], report["throughput"], report["health"]
    say("")
    say(
        f"omni serve benchmark: {report['cpus']} CPUs, torch {report['torch']} with {report['torch_threads']} "
        f"thread(s) per process, python {report['python']}, load average {report['load_average']['before']} "
        f"-> {report['load_average']['after']}"
    )
    say(f"command: {report['command']}")
    say(
        f"models: the embedded defaults, tiny-image ({report['image_family']}) "
        f"and tiny-voice ({report['voice_family']})"
    )
    say("")
    say(f"1. Overhead per request: sequential, one client, {o['image']['rounds']} rounds each, interleaved")
    say(f"   {'':<46} {'p50 ms':>8} {'p99 ms':>8}")
    for kind, title, call in (
        ("image", f"image {o['image_shape']}", "generate"),
        ("speech", f'speech "{SPEECH_TEXT}"', "speak"),
    ):
        r = o[kind]
        say(f"   {title}")
        say(_row(f"  offline Omni.{call}", r["times"]["offline"]))
        say(_row("  HTTP, batching on (default server)", r["times"]["http_on"]))
        say(_row("  HTTP, batching off", r["times"]["http_off"]))
        say(_row("  HTTP - offline, paired, batching on", r["difference"]["on"], 2))
        say(_row("  HTTP - offline, paired, batching off", r["difference"]["off"], 2))
        log = r["server_log"]["on"]
        say(_row("  server log: total - run (outside the model)", log["outside_job"], 2))
        say(_row("    of which waiting for the worker thread", log["queue"], 2))
        say(_row("  server log: the model job (run_ms)", log["run"]))
    say(f"   (PNG + base64 of one {o['image_shape'].split(',')[0]} image, in-process: {o['png_ms']:.2f} ms)")
    say("")
    say("   Batching at the pipeline level, in-process: 8 x generate vs one generate_batch of 8, ms per image")
    for name, row in report["pipeline_gain"].items():
        mark = "  <- the throughput shape" if name == t["shape"] else ""
        say(
            f"   {name:<24} single {row['single_ms']:7.1f}   batched {row['batched_ms_per_image']:7.1f}   "
            f"gain {row['gain']:.2f}x{mark}"
        )
    say("")
    per = ", ".join(f"{n} at {c}" for c, n in t["requests"].items())
    say(f"2. Throughput: {t['shape']}; requests per run {per} client(s); {t['rounds']} round(s), off/on interleaved")
    say(
        f"   {'clients':>7} {'off img/s':>10} {'on img/s':>10} {'on/off*':>7} {'mean batch':>11} "
        f"{'p50 ms off / on':>17} {'p99 ms off / on':>17}"
    )
    for clients, row in t["by_clients"].items():
        off, on = row["off"], row["on"]
        say(
            f"   {clients:>7} {off['images_per_s']:10.2f} {on['images_per_s']:10.2f} {row['ratio']:6.2f}x "
            f"{on['mean_batch']:11.2f} {off['latency_p50_ms']:8.0f} / {on['latency_p50_ms']:<6.0f}"
            f"{off['latency_p99_ms']:8.0f} / {on['latency_p99_ms']:<6.0f}"
        )
    say("   * on/off: the median of the back-to-back pairs' ratios; each pair's:")
    for clients, row in t["by_clients"].items():
        say(f"   {clients:>7} client(s): " + ", ".join(f"{r:.2f}" for r in row["pair_ratios"]))
    say("   pipeline calls by batch size, batching on (size: calls):")
    for clients, row in t["by_clients"].items():
        say(f"   {clients:>7} client(s): {row['on']['batch_histogram']}")
    say("")
    say("3. /health latency")
    say(f"   {'':<46} {'p50 ms':>8} {'p99 ms':>8} {'polls':>6}")
    say(_row("idle server", h["idle"], 2, f" {h['idle']['n']:6d}"))
    for mode in ("off", "on"):
        stats = t["health"][mode]
        say(_row(f"during the 8-client runs, batching {mode}", stats, 2, f" {stats['n']:6d}"))
    say("")
    say("Goals")
    for line in report["goals"]:
        say(f"   {line['goal']:<66} {line['value']:>10}  {verdict(line['pass'])}")
    say("")
    say("overall: " + verdict(all(g["pass"] for g in report["goals"])))


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    o, t = report["overhead"], report["throughput"]["by_clients"]
    rows = []
    for kind in ("image", "speech"):
        value = o[kind]["difference"]["on"]["p50_ms"]
        rows.append(
            {
                "goal": f"server overhead p50, {kind} (HTTP - offline, paired) <= {GOAL_OVERHEAD_MS:g} ms",
                "value": f"{value:.2f} ms",
                "pass": value <= GOAL_OVERHEAD_MS,
            }
        )
    rows.append(
        {
            "goal": "batching on/off at 1 client >= 0.97 (costs at most 3%)",
            "value": f"{t['1']['ratio']:.3f}x",
            "pass": t["1"]["ratio"] >= GOAL_COST_1,
        }
    )
    rows.append(
        {
            "goal": "batching on/off at 8 clients >= 1.5x images/s",
            "value": f"{t['8']['ratio']:.2f}x",
            "pass": t["8"]["ratio"] >= GOAL_GAIN_8,
        }
    )
    return rows


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and requests (about 1 minute)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument(
        "--shape", type=parse_shape, default=parse_shape("128x128:4"), help="throughput request, WxH:STEPS (128x128:4)"
    )
    parser.add_argument(
        "--overhead-shape", type=parse_shape, default=parse_shape("64x64:2"), help="overhead request (64x64:2)"
    )
    parser.add_argument("--rounds", type=int, help="overhead rounds (default 60; --quick 20)")
    parser.add_argument("--load-rounds", type=int, help="throughput rounds, off/on interleaved (default 3; --quick 1)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of every process, the servers' and this one's (1; 0: torch's default, one per CPU)",
    )
    parser.add_argument("--health-interval-ms", type=float, default=25.0, help="/health poll interval (25)")
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help=f"where the defaults are made ({DEFAULT_CACHE})"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (20 if args.quick else 60)
    load_rounds = args.load_rounds or (1 if args.quick else 3)
    # requests per throughput run, by concurrency: enough for several full batches
    requests_per_run = {1: 12, 8: 48, 32: 96} if args.quick else {1: 24, 8: 96, 32: 192}

    cache = args.cache.resolve()
    home = Path(tempfile.mkdtemp(prefix="omni-bench-serve-"))
    # this process opens the same checkpoints the servers serve: same cache, same config
    os.environ["OMNI_CACHE_DIR"] = str(cache / "cache")
    os.environ["OMNI_CONFIG_DIR"] = str(home / "config")
    os.environ.pop("OMNI_ATTENTION_BACKEND", None)
    if args.threads > 0:
        # read by torch when it starts, here and in the servers (they inherit this environment)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)

    import httpx
    import torch
    from omni_cli.commands import generate as generate_cmd
    from omni_cli.commands import speak as speak_cmd

    from omni_core import Omni
    from omni_core.plugins import get_plugins

    load_before = load_average()
    started = time.perf_counter()
    plugins = get_plugins()
    image_dir = generate_cmd.embedded_default(plugins)  # made once; the servers find them made
    voice_dir = speak_cmd.fallback_model(plugins)
    say(f"[setup] starting two omni serve processes (batching off / on) in {home}")
    servers = start_servers(home, cache / "cache")
    try:
        image = Omni(image_dir, progress=False)
        voice = Omni(voice_dir)
        image_family, voice_family = image.family, voice.adapter
        clients = {mode: httpx.Client(base_url=s.url, timeout=600) for mode, s in servers.items()}
        for mode, client in clients.items():
            models = [m["id"] for m in client.get("/v1/models").json()["data"]]
            if sorted(models) != ["tiny-image", "tiny-voice"]:
                raise SystemExit(f"the {mode} server serves {models}, not the embedded defaults")
        say(f"[setup] ready after {time.perf_counter() - started:.1f} s")

        say("[1/3] overhead per request (sequential)")
        overhead_report = {
            "image_shape": shape_name(args.overhead_shape),
            "image": overhead(image, clients, servers, "image", rounds, 3, args.overhead_shape),
            "speech": overhead(voice, clients, servers, "speech", rounds, 3, None),
            "png_ms": png_cost(image, args.overhead_shape),
        }
        say("[1/3] pipeline-level batching gain (in-process)")
        shapes = [args.shape] if args.quick else sorted({args.shape, *map(parse_shape, PROBE_SHAPES)})
        gain = {shape_name(s): pipeline_gain(image, s, 1 if args.quick else 2) for s in shapes}
        image.close()
        voice.close()
        for client in clients.values():
            client.close()

        say("[3/3] /health on an idle server (under load: during the 8-client runs)")
        idle = idle_health(servers["on"].url, 1.5, args.health_interval_ms / 1000)
        say(f"[2/3] throughput, {shape_name(args.shape)}")
        load = throughput(servers, args.shape, requests_per_run, load_rounds, args.health_interval_ms / 1000)
    finally:
        codes = {mode: s.stop() for mode, s in servers.items()}
    if any(codes.values()):
        raise SystemExit(f"a server did not exit cleanly: {codes}")

    report: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "threads_option": args.threads,
        "image_family": f"{image_family}, random weights",
        "voice_family": f"{voice_family}, random weights",
        "load_average": {"before": load_before, "after": load_average()},
        "seconds": time.perf_counter() - started,
        "overhead": overhead_report,
        "pipeline_gain": gain,
        "throughput": load,
        "health": {"idle": stats_ms(idle), "idle_samples_ms": [s * 1000 for s in idle]},
    }
    report["goals"] = goals(report)
    print_report(report)
    finish(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
