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

    assert ShmConnector.validate_options({}).inline_threshold_bytes == 65536  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="inline_threshold_bytes"):
        ShmConnector.validate_options({"inline_threshold_bytes": -1})
    with pytest.raises(ValueError, match="inline_treshold"):
        ShmConnector.validate_options({"inline_treshold": 1})


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
    assert segments(segment_prefix(run_id)) == []


def test_the_parent_puts_and_a_child_gets_everything(run_id: str, spawn: Any) -> None:
    from connectors_testkit import consume

    small = shm(run_id, who="thinker")
    segmented = shm(run_id, who="thinker", inline_threshold_bytes=0)
    handles = {}
    for name, payload in cases().items():
        handles[f"inline:{name}"] = small.put(EDGE, "req-1", payload, timeout=5)
        handles[f"segment:{name}"] = segmented.put(EDGE, "req-1", payload, timeout=5)
    handles["big"] = segmented.put(EDGE, "req-1", big(), timeout=30)
    parent_end, child_end = spawn.Pipe()
    child = spawn.Process(target=consume, args=(run_id, handles, child_end))
    child.start()
    problems = recv(parent_end, child)
    child.join(30)
    assert problems == []
    assert child.exitcode == 0
    assert segments(segment_prefix(run_id)) == []


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


def test_a_consumer_killed_after_its_get_leaves_nothing(run_id: str, spawn: Any) -> None:
    from connectors_testkit import consume_and_hold

    producer = shm(run_id, who="thinker")
    payload = torch.arange(4 * 1024 * 1024, dtype=torch.int64)  # 32 MiB
    handle = producer.put(EDGE, "req-1", payload, timeout=5)
    parent_end, child_end = spawn.Pipe()
    child = spawn.Process(target=consume_and_hold, args=(run_id, handle, child_end))
    child.start()
    status, last, pid = recv(parent_end, child)
    assert (status, last) == ("held", 4 * 1024 * 1024 - 1)
    # the consumer maps the segment, yet its name is already gone: nothing to leak
    assert segments(segment_prefix(run_id)) == []
    with open(f"/proc/{pid}/maps") as maps:
        assert f"{SHM_DIR}/{handle['shm']} (deleted)" in maps.read()
    os.kill(pid, signal.SIGKILL)
    child.join(10)
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
