#!/usr/bin/env python3
"""CLI startup benchmark: is ``omni`` cheap to start, and does discovery stay flat as plugins grow?

Run with any Python >= 3.11 (the repo's ``.venv`` is fine; nothing is imported from it)::

    python benchmarks/cli_startup.py [--runs N] [--json OUT] [--rebuild]

What it does:

1. Builds (once, cached under ``.bench/`` at the repo root, which git ignores) a fresh venv
   *without torch*, holding this checkout's ``omni-core``, ``plugin_template/``, ``cli/`` and
   ``omni_plugins/cpu/`` installed non-editable with ``--no-deps``, plus their runtime
   dependencies (pluggy, pydantic, packaging, tomli-w, typer). The local packages are
   reinstalled whenever their sources change (a fingerprint of the files is kept).
2. Generates 50 small but real plugin packages (entry point in ``omni.plugins``, an
   ``omni_plugin.toml`` declaring one model and one attention backend, ``hooks.py`` registering
   them) and installs them with ``pip install --target`` into a separate directory, so putting
   that directory on ``PYTHONPATH`` switches between "0 extra plugins" and "50 extra plugins"
   on the same interpreter. The 0-plugin runs get an empty directory on ``PYTHONPATH`` so both
   sides see a ``sys.path`` of the same length.
3. Times whole subprocesses (wall clock, ``time.perf_counter``), interleaved round-robin
   (A, B, C, ..., A, B, C, ...) so that machine noise is shared fairly, after a few discarded
   warm-up rounds: ``python -c "import pluggy"``, ``omni --help``, ``omni plugins list`` with 0
   and 50 extra plugins, and, for information, ``omni plugins list`` with 50 plugins and an
   empty ``OMNI_CACHE_DIR`` every run (first run after an install: no parsed manifest is
   remembered yet) and ``omni plugins list --load`` with 0 and 50. Each case has its own
   ``OMNI_CONFIG_DIR``/``OMNI_CACHE_DIR`` under a temporary directory.
4. Prints medians, p10 and p90 and the ratios against the limits of the issue, with PASS/FAIL.

It is a measurement, not a test: the exit code is 0 whatever the figures (non-zero only when
the environment cannot be built or a command fails).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = REPO / ".bench"
#: the repo's own distributions, in dependency order (as tests/conftest.py installs them)
LOCAL_PACKAGES = (REPO, REPO / "plugin_template", REPO / "cli", REPO / "omni_plugins" / "cpu")
RUNTIME_DEPS = ("pluggy>=1.5", "pydantic>=2.6", "packaging>=23", "tomli-w>=1.0", "typer>=0.12")
BUILD_DEPS = ("setuptools>=68", "wheel")
N_PLUGINS = 50
#: bump when the generated plugin packages change shape, so cached installs are rebuilt
PLUGIN_GENERATION = 1

#: set when this run (re)installed anything: fresh files are not yet cacheable (see below)
_JUST_INSTALLED = False

#: limits from the issue
LIMIT_VS_PLUGGY = 4.0
LIMIT_GROWTH = 0.10


# --------------------------------------------------------------------------- environment


def _run(cmd: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    proc: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        [str(c) for c in cmd], capture_output=True, text=True, check=False, **kwargs
    )
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stdout}\n{proc.stderr}")
    return proc


def _pip(python: Path, *args: str | Path) -> None:
    _run([python, "-m", "pip", "--disable-pip-version-check", "--quiet", *args])


def _source_fingerprint() -> str:
    """Hash of every source file of the local packages: a change means reinstall."""
    digest = hashlib.sha256()
    skip = {"__pycache__", ".git", ".venv", ".bench", "build", "dist", "tests", "benchmarks", "docs", "recipes"}
    roots = [REPO / "omni_core", REPO / "pyproject.toml", *LOCAL_PACKAGES[1:]]
    for root in roots:
        files = (
            [root]
            if root.is_file()
            else sorted(
                p
                for p in root.rglob("*")
                if p.is_file()
                and not any(part in skip or part.endswith(".egg-info") for part in p.relative_to(REPO).parts)
            )
        )
        for path in files:
            digest.update(str(path.relative_to(REPO)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def ensure_venv(root: Path, rebuild: bool) -> Path:
    """A torch-free venv with the checkout installed non-editable; returns its python."""
    python = root / "bin" / "python"
    stamp = root / ".omni-bench-deps"
    deps_key = " ".join((*BUILD_DEPS, *RUNTIME_DEPS, platform.python_version()))
    if rebuild or not python.exists() or not stamp.exists() or stamp.read_text() != deps_key:
        print(f"[setup] creating venv {root}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(root)
        _pip(python, "install", *BUILD_DEPS, *RUNTIME_DEPS)
        stamp.write_text(deps_key)
    installed = root / ".omni-bench-source"
    fingerprint = _source_fingerprint()
    if not installed.exists() or installed.read_text() != fingerprint:
        print("[setup] installing this checkout (non-editable, --no-deps)", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            # build from copies so setuptools' build/ and egg-info dirs never touch the checkout
            copies = []
            junk = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
            for pkg in LOCAL_PACKAGES:
                dest = Path(tmp) / ("omni-core" if pkg == REPO else pkg.relative_to(REPO).as_posix().replace("/", "_"))
                if pkg == REPO:  # the core: its project files and omni_core/ only
                    dest.mkdir()
                    for item in [*REPO.glob("*.toml"), *REPO.glob("README*"), *REPO.glob("LICENSE*")]:
                        shutil.copy2(item, dest / item.name)
                    shutil.copytree(REPO / "omni_core", dest / "omni_core", ignore=junk)
                else:
                    shutil.copytree(pkg, dest, ignore=junk)
                copies.append(dest)
            _pip(python, "install", "--no-deps", "--no-build-isolation", "--force-reinstall", *copies)
        installed.write_text(fingerprint)
        _just_installed()
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True, check=False)
    if probe.returncode == 0:
        raise SystemExit(f"{root} can import torch; the benchmark venv must not have it (use --rebuild)")
    return python


def _plugin_files(i: int) -> dict[str, str]:
    pkg = f"omni_plugin_bench{i:02d}"
    model, attn = f"bench-model-{i:02d}", f"BENCH_ATTN_{i:02d}"
    return {
        "pyproject.toml": f"""\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "omni-plugin-bench{i:02d}"
version = "0.1.0"
description = "Benchmark plugin {i}: one model and one attention backend."
requires-python = ">=3.11"
dependencies = ["omni-core>=0.1,<0.2"]

[project.entry-points."omni.plugins"]
bench{i:02d} = "{pkg}.hooks"

[tool.setuptools.packages.find]
include = ["{pkg}*"]

[tool.setuptools.package-data]
{pkg} = ["omni_plugin.toml"]
""",
        f"{pkg}/__init__.py": f'"""Benchmark plugin {i}. Importing this package is cheap."""\n',
        f"{pkg}/omni_plugin.toml": f"""\
omni_api = ">=1.0,<2"
description = "Benchmark plugin {i}: one model and one attention backend"
requires_hardware = []

[[model]]
name = "{model}"
ref = "{pkg}.model:BenchModel"
architectures = ["Bench{i:02d}ForCausalLM"]
model_types = ["bench{i:02d}"]
tasks = ["text-generation"]

[[attention_backend]]
name = "{attn}"
ref = "{pkg}.attention:BenchAttentionBackend"
""",
        f"{pkg}/hooks.py": f'''\
"""Hook implementations: names and lazy references only."""

from omni_core import hookimpl


@hookimpl
def omni_register_models(registry):  # type: ignore[no-untyped-def]
    registry.register(
        "{model}",
        "{pkg}.model:BenchModel",
        architectures=("Bench{i:02d}ForCausalLM",),
        model_types=("bench{i:02d}",),
        tasks=("text-generation",),
    )


@hookimpl
def omni_register_attention_backends(registry):  # type: ignore[no-untyped-def]
    registry.register("{attn}", "{pkg}.attention:BenchAttentionBackend")
''',
        f"{pkg}/model.py": f'''\
"""The model (never imported by the benchmark: references stay lazy)."""


class BenchModel:
    name = "{model}"
''',
        f"{pkg}/attention.py": f'''\
"""The attention backend (never imported by the benchmark: references stay lazy)."""

from typing import ClassVar

from omni_core.attention import AttentionBackend


class BenchAttentionBackend(AttentionBackend):
    name: ClassVar[str] = "{attn}"
''',
    }


def ensure_plugins(python: Path, cache: Path, rebuild: bool) -> Path:
    """50 generated plugins installed into ``cache/site50``; returns that directory."""
    site = cache / f"site{N_PLUGINS}"
    stamp = site / ".omni-bench-plugins"
    key = f"{PLUGIN_GENERATION} {N_PLUGINS} {platform.python_version()}"
    if not rebuild and stamp.exists() and stamp.read_text() == key:
        return site
    print(f"[setup] generating and installing {N_PLUGINS} plugins into {site}", flush=True)
    src = cache / "plugin-src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(site, ignore_errors=True)
    dirs = []
    for i in range(N_PLUGINS):
        root = src / f"omni-plugin-bench{i:02d}"
        for rel, text in _plugin_files(i).items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        dirs.append(root)
    site.mkdir(parents=True)
    _pip(python, "install", "--no-deps", "--no-build-isolation", "--target", site, *dirs)
    stamp.write_text(key)
    _just_installed()
    return site


def _just_installed() -> None:
    global _JUST_INSTALLED
    _JUST_INSTALLED = True


# --------------------------------------------------------------------------- measurement


def base_env(venv_root: Path, home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMNI_", "PYTHON", "VIRTUAL_ENV", "CONDA")) and k != "PIP_TARGET"
    }
    env.update(
        OMNI_CONFIG_DIR=str(home / "config"),
        OMNI_CACHE_DIR=str(home / "cache"),
        PATH=f"{venv_root / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv_root),
        NO_COLOR="1",
        COLUMNS="120",
    )
    return env


def check_outputs(cases: dict[str, tuple[list[str], dict[str, str]]]) -> None:
    """Each command must work, and the 50 plugins must really be discovered (and load)."""
    for label, (cmd, env) in cases.items():
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{label}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        if label.startswith(("list", "load")) and cmd[-1] != "--help":
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("bench")]
            want = N_PLUGINS if "50" in label else 0
            ok = [ln for ln in lines if " ok " in ln]
            if len(lines) != want or len(ok) != want or "cpu " not in proc.stdout:
                raise SystemExit(f"{label}: expected {want} bench plugins (all ok) plus cpu, got:\n{proc.stdout}")


def measure(
    cases: dict[str, tuple[list[str], dict[str, str]]],
    runs: int,
    warmup: int,
    fresh_cache: frozenset[str] = frozenset(),
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall times, CPU times) per case, in seconds. The CPU time (user + system of the child)
    is far less sensitive to other load on the machine than the wall time, and shown beside it.
    Cases in ``fresh_cache`` get an empty OMNI_CACHE_DIR every run."""
    times: dict[str, list[float]] = {label: [] for label in cases}
    cpu: dict[str, list[float]] = {label: [] for label in cases}
    for round_ in range(warmup + runs):
        for label, (cmd, env) in cases.items():  # interleaved: A, B, C, ..., A, B, C, ...
            if label in fresh_cache:
                env = {**env, "OMNI_CACHE_DIR": tempfile.mkdtemp(prefix="cache-", dir=env["OMNI_CACHE_DIR"])}
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
            elapsed = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if proc.returncode != 0:
                raise SystemExit(f"{label} failed during timing: {proc.stderr.decode(errors='replace')}")
            if round_ >= warmup:
                times[label].append(elapsed)
                cpu[label].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if round_ >= warmup and (round_ - warmup + 1) % 10 == 0:
            print(f"[measure] {round_ - warmup + 1}/{runs} rounds", flush=True)
    return times, cpu


def summarize(samples: list[float]) -> dict[str, float]:
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return {
        "median_ms": statistics.median(samples) * 1000,
        "p10_ms": deciles[0] * 1000,
        "p90_ms": deciles[-1] * 1000,
        "min_ms": min(samples) * 1000,
        "max_ms": max(samples) * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs per command (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="discarded rounds before timing (default 3)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the figures as JSON to OUT")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"cache dir (default {DEFAULT_CACHE})")
    parser.add_argument("--rebuild", action="store_true", help="recreate the venv and the 50 plugins")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs must be at least 2")

    cache: Path = args.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    venv_root = cache / "venv"
    python = ensure_venv(venv_root, args.rebuild)
    site50 = ensure_plugins(python, cache, args.rebuild)
    site0 = cache / "site0"  # empty: same sys.path length as the 50-plugin runs
    site0.mkdir(exist_ok=True)
    omni = str(venv_root / "bin" / "omni")
    if _JUST_INSTALLED:
        # omni remembers parsed manifests only once their files are 2 s old (a file written
        # within its timestamps' resolution may change unseen): measure the settled state.
        time.sleep(2.5)

    with tempfile.TemporaryDirectory(prefix="omni-bench-home-") as tmp:
        home = Path(tmp)
        env0 = base_env(venv_root, home / "h0")
        env0["PYTHONPATH"] = str(site0)
        env50 = base_env(venv_root, home / "h50")
        env50["PYTHONPATH"] = str(site50)
        env50cold = base_env(venv_root, home / "h50cold")  # OMNI_CACHE_DIR: a fresh subdir per run
        env50cold["PYTHONPATH"] = str(site50)
        Path(env50cold["OMNI_CACHE_DIR"]).mkdir(parents=True)
        cases: dict[str, tuple[list[str], dict[str, str]]] = {
            "pluggy": ([str(python), "-c", "import pluggy"], env0),
            "help": ([omni, "--help"], env0),
            "list0": ([omni, "plugins", "list"], env0),
            "list50": ([omni, "plugins", "list"], env50),
            "list50cold": ([omni, "plugins", "list"], env50cold),
            "load0": ([omni, "plugins", "list", "--load"], env0),
            "load50": ([omni, "plugins", "list", "--load"], env50),
        }
        check_outputs(cases)
        print(
            f"[measure] {args.runs} runs each (+{args.warmup} warm-up), interleaved over {len(cases)} commands",
            flush=True,
        )
        load_before = os.getloadavg()[0]
        times, cpu_times = measure(cases, args.runs, args.warmup, fresh_cache=frozenset({"list50cold"}))
        load_after = os.getloadavg()[0]

    stats = {label: summarize(samples) for label, samples in times.items()}
    med = {label: s["median_ms"] for label, s in stats.items()}
    cpu_med = {label: statistics.median(samples) * 1000 for label, samples in cpu_times.items()}
    for label in stats:
        stats[label]["cpu_median_ms"] = cpu_med[label]
    cpu_ratios = {
        "help_vs_pluggy": cpu_med["help"] / cpu_med["pluggy"],
        "list_vs_pluggy": cpu_med["list0"] / cpu_med["pluggy"],
        "list50_growth": cpu_med["list50"] / cpu_med["list0"] - 1,
    }
    ratios = {
        "help_vs_pluggy": med["help"] / med["pluggy"],
        "list_vs_pluggy": med["list0"] / med["pluggy"],
        "list50_growth": med["list50"] / med["list0"] - 1,
        "load50_growth": med["load50"] / med["load0"] - 1,
        "list50cold_growth": med["list50cold"] / med["list0"] - 1,
    }
    verdicts = {
        "help_vs_pluggy": ratios["help_vs_pluggy"] <= LIMIT_VS_PLUGGY,
        "list_vs_pluggy": ratios["list_vs_pluggy"] <= LIMIT_VS_PLUGGY,
        "list50_growth": ratios["list50_growth"] <= LIMIT_GROWTH,
    }

    descriptions = {
        "pluggy": 'python -c "import pluggy"',
        "help": "omni --help",
        "list0": "omni plugins list          (0 extra plugins)",
        "list50": "omni plugins list          (50 extra plugins)",
        "list50cold": "omni plugins list          (50, empty cache dir)",
        "load0": "omni plugins list --load   (0 extra plugins)",
        "load50": "omni plugins list --load   (50 extra plugins)",
    }
    print()
    print(f"omni CLI startup: {args.runs} interleaved runs each, wall time of the whole subprocess")
    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPU(s), "
        f"load average {load_before:.2f} before, {load_after:.2f} after"
    )
    print()
    print(f"{'command':<48} {'median':>9} {'p10':>9} {'p90':>9} {'cpu med':>9}")
    print(f"{'-' * 48} {'-' * 9} {'-' * 9} {'-' * 9} {'-' * 9}")
    for label, s in stats.items():
        print(
            f"{descriptions[label]:<48} {s['median_ms']:>7.1f}ms {s['p10_ms']:>7.1f}ms {s['p90_ms']:>7.1f}ms "
            f"{s['cpu_median_ms']:>7.1f}ms"
        )
    print()

    def verdict(key: str) -> str:
        return "PASS" if verdicts[key] else "FAIL"

    print(f"{'ratio (medians)':<48} {'value':>9} {'limit':>9}  verdict")
    print(f"{'-' * 48} {'-' * 9} {'-' * 9}  -------")
    print(
        f"{'omni --help / import pluggy':<48} {ratios['help_vs_pluggy']:>8.2f}x {LIMIT_VS_PLUGGY:>8.1f}x  "
        f"{verdict('help_vs_pluggy')}"
    )
    print(
        f"{'omni plugins list / import pluggy':<48} {ratios['list_vs_pluggy']:>8.2f}x {LIMIT_VS_PLUGGY:>8.1f}x  "
        f"{verdict('list_vs_pluggy')}"
    )
    print(
        f"{'plugins list: 50 plugins vs 0 (added time)':<48} {ratios['list50_growth']:>+8.1%} "
        f"{LIMIT_GROWTH:>+8.0%}  {verdict('list50_growth')}"
    )
    print(f"{'plugins list: 50 vs 0, empty cache dir (info)':<48} {ratios['list50cold_growth']:>+8.1%} {'-':>9}  info")
    print(f"{'plugins list --load: 50 vs 0 (informational)':<48} {ratios['load50_growth']:>+8.1%} {'-':>9}  info")
    print(
        f"(same ratios on CPU time, for information: help {cpu_ratios['help_vs_pluggy']:.2f}x, "
        f"list {cpu_ratios['list_vs_pluggy']:.2f}x, 50 plugins {cpu_ratios['list50_growth']:+.1%})"
    )
    print()
    print("overall: " + ("PASS" if all(verdicts.values()) else "FAIL"))

    if args.json:
        report = {
            "runs": args.runs,
            "warmup": args.warmup,
            "plugins": N_PLUGINS,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "commands": {label: {"command": descriptions[label], **stats[label]} for label in stats},
            "ratios": ratios,
            "cpu_ratios": cpu_ratios,
            "load_average": {"before": load_before, "after": load_after},
            "limits": {
                "help_vs_pluggy": LIMIT_VS_PLUGGY,
                "list_vs_pluggy": LIMIT_VS_PLUGGY,
                "list50_growth": LIMIT_GROWTH,
            },
            "pass": verdicts,
            "samples_ms": {label: [t * 1000 for t in samples] for label, samples in times.items()},
            "cpu_samples_ms": {label: [t * 1000 for t in samples] for label, samples in cpu_times.items()},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
