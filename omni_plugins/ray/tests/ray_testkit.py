"""Helpers of the ray executor's tests: leftovers of a run, exact comparison of outputs."""

from __future__ import annotations

import os
from typing import Any


def shm_of(run_id: str) -> list[str]:
    return sorted(p for p in os.listdir("/dev/shm") if p.startswith(f"omni-{run_id}-"))


def actors_of(run_id: str) -> list[str]:
    """The live named actors of a pipeline run (every stage actor is named omni-<run id>-...)."""
    import ray

    names = ray.util.list_named_actors(all_namespaces=True)
    return sorted(a["name"] for a in names if a["name"].startswith(f"omni-{run_id}-"))


def same(got: list[Any], want: list[Any]) -> bool:
    from omni_fixture_pipeline.compare import same_items  # importable once pipeline_site ran

    return same_items(got, want)
