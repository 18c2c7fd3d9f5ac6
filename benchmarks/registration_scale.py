#!/usr/bin/env python3
"""Registration scale benchmark: does loading stay linear as one plugin registers thousands of names?

Run with the repo's ``.venv`` (it imports ``omni_core``)::

    .venv/bin/python benchmarks/registration_scale.py [--sizes 1000,10000] [--runs 3]

For each size N it times, in this process, every step a load takes for one plugin that
declares and registers N models, the way ``omni_core.plugins.load_plugins`` runs them:

1. ``parse_manifest``: validating the declared ``[[model]]`` tables;
2. ``register``: N ``registry.register(...)`` calls on a real ``ModelRegistrar`` (pydantic
   validation and the duplicate-name check);
3. ``compare_with_manifest``: registered against declared, field by field;
4. ``resolve``: the conflict policy over N offers;
5. ``Registry.add`` for every decision, then a hit and a miss lookup.

It prints the best of ``--runs`` for each step and the ratio of the largest size to the
smallest against the ratio of the sizes: linear steps grow about as the sizes do (10x for 1k ->
10k); a quadratic one grows about 100x. Before the fix, ``register`` alone took ~30 s at 10,000
names (a scan of every earlier name per call). A measurement, not a test: it exits 0 whatever
the figures. ``tests/test_faults_plugins.py`` checks the same property without timing anything.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from omni_core.conflicts import Offer, resolve
from omni_core.kinds import Kind
from omni_core.manifest import parse_manifest
from omni_core.plugins import compare_with_manifest
from omni_core.registry import REGISTRAR_TYPES, Provider, Registrar, Registry

REF = "omni_fixture_scale.model:Model"


def steps(n: int) -> dict[str, Callable[[], Any]]:
    """The load steps for one plugin with ``n`` models, each a closure over the previous result."""
    provider = Provider("fixture-scale", "omni-fixture-scale", "0.1.0")
    data = {"omni_api": ">=1.0,<2", "model": [{"name": f"scale-{i}", "ref": REF} for i in range(n)]}
    state: dict[str, Any] = {}

    def parse() -> None:
        state["manifest"] = parse_manifest(data, "<benchmark>")

    def register() -> None:
        registrars: dict[Kind, Registrar[Any]] = {k: REGISTRAR_TYPES[k](provider) for k in Kind}
        for i in range(n):
            registrars[Kind.MODEL].register(f"scale-{i}", REF)
        state["registrars"] = registrars

    def compare() -> None:
        problems = compare_with_manifest(state["manifest"], state["registrars"])
        assert not problems, problems[:3]

    def conflicts() -> None:
        offers = [
            Offer(Kind.MODEL, s.name, s.priority, provider.plugin, provider.distribution, provider.version, s)
            for s in state["registrars"][Kind.MODEL].specs
        ]
        state["resolution"] = resolve(offers, {})

    def registry() -> None:
        reg: Registry[Any] = Registry(Kind.MODEL)
        for decision in state["resolution"].decisions.values():
            reg.add(decision)
        assert "scale-0" in reg and "no-such-model" not in reg

    return {
        "parse_manifest": parse,
        "register": register,
        "compare_with_manifest": compare,
        "resolve": conflicts,
        "registry + lookups": registry,
    }


def measure(n: int, runs: int) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(runs):
        for name, step in steps(n).items():
            start = time.perf_counter()
            step()
            elapsed = time.perf_counter() - start
            best[name] = min(best.get(name, elapsed), elapsed)
    best["total"] = sum(best.values())
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated numbers of names")
    parser.add_argument("--runs", type=int, default=3, help="repetitions per size (the best is kept)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {n: measure(n, args.runs) for n in sizes}

    small, large = min(sizes), max(sizes)
    names = list(results[small])
    header = f"{'step':<24}" + "".join(f"{f'{n:,} names':>14}" for n in sizes)
    header += f"{'ratio':>9}" if large != small else ""
    print(header)
    print("-" * len(header))
    for name in names:
        row = f"{name:<24}" + "".join(f"{results[n][name]:>12.3f} s" for n in sizes)
        if large != small and results[small][name] > 0:
            row += f"{results[large][name] / results[small][name]:>8.1f}x"
        print(row)
    if large != small:
        print(f"\nsizes grew {large / small:.0f}x: a linear step grows about as much, a quadratic one about the square")


if __name__ == "__main__":
    main()
