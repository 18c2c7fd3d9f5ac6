"""The ``mooncake`` connector between real processes: a spawned stage process (a fresh
interpreter, as the runtime starts one) and this one, over loopback TCP."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from mooncake_testkit import BIG, EDGE, engine_skip_reason, mooncake, stage

from omni_core.errors import ConnectorError
from omni_core.testing.connectors import ConnectorProcess, assert_same, payload_case
from omni_core.testing.connectors import payload_cases as cases

_reason = engine_skip_reason()
if _reason:
    pytest.skip(_reason, allow_module_level=True)


@pytest.fixture(scope="module")
def here(stage_run_id: str) -> Iterator[Any]:
    """This process's instance of the stage's run (the orchestrator's, say)."""
    conn = mooncake(stage_run_id, who="orchestrator", owner=True, inline_threshold_bytes=0)
    yield conn
    conn.close()


@pytest.mark.parametrize("name", list(cases()))
def test_payloads_put_by_the_stage_process_arrive_here(stage: ConnectorProcess, here: Any, name: str) -> None:
    handle, _ = stage.put(EDGE, "req-1", name)
    assert_same(here.get(EDGE, "req-1", handle, timeout=10), cases()[name], name)
    with pytest.raises(ConnectorError, match="already read"):
        here.get(EDGE, "req-1", handle, timeout=10)


@pytest.mark.parametrize("name", list(cases()))
def test_payloads_put_here_arrive_in_the_stage_process(stage: ConnectorProcess, here: Any, name: str) -> None:
    handle = here.put(EDGE, "req-2", cases()[name], timeout=10)
    stage.get(EDGE, "req-2", handle, name)
    assert here.health()["pool_used_bytes"] == 0  # the stage marked it taken: the slot is free here


def test_a_64_mib_payload_both_ways(stage: ConnectorProcess, here: Any) -> None:
    payload = payload_case(BIG)
    handle, put_s = stage.put(EDGE, "req-big", BIG)
    assert handle["nbytes"] > 64 << 20
    start = time.perf_counter()
    got = here.get(EDGE, "req-big", handle, timeout=60)
    get_s = time.perf_counter() - start
    assert_same(got, payload, "64 MiB tensor")
    back = here.put(EDGE, "req-big", payload, timeout=60)
    back_get_s = stage.get(EDGE, "req-big", back, BIG)
    mb = handle["nbytes"] / 1e6
    print(
        f"\n64 MiB over loopback: stage put {put_s * 1e3:.0f} ms, get here {get_s * 1e3:.0f} ms "
        f"({mb / get_s:.0f} MB/s); get in the stage {back_get_s * 1e3:.0f} ms ({mb / back_get_s:.0f} MB/s)"
    )


def test_cleanup_in_the_stage_process_frees_its_payloads(stage: ConnectorProcess, here: Any) -> None:
    handle, _ = stage.put(EDGE, "req-gone", "nested")
    kept, _ = stage.put(EDGE, "req-kept", "float16")
    assert stage.health()["waiting_payloads"] == 2
    stage.cleanup("req-gone")
    with pytest.raises(ConnectorError, match="gone"):
        here.get(EDGE, "req-gone", handle, timeout=10)
    assert_same(here.get(EDGE, "req-kept", kept, timeout=10), cases()["float16"])
    assert stage.health()["waiting_payloads"] == 0


def test_a_dead_producer_fails_a_get_at_once(run_id: str, here: Any) -> None:
    doomed = stage(run_id)  # here is of another run: build a consumer of this one
    consumer = mooncake(run_id, who="consumer")
    try:
        first, _ = doomed.put(EDGE, "req-dead", "large")
        second, _ = doomed.put(EDGE, "req-dead", "large")
        consumer.get(EDGE, "req-dead", first, timeout=10)  # the session is open and cached
        doomed.process.kill()
        doomed.process.join(10)
        start = time.monotonic()
        with pytest.raises(ConnectorError, match="could not be read"):
            consumer.get(EDGE, "req-dead", second, timeout=20)
        assert time.monotonic() - start < 5
    finally:
        consumer.close()
        doomed.stop()


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_a_stopped_producer_fails_a_get_within_its_timeout(run_id: str) -> None:
    """The engine's own limits are 30 s (a transfer) and ~60 s (a first handshake): a get still
    ends when its own timeout does, for a peer it has reached before and for a new one."""
    stopped = stage(run_id)
    consumer = mooncake(run_id, who="consumer")
    fresh = mooncake(run_id, who="fresh-consumer")
    try:
        first, _ = stopped.put(EDGE, "req-stop", "large")
        second, _ = stopped.put(EDGE, "req-stop", "large")
        consumer.get(EDGE, "req-stop", first, timeout=10)
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            for conn, what in ((consumer, "a reached peer"), (fresh, "a first handshake")):
                start = time.monotonic()
                with pytest.raises(ConnectorError, match="did not arrive within the get's timeout"):
                    conn.get(EDGE, "req-stop", second, timeout=1.0)
                elapsed = time.monotonic() - start
                assert 1.0 <= elapsed < 3.0, f"{what}: {elapsed:.1f} s"
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
    finally:
        stopped.process.kill()
        stopped.process.join(10)
        stopped.stop()
        consumer.close()
        fresh.close()
