"""The connector's rules, with producer and consumer in this process (still over loopback TCP)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
import torch
from tcp_testkit import EDGE

from omni_core.errors import ConnectorError, PayloadError
from omni_core.pipeline.connector import Edge
from omni_core.testing.connectors import assert_same, big_payload, payload_case

#: a payload over the 64 KiB inline threshold, under 1 MiB
KIB_256 = 256 << 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("omni-tcp")]


# -- handles -------------------------------------------------------------------------------------


def test_small_payloads_travel_inline_and_large_ones_are_served(make_conn) -> None:  # type: ignore[no-untyped-def]
    prod, cons = make_conn(owner="thinker"), make_conn(owner="talker")
    small = prod.put(EDGE, "r1", payload_case("nested"), timeout=5)
    assert set(small) == {"inline", "nbytes"} and isinstance(small["inline"], bytes)
    assert small["nbytes"] == len(small["inline"]) <= 65536
    assert prod.health()["buffered"] == 0
    served = prod.put(EDGE, "r1", payload_case("large"), timeout=5)
    assert set(served) == {"addr", "key", "nbytes"} and served["addr"] == prod.addr
    assert prod.health() == {"ok": True, "addr": prod.addr, "buffered": 1, "buffered_bytes": served["nbytes"]}
    assert_same(cons.get(EDGE, "r1", small, timeout=5), payload_case("nested"))
    assert_same(cons.get(EDGE, "r1", served, timeout=5), payload_case("large"))
    assert prod.health()["buffered"] == 0 and prod.health()["buffered_bytes"] == 0


def test_inline_threshold_is_an_option(make_conn) -> None:  # type: ignore[no-untyped-def]
    prod = make_conn({"inline_threshold_bytes": 0})
    assert "addr" in prod.put(EDGE, "r", payload_case("nested"), timeout=5)
    prod = make_conn({"inline_threshold_bytes": 1 << 20})
    assert "inline" in prod.put(EDGE, "r", big_payload(KIB_256), timeout=5)


def test_the_producer_may_change_its_tensor_after_put(make_conn) -> None:  # type: ignore[no-untyped-def]
    prod, cons = make_conn(), make_conn()
    tensor = big_payload(KIB_256)
    handle = prod.put(EDGE, "r", tensor, timeout=5)
    tensor.zero_()  # a reused buffer: the payload put earlier is a snapshot
    assert_same(cons.get(EDGE, "r", handle, timeout=5), big_payload(KIB_256))


def _listening_addr() -> str:
    return f"tcp://127.0.0.1:{_free_port()}"


MALFORMED: list[tuple[str, Any]] = [
    ("not a dict", None),
    ("a list", [1, 2]),
    ("empty", {}),
    ("nbytes negative", {"inline": b"", "nbytes": -1}),
    ("nbytes a bool", {"inline": b"", "nbytes": True}),
    ("nbytes a str", {"addr": "tcp://127.0.0.1:5555", "key": "k", "nbytes": "10"}),
    ("inline a str", {"inline": "abc", "nbytes": 3}),
    ("inline size mismatch", {"inline": b"abcd", "nbytes": 3}),
    ("inline garbage", {"inline": b"not a payload frame", "nbytes": 19}),
    ("addr missing", {"key": "k", "nbytes": 10}),
    ("addr not tcp", {"addr": "ipc:///tmp/x", "key": "k", "nbytes": 10}),
    ("addr http", {"addr": "http://127.0.0.1:80", "key": "k", "nbytes": 10}),
    ("addr no port", {"addr": "tcp://127.0.0.1", "key": "k", "nbytes": 10}),
    ("addr port 0", {"addr": "tcp://127.0.0.1:0", "key": "k", "nbytes": 10}),
    ("addr an int", {"addr": 5555, "key": "k", "nbytes": 10}),
    ("key missing", {"addr": "tcp://127.0.0.1:5555", "nbytes": 10}),
    ("key empty", {"addr": "tcp://127.0.0.1:5555", "key": "", "nbytes": 10}),
    ("key an int", {"addr": "tcp://127.0.0.1:5555", "key": 7, "nbytes": 10}),
    ("key too long", {"addr": "tcp://127.0.0.1:5555", "key": "k" * 10_000, "nbytes": 10}),
    ("key not utf-8", {"addr": "tcp://127.0.0.1:5555", "key": "k\udc80", "nbytes": 10}),
]


@pytest.mark.parametrize("handle", [h for _, h in MALFORMED], ids=[n for n, _ in MALFORMED])
def test_malformed_handles_raise_connector_error_at_once(make_conn, handle) -> None:  # type: ignore[no-untyped-def]
    cons = make_conn()
    start = time.monotonic()
    with pytest.raises(ConnectorError, match=str(EDGE)):
        cons.get(EDGE, "r", handle, timeout=5)
    assert time.monotonic() - start < 1


def test_an_unknown_key_on_a_live_server_is_gone(make_conn) -> None:  # type: ignore[no-untyped-def]
    prod, cons = make_conn(), make_conn()
    with pytest.raises(ConnectorError, match="is gone"):
        cons.get(EDGE, "r", {"addr": prod.addr, "key": "r/x_to_y/99", "nbytes": 100}, timeout=5)


def test_an_address_nobody_listens_on_times_out_naming_it(make_conn) -> None:  # type: ignore[no-untyped-def]
    cons = make_conn()
    addr = _listening_addr()
    start = time.monotonic()
    with pytest.raises(ConnectorError, match=rf"no answer from {addr} within 0.3s .*{EDGE}"):
        cons.get(EDGE, "r", {"addr": addr, "key": "r/x/0", "nbytes": 100}, timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 1.3


def test_a_handle_whose_size_lies_is_refused_and_nothing_wrong_is_returned(make_conn) -> None:  # type: ignore[no-untyped-def]
    prod, cons = make_conn(), make_conn()
    handle = prod.put(EDGE, "r", payload_case("large"), timeout=5)
    with pytest.raises(ConnectorError, match="handle says"):
        cons.get(EDGE, "r", {**handle, "nbytes": handle["nbytes"] + 1}, timeout=5)


# -- limits --------------------------------------------------------------------------------------


def test_a_payload_over_max_payload_bytes_is_refused_and_leaves_nothing(make_conn) -> None:  # type: ignore[no-untyped-def]
    prod = make_conn({"max_payload_bytes": 1000})
    with pytest.raises(PayloadError, match=r"over the 'tcp' connector's max_payload_bytes \(1,000\)"):
        prod.put(EDGE, "r", payload_case("large"), timeout=5)
    with pytest.raises(PayloadError, match="max_payload_bytes"):  # inline-sized too
        prod.put(EDGE, "r", torch.zeros(1000), timeout=5)
    assert prod.health()["buffered"] == 0 and prod.health()["buffered_bytes"] == 0


def test_a_type_the_wire_does_not_carry_is_a_payload_error(make_conn) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PayloadError):
        make_conn().put(EDGE, "r", object(), timeout=5)


def test_a_full_outbox_waits_for_consumers_then_names_the_limit(make_conn) -> None:  # type: ignore[no-untyped-def]
    mib = 1 << 20
    prod = make_conn({"max_buffered_bytes": 3 * mib + 4096, "inline_threshold_bytes": 0})
    cons = make_conn()
    handles = [prod.put(EDGE, "r", torch.zeros(mib // 4), timeout=1) for _ in range(3)]
    start = time.monotonic()
    with pytest.raises(ConnectorError, match=r"stayed full for 0.3s.*max_buffered_bytes \(3,149,824\).*'talker'"):
        prod.put(EDGE, "r", torch.zeros(mib // 4), timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 1.3
    with pytest.raises(ConnectorError, match=r"larger than the tcp connector's max_buffered_bytes"):
        prod.put(EDGE, "r", torch.zeros(mib), timeout=0.3)  # could never fit: refused at once

    results: list[Any] = []
    waiter = threading.Thread(target=lambda: results.append(prod.put(EDGE, "r", torch.ones(mib // 4), timeout=10)))
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()  # waiting for room
    cons.get(EDGE, "r", handles[0], timeout=5)  # a consumer drains one
    waiter.join(5)
    assert not waiter.is_alive() and "key" in results[0]
    assert prod.health()["buffered"] == 3


def test_a_fixed_port_in_use_is_a_connector_error_naming_it(make_conn) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConnectorError, match=rf"127.0.0.1:{port}: the address is already in use.*port 0") as info:
            make_conn({"port": port})
        assert info.value.__cause__ is None and info.value.__suppress_context__
    assert not _server_threads()


def test_a_host_not_on_this_machine_is_a_connector_error(make_conn) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConnectorError, match=r"cannot listen on 192.0.2.1:\*"):
        make_conn({"host": "192.0.2.1"})


def test_fixed_port_advertise_host_and_per_owner(make_conn) -> None:  # type: ignore[no-untyped-def]
    port_a, port_b = _free_port(), _free_port()
    extra = {"port": port_a, "advertise_host": "localhost", "per_owner": {"talker": {"port": port_b}}}
    thinker, talker = make_conn(extra, owner="thinker"), make_conn(extra, owner="talker")
    assert thinker.addr == f"tcp://localhost:{port_a}" and talker.addr == f"tcp://localhost:{port_b}"
    handle = thinker.put(EDGE, "r", payload_case("large"), timeout=5)
    assert_same(talker.get(EDGE, "r", handle, timeout=5), payload_case("large"))
    wildcard = make_conn({"host": "0.0.0.0"}, owner="x")
    assert wildcard.addr == f"tcp://{socket.gethostname()}:{wildcard.port}"


# -- threads and lifecycle -----------------------------------------------------------------------


def test_concurrent_gets_from_several_threads(make_conn) -> None:  # type: ignore[no-untyped-def]
    prod, cons = make_conn(), make_conn()
    payloads = [big_payload(1 << 20) + i for i in range(24)]  # 1 MiB each, each its own values
    handles = [prod.put(Edge("a", "b"), f"r{i}", p, timeout=5) for i, p in enumerate(payloads)]
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(worker, len(payloads), 6):
                assert_same(cons.get(Edge("a", "b"), f"r{i}", handles[i], timeout=10), payloads[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    assert prod.health()["buffered"] == 0


def test_a_late_reply_is_never_taken_for_the_next_answer(make_conn) -> None:  # type: ignore[no-untyped-def]
    prod, cons = make_conn(), make_conn()
    big = prod.put(EDGE, "r", payload_case("big_64"), timeout=5)
    small = prod.put(EDGE, "r", payload_case("large"), timeout=5)
    with pytest.raises(ConnectorError, match="no answer"):
        cons.get(EDGE, "r", big, timeout=0.001)  # its reply is still on the way
    assert_same(cons.get(EDGE, "r", small, timeout=5), payload_case("large"))


def test_a_reply_to_another_request_on_the_same_socket_is_dropped(make_conn) -> None:  # type: ignore[no-untyped-def]
    """What a reused socket would see after a timed-out request: the late reply comes first."""
    import zmq
    from omni_plugin_zmq import transport

    prod = make_conn()
    stale = prod.put(EDGE, "r", big_payload(KIB_256), timeout=5)
    wanted = prod.put(EDGE, "r", payload_case("large"), timeout=5)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(prod.addr)
        sock.send_multipart([transport.PROTOCOL, transport.GET, b"earlier!", stale["key"].encode()])
        sock.send_multipart([b"garbage"])  # not even a request: the server ignores it
        status, body = transport.request(sock, wanted["key"], time.monotonic() + 5)
        assert status == transport.OK and len(body.buffer) == wanted["nbytes"]
        assert prod.health()["buffered"] == 0  # the earlier request was answered (and its reply dropped)
    finally:
        sock.close(linger=0)
        ctx.term()


def test_close_is_idempotent_and_leaves_no_thread(make_conn) -> None:  # type: ignore[no-untyped-def]
    prod, cons = make_conn(), make_conn()
    handle = prod.put(EDGE, "r", payload_case("large"), timeout=5)
    cons.get(EDGE, "r", prod.put(EDGE, "r", big_payload(KIB_256), timeout=5), timeout=5)  # a pooled socket
    assert len(_server_threads()) == 2
    start = time.monotonic()
    for conn in (prod, cons, prod, cons):
        conn.close()
    assert time.monotonic() - start < 1
    assert not _server_threads(), _server_threads()
    assert prod.health()["ok"] is False and prod.health()["reason"] == "closed"
    with pytest.raises(ConnectorError, match="closed"):
        prod.put(EDGE, "r", payload_case("large"), timeout=5)
    with pytest.raises(ConnectorError, match="closed"):
        cons.get(EDGE, "r", handle, timeout=5)
    prod.cleanup("r")  # nothing left: no error


def test_close_interrupts_a_waiting_get_and_a_waiting_put(make_conn) -> None:  # type: ignore[no-untyped-def]
    cons = make_conn()
    prod = make_conn({"max_buffered_bytes": 1 << 20, "inline_threshold_bytes": 0})
    prod.put(EDGE, "r", torch.zeros((1 << 20) // 4 - 64), timeout=1)
    errors: list[BaseException] = []

    def run(call: Any) -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    addr = _listening_addr()
    threads = [
        threading.Thread(
            target=run, args=(lambda: cons.get(EDGE, "r", {"addr": addr, "key": "k", "nbytes": 1}, timeout=30),)
        ),
        threading.Thread(target=run, args=(lambda: prod.put(EDGE, "r", torch.zeros(1 << 16), timeout=30),)),
    ]
    for t in threads:
        t.start()
    time.sleep(0.3)
    start = time.monotonic()
    cons.close()
    prod.close()
    for t in threads:
        t.join(5)
    assert time.monotonic() - start < 3
    assert len(errors) == 2 and all(isinstance(e, ConnectorError) and "closed" in str(e) for e in errors), errors
    assert not _server_threads()
