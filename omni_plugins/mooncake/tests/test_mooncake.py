"""The ``mooncake`` connector with real transfer engines over loopback TCP, producer and consumer
in this process (each instance owns its own engine, as two stage processes would)."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from mooncake_testkit import EDGE, OTHER_EDGE, engine_skip_reason, mooncake

from omni_core.errors import ConnectorError, PayloadError
from omni_core.pipeline.payload import encode
from omni_core.testing.connectors import assert_same
from omni_core.testing.connectors import payload_cases as cases

_reason = engine_skip_reason()
if _reason:
    pytest.skip(_reason, allow_module_level=True)

MiB = 1 << 20


@pytest.fixture(scope="module")
def run() -> str:
    return "tmooncake_inproc"


@pytest.fixture(scope="module")
def producer(run: str) -> Iterator[Any]:
    """Every payload through the pool (no inline), a pool of 8 MiB."""
    conn = mooncake(run, who="thinker", inline_threshold_bytes=0, buffer_bytes=8 * MiB)
    yield conn
    conn.close()


@pytest.fixture(scope="module")
def consumer(run: str) -> Iterator[Any]:
    conn = mooncake(run, who="talker", owner=True)
    yield conn
    conn.close()


def used(conn: Any) -> int:
    health = conn.health()
    assert health["ok"] is True
    return int(health["pool_used_bytes"])


@pytest.fixture(autouse=True)
def pool_is_empty_after(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, the module's producer holds no payload (every test reads or cleans up)."""
    yield
    if "producer" in request.fixturenames:
        producer = request.getfixturevalue("producer")
        if not producer._closed:
            assert used(producer) == 0, producer.health()


# -- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(cases()))
def test_every_case_round_trips_through_the_pool(producer: Any, consumer: Any, name: str) -> None:
    payload = cases()[name]
    handle = producer.put(EDGE, "req-1", payload, timeout=5)
    assert sorted(handle) == ["addr", "key", "nbytes", "session"]
    assert handle["nbytes"] == encode(payload).nbytes
    assert handle["session"] == producer.session and isinstance(handle["addr"], int)
    assert used(producer) > 0
    got = consumer.get(EDGE, "req-1", handle, timeout=5)
    assert_same(got, payload, name)
    assert used(producer) == 0  # taken: the producer freed the slot


def test_small_payloads_travel_inline_and_decode_as_often_as_read(consumer: Any, run: str) -> None:
    conn = consumer  # default options: a 64 KiB inline threshold
    payload = cases()["nested"]
    handle = conn.put(EDGE, "req-inline", payload, timeout=5)
    assert sorted(handle) == ["inline", "nbytes"] and handle["nbytes"] == len(handle["inline"])
    assert_same(consumer.get(EDGE, "req-inline", handle, timeout=5), payload)
    assert_same(consumer.get(EDGE, "req-inline", handle, timeout=5), payload)
    assert used(conn) == 0


def test_the_consumer_gets_its_own_writable_copy(producer: Any, consumer: Any) -> None:
    sent = torch.arange(6, dtype=torch.float32)
    handle = producer.put(EDGE, "req-copy", {"t": sent}, timeout=5)
    sent += 100  # after put returned: not seen by the consumer
    got = consumer.get(EDGE, "req-copy", handle, timeout=5)["t"]
    assert torch.equal(got, torch.arange(6, dtype=torch.float32))
    got.mul_(2)  # writable, and its own memory
    assert got[1].item() == 2.0


def test_each_handle_is_read_once(producer: Any, consumer: Any) -> None:
    handle = producer.put(EDGE, "req-once", cases()["float32"], timeout=5)
    consumer.get(EDGE, "req-once", handle, timeout=5)
    with pytest.raises(ConnectorError, match="already read"):
        consumer.get(EDGE, "req-once", handle, timeout=5)
    # and once its slot is reused by another payload, the old handle finds another key
    again = producer.put(EDGE, "req-once", cases()["float32"], timeout=5)
    assert again["addr"] == handle["addr"]
    with pytest.raises(ConnectorError, match="gone"):
        consumer.get(EDGE, "req-once", handle, timeout=5)
    consumer.get(EDGE, "req-once", again, timeout=5)


def test_a_handle_is_read_only_on_its_edge_and_request(producer: Any, consumer: Any) -> None:
    payload = cases()["int64"]
    handle = producer.put(EDGE, "req-route", payload, timeout=5)
    with pytest.raises(ConnectorError, match="not a payload of request 'req-route' on this edge"):
        consumer.get(OTHER_EDGE, "req-route", handle, timeout=5)
    with pytest.raises(ConnectorError, match="not a payload of request 'req-other'"):
        consumer.get(EDGE, "req-other", handle, timeout=5)
    other_run = mooncake("another-run", who="talker")
    try:
        with pytest.raises(ConnectorError, match="of run 'another-run'"):
            other_run.get(EDGE, "req-route", handle, timeout=5)
    finally:
        other_run.close()
    # none of those took it
    assert_same(consumer.get(EDGE, "req-route", handle, timeout=5), payload)


def test_concurrent_gets_of_one_consumer(producer: Any, consumer: Any) -> None:
    payloads = {i: torch.full((1000 + i,), float(i)) for i in range(8)}
    handles = {i: producer.put(EDGE, f"req-{i}", p, timeout=5) for i, p in payloads.items()}
    results: dict[int, Any] = {}

    def read(i: int) -> None:
        results[i] = consumer.get(EDGE, f"req-{i}", handles[i], timeout=10)

    threads = [threading.Thread(target=read, args=(i,)) for i in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == sorted(payloads)
    for i, payload in payloads.items():
        assert_same(results[i], payload, f"payload {i}")


# -- malformed handles --------------------------------------------------------------------------


def good_handle(producer: Any) -> dict[str, Any]:
    return producer.put(EDGE, "req-bad", cases()["float32"], timeout=5)


MALFORMED = [
    pytest.param(lambda h: {}, "lacks 'session', 'addr', 'nbytes', 'key'", id="empty"),
    pytest.param(lambda h: {"nbytes": "x"}, "lacks", id="nbytes_only"),
    pytest.param(lambda h: None, "is None, not a dict", id="none"),
    pytest.param(lambda h: [h], "is a list, not a dict", id="list"),
    pytest.param(lambda h: {**h, "extra": 1}, "unknown key", id="extra_key"),
    pytest.param(lambda h: {**h, "addr": True}, "'addr' is bool", id="addr_bool"),
    pytest.param(lambda h: {**h, "addr": str(h["addr"])}, "'addr' is str", id="addr_str"),
    pytest.param(lambda h: {**h, "nbytes": -5}, "negative", id="nbytes_negative"),
    pytest.param(lambda h: {**h, "nbytes": 3}, "no payload is that small", id="nbytes_tiny"),
    pytest.param(lambda h: {**h, "key": "xyz"}, "not 16 hex digits", id="key_not_hex"),
    pytest.param(lambda h: {**h, "session": "no port here"}, "is not 'host:port'", id="session_no_port"),
    pytest.param(lambda h: {**h, "addr": 0}, "is not an address", id="addr_zero"),
    pytest.param(lambda h: {**h, "key": f"{int(h['key'], 16) ^ 1:016x}"}, "gone", id="other_key"),
    pytest.param(lambda h: {**h, "nbytes": h["nbytes"] + 64}, "with .* bytes: the handle was altered", id="nbytes_off"),
    pytest.param(lambda h: {**h, "addr": h["addr"] + 64}, "gone", id="addr_inside_the_slot"),
    # the producer's engine refuses what is outside its registered pool
    pytest.param(lambda h: {**h, "addr": 4096}, "could not be read", id="addr_outside_the_pool"),
    pytest.param(lambda h: {**h, "addr": h["addr"] + 8 * MiB - 128}, "could not be read", id="past_the_pools_end"),
    pytest.param(lambda h: {**h, "session": "127.0.0.1:1"}, "could not be read", id="nobody_at_session"),
    pytest.param(lambda h: {"inline": b"not a frame at all", "nbytes": 18}, "does not decode", id="inline_garbage"),
    pytest.param(lambda h: {"inline": b"abc", "nbytes": 4}, "the handle was altered", id="inline_size_off"),
]


@pytest.mark.parametrize(("change", "message"), MALFORMED)
def test_a_malformed_handle_is_a_connector_error(producer: Any, consumer: Any, change: Any, message: str) -> None:
    handle = good_handle(producer)
    try:
        start = time.monotonic()
        with pytest.raises(ConnectorError, match=message):
            consumer.get(EDGE, "req-bad", change(handle), timeout=5)
        assert time.monotonic() - start < 4, "a malformed handle must fail at once"
        # the real handle still reads: nothing above took the payload
        assert_same(consumer.get(EDGE, "req-bad", handle, timeout=5), cases()["float32"])
    finally:
        producer.cleanup("req-bad")


# -- sizes --------------------------------------------------------------------------------------


def test_a_payload_over_max_payload_bytes_is_refused_and_leaves_nothing(run: str) -> None:
    limited = mooncake(run, who="limited", max_payload_bytes=1000, inline_threshold_bytes=0)
    try:
        with pytest.raises(PayloadError, match=r"max_payload_bytes \(1,000\)"):
            limited.put(EDGE, "req-big", torch.zeros(1000), timeout=5)
        assert limited.health()["waiting_payloads"] == 0
        # the consumer side refuses a handle over its limit before it allocates anything
        handle = {"session": "127.0.0.1:9", "addr": 1 << 40, "nbytes": 10**15, "key": "0" * 16}
        with pytest.raises(ConnectorError, match=r"over this connector's max_payload_bytes"):
            limited.get(EDGE, "req-big", handle, timeout=5)
    finally:
        limited.close()


def test_a_payload_larger_than_the_pool_is_refused_at_once(producer: Any) -> None:
    start = time.monotonic()
    with pytest.raises(ConnectorError, match=r"does not fit the staging pool \(buffer_bytes 8,388,608"):
        producer.put(EDGE, "req-huge", torch.zeros(2 * MiB + 1), timeout=5)
    assert time.monotonic() - start < 1


def test_a_full_pool_waits_for_consumers_then_gives_up(producer: Any, consumer: Any) -> None:
    three_mib = torch.ones(3 * MiB // 4)
    first = producer.put(EDGE, "req-full", three_mib, timeout=5)
    second = producer.put(EDGE, "req-full", three_mib, timeout=5)
    start = time.monotonic()
    with pytest.raises(ConnectorError, match="stayed full: 2 payload"):
        producer.put(EDGE, "req-full", three_mib, timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 2
    # a consumer that reads while the put waits makes room for it
    reader = threading.Timer(0.2, lambda: consumer.get(EDGE, "req-full", first, timeout=5))
    reader.start()
    third = producer.put(EDGE, "req-full", three_mib, timeout=5)
    reader.join()
    for handle in (second, third):
        assert_same(consumer.get(EDGE, "req-full", handle, timeout=5), three_mib)


def test_a_large_payload_fills_most_of_the_pool(producer: Any, consumer: Any) -> None:
    payload = torch.arange(8 * MiB // 4 - 64, dtype=torch.float32)  # 8 MiB less 256 bytes
    handle = producer.put(EDGE, "req-large", payload, timeout=5)
    assert_same(consumer.get(EDGE, "req-large", handle, timeout=10), payload)


# -- cleanup, timeouts, close -------------------------------------------------------------------


def test_cleanup_frees_a_requests_payloads_read_or_not(producer: Any, consumer: Any) -> None:
    a1 = producer.put(EDGE, "req-a", cases()["float16"], timeout=5)
    a2 = producer.put(OTHER_EDGE, "req-a", cases()["bfloat16"], timeout=5)
    b = producer.put(EDGE, "req-b", cases()["int64"], timeout=5)
    assert producer.health()["waiting_payloads"] == 3
    producer.cleanup("req-a")
    consumer.cleanup("req-a")  # nothing on the consumer's side
    for handle, edge in ((a1, EDGE), (a2, OTHER_EDGE)):
        with pytest.raises(ConnectorError, match="gone"):
            consumer.get(edge, "req-a", handle, timeout=5)
    assert producer.health()["waiting_payloads"] == 1
    assert_same(consumer.get(EDGE, "req-b", b, timeout=5), cases()["int64"])
    producer.cleanup("req-a")  # twice, and of requests nobody knows: no error
    producer.cleanup("never-seen")


@pytest.mark.parametrize("timeout", [-1, math.nan, math.inf, True, "5", None])
def test_a_timeout_must_be_finite_seconds(producer: Any, consumer: Any, timeout: Any) -> None:
    with pytest.raises(ConnectorError, match="timeout must be"):
        producer.put(EDGE, "req-t", b"x", timeout=timeout)
    with pytest.raises(ConnectorError, match="timeout must be"):
        consumer.get(EDGE, "req-t", {"inline": b"", "nbytes": 0}, timeout=timeout)


def test_a_payload_the_codec_refuses_is_a_payload_error(producer: Any) -> None:
    with pytest.raises(PayloadError):
        producer.put(EDGE, "req-set", {1, 2}, timeout=5)
    with pytest.raises(PayloadError):
        producer.put(EDGE, "req-set", np.array(["strings"]), timeout=5)


def test_close_is_idempotent_and_ends_everything(run: str, consumer: Any) -> None:
    conn = mooncake(run, who="closing", inline_threshold_bytes=0)
    handle = conn.put(EDGE, "req-close", cases()["float32"], timeout=5)
    start = time.monotonic()
    conn.close()
    conn.close()
    assert time.monotonic() - start < 10
    assert conn.health()["ok"] is False
    with pytest.raises(ConnectorError, match="closed"):
        conn.put(EDGE, "req-close", b"x", timeout=5)
    with pytest.raises(ConnectorError, match="closed"):
        conn.get(EDGE, "req-close", handle, timeout=5)
    conn.cleanup("req-close")  # no error either
    # the producer's engine is gone: its handle fails at once, never hangs
    start = time.monotonic()
    with pytest.raises(ConnectorError, match="could not be read"):
        consumer.get(EDGE, "req-close", handle, timeout=5)
    assert time.monotonic() - start < 4


def test_per_owner_gives_a_process_its_own_address(run: str, consumer: Any) -> None:
    extra = {"inline_threshold_bytes": 0, "per_owner": {"vocoder": {"local_hostname": "localhost"}}}
    conn = mooncake(run, who="vocoder", **extra)
    try:
        assert conn.session.startswith("localhost:")
        handle = conn.put(EDGE, "req-owner", cases()["float32"], timeout=5)
        assert handle["session"] == conn.session
        assert_same(consumer.get(EDGE, "req-owner", handle, timeout=5), cases()["float32"])
    finally:
        conn.close()
    assert consumer.session.startswith("127.0.0.1:")


def test_an_engine_that_does_not_start_is_a_connector_error(run: str) -> None:
    with pytest.raises(ConnectorError, match=r"cannot start its transfer engine: TransferEngine.initialize\("):
        mooncake(run, who="broken", metadata_server="http://127.0.0.1:1/metadata")  # nobody there


@pytest.mark.skipif(os.path.isdir("/sys/class/infiniband"), reason="this machine has RDMA devices")
def test_rdma_without_an_rdma_device_is_refused(run: str) -> None:
    # the engine itself starts and silently moves the data another way
    with pytest.raises(ConnectorError, match="found no RDMA device"):
        mooncake(run, who="rdma", protocol="rdma")
