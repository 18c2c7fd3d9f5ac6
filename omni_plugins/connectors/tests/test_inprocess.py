"""The ``inprocess`` connector: stages of one process, each with its own instance of the run."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from connectors_testkit import EDGE, OTHER_EDGE, assert_same, big, cases
from omni_plugin_connectors.inprocess import _STORES, InProcessConnector

from omni_core.errors import ConnectorError, PayloadError
from omni_core.pipeline.connector import ConnectorContext


def inproc(run_id: str, *, owner: bool = False, **extra: Any) -> InProcessConnector:
    return InProcessConnector(extra, ConnectorContext(run_id=run_id, owner="stage", is_owner=owner))


@pytest.fixture(autouse=True)
def no_store_left(run_id: str) -> Any:
    """Every test closes what it opens: the run's store is gone afterwards."""
    yield
    assert run_id not in _STORES


def test_every_case_round_trips_between_two_instances_of_the_run(run_id: str) -> None:
    producer, consumer = inproc(run_id), inproc(run_id)
    for name, payload in {**cases(), "big": big()}.items():
        handle = producer.put(EDGE, "req-1", payload, timeout=1)
        assert set(handle) == {"key", "nbytes"} and isinstance(handle["key"], str)
        assert_same(consumer.get(EDGE, "req-1", handle, timeout=1), payload, name)
    producer.close()
    consumer.close()


def test_the_consumer_gets_its_own_copy(run_id: str) -> None:
    conn = inproc(run_id)
    tensor, array = torch.zeros(4), np.zeros(4)
    handle = conn.put(EDGE, "req-1", {"t": tensor, "a": array}, timeout=1)
    tensor += 1  # the producer changes its objects after the put
    array += 1
    got = conn.get(EDGE, "req-1", handle, timeout=1)
    assert torch.equal(got["t"], torch.zeros(4)) and np.array_equal(got["a"], np.zeros(4))
    got["t"] += 5  # and the consumer may write to its own
    got["a"] += 5
    assert torch.equal(tensor, torch.ones(4)) and np.array_equal(array, np.ones(4))
    conn.close()


def test_each_handle_is_read_once(run_id: str) -> None:
    producer, consumer = inproc(run_id), inproc(run_id)
    handle = producer.put(EDGE, "req-1", [1, 2], timeout=1)
    assert consumer.get(EDGE, "req-1", handle, timeout=1) == [1, 2]
    started = time.monotonic()
    with pytest.raises(ConnectorError, match="is gone: already read"):
        consumer.get(EDGE, "req-1", handle, timeout=5)
    assert time.monotonic() - started < 2.5  # known to be gone: no wait for the 5 s timeout
    producer.close()
    consumer.close()


def test_malformed_handles_are_connector_errors(run_id: str) -> None:
    conn = inproc(run_id)
    good = conn.put(EDGE, "req-1", torch.ones(3), timeout=1)
    bad = {
        "not a dict": "edge#0#req-1",
        "None": None,
        "no key": {"nbytes": good["nbytes"]},
        "no nbytes": {"key": good["key"]},
        "unknown key": {**good, "shm": "x"},
        "key not a str": {"key": 0, "nbytes": good["nbytes"]},
        "nbytes a bool": {"key": good["key"], "nbytes": False},
        "nbytes wrong": {"key": good["key"], "nbytes": good["nbytes"] + 1},
        "another request": {"key": good["key"].replace("req-1", "req-2"), "nbytes": good["nbytes"]},
        "another edge": {"key": good["key"].replace(EDGE.key, OTHER_EDGE.key), "nbytes": good["nbytes"]},
        "no sequence": {"key": f"{EDGE.key}##req-1", "nbytes": 4},
        "sequence not a number": {"key": f"{EDGE.key}#x1#req-1", "nbytes": 4},
        "sequence negative": {"key": f"{EDGE.key}#-1#req-1", "nbytes": 4},
        "garbage": {"key": "\x00" * 10, "nbytes": 4},
    }
    for what, handle in bad.items():
        started = time.monotonic()
        with pytest.raises(ConnectorError, match="thinker->talker"):
            conn.get(EDGE, "req-1", handle, timeout=5)
        assert time.monotonic() - started < 2.5, what  # well under the 5 s timeout: no wait
    assert torch.equal(conn.get(EDGE, "req-1", good, timeout=1), torch.ones(3))  # untouched by the bad ones
    conn.close()


def test_a_get_waits_for_its_payload_up_to_the_timeout(run_id: str) -> None:
    producer, consumer = inproc(run_id), inproc(run_id)
    first = producer.put(EDGE, "req-1", "first", timeout=1)
    upcoming = {"key": first["key"].replace("#0#", "#1#"), "nbytes": first["nbytes"]}  # the next put's key
    timer = threading.Timer(0.2, lambda: producer.put(EDGE, "req-1", "after", timeout=1))
    timer.start()
    started = time.monotonic()
    assert consumer.get(EDGE, "req-1", upcoming, timeout=5) == "after"  # as long as "first"
    assert 0.15 < time.monotonic() - started < 2
    timer.join()
    never = {"key": first["key"].replace("#0#", "#7#"), "nbytes": 4}
    started = time.monotonic()
    with pytest.raises(ConnectorError, match=r"not put within the 0.3 s timeout"):
        consumer.get(EDGE, "req-1", never, timeout=0.3)
    assert 0.25 < time.monotonic() - started < 2
    with pytest.raises(ConnectorError, match="timeout must be"):
        consumer.get(EDGE, "req-1", first, timeout=-1)
    producer.close()
    consumer.close()


def test_runs_are_separate_and_cleanup_drops_one_request(run_id: str) -> None:
    conn, other_run = inproc(run_id), inproc(run_id + "-other")
    a = conn.put(EDGE, "req-a", 1, timeout=1)
    b = conn.put(EDGE, "req-b", 2, timeout=1)
    with pytest.raises(ConnectorError, match="was not put within"):
        other_run.get(EDGE, "req-a", a, timeout=0.05)
    inproc_peer = inproc(run_id)
    inproc_peer.cleanup("req-a")
    with pytest.raises(ConnectorError, match="is gone"):
        conn.get(EDGE, "req-a", a, timeout=1)
    assert conn.get(EDGE, "req-b", b, timeout=1) == 2
    conn.cleanup("never-seen")
    assert conn.health() == {"ok": True, "payloads": 0}
    for c in (conn, other_run, inproc_peer):
        c.close()


def test_oversize_and_unsupported_payloads_are_payload_errors(run_id: str) -> None:
    conn = inproc(run_id, max_payload_bytes=256)
    with pytest.raises(PayloadError, match="max_payload_bytes"):
        conn.put(EDGE, "req-1", torch.zeros(1000), timeout=1)
    with pytest.raises(PayloadError):
        conn.put(EDGE, "req-1", {1, 2}, timeout=1)
    assert conn.health() == {"ok": True, "payloads": 0}
    conn.close()


def test_close_drops_own_payloads_and_the_owner_the_runs_store(run_id: str) -> None:
    thinker, talker, owner = inproc(run_id), inproc(run_id), inproc(run_id, owner=True)
    mine = thinker.put(EDGE, "req-1", "mine", timeout=1)
    theirs = talker.put(OTHER_EDGE, "req-1", "theirs", timeout=1)
    thinker.close()
    thinker.close()  # idempotent
    with pytest.raises(ConnectorError, match="closed"):
        thinker.put(EDGE, "req-1", 1, timeout=1)
    with pytest.raises(ConnectorError, match="is gone"):
        talker.get(EDGE, "req-1", mine, timeout=1)
    assert owner.health()["payloads"] == 1
    # a get waiting when the owner closes the run fails at once, not at its timeout
    waiting: list[BaseException] = []

    def wait() -> None:
        try:
            talker.get(OTHER_EDGE, "req-1", {**theirs, "key": theirs["key"].replace("#1#", "#9#")}, timeout=10)
        except BaseException as exc:
            waiting.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.1)
    started = time.monotonic()
    owner.close()
    waiter.join(5)
    assert time.monotonic() - started < 5  # woken by the close, not at its 10 s timeout
    assert isinstance(waiting[0], ConnectorError) and "closed by its owner" in str(waiting[0])
    with pytest.raises(ConnectorError, match="closed"):
        talker.get(OTHER_EDGE, "req-1", theirs, timeout=1)
    assert talker.health()["ok"] is False
    talker.close()


def test_it_is_declared_same_process_only() -> None:
    assert InProcessConnector.same_process_only is True
    assert InProcessConnector.name == "inprocess"
