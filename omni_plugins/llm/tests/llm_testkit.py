"""Helpers the tests share (a uniquely named module: every plugin's tests directory is on the
path when the whole repository's tests run together)."""

from __future__ import annotations

from typing import Any

from omni_core.testing import run_stage_engine


def answer(engine: Any, request: Any, **params: Any) -> tuple[list[int], list[str]]:
    """One request through the engine as the stage loop drives it: each token, then its text."""
    tokens, pieces, _ = run_stage_engine(engine, request, **params)
    return tokens, pieces


def finish_of(engine: Any, request: Any, **params: Any) -> str:
    """How one answer ended: what ``run`` returned, read as the stage loop reads it."""
    return run_stage_engine(engine, request, **params)[2]
