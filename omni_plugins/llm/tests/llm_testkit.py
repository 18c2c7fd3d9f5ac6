"""Helpers the tests share (a uniquely named module: every plugin's tests directory is on the
path when the whole repository's tests run together)."""

from __future__ import annotations

from typing import Any


def answer(engine: Any, request: Any, **params: Any) -> tuple[list[int], list[str]]:
    """One request through the engine as the stage loop drives it: each token, then its text."""
    tokens: list[int] = []
    pieces: list[str] = []
    for token in engine.run(iter([request]), params):
        tokens.append(token)
        pieces.append(engine.for_output(token))
    return tokens, pieces


def finish_of(engine: Any, request: Any, **params: Any) -> str:
    """How one answer ended: what ``run`` returned, read as the stage loop reads it."""
    tokens = engine.run(iter([request]), params)
    while True:
        try:
            engine.for_output(next(tokens))
        except StopIteration as end:
            return str(end.value)
