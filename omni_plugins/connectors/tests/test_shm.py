"""The ``shm`` connector, with real segments in /dev/shm and real (spawned) processes."""

from __future__ import annotations

import errno
import gc
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest
import torch
from connectors_testkit import EDGE, OTHER_EDGE, assert_same, big, cases, shm
from omni_plugin_connectors import shm as shm_module
from omni_plugin_connectors.shm import SHM_DIR, segment_prefix, segments

from omni_core.errors import ConnectorError, PayloadError
from omni_core.pipeline.connector import Edge
from omni_core.pipeline.payload import encode

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="POSIX shared memory (/dev/shm) is Linux only")


def mappings_of(name: str) -> list[tuple[int, int]]:
    """The address ranges this process maps from the segment ``name`` (unlinked or not)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if f"{SHM_DIR}/{name}" in line:
                start, end = line.split()[0].split("-")
                ranges.append((int(start, 16), int(end, 16)))
    return ranges


def recv(conn: Any, process: Any, seconds: float = 60) -> Any:
    """The next message from a child process, or fail naming its exit code."""
    deadline = time.monotonic() + seconds
    while not conn.poll(0.1):
        if not process.is_alive() and not conn.poll(0):
            pytest.fail(f"the child process exited with {process.exitcode} without answering")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the child process did not answer in time")
    return conn.recv()


# -- in one process ------------------------------------------------------------------------------


@pytest.mark.parametrize("threshold", [65536, 0], ids=["inline_when_small", "all_through_segments"])
def test_every_case_round_trips(run_id: str, threshold: int) -> None:
    producer, consumer = shm(run_id, inline_threshold_bytes=threshold), shm(run_id, who="talker")
    for name, payload in cases().items():
        handle = producer.put(EDGE, "req-1", payload, timeout=1)
        assert set(handle) == ({"inline", "nbytes"} if "inline" in handle else {"shm", "nbytes"})
        assert ("inline" in handle) == (threshold > 0 and name != "large"), name
        assert_same(consumer.get(EDGE, "req-1", handle, timeout=1), payload, name)
    producer.close()
    consumer.close()


def test_small_payloads_travel_inline_and_large_ones_through_a_segment(run_id: str) -> None:
    conn = shm(run_id, inline_threshold_bytes=4096)
    small = conn.put(EDGE, "req-1", torch.ones(16), timeout=1)
    assert isinstance(small["inline"], bytes) and small["nbytes"] == len(small["inline"])
    assert segments(segment_prefix(run_id)) == []
    large = conn.put(EDGE, "req-1", torch.ones(4096), timeout=1)
    assert segments(segment_prefix(run_id)) == [large["shm"]]
    assert os.path.getsize(f"{SHM_DIR}/{large['shm']}") == large["nbytes"] > 4096 * 4
    assert torch.equal(conn.get(EDGE, "req-1", large, timeout=1), torch.ones(4096))
    assert torch.equal(conn.get(EDGE, "req-1", small, timeout=1), torch.ones(16))
    conn.close()


def test_get_is_zero_copy_and_the_mapping_lives_as_long_as_the_views(run_id: str) -> None:
    """The tensor and array a get returns lie inside the segment's mapping; the segment's name
    is gone at once; the mapping outlives everything but the views and goes with the last one."""
    conn = shm(run_id)
    want_t = torch.randn(256, 1024)
    want_a = np.arange(100_000, dtype=np.float64)
    handle = conn.put(EDGE, "req-1", {"t": want_t, "a": want_a}, timeout=1)
    name = handle["shm"]
    got = conn.get(EDGE, "req-1", handle, timeout=1)
    assert not os.path.exists(f"{SHM_DIR}/{name}")  # unlinked at get
    (start, end), *_ = mappings_of(name)
    tensor, array = got["t"], got["a"]
    for what, pointer, size in (
        ("tensor", tensor.data_ptr(), tensor.numel() * tensor.element_size()),
        ("array", array.ctypes.data, array.nbytes),
    ):
        assert start <= pointer and pointer + size <= end, f"the {what} does not view the segment"
    del got, array
    gc.collect()
    assert mappings_of(name), "the mapping went while a tensor still views it"
    assert torch.equal(tensor, want_t)
    tensor.mul_(2)  # the consumer's own memory: writable, nobody else sees it
    assert torch.equal(tensor, want_t * 2)
    del tensor
    gc.collect()
    assert mappings_of(name) == [], "the mapping outlived every view"
    conn.close()


def test_each_segment_handle_is_read_once(run_id: str) -> None:
    conn = shm(run_id, inline_threshold_bytes=0)
    handle = conn.put(EDGE, "req-1", torch.ones(3), timeout=1)
    conn.get(EDGE, "req-1", handle, timeout=1)
    with pytest.raises(ConnectorError, match="is gone: already read"):
        conn.get(EDGE, "req-1", handle, timeout=1)
    other = shm(run_id)  # another process's instance: the same
    with pytest.raises(ConnectorError, match="is gone"):
        other.get(EDGE, "req-1", handle, timeout=1)


def _bad_handles(run_id: str, good: dict[str, Any], frame: bytes, other_request: str) -> dict[str, Any]:
    prefix = segment_prefix(run_id, "req-1")
    return {
        "not a dict": ["shm", good["shm"]],
        "None": None,
        "empty": {},
        "no nbytes": {"shm": good["shm"]},
        "no shm": {"nbytes": good["nbytes"]},
        "unknown key": {**good, "extra": 1},
        "both inline and shm": {**good, "inline": frame},
        "nbytes a str": {"shm": good["shm"], "nbytes": "10"},
        "nbytes a bool": {"shm": good["shm"], "nbytes": True},
        "nbytes a float": {"shm": good["shm"], "nbytes": float(good["nbytes"])},
        "nbytes negative": {"shm": good["shm"], "nbytes": -1},
        "nbytes zero": {"shm": good["shm"], "nbytes": 0},
        "nbytes wrong": {"shm": good["shm"], "nbytes": good["nbytes"] + 1},
        "shm not a str": {"shm": 12, "nbytes": 4},
        "path traversal": {"shm": "../../etc/passwd", "nbytes": 4},
        "absolute path": {"shm": "/etc/passwd", "nbytes": 4},
        "another run": {"shm": good["shm"].replace(run_id, run_id + "x"), "nbytes": good["nbytes"]},
        "another request": {"shm": other_request, "nbytes": good["nbytes"]},
        "forged, never put": {"shm": f"{prefix}{EDGE.key}-ffff_0", "nbytes": 100},
        "inline not bytes": {"inline": "text", "nbytes": 4},
        "inline not a frame": {"inline": b"not a frame, not at all", "nbytes": 23},
        "inline truncated": {"inline": frame[:-3], "nbytes": len(frame) - 3},
        "inline nbytes wrong": {"inline": frame, "nbytes": 3},
    }


def test_malformed_handles_are_connector_errors_never_a_crash_or_a_hang(run_id: str) -> None:
    conn = shm(run_id, inline_threshold_bytes=0)
    frame = shm(run_id).put(EDGE, "req-1", torch.arange(10), timeout=1)["inline"]
    good = conn.put(EDGE, "req-1", torch.arange(1000), timeout=1)
    other = conn.put(EDGE, "req-2", torch.arange(1000), timeout=1)
    for what, handle in _bad_handles(run_id, good, frame, other["shm"]).items():
        started = time.monotonic()
        with pytest.raises(ConnectorError) as caught:
            conn.get(EDGE, "req-1", handle, timeout=5)
        assert time.monotonic() - started < 2.5, what  # well under the 5 s timeout: no wait
        assert "thinker->talker" in str(caught.value), what
    # none of them took a real payload
    assert segments(segment_prefix(run_id)) == sorted([good["shm"], other["shm"]])
    assert torch.equal(conn.get(EDGE, "req-1", good, timeout=1), torch.arange(1000))
    conn.close()


def test_a_segment_that_is_not_a_frame_is_refused_and_dropped(run_id: str) -> None:
    conn = shm(run_id)
    name = f"{segment_prefix(run_id, 'req-1')}{EDGE.key}-abc_1"
    with open(f"{SHM_DIR}/{name}", "wb") as f:
        f.write(os.urandom(4096))
    with pytest.raises(ConnectorError, match="does not decode"):
        conn.get(EDGE, "req-1", {"shm": name, "nbytes": 4096}, timeout=1)
    assert segments(segment_prefix(run_id)) == []


def test_the_handle_must_name_this_edge(run_id: str) -> None:
    conn = shm(run_id, inline_threshold_bytes=0)
    handle = conn.put(EDGE, "req-1", torch.ones(2), timeout=1)
    with pytest.raises(ConnectorError, match="not a payload of request 'req-1' on this edge"):
        conn.get(OTHER_EDGE, "req-1", handle, timeout=1)
    assert torch.equal(conn.get(EDGE, "req-1", handle, timeout=1), torch.ones(2))


def test_unsupported_and_oversize_payloads_leave_nothing(run_id: str) -> None:
    conn = shm(run_id, inline_threshold_bytes=0, max_payload_bytes=1000)
    with pytest.raises(PayloadError, match="max_payload_bytes"):
        conn.put(EDGE, "req-1", torch.zeros(1000), timeout=1)
    with pytest.raises(PayloadError):
        conn.put(EDGE, "req-1", {"f": object()}, timeout=1)
    assert segments(segment_prefix(run_id)) == []
    inline = shm(run_id, max_payload_bytes=100)  # the limit holds for inline payloads too
    with pytest.raises(PayloadError, match=r"over the 'shm' connector's max_payload_bytes \(100\)"):
        inline.put(EDGE, "req-1", torch.zeros(100), timeout=1)
    assert conn.put(EDGE, "req-1", torch.zeros(10), timeout=1)["nbytes"] <= 1000
    conn.close()


def test_a_segment_holds_exactly_the_codecs_frame(run_id: str) -> None:
    """put writes the frame in pieces (pwritev of the header, the padding and each buffer):
    byte for byte what the codec's own to_bytes gives, for every case."""
    conn = shm(run_id, inline_threshold_bytes=0)
    for name, payload in {**cases(), "many buffers": [np.full(i, i, dtype=np.uint8) for i in range(70)]}.items():
        want = encode(payload).to_bytes()
        assert b"".join(shm_module._frame_parts(encode(payload))) == want, name
        handle = conn.put(EDGE, "req-1", payload, timeout=1)
        with open(f"{SHM_DIR}/{handle['shm']}", "rb") as f:
            assert f.read() == want, name
        assert_same(conn.get(EDGE, "req-1", handle, timeout=1), payload, name)
    conn.close()


def test_short_writes_and_more_buffers_than_one_pwritev_takes(run_id: str, monkeypatch: Any) -> None:
    """A write may stop short (at 2 GiB, or when tmpfs fills up): put goes on where it stopped,
    also in the middle of a buffer and across the batches of at most _IOV_MAX buffers."""
    real = os.pwritev
    calls = []

    def short(fd: int, buffers: list[Any], offset: int) -> int:
        calls.append(len(buffers))
        # a put that lost its place would write on and on: stop it long before /dev/shm fills up
        assert offset + sum(memoryview(b).nbytes for b in buffers) <= 4 << 20 and len(calls) < 10_000
        limit = 1 + len(calls) * 7919 % 100_000  # a different odd cut every call
        taken, left = [], limit
        for buffer in buffers:
            view = memoryview(buffer)[:left]
            taken.append(view)
            left -= view.nbytes
            if not left:
                break
        return real(fd, taken, offset)

    monkeypatch.setattr(os, "pwritev", short)
    monkeypatch.setattr(shm_module, "_IOV_MAX", 16)
    conn = shm(run_id, inline_threshold_bytes=0)
    payload = {"many": [np.arange(i, dtype=np.int16) for i in range(200)], "large": cases()["large"]}
    handle = conn.put(EDGE, "req-1", payload, timeout=1)
    assert len(calls) > 20 and max(calls) == 16
    with open(f"{SHM_DIR}/{handle['shm']}", "rb") as f:
        assert f.read() == encode(payload).to_bytes()
    assert_same(conn.get(EDGE, "req-1", handle, timeout=1), payload)
    conn.close()


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), r"no room in /dev/shm for a payload of 2,09\d,\d{3} bytes"),
        (OSError(errno.ENOMEM, "Cannot allocate memory"), r"no room in /dev/shm .*Cannot allocate memory, errno"),
        (OSError(errno.EIO, "Input/output error"), r"cannot write segment 'omni-.*Input/output error \(errno 5\)"),
        (0, r"no room in /dev/shm .*No space left on device, errno 28"),  # a write that makes no progress
        (KeyboardInterrupt(), None),
    ],
    ids=["ENOSPC", "ENOMEM", "EIO", "no_progress", "interrupted"],
)
def test_a_write_that_fails_half_way_leaves_no_segment(
    run_id: str, monkeypatch: Any, fault: BaseException | int, message: str | None
) -> None:
    """The first write gets half the frame in, the next one fails: a clean ConnectorError (or
    the interruption itself), and the half-written segment is gone."""
    real = os.pwritev
    writes = []

    def failing(fd: int, buffers: list[Any], offset: int) -> int:
        writes.append(offset)
        if len(writes) == 1:
            return real(fd, buffers[:1], offset)  # the header only: a short write
        if isinstance(fault, BaseException):
            raise fault
        return fault

    monkeypatch.setattr(os, "pwritev", failing)
    conn = shm(run_id, inline_threshold_bytes=0)
    payload = cases()["large"]
    if message is None:
        with pytest.raises(KeyboardInterrupt):
            conn.put(EDGE, "req-1", payload, timeout=1)
    else:
        with pytest.raises(ConnectorError, match=message) as caught:
            conn.put(EDGE, "req-1", payload, timeout=1)
        assert "thinker->talker" in str(caught.value)
    assert len(writes) == 2
    assert segments(segment_prefix(run_id)) == []
    monkeypatch.setattr(os, "pwritev", real)
    handle = conn.put(EDGE, "req-1", payload, timeout=1)  # the connector is still usable
    assert_same(conn.get(EDGE, "req-1", handle, timeout=1), payload)
    conn.close()


def test_cleanup_removes_that_requests_unread_segments_only(run_id: str) -> None:
    conn = shm(run_id, inline_threshold_bytes=0)
    a1 = conn.put(EDGE, "req-a", torch.ones(8), timeout=1)
    a2 = conn.put(OTHER_EDGE, "req-a", torch.ones(8), timeout=1)
    b = conn.put(EDGE, "req-b", torch.full((8,), 2.0), timeout=1)
    ab = conn.put(EDGE, "req-ab", torch.ones(8), timeout=1)  # "req-a" is a prefix of its id
    other_run = shm(run_id + "2", inline_threshold_bytes=0)
    elsewhere = other_run.put(EDGE, "req-a", torch.ones(8), timeout=1)
    shm(run_id).cleanup("req-a")  # any process's instance can clean up
    assert segments(segment_prefix(run_id)) == sorted([b["shm"], ab["shm"]])
    for handle, edge in ((a1, EDGE), (a2, OTHER_EDGE)):
        with pytest.raises(ConnectorError, match="is gone"):
            conn.get(edge, "req-a", handle, timeout=1)
    assert torch.equal(conn.get(EDGE, "req-b", b, timeout=1), torch.full((8,), 2.0))
    conn.cleanup("req-a")  # already gone: nothing to do, no error
    conn.cleanup("never-seen")
    assert os.path.exists(f"{SHM_DIR}/{elsewhere['shm']}")
    other_run.close()  # its own unread segment goes with it
    assert not os.path.exists(f"{SHM_DIR}/{elsewhere['shm']}")
    conn.close()


def test_close_reclaims_own_segments_and_the_owner_the_whole_runs(run_id: str) -> None:
    thinker = shm(run_id, inline_threshold_bytes=0)
    talker = shm(run_id, inline_threshold_bytes=0)
    owner = shm(run_id, owner=True, who="orchestrator")
    mine = thinker.put(EDGE, "req-1", torch.ones(4), timeout=1)
    theirs = talker.put(OTHER_EDGE, "req-1", torch.ones(4), timeout=1)
    thinker.close()
    assert segments(segment_prefix(run_id)) == [theirs["shm"]]
    with pytest.raises(ConnectorError, match="is gone"):
        talker.get(EDGE, "req-1", mine, timeout=1)
    neighbour = shm(f"{run_id}-b", inline_threshold_bytes=0)  # another run whose id starts with this one's
    theirs_too = neighbour.put(EDGE, "req-1", torch.ones(4), timeout=1)
    owner.close()
    assert segments(segment_prefix(run_id)) == []
    assert segments(segment_prefix(f"{run_id}-b")) == [theirs_too["shm"]]
    neighbour.close()
    owner.close()  # idempotent
    thinker.close()


def test_a_closed_connector_refuses_puts_and_gets(run_id: str) -> None:
    conn = shm(run_id, inline_threshold_bytes=0)
    handle = conn.put(EDGE, "req-1", torch.ones(4), timeout=1)
    conn.close()
    with pytest.raises(ConnectorError, match="closed"):
        conn.put(EDGE, "req-1", torch.ones(4), timeout=1)
    with pytest.raises(ConnectorError, match="closed"):
        conn.get(EDGE, "req-1", handle, timeout=1)
    assert conn.health()["ok"] is False


def test_timeouts_are_checked(run_id: str) -> None:
    conn = shm(run_id)
    for bad in (-1, float("nan"), float("inf"), None, "1", True):
        with pytest.raises(ConnectorError, match="timeout"):
            conn.put(EDGE, "req-1", 1, timeout=bad)  # type: ignore[arg-type]
    assert conn.get(EDGE, "req-1", conn.put(EDGE, "req-1", 1, timeout=0), timeout=0) == 1


def test_health_counts_this_runs_segments_and_the_free_room(run_id: str) -> None:
    conn = shm(run_id, inline_threshold_bytes=0)
    health = conn.health()
    assert health["ok"] is True and health["segments"] == 0
    assert isinstance(health["shm_free_bytes"], int) and health["shm_free_bytes"] > 0
    handle = conn.put(EDGE, "req-1", torch.ones(4), timeout=1)
    assert conn.health()["segments"] == 1
    conn.get(EDGE, "req-1", handle, timeout=1)
    assert conn.health()["segments"] == 0


def test_names_are_safe_bounded_and_found_by_cleanup(run_id: str) -> None:
    conn = shm(run_id, inline_threshold_bytes=0)
    weird = ["9f1c-uuid-like-4e2a", "a/b/../c:d e", "ü" * 40, "x" * 500, "req-1"]
    handles = {rid: conn.put(Edge("a-b", "c d"), rid, torch.ones(2), timeout=1) for rid in weird}
    for rid, handle in handles.items():
        name = handle["shm"]
        assert name.startswith(segment_prefix(run_id, rid)) and len(name) < 200
        assert all(c.isascii() and (c.isalnum() or c in "-_") for c in name), name
    assert len({h["shm"] for h in handles.values()}) == len(weird)
    conn.cleanup("x" * 500)
    assert handles["x" * 500]["shm"] not in segments(segment_prefix(run_id))
    for rid in weird[:3]:
        assert torch.equal(conn.get(Edge("a-b", "c d"), rid, handles[rid], timeout=1), torch.ones(2))
    conn.close()  # the unread "req-1" payload goes with its producer


def test_options_are_validated() -> None:
    from omni_plugin_connectors.shm import ShmConnector

    defaults: Any = ShmConnector.validate_options({})
    assert defaults.inline_threshold_bytes == 65536
    assert (defaults.reuse_threshold_bytes, defaults.reuse_pool_bytes) == (1 << 20, 512 << 20)
    for option in ("inline_threshold_bytes", "reuse_threshold_bytes", "reuse_pool_bytes"):
        with pytest.raises(ValueError, match=option):
            ShmConnector.validate_options({option: -1})
    with pytest.raises(ValueError, match="inline_treshold"):
        ShmConnector.validate_options({"inline_treshold": 1})


# -- reuse of large segments ---------------------------------------------------------------------

MIB = 1 << 20


def pool_of(run_id: str) -> list[str]:
    """The run's pool: segments a consumer let go of, waiting for a put."""
    return segments(f"{segment_prefix(run_id)}-pool-")


def inode(name: str) -> int:
    return os.stat(f"{SHM_DIR}/{name}").st_ino


def filled(value: float, mib: int = 2) -> dict[str, Any]:
    """A payload of about ``mib`` MiB, a tensor and an array, every element ``value``."""
    numel = mib * MIB // 8
    return {"t": torch.full((numel,), value), "a": np.full(numel, value, dtype=np.float32)}


def test_a_large_put_reuses_the_pages_of_a_segment_its_consumer_let_go_of(run_id: str, monkeypatch: Any) -> None:
    """The consumer's get renames the segment (it holds it while it views it); its last view
    freed, the segment joins the run's pool for its edge; the next large put on that edge takes
    that very file (same inode), writing through a mapping of its existing pages: no pwritev, no
    new file. A put on another edge leaves it alone."""
    producer, consumer = shm(run_id, who="thinker"), shm(run_id, who="talker")
    first = producer.put(EDGE, "req-1", filled(1.0), timeout=1)
    pages = inode(first["shm"])
    got = consumer.get(EDGE, "req-1", first, timeout=1)
    (held,) = segments(segment_prefix(run_id))
    assert held == f"{first['shm']}-{consumer._token}_h" and inode(held) == pages
    assert pool_of(run_id) == []
    del got
    gc.collect()
    assert segments(segment_prefix(run_id)) == pool_of(run_id) and [inode(n) for n in pool_of(run_id)] == [pages]
    assert consumer.health()["pool_segments"] == 1 and consumer.health()["pool_bytes"] == first["nbytes"]
    elsewhere = producer.put(OTHER_EDGE, "req-2", filled(3.0), timeout=1)
    assert inode(elsewhere["shm"]) != pages and len(pool_of(run_id)) == 1
    writes = []
    monkeypatch.setattr(os, "pwritev", lambda *args: writes.append(args))  # the reuse must not write this way
    second = producer.put(EDGE, "req-2", filled(2.0), timeout=1)
    assert writes == [] and inode(second["shm"]) == pages and pool_of(run_id) == []
    assert segments(segment_prefix(run_id)) == sorted([second["shm"], elsewhere["shm"]])
    with open(f"{SHM_DIR}/{second['shm']}", "rb") as f:
        assert f.read() == encode(filled(2.0)).to_bytes()
    assert_same(consumer.get(EDGE, "req-2", second, timeout=1), filled(2.0))
    assert_same(consumer.get(OTHER_EDGE, "req-2", elsewhere, timeout=1), filled(3.0))
    consumer.close()  # it takes the segments it pooled with it
    producer.close()


def test_a_producer_refills_through_the_mapping_it_kept_and_drops_it_once_unlinked(
    run_id: str, monkeypatch: Any
) -> None:
    """A producer keeps its mapping of a segment it refilled: when the segment comes back from
    the pool, the next refill is a plain copy (no new mapping). A kept mapping holds its
    segment's pages, so one whose segment was unlinked since (a cleanup, here) goes at the
    producer's next large put, and its close drops them all."""
    producer, consumer = shm(run_id, who="thinker"), shm(run_id, who="talker")
    first = producer.put(EDGE, "req-1", filled(1.0), timeout=1)
    consumer.get(EDGE, "req-1", first, timeout=1)  # let go of at once: pooled
    assert producer.health()["mapped_bytes"] == 0  # a fresh segment is written, not mapped
    second = producer.put(EDGE, "req-2", filled(2.0), timeout=1)
    pages = inode(second["shm"])
    assert producer.health()["mapped_bytes"] == second["nbytes"]
    consumer.get(EDGE, "req-2", second, timeout=1)
    maps = []
    real_mmap = shm_module.mmap.mmap
    monkeypatch.setattr(shm_module.mmap, "mmap", lambda *a, **k: maps.append(a) or real_mmap(*a, **k))
    third = producer.put(EDGE, "req-3", filled(3.0), timeout=1)
    assert maps == [] and inode(third["shm"]) == pages  # the kept mapping, no new one
    with open(f"{SHM_DIR}/{third['shm']}", "rb") as f:
        assert f.read() == encode(filled(3.0)).to_bytes()
    got = consumer.get(EDGE, "req-3", third, timeout=1)
    producer.cleanup("req-3")  # unlinks the held segment: the consumer's view and the kept mapping remain
    assert producer.health()["mapped_bytes"] == third["nbytes"]
    producer.put(EDGE, "req-4", filled(4.0, mib=1), timeout=1)  # any large put drops it
    assert producer.health()["mapped_bytes"] == 0
    assert_same(got, filled(3.0))
    del got
    gc.collect()
    assert mappings_of(third["shm"]) == []  # neither the view nor the kept mapping
    fifth = producer.put(EDGE, "req-5", filled(5.0), timeout=1)
    consumer.get(EDGE, "req-5", fifth, timeout=1)
    producer.put(EDGE, "req-6", filled(6.0), timeout=1)
    assert producer.health()["mapped_bytes"] > 0
    producer.close()
    assert producer._maps == {}
    consumer.close()


def test_a_segment_is_never_reused_while_any_view_of_it_lives(run_id: str) -> None:
    """The safety of reuse: as long as anything decoded from a segment lives (a tensor, a slice
    of it, an array, a tensor made from that array), no put writes into it; the consumer's data
    stays intact while the producer goes on putting, taking only what was let go of."""
    producer, consumer = shm(run_id, who="thinker"), shm(run_id, who="talker")
    got, inodes = [], []
    for i in range(4):
        handle = producer.put(EDGE, f"req-{i}", filled(float(i)), timeout=1)
        inodes.append(inode(handle["shm"]))
        got.append(consumer.get(EDGE, f"req-{i}", handle, timeout=1))
    assert len(set(inodes)) == 4 and pool_of(run_id) == []
    kept_slice = got[0]["t"][10:20]
    kept_from_numpy = torch.from_numpy(got[1]["a"][5:])
    del got
    gc.collect()
    assert sorted(inode(n) for n in pool_of(run_id)) == sorted(inodes[2:])  # only those let go of
    taken = []
    for i in range(4, 12):
        handle = producer.put(EDGE, f"req-{i}", filled(float(i)), timeout=1)
        taken.append(inode(handle["shm"]))
        assert_same(consumer.get(EDGE, f"req-{i}", handle, timeout=1), filled(float(i)))
        assert torch.equal(kept_slice, torch.zeros(10)), f"overwritten by put {i}"
        assert torch.equal(kept_from_numpy, torch.ones(kept_from_numpy.numel())), f"overwritten by put {i}"
    assert not set(taken) & set(inodes[:2])
    assert set(taken) >= set(inodes[2:])  # the pool was used, just never for the held ones
    del kept_slice, kept_from_numpy
    gc.collect()
    assert set(inodes[:2]) <= {inode(n) for n in pool_of(run_id)}  # let go of at last: pooled
    consumer.close()
    producer.close()


def test_read_once_holds_with_reuse_and_held_or_pooled_names_are_no_handles(run_id: str) -> None:
    producer, consumer = shm(run_id, who="thinker"), shm(run_id, who="talker")
    handle = producer.put(EDGE, "req-1", filled(1.0), timeout=1)
    got = consumer.get(EDGE, "req-1", handle, timeout=1)
    for who in (consumer, shm(run_id)):
        with pytest.raises(ConnectorError, match="is gone: already read"):
            who.get(EDGE, "req-1", handle, timeout=1)
    (held,) = segments(segment_prefix(run_id))
    with pytest.raises(ConnectorError, match="not a payload of request 'req-1'"):
        shm(run_id).get(EDGE, "req-1", {"shm": held, "nbytes": handle["nbytes"]}, timeout=1)
    del got
    gc.collect()
    (pooled,) = pool_of(run_id)
    for name in (handle["shm"], pooled):
        with pytest.raises(ConnectorError):
            consumer.get(EDGE, "req-1", {"shm": name, "nbytes": handle["nbytes"]}, timeout=1)
    assert pool_of(run_id) == [pooled]  # untouched by the refused gets
    consumer.close()


def test_cleanup_and_close_reclaim_held_and_pooled_segments(run_id: str) -> None:
    """A request's cleanup unlinks the segments its consumer holds (their views stay intact,
    and they are not pooled when let go of); a consumer's close unlinks what it holds and what
    it pooled; the owner's close the whole run's. Nothing reappears afterwards."""
    producer, consumer = shm(run_id, who="thinker"), shm(run_id, who="talker")
    owner = shm(run_id, owner=True, who="orchestrator")
    a = consumer.get(EDGE, "req-a", producer.put(EDGE, "req-a", filled(1.0), timeout=1), timeout=1)
    b = consumer.get(EDGE, "req-b", producer.put(EDGE, "req-b", filled(2.0), timeout=1), timeout=1)
    owner.cleanup("req-a")
    assert len(segments(segment_prefix(run_id, "req-b"))) == 1 and segments(segment_prefix(run_id, "req-a")) == []
    assert_same(a, filled(1.0))  # the mapping outlives the name
    del a
    gc.collect()
    assert pool_of(run_id) == []  # it had no name left to pool
    consumer.get(EDGE, "req-c", producer.put(EDGE, "req-c", filled(3.0), timeout=1), timeout=1)  # let go of at once
    assert len(pool_of(run_id)) == 1
    consumer.close()  # what it holds (b) and what it pooled
    assert segments(segment_prefix(run_id)) == []
    assert_same(b, filled(2.0))
    del b
    gc.collect()
    assert segments(segment_prefix(run_id)) == []  # a closed consumer pools nothing
    again = shm(run_id, who="talker")  # the owner's close takes everything of the run
    kept = again.get(EDGE, "req-d", producer.put(EDGE, "req-d", filled(4.0), timeout=1), timeout=1)
    again.get(EDGE, "req-e", producer.put(EDGE, "req-e", filled(5.0), timeout=1), timeout=1)
    assert len(segments(segment_prefix(run_id))) == 2  # one held, one pooled
    owner.close()
    assert segments(segment_prefix(run_id)) == []
    del kept
    gc.collect()
    assert segments(segment_prefix(run_id)) == []  # the held one's name was gone: nothing pooled
    producer.close()
    again.close()


def test_the_pool_keeps_at_most_reuse_pool_bytes_and_a_quarter_of_dev_shm(run_id: str, monkeypatch: Any) -> None:
    frame = encode(filled(0.0)).nbytes  # 2 MiB and its header
    consumer = shm(run_id, who="talker", reuse_pool_bytes=2 * frame + frame // 2)
    producer = shm(run_id, who="thinker", reuse_pool_bytes=0)  # puts fresh segments only: the pool fills
    got = [
        consumer.get(EDGE, f"r{i}", producer.put(EDGE, f"r{i}", filled(float(i)), timeout=1), timeout=1)
        for i in range(3)
    ]
    inodes = [inode(name) for name in segments(segment_prefix(run_id))]  # r0, r1, r2
    for _ in range(3):
        del got[0]  # let go of in order: the oldest in the pool makes room for the newest
        gc.collect()
    assert [inode(name) for name in pool_of(run_id)] == inodes[1:]
    assert consumer.health()["pool_bytes"] == 2 * frame <= consumer.options.reuse_pool_bytes  # type: ignore[attr-defined]
    bigger = filled(0.0, mib=6)
    consumer.get(EDGE, "r9", producer.put(EDGE, "r9", bigger, timeout=1), timeout=1)  # over the bound alone
    assert consumer.health()["pool_bytes"] == 2 * frame
    consumer.close()
    assert segments(segment_prefix(run_id)) == []

    real = os.statvfs

    def small_dev_shm(path: Any) -> os.statvfs_result:  # a /dev/shm of 12 MiB: a pool of 3 MiB at most
        st = real(path)
        fields = list(st)
        fields[2] = 12 * MIB // st.f_frsize  # f_blocks
        return os.statvfs_result(fields)

    monkeypatch.setattr(os, "statvfs", small_dev_shm)
    consumer = shm(run_id, who="talker")  # the default bound (512 MiB), capped by the size of /dev/shm
    got = [
        consumer.get(EDGE, f"s{i}", producer.put(EDGE, f"s{i}", filled(float(i)), timeout=1), timeout=1)
        for i in range(2)
    ]
    del got
    gc.collect()
    assert len(pool_of(run_id)) == 1
    consumer.close()
    producer.close()


def test_a_forked_childs_copy_of_the_views_never_pools_the_segment(run_id: str) -> None:
    """A fork (a DataLoader worker, say) copies the views and their finalizer: the copies dying
    in the child must not hand the segment to the pool while the parent still views it."""
    producer, consumer = shm(run_id, who="thinker"), shm(run_id, who="talker")
    got = consumer.get(EDGE, "req-1", producer.put(EDGE, "req-1", filled(1.0), timeout=1), timeout=1)
    pid = os.fork()
    if pid == 0:  # the child: let go of its copies, then leave without running any exit handler
        try:
            del got
            gc.collect()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert pool_of(run_id) == [] and len(segments(segment_prefix(run_id))) == 1  # still held
    assert_same(got, filled(1.0))
    del got
    gc.collect()
    assert len(pool_of(run_id)) == 1
    consumer.close()
    producer.close()


@pytest.mark.parametrize("extra", [{"reuse_pool_bytes": 0}, {"reuse_threshold_bytes": 64 * MIB}], ids=["off", "under"])
def test_without_reuse_get_unlinks_at_once_and_puts_make_new_segments(run_id: str, extra: dict[str, Any]) -> None:
    producer, consumer = shm(run_id, who="thinker", **extra), shm(run_id, who="talker", **extra)
    for i in range(3):
        handle = producer.put(EDGE, f"req-{i}", filled(float(i)), timeout=1)
        assert segments(segment_prefix(run_id)) == [handle["shm"]]
        got = consumer.get(EDGE, f"req-{i}", handle, timeout=1)
        assert segments(segment_prefix(run_id)) == []  # unlinked at the get
        assert mappings_of(handle["shm"])
        assert_same(got, filled(float(i)))
        del got
        gc.collect()
        assert segments(segment_prefix(run_id)) == [] and consumer.health()["pool_segments"] == 0


def test_a_reused_segment_holds_exactly_the_new_frame_when_shrunk_or_grown(run_id: str) -> None:
    """A pool segment larger than the payload is cut to its size; a smaller one (the pool has
    nothing larger) is grown, its own pages written again and the missing ones allocated."""
    producer, consumer = shm(run_id, who="thinker"), shm(run_id, who="talker")
    pages = None
    for i, mib in enumerate((3, 2, 4, 4)):
        read_only = np.frombuffer(bytes(range(256)) * 1000 * (i + 1), dtype=np.uint8)  # no address to take
        payload = {
            "x": filled(float(i), mib),
            "list": [np.arange(i + 1, dtype=np.int8), b"\x01" * (i * 333), read_only],
        }
        handle = producer.put(EDGE, f"req-{i}", payload, timeout=1)
        pages = pages or inode(handle["shm"])
        assert inode(handle["shm"]) == pages, f"put {i} did not reuse the segment"
        with open(f"{SHM_DIR}/{handle['shm']}", "rb") as f:
            assert f.read() == encode(payload).to_bytes(), f"put {i}"
        assert_same(consumer.get(EDGE, f"req-{i}", handle, timeout=1), payload, f"put {i}")
    consumer.close()
    producer.close()


def test_a_put_short_of_room_evicts_the_pool_before_giving_up(run_id: str, monkeypatch: Any) -> None:
    """Idle pool segments never cost a put its room: they go first (oldest first). With still no
    room, the put is the named ConnectorError, and leaves nothing of its request."""
    consumer = shm(run_id, who="talker")
    fresh = shm(run_id, who="thinker", reuse_pool_bytes=0)  # never claims: it needs room for each put
    for i in range(2):
        consumer.get(EDGE, f"p{i}", fresh.put(EDGE, f"p{i}", filled(float(i)), timeout=1), timeout=1)
    assert len(pool_of(run_id)) == 2
    monkeypatch.setattr(shm_module, "shm_free_bytes", lambda: 0 if pool_of(run_id) else 1 << 40)
    handle = fresh.put(EDGE, "req-1", filled(5.0), timeout=1)  # room once the pool is gone
    assert pool_of(run_id) == [] and segments(segment_prefix(run_id)) == [handle["shm"]]
    assert_same(consumer.get(EDGE, "req-1", handle, timeout=1), filled(5.0))  # pooled again

    # a claimed segment too small for the payload needs room to grow: none left, even without the pool
    monkeypatch.setattr(shm_module, "shm_free_bytes", lambda: 0)
    claimer = shm(run_id, who="thinker")
    with pytest.raises(ConnectorError, match=r"no room in /dev/shm for a payload of 4,194,\d{3} bytes"):
        claimer.put(EDGE, "req-2", filled(6.0, mib=4), timeout=1)
    assert segments(segment_prefix(run_id)) == []  # the claimed segment went with the refused put
    consumer.close()


# -- across processes ----------------------------------------------------------------------------


def test_a_child_puts_and_exits_then_the_parent_gets_everything(run_id: str, spawn: Any) -> None:
    """Every case inline and through segments, and a 256 MiB tensor: the segments outlive the
    producer's exit (no resource tracker unlinks them), each read once."""
    from connectors_testkit import produce

    parent_end, child_end = spawn.Pipe()
    child = spawn.Process(target=produce, args=(run_id, child_end), kwargs={"with_big": True, "linger": False})
    child.start()
    status, handles = recv(parent_end, child)
    child.join(30)
    assert status == "ok", handles
    assert child.exitcode == 0
    assert len(segments(segment_prefix(run_id))) == len(cases()) + 2  # all segment cases, large, big
    consumer = shm(run_id, who="talker")
    want = cases()
    for key, handle in handles.items():
        if key == "big":
            continue
        assert_same(consumer.get(EDGE, "req-1", handle, timeout=5), want[key.split(":", 1)[1]], key)
    got = consumer.get(EDGE, "req-1", handles["big"], timeout=5)
    assert got.dtype == torch.int32 and got.numel() == 64 * 1024 * 1024
    assert torch.equal(got, big())
    with pytest.raises(ConnectorError, match="already read"):
        consumer.get(EDGE, "req-1", handles["big"], timeout=5)
    # no payload is left: what the consumer still views is held under its own name, what it let
    # go of waits in the run's pool for the next put, and its close reclaims both
    left = segments(segment_prefix(run_id))
    assert left and all(name.endswith("_h") or "--pool-" in name for name in left), left
    del got
    consumer.close()
    assert segments(segment_prefix(run_id)) == []


def test_the_parent_puts_and_a_child_gets_everything(run_id: str) -> None:
    """Every case inline and through segments, and a 256 MiB tensor: the child gets each and
    compares it with its own copy; a second get of a segment's handle is refused."""
    from connectors_testkit import BIG
    from omni_plugin_connectors.shm import ShmConnector

    from omni_core.testing.connectors import ConnectorProcess

    small = shm(run_id, who="thinker")
    segmented = shm(run_id, who="thinker", inline_threshold_bytes=0)
    handles = []
    for name, payload in cases().items():
        handles.append((name, small.put(EDGE, "req-1", payload, timeout=5)))
        handles.append((name, segmented.put(EDGE, "req-1", payload, timeout=5)))
    handles.append((BIG, segmented.put(EDGE, "req-1", big(), timeout=30)))
    with ConnectorProcess(ShmConnector, run_id, owner="talker") as child:
        for name, handle in handles:
            child.get(EDGE, "req-1", handle, name, timeout=5)
            if "shm" in handle:
                with pytest.raises(AssertionError, match=r"ConnectorError: .*already read"):
                    child.get(EDGE, "req-1", handle, name, timeout=5)
        child.leave()
        child.process.join(30)
        assert child.process.exitcode == 0
    assert segments(segment_prefix(run_id)) == []  # the child never closed: what it pooled went at its exit


def test_a_killed_producers_segments_are_reclaimed_by_the_owners_close(run_id: str, spawn: Any) -> None:
    from connectors_testkit import produce

    owner = shm(run_id, owner=True, who="orchestrator")
    parent_end, child_end = spawn.Pipe()
    child = spawn.Process(target=produce, args=(run_id, child_end), kwargs={"with_big": False, "linger": True})
    child.start()
    status, handles = recv(parent_end, child)
    assert status == "ok", handles
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    assert child.exitcode == -signal.SIGKILL
    left = segments(segment_prefix(run_id))
    assert len(left) == len(cases()) + 1  # unread, and nobody unlinked them at the producer's death
    assert owner.health()["segments"] == len(left)
    owner.close()
    assert segments(segment_prefix(run_id)) == []


@pytest.mark.parametrize("numel", [64 * 1024, 4 * 1024 * 1024], ids=["512KiB_unlinked_at_get", "32MiB_held"])
def test_a_consumer_killed_after_its_get_leaves_nothing(run_id: str, spawn: Any, numel: int) -> None:
    """Under reuse_threshold_bytes, the segment's name is gone at the get: nothing to leak. At
    or over it, the consumer holds it under a name of the request's (for the pool, once it lets
    go): a consumer killed first leaves it to the request's cleanup (the orchestrator's, for the
    failed request) or the owner's close."""
    from connectors_testkit import consume_and_hold

    producer = shm(run_id, who="thinker")
    payload = torch.arange(numel, dtype=torch.int64)
    handle = producer.put(EDGE, "req-1", payload, timeout=5)
    parent_end, child_end = spawn.Pipe()
    child = spawn.Process(target=consume_and_hold, args=(run_id, handle, child_end))
    child.start()
    status, last, pid = recv(parent_end, child)
    assert (status, last) == ("held", numel - 1)
    held = segments(segment_prefix(run_id))
    with open(f"/proc/{pid}/maps") as maps:
        mapped = maps.read()
    if handle["nbytes"] < (1 << 20):
        assert held == []  # the consumer maps the segment, yet its name is already gone
        assert f"{SHM_DIR}/{handle['shm']} (deleted)" in mapped
    else:
        assert len(held) == 1 and held[0].startswith(handle["shm"] + "-") and held[0].endswith("_h")
        assert f"{SHM_DIR}/{held[0]}\n" in mapped
    os.kill(pid, signal.SIGKILL)
    child.join(10)
    assert segments(segment_prefix(run_id)) == held
    producer.cleanup("req-1")
    assert segments(segment_prefix(run_id)) == []
    producer.close()


def test_a_full_dev_shm_is_a_connector_error_naming_sizes_and_the_fix(run_id: str, spawn: Any) -> None:
    from connectors_testkit import put_without_room

    parent_end, child_end = spawn.Pipe()
    child = spawn.Process(target=put_without_room, args=(run_id, child_end))
    child.start()
    kind, message = recv(parent_end, child)
    child.join(30)
    assert kind == "ConnectorError", message
    assert "no room in /dev/shm for a payload of 4,194," in message
    assert "bytes free" in message and "--shm-size" in message and "inline_threshold_bytes" in message
    assert segments(segment_prefix(run_id)) == []


def _can_mount_a_private_dev_shm() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _can_mount_a_private_dev_shm(), reason="needs unshare -m and mount (root or CAP_SYS_ADMIN)")
def test_a_really_full_dev_shm_in_a_private_mount_namespace(run_id: str) -> None:
    """A child process sees its own 1 MiB /dev/shm: a second 600 KiB payload finds no room."""
    script = textwrap.dedent(
        f"""
        import json, os, torch
        from connectors_testkit import EDGE, shm
        from omni_core.errors import ConnectorError
        conn = shm({run_id!r}, inline_threshold_bytes=0)
        first = conn.put(EDGE, "req-1", torch.zeros(150_000), timeout=5)
        try:
            conn.put(EDGE, "req-1", torch.zeros(150_000), timeout=5)
            error = None
        except ConnectorError as exc:
            error = str(exc)
        print(json.dumps({{"error": error, "left": sorted(os.listdir("/dev/shm")), "first": first["shm"],
                           "health": conn.health()}}))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    command = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {shlex.quote(sys.executable)} -c {shlex.quote(script)}"
    done = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["left"] == [result["first"]]  # the refused payload left nothing
    assert re.search(r"no room in /dev/shm for a payload of 600,\d{3} bytes", result["error"]), result["error"]
    assert "/dev/shm has " in result["error"] and "--shm-size" in result["error"]
    assert result["health"]["ok"] is True and result["health"]["shm_free_bytes"] < 600_000
    assert segments(segment_prefix(run_id)) == []  # the host's /dev/shm never saw any of it


@pytest.mark.skipif(not _can_mount_a_private_dev_shm(), reason="needs unshare -m and mount (root or CAP_SYS_ADMIN)")
def test_a_dev_shm_that_fills_up_during_the_write(run_id: str) -> None:
    """The room check before a segment is created passes (as when another producer takes the
    room between the check and the write), then the kernel's write fails with ENOSPC half way:
    a ConnectorError naming the sizes, nothing left behind, and the free room it reports is
    the room there really is (the partial segment's pages freed first)."""
    script = textwrap.dedent(
        f"""
        import json, os, torch
        from connectors_testkit import EDGE, shm
        from omni_core.errors import ConnectorError
        import omni_plugin_connectors.shm as module
        real = module.shm_free_bytes
        conn = shm({run_id!r}, inline_threshold_bytes=0)
        first = conn.put(EDGE, "req-1", torch.zeros(150_000), timeout=5)
        free_before = real()
        module.shm_free_bytes = lambda: 1 << 40  # the check before the create passes
        checks = []
        def after_create(*args, **kwargs):
            checks.append(1)
            module.shm_free_bytes = real  # the error's own count is real
            return original(*args, **kwargs)
        original = module._write_frame
        module._write_frame = after_create
        try:
            conn.put(EDGE, "req-1", torch.zeros(150_000), timeout=5)
            error = None
        except ConnectorError as exc:
            error = str(exc)
        print(json.dumps({{"error": error, "left": sorted(os.listdir("/dev/shm")), "first": first["shm"],
                           "free_before": free_before, "free_after": real(), "checks": len(checks)}}))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    command = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {shlex.quote(sys.executable)} -c {shlex.quote(script)}"
    done = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["checks"] == 1  # the write was reached
    assert result["left"] == [result["first"]]  # the partial segment is gone
    assert result["free_after"] == result["free_before"] > 0
    error = result["error"]
    assert re.search(
        r"no room in /dev/shm for a payload of 600,\d{3} bytes \(No space left on device, errno 28\)", error
    )
    assert f"/dev/shm has {result['free_before']:,} bytes free" in error and "--shm-size" in error
    assert segments(segment_prefix(run_id)) == []


def test_no_resource_tracker_warning_in_a_spawned_childs_stderr(run_id: str) -> None:
    """A fresh interpreter puts through segments, gets one and exits holding its tensor: its
    stderr is clean (no "leaked shared_memory objects", no BufferError), and the segments it
    put are still there for their consumer."""
    held = shm(run_id, inline_threshold_bytes=0).put(EDGE, "req-1", torch.arange(100_000), timeout=1)
    script = textwrap.dedent(
        f"""
        import json, sys, torch
        from connectors_testkit import EDGE, shm
        conn = shm({run_id!r}, inline_threshold_bytes=0)
        handles = [conn.put(EDGE, "req-1", torch.full((1000,), float(i)), timeout=5) for i in range(3)]
        kept = conn.get(EDGE, "req-1", {held!r}, timeout=5)  # still viewing its mapping at exit
        assert int(kept[-1]) == 99_999
        print(json.dumps(handles))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "resource_tracker" not in done.stderr and "leaked" not in done.stderr, done.stderr
    assert done.stderr.strip() == ""
    consumer = shm(run_id)
    handles = json.loads(done.stdout)
    assert segments(segment_prefix(run_id)) == sorted(h["shm"] for h in handles)
    for i, handle in enumerate(handles):
        assert torch.equal(consumer.get(EDGE, "req-1", handle, timeout=1), torch.full((1000,), float(i)))


def produce_on_command(run_id: str, conn: Any) -> None:
    """A producer process (spawned: it imports this module by name): puts ``filled(value)`` for
    each ``(request, value)`` it is sent, answering the handle and the segment's inode; closes
    at ``None``."""
    producer = shm(run_id, who="thinker")
    try:
        while (message := conn.recv()) is not None:
            request, value = message
            handle = producer.put(EDGE, request, filled(value), timeout=5)
            conn.send((handle, inode(handle["shm"])))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        producer.close()


def test_a_producer_process_reuses_what_this_consumer_let_go_of_and_nothing_it_holds(run_id: str, spawn: Any) -> None:
    parent_end, child_end = spawn.Pipe()
    child = spawn.Process(target=produce_on_command, args=(run_id, child_end))
    child.start()
    consumer = shm(run_id, who="talker")

    def put(request: str, value: float) -> tuple[dict[str, Any], int]:
        parent_end.send((request, value))
        answer = recv(parent_end, child)
        assert answer[0] != "error", answer[1]
        return answer

    first, first_pages = put("req-1", 1.0)
    got_first = consumer.get(EDGE, "req-1", first, timeout=5)
    second, second_pages = put("req-2", 2.0)
    assert second_pages != first_pages  # held by this process's views: not reusable
    got_second = consumer.get(EDGE, "req-2", second, timeout=5)
    del got_first
    gc.collect()
    third, third_pages = put("req-3", 3.0)
    assert third_pages == first_pages  # let go of: the producer process wrote into those pages
    assert_same(consumer.get(EDGE, "req-3", third, timeout=5), filled(3.0))
    fourth, fourth_pages = put("req-4", 4.0)
    assert fourth_pages == first_pages  # the third's, let go of at once; never the second's, still viewed
    assert_same(consumer.get(EDGE, "req-4", fourth, timeout=5), filled(4.0))
    assert_same(got_second, filled(2.0))  # intact after every later put
    parent_end.send(None)
    child.join(30)
    assert child.exitcode == 0
    del got_second
    gc.collect()
    assert segments(segment_prefix(run_id)) == pool_of(run_id) != []  # the producer's exit took no payload
    consumer.close()
    assert segments(segment_prefix(run_id)) == []
