"""Payloads, comparisons, the skip reason, and the stage process the tests start (``spawn``: a
fresh interpreter that imports this module by name, as a stage process would): :func:`serve`
is its body, :class:`Stage` drives it from the test process."""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from typing import Any

import pytest
import torch

from omni_core.pipeline.connector import ConnectorContext, Edge
from omni_core.testing.connectors import assert_same as assert_same
from omni_core.testing.connectors import payload_cases as cases

EDGE = Edge("thinker", "talker")
OTHER_EDGE = Edge("talker", "code2wav")
#: 16 Mi float32 elements: a 64 MiB tensor
BIG_NUMEL = 16 * 1024 * 1024


def big() -> torch.Tensor:
    return torch.arange(BIG_NUMEL, dtype=torch.float32)


def mooncake(run_id: str, *, who: str = "stage", owner: bool = False, **extra: Any) -> Any:
    from omni_plugin_mooncake.connector import MooncakeConnector

    return MooncakeConnector(extra, ConnectorContext(run_id=run_id, owner=who, is_owner=owner))


def payload(name: str) -> Any:
    return big() if name == "big" else cases()[name]


def engine_skip_reason() -> str | None:
    from omni_plugin_mooncake.engine import engine_problem

    problem = engine_problem()
    if problem is not None and os.environ.get("CI"):
        # CI installs everything the transport needs (scripts/bootstrap.sh): a skip there would hide a break
        import pytest

        pytest.fail(f"CI must run the Mooncake transport tests, and the engine is not usable: {problem}")
    return None if problem is None else f"Mooncake's transfer engine is not usable here: {problem}"


# -- the spawned process ------------------------------------------------------------------------


def serve(conn: Any, run_id: str, extra: dict[str, Any]) -> None:  # pragma: no cover - runs in the child
    """A stage process: builds a connector and runs the parent's commands until "stop".

    ``("put", case, edge, request)`` answers the handle and the put's seconds;
    ``("get", handle, case, edge, request)`` answers "ok" (the payload arrived equal) and the
    get's seconds, or the error; ``("cleanup", request)``, ``("health",)`` and ``("pid",)``
    answer what they say."""
    stage = None
    try:
        stage = mooncake(run_id, who="child", **extra)
        conn.send(("ready", os.getpid()))
        while True:
            command = conn.recv()
            op = command[0]
            try:
                if op == "stop":
                    break
                if op == "put":
                    _, name, edge, request = command
                    start = time.perf_counter()
                    handle = stage.put(edge, request, payload(name), timeout=30)
                    conn.send(("ok", handle, time.perf_counter() - start))
                elif op == "get":
                    _, handle, name, edge, request = command
                    start = time.perf_counter()
                    got = stage.get(edge, request, handle, timeout=30)
                    seconds = time.perf_counter() - start
                    assert_same(got, payload(name), name)
                    conn.send(("ok", None, seconds))
                elif op == "cleanup":
                    stage.cleanup(command[1])
                    conn.send(("ok", None, 0.0))
                elif op == "health":
                    conn.send(("ok", stage.health(), 0.0))
            except BaseException as exc:
                conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-2)}", 0.0))
    finally:
        if stage is not None:
            stage.close()
        conn.close()


class Stage:
    """A spawned process running :func:`mooncake_testkit.serve`."""

    def __init__(self, run_id: str, extra: dict[str, Any] | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(theirs, run_id, extra or {}), daemon=True)
        self.process.start()
        theirs.close()
        status, self.pid = self.recv(180)
        assert status == "ready", status

    def recv(self, seconds: float = 120) -> Any:
        deadline = time.monotonic() + seconds
        while not self.conn.poll(0.1):
            if not self.process.is_alive() and not self.conn.poll(0):
                pytest.fail(f"the stage process exited with {self.process.exitcode} without answering")
            if time.monotonic() > deadline:
                self.process.kill()
                pytest.fail("the stage process did not answer in time")
        return self.conn.recv()

    def call(self, *command: Any) -> tuple[Any, float]:
        """Run a command; its answer and seconds, or fail with the child's error."""
        self.conn.send(command)
        status, value, seconds = self.recv()
        if status != "ok":
            pytest.fail(f"in the stage process: {value}")
        return value, seconds

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(("stop",))
            except OSError:
                pass
            self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
        self.conn.close()
