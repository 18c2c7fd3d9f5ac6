"""Driving a stage engine in a test as the stage loop drives it, without a pipeline around it."""

from __future__ import annotations

from typing import Any

from omni_core.pipeline.stage import finish_reason


def run_stage_engine(engine: Any, request: Any, **params: Any) -> tuple[list[Any], list[Any], str]:
    """One request through ``engine`` as the entry stage gets it (the request its one input):
    the items ``run`` yields, what ``for_output`` makes of each as it comes, and how the answer
    ended, read from ``run``'s return value by the stage loop's own rule."""
    items: list[Any] = []
    outputs: list[Any] = []
    run = iter(engine.run(iter([request]), params))
    while True:
        try:
            item = next(run)
        except StopIteration as end:
            return items, outputs, finish_reason(end.value, "under test")
        items.append(item)
        outputs.append(engine.for_output(item))
