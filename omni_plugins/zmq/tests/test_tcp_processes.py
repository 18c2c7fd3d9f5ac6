"""Payloads crossing real processes over loopback: the producer is a spawned process."""

from __future__ import annotations

import os
import signal
import time

import pytest
from tcp_testkit import EDGE, producer

from omni_core.errors import ConnectorError
from omni_core.pipeline.payload import encode
from omni_core.testing.connectors import assert_same, payload_case, payload_cases

#: the connector's default inline threshold
INLINE_THRESHOLD = 65536


@pytest.fixture(scope="module")
def consumer():  # type: ignore[no-untyped-def]
    from tcp_testkit import connector

    conn = connector({}, owner="talker")
    yield conn
    conn.close()


@pytest.mark.parametrize("served", [False, True], ids=["inline_when_small", "all_served"])
@pytest.mark.parametrize("name", list(payload_cases()))
def test_payload_crosses_processes(request, consumer, name, served) -> None:  # type: ignore[no-untyped-def]
    proc = request.getfixturevalue("served_producer" if served else "producer")
    handle, _ = proc.put(EDGE, f"r-{name}", name)
    inline = not served and encode(payload_case(name)).nbytes <= INLINE_THRESHOLD
    assert ("inline" in handle) is inline, handle.keys()
    if not inline:
        assert handle["addr"].startswith("tcp://127.0.0.1:") and handle["key"].startswith(f"r-{name}/{EDGE.key}/")
    got = consumer.get(EDGE, f"r-{name}", handle, timeout=10)
    assert_same(got, payload_case(name), name)


def test_received_tensors_are_writable_and_outlive_the_frame(producer, consumer) -> None:  # type: ignore[no-untyped-def]
    import gc

    got = consumer.get(EDGE, "r-w", producer.put(EDGE, "r-w", "large")[0], timeout=10)
    gc.collect()
    want = payload_case("large")
    assert_same(got, want)
    got += 1  # in place, on the memory the frame arrived in
    assert_same(got, want + 1)


@pytest.mark.parametrize("mib", [64, 256])
def test_large_tensor_crosses_processes(producer, consumer, mib) -> None:  # type: ignore[no-untyped-def]
    handle, put_s = producer.put(EDGE, f"r-big{mib}", f"big_{mib}")
    assert handle["nbytes"] >= mib << 20
    start = time.perf_counter()
    got = consumer.get(EDGE, f"r-big{mib}", handle, timeout=30)
    get_s = time.perf_counter() - start
    assert_same(got, payload_case(f"big_{mib}"))
    print(f"\n{mib} MiB: put {put_s * 1000:.0f} ms, get {get_s * 1000:.0f} ms ({mib / 1024 / get_s:.2f} GiB/s)")
    del got
    assert producer.health()["buffered_bytes"] == 0


def test_each_handle_is_read_once(producer, consumer) -> None:  # type: ignore[no-untyped-def]
    handle, _ = producer.put(EDGE, "r-once", "large")
    consumer.get(EDGE, "r-once", handle, timeout=10)
    with pytest.raises(ConnectorError, match=r"is gone .*already read, or its request was cleaned up"):
        consumer.get(EDGE, "r-once", handle, timeout=10)


def test_cleanup_drops_only_that_request(producer, consumer) -> None:  # type: ignore[no-untyped-def]
    dropped = [producer.put(EDGE, "r-drop", "large")[0], producer.put(EDGE, "r-drop", "big_1")[0]]
    kept, _ = producer.put(EDGE, "r-keep", "big_2")
    before = producer.health()
    assert before["buffered"] == 3 and before["buffered_bytes"] == sum(h["nbytes"] for h in [*dropped, kept])
    producer.cleanup("r-drop")
    producer.cleanup("r-never-seen")  # nothing to drop: no error
    assert producer.health()["buffered"] == 1
    for handle in dropped:
        with pytest.raises(ConnectorError, match="is gone"):
            consumer.get(EDGE, "r-drop", handle, timeout=10)
    assert_same(consumer.get(EDGE, "r-keep", kept, timeout=10), payload_case("big_2"))
    assert producer.health()["buffered"] == 0


def test_oversize_payload_is_refused_in_the_producer() -> None:
    with producer({"max_payload_bytes": 100_000}) as proc:
        with pytest.raises(
            AssertionError, match=r"PayloadError: payload of [\d,]+ bytes .*max_payload_bytes \(100,000\)"
        ):
            proc.put(EDGE, "r-big", "large")
        assert proc.health()["buffered"] == 0


def test_get_from_a_killed_producer_fails_within_its_timeout(consumer) -> None:  # type: ignore[no-untyped-def]
    with producer({}) as proc:
        handle, _ = proc.put(EDGE, "r-dead", "large")
        os.kill(proc.pid, signal.SIGKILL)
        proc.process.join(10)
        timeout = 1.5
        start = time.monotonic()
        with pytest.raises(ConnectorError) as info:
            consumer.get(EDGE, "r-dead", handle, timeout=timeout)
        elapsed = time.monotonic() - start
    assert timeout <= elapsed + 0.05 and elapsed < timeout + 1.0, elapsed
    message = str(info.value)
    assert handle["addr"] in message and str(EDGE) in message and "1.5s" in message and "'thinker'" in message


def test_a_process_that_never_closes_still_exits() -> None:
    """The daemon server thread and the atexit hook must let a process end whose connector
    still serves a payload."""
    with producer({"inline_threshold_bytes": 0}) as proc:
        handle, _ = proc.put(EDGE, "r-exit", "float32")
        assert "addr" in handle
        proc.leave()
        proc.process.join(15)
        alive = proc.process.is_alive()
    assert not alive and proc.process.exitcode == 0
