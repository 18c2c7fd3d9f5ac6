"""Payloads crossing real processes over loopback: the producer is a spawned process."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest
from tcp_testkit import EDGE, Producer, assert_same, make_payload, put_and_leave

from omni_core.errors import ConnectorError


@pytest.fixture(scope="module")
def consumer():  # type: ignore[no-untyped-def]
    from tcp_testkit import connector

    conn = connector({}, owner="talker")
    yield conn
    conn.close()


@pytest.mark.parametrize(
    "name",
    ["f16", "f32", "bf16", "i64", "zero_d", "non_contiguous", "empty", "empty_bytes", "numpy", "nested", "small"],
)
def test_payload_crosses_processes(producer, consumer, name) -> None:  # type: ignore[no-untyped-def]
    handle = producer.put(name, f"r-{name}")
    inline = name in ("zero_d", "empty", "empty_bytes", "small")
    assert ("inline" in handle) is inline, handle.keys()
    if not inline:
        assert handle["addr"].startswith("tcp://127.0.0.1:") and handle["key"].startswith(f"r-{name}/{EDGE.key}/")
    got = consumer.get(EDGE, f"r-{name}", handle, timeout=10)
    assert_same(got, make_payload(name))


def test_received_tensors_are_writable_and_outlive_the_frame(producer, consumer) -> None:  # type: ignore[no-untyped-def]
    import gc

    got = consumer.get(EDGE, "r-w", producer.put("f32", "r-w"), timeout=10)
    gc.collect()
    want = make_payload("f32")
    assert_same(got, want)
    got += 1  # in place, on the memory the frame arrived in
    assert_same(got, want + 1)


@pytest.mark.parametrize("mib", [64, 256])
def test_large_tensor_crosses_processes(producer, consumer, mib) -> None:  # type: ignore[no-untyped-def]
    handle, put_s = producer.call("put", f"big_{mib}", f"r-big{mib}")
    assert handle["nbytes"] >= mib << 20
    start = time.perf_counter()
    got = consumer.get(EDGE, f"r-big{mib}", handle, timeout=30)
    get_s = time.perf_counter() - start
    assert_same(got, make_payload(f"big_{mib}"))
    print(f"\n{mib} MiB: put {put_s * 1000:.0f} ms, get {get_s * 1000:.0f} ms ({mib / 1024 / get_s:.2f} GiB/s)")
    del got
    assert producer.call("health")["buffered_bytes"] == 0


def test_each_handle_is_read_once(producer, consumer) -> None:  # type: ignore[no-untyped-def]
    handle = producer.put("f32", "r-once")
    consumer.get(EDGE, "r-once", handle, timeout=10)
    with pytest.raises(ConnectorError, match=r"is gone .*already read, or its request was cleaned up"):
        consumer.get(EDGE, "r-once", handle, timeout=10)


def test_cleanup_drops_only_that_request(producer, consumer) -> None:  # type: ignore[no-untyped-def]
    dropped = [producer.put("f16", "r-drop"), producer.put("bf16", "r-drop")]
    kept = producer.put("i64", "r-keep")
    before = producer.call("health")
    assert before["buffered"] == 3 and before["buffered_bytes"] == sum(h["nbytes"] for h in [*dropped, kept])
    producer.call("cleanup", "r-drop")
    producer.call("cleanup", "r-never-seen")  # nothing to drop: no error
    assert producer.call("health")["buffered"] == 1
    for handle in dropped:
        with pytest.raises(ConnectorError, match="is gone"):
            consumer.get(EDGE, "r-drop", handle, timeout=10)
    assert_same(consumer.get(EDGE, "r-keep", kept, timeout=10), make_payload("i64"))
    assert producer.call("health")["buffered"] == 0


def test_oversize_payload_is_refused_in_the_producer() -> None:
    proc = Producer({"max_payload_bytes": 100_000})
    try:
        with pytest.raises(
            AssertionError, match=r"PayloadError: payload of [\d,]+ bytes .*max_payload_bytes \(100,000\)"
        ):
            proc.put("f16", "r-big")
        assert proc.call("health")["buffered"] == 0
    finally:
        proc.stop()


def test_get_from_a_killed_producer_fails_within_its_timeout(consumer) -> None:  # type: ignore[no-untyped-def]
    proc = Producer({})
    handle = proc.put("f32", "r-dead")
    os.kill(proc.call("pid"), signal.SIGKILL)
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
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=put_and_leave, args=(child,))
    proc.start()
    assert parent.poll(60)
    assert "addr" in parent.recv()
    proc.join(15)
    alive = proc.is_alive()
    if alive:
        proc.kill()
    assert not alive and proc.exitcode == 0
