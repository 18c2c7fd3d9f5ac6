"""Payloads, comparisons, the skip reason, and the stage process the tests start (``spawn``: a
fresh interpreter that imports this module by name, as a stage process would): :func:`serve`
is its body, :class:`Stage` drives it from the test process."""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from typing import Any

import numpy as np
import pytest
import torch

from omni_core.pipeline.connector import ConnectorContext, Edge

EDGE = Edge("thinker", "talker")
OTHER_EDGE = Edge("talker", "code2wav")
#: 16 Mi float32 elements: a 64 MiB tensor
BIG_NUMEL = 16 * 1024 * 1024


def cases() -> dict[str, Any]:
    """One payload per case, the same values in every process (seeded)."""
    gen = torch.Generator().manual_seed(1234)
    rng = np.random.default_rng(1234)
    return {
        "float16": torch.randn(64, 33, generator=gen).half(),
        "float32": torch.randn(3, 5, 7, generator=gen),
        "bfloat16": torch.randn(1000, generator=gen).to(torch.bfloat16),
        "int64": torch.arange(-500, 500, dtype=torch.int64) * (2**40),
        "zero_dim": torch.tensor(3.5),
        "non_contiguous": torch.arange(120, dtype=torch.float32).reshape(10, 12).t()[::2],
        "empty_tensor": torch.empty(0, 4),
        "zero_bytes": b"",
        "numpy_float64": rng.standard_normal((17, 3)),
        "numpy_uint8": rng.integers(0, 255, size=(4, 4, 3), dtype=np.uint8),
        "numpy_non_contiguous": np.arange(60, dtype=np.int32).reshape(6, 10)[:, ::3],
        "nested": {
            "audio": torch.randn(2, 480, generator=gen),
            "meta": {"sample_rate": 24000, "speaker": "Ethan", "done": False, "score": 0.25, "none": None},
            "codes": [np.arange(5, dtype=np.int16), torch.ones(3, dtype=torch.int32), b"\x00\xffraw"],
            "pair": (1, "two"),
        },
        "large": torch.randn(512, 1024, generator=gen),  # 2 MiB: over the inline threshold
    }


def big() -> torch.Tensor:
    return torch.arange(BIG_NUMEL, dtype=torch.float32)


def assert_same(got: Any, want: Any, where: str = "payload") -> None:
    """Equal values, dtypes, shapes and container types (bit-exact for floats)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: {type(got).__name__}, not a tensor"
        assert got.dtype == want.dtype and got.shape == want.shape, f"{where}: {got.dtype}{tuple(got.shape)}"
        assert torch.equal(got, want), f"{where}: values differ"
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: {type(got).__name__}, not an ndarray"
        assert got.dtype == want.dtype and got.shape == want.shape, f"{where}: {got.dtype}{got.shape}"
        assert np.array_equal(got, want), f"{where}: values differ"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), f"{where}: keys {list(got)}"
        for key in want:
            assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{where}: {type(got).__name__} {got!r}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert type(got) is type(want) and got == want, f"{where}: {got!r} != {want!r}"


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
