"""The fault battery's shared rules: what every failure omni reports must look like.

Each row of the battery (``tests/test_faults_*.py``) runs the real ``omni`` command in a real
virtual environment and checks, through :func:`assert_clean_failure`:

* the exit code (only 0, 1, 2, 3, and 130 for the user's own Ctrl-C, ever appear);
* a message naming the cause (every string in ``mentions``, case-insensitively);
* no Python traceback on either stream;
* no file lost or half-written (:func:`snapshot` before, :func:`assert_unchanged` after).

Every fault found later gets a row in one of those files.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from omni_testenv import Result

ALLOWED_EXIT_CODES = frozenset({0, 1, 2, 3, 130})
#: what a Python traceback prints; none of it may reach a user
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s+File \".*\", line \d+", re.MULTILINE)
#: raw terminal control characters (ESC, BEL, ...) that a plugin's text could smuggle in
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def output(result: Result) -> str:
    return result.stdout + result.stderr


def assert_no_traceback(result: Result) -> None:
    text = output(result)
    assert not _TRACEBACK.search(text), f"a traceback reached the user:\n{text}"


def assert_no_control_chars(result: Result) -> None:
    text = output(result)
    found = _CONTROL.search(text)
    assert found is None, f"raw control character {found.group()!r} reached the terminal:\n{text!r}"


def assert_clean_failure(result: Result, code: int, *mentions: str) -> None:
    """``result`` exited ``code``, names every one of ``mentions``, and shows no traceback."""
    text = output(result)
    assert result.returncode in ALLOWED_EXIT_CODES, f"exit code {result.returncode} is not one of omni's:\n{text}"
    assert result.returncode == code, f"expected exit {code}, got {result.returncode}:\n{text}"
    assert_no_traceback(result)
    lowered = text.lower()
    for mention in mentions:
        assert mention.lower() in lowered, f"the message does not name {mention!r}:\n{text}"


def snapshot(paths: Iterable[Path]) -> dict[Path, str | None]:
    """A digest of every file under ``paths`` (None for a path that does not exist)."""
    digests: dict[Path, str | None] = {}
    for root in paths:
        if root.is_file():
            digests[root] = hashlib.sha256(root.read_bytes()).hexdigest()
        elif root.is_dir():
            for f in sorted(p for p in root.rglob("*") if p.is_file()):
                digests[f] = hashlib.sha256(f.read_bytes()).hexdigest()
        else:
            digests[root] = None
    return digests


def assert_unchanged(before: dict[Path, str | None], roots: Iterable[Path]) -> None:
    """Every file recorded by :func:`snapshot` is still there with the same bytes."""
    after = snapshot(roots)
    lost = [str(p) for p, digest in before.items() if digest is not None and after.get(p) != digest]
    assert not lost, f"files lost or changed: {lost}"
