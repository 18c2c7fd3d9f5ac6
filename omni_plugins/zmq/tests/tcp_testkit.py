"""Helpers shared by the tests and the processes they spawn (importable in a spawned child:
the tests directory is on ``sys.path``, which ``spawn`` passes on).

Payloads are built deterministically by name in both processes, so the parent compares what it
got with what it builds itself, and nothing but handles crosses the control pipe.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from typing import Any

import numpy as np
import torch

from omni_core.pipeline.connector import ConnectorContext, Edge
from omni_core.testing.connectors import assert_same as assert_same

EDGE = Edge("thinker", "talker")
RUN_ID = "run-test"


def tensor_of(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    return torch.randint(-(2**40), 2**40, shape, generator=gen, dtype=torch.int64).to(dtype)


def big_tensor(nbytes: int) -> torch.Tensor:
    """A float32 tensor of ``nbytes`` bytes whose values are all distinct (cheap to build)."""
    return torch.arange(nbytes // 4, dtype=torch.float32)


def make_payload(name: str) -> Any:
    """The payload called ``name``, the same in every process."""
    if name == "f16":
        return tensor_of(torch.float16, (256, 300), 1)  # 150 KiB: served
    if name == "f32":
        return tensor_of(torch.float32, (128, 257), 2)
    if name == "bf16":
        return tensor_of(torch.bfloat16, (512, 129), 3)
    if name == "i64":
        return tensor_of(torch.int64, (64, 333), 4)
    if name == "zero_d":
        return torch.tensor(3.25, dtype=torch.float64)
    if name == "non_contiguous":
        base = tensor_of(torch.float32, (600, 400), 5)
        return base.t()[::2, 1::3]  # transposed and strided
    if name == "empty":
        return torch.empty(0, 7, dtype=torch.float32)
    if name == "empty_bytes":
        return b""
    if name == "numpy":
        rng = np.random.default_rng(6)
        return {
            "f64": rng.standard_normal((100, 200)),
            "u8": rng.integers(0, 255, (300, 300), dtype=np.uint8),
            "bool": rng.integers(0, 2, (50,)).astype(bool),
            "fortran": np.asfortranarray(rng.standard_normal((64, 48)).astype(np.float32)),
        }
    if name == "nested":
        return {
            "hidden": tensor_of(torch.bfloat16, (4, 64, 256), 7),
            "ids": [tensor_of(torch.int64, (17,), 8), tensor_of(torch.int32, (3, 3), 9)],
            "meta": {"text": "héllo", "n": 3, "ratio": 0.5, "flag": True, "none": None, "raw": b"\x00\x01"},
            "pair": (1, "two", [3.0]),
            "audio": np.linspace(-1, 1, 40_000, dtype=np.float32),
        }
    if name == "small":  # under the inline threshold
        return {"tokens": torch.arange(100, dtype=torch.int64), "done": False}
    if name.startswith("big_"):  # big_<MiB>
        return big_tensor(int(name[4:]) << 20)
    if name.startswith("mib_"):  # mib_<MiB>_<seed>
        _, mib, seed = name.split("_")
        return tensor_of(torch.float32, ((int(mib) << 20) // 4,), int(seed))
    raise KeyError(name)


def connector(extra: dict[str, Any] | None = None, owner: str = "test") -> Any:
    from omni_plugin_zmq.connector import TcpConnector

    return TcpConnector(extra or {}, ConnectorContext(run_id=RUN_ID, owner=owner))


# -- processes -----------------------------------------------------------------------------------


def serve_commands(pipe: Any, extra: dict[str, Any]) -> None:
    """A producer process: builds a connector and runs commands from ``pipe`` until "exit".

    Commands: ("put", name, request_id) -> (handle, put seconds); ("cleanup", request_id);
    ("health",); ("pid",); ("exit",). Each answer is ("ok", value) or ("err", type, message)."""
    conn = connector(extra, owner="thinker")
    try:
        while True:
            command = pipe.recv()
            try:
                if command[0] == "exit":
                    pipe.send(("ok", None))
                    return
                if command[0] == "put":
                    payload = make_payload(command[1])
                    start = time.perf_counter()
                    handle = conn.put(EDGE, command[2], payload, timeout=10)
                    pipe.send(("ok", (handle, time.perf_counter() - start)))
                elif command[0] == "cleanup":
                    conn.cleanup(command[1])
                    pipe.send(("ok", None))
                elif command[0] == "health":
                    pipe.send(("ok", conn.health()))
                elif command[0] == "pid":
                    pipe.send(("ok", os.getpid()))
                else:
                    pipe.send(("err", "KeyError", f"unknown command {command!r}"))
            except Exception as exc:
                pipe.send(("err", type(exc).__name__, f"{exc}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def put_and_leave(pipe: Any) -> None:
    """Put a served payload, report its handle, and exit without closing the connector."""
    conn = connector({"inline_threshold_bytes": 0}, owner="thinker")
    handle = conn.put(EDGE, "r-exit", make_payload("f32"), timeout=5)
    pipe.send(handle)
    # no close(): the daemon server thread and the atexit hook must let the process end


class Producer:
    """A spawned process with a tcp connector, driven over a pipe (see ``serve_commands``)."""

    def __init__(self, extra: dict[str, Any]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipe, child = ctx.Pipe()
        self.process = ctx.Process(target=serve_commands, args=(child, extra), daemon=True)
        self.process.start()
        child.close()

    def call(self, *command: Any, timeout: float = 60) -> Any:
        self.pipe.send(command)
        if not self.pipe.poll(timeout):
            raise TimeoutError(f"producer did not answer {command!r} within {timeout}s")
        answer = self.pipe.recv()
        if answer[0] != "ok":
            raise AssertionError(f"producer failed {command!r}: {answer[1]}: {answer[2]}")
        return answer[1]

    def put(self, name: str, request_id: str) -> dict[str, Any]:
        handle, _ = self.call("put", name, request_id)
        return handle  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.call("exit", timeout=10)
            except (OSError, EOFError, TimeoutError):
                pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
