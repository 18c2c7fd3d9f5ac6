"""The shm connector of a test, and the bodies of the shm-specific processes the tests start
(``spawn``: each is a fresh interpreter that imports this module by name, as a stage process
would). Payloads are ``omni_core.testing.connectors``' cases, the same in every process."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from omni_core.pipeline.connector import ConnectorContext, Edge
from omni_core.testing.connectors import assert_same as assert_same
from omni_core.testing.connectors import payload_case
from omni_core.testing.connectors import payload_cases as cases

EDGE = Edge("thinker", "talker")
OTHER_EDGE = Edge("talker", "code2wav")
#: the large payload of the tests: a 256 MiB int32 tensor
BIG = "big_256"


def big() -> torch.Tensor:
    return payload_case(BIG)  # type: ignore[no-any-return]


def shm(run_id: str, *, owner: bool = False, who: str = "stage", **extra: Any) -> Any:
    from omni_plugin_connectors.shm import ShmConnector

    return ShmConnector(extra, ConnectorContext(run_id=run_id, owner=who, is_owner=owner))


# -- process bodies ---------------------------------------------------------------------------------


def produce(run_id: str, conn: Any, *, with_big: bool, linger: bool) -> None:
    """Put every case (inline where small, and all through segments), send the handles, then
    exit at once (the segments must outlive the producer), or linger to be killed."""
    try:
        small = shm(run_id, who="thinker")
        segmented = shm(run_id, who="thinker", inline_threshold_bytes=0)
        handles: dict[str, Any] = {}
        for name, payload in cases().items():
            handles[f"inline:{name}"] = small.put(EDGE, "req-1", payload, timeout=5)
            handles[f"segment:{name}"] = segmented.put(EDGE, "req-1", payload, timeout=5)
        if with_big:
            handles["big"] = segmented.put(EDGE, "req-1", big(), timeout=30)
        conn.send(("ok", handles))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
    if linger:
        time.sleep(120)  # the test SIGKILLs this process


def consume_and_hold(run_id: str, handle: dict[str, Any], conn: Any) -> None:
    """Get one payload and hold its tensor (the mapping) until SIGKILLed."""
    tensor = shm(run_id, who="talker").get(EDGE, "req-1", handle, timeout=5)
    conn.send(("held", int(tensor[-1]), os.getpid()))
    time.sleep(120)


def put_without_room(run_id: str, conn: Any) -> None:
    """Put a 4 MiB payload in a process whose files may not grow past 1 MiB (RLIMIT_FSIZE):
    the segment cannot be given its pages, as when /dev/shm is full."""
    import resource
    import signal

    from omni_core.errors import ConnectorError

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    try:
        shm(run_id, who="thinker").put(EDGE, "req-1", torch.zeros(1 << 20), timeout=5)
        conn.send(("stored", ""))
    except ConnectorError as exc:
        conn.send(("ConnectorError", str(exc)))
    except BaseException as exc:
        conn.send((type(exc).__name__, str(exc)))
