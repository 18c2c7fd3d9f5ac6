"""Naming the plugin that ended the process: a breadcrumb written before each plugin's code runs.

A plugin that calls ``os._exit()`` (or crashes the interpreter) cannot be caught in-process:
nothing after it runs. So before omni runs a plugin's code (its import, each of its hooks,
``omni_configure``, a platform probe) it records "loading plugin X (distribution, version),
step" in ``$OMNI_CACHE_DIR/loading/<pid>.json``, and removes the file once loading finished
cleanly. A breadcrumb whose process is gone is the trace of a run that ended while loading
that plugin. The next command that looks (:func:`collect_stale`: ``omni plugins list``,
``omni doctor``, every load) turns it into the plugin's remembered health, status
``crashed``, with the fix, and removes it.

One file per process, so concurrent commands never clear each other's breadcrumb. The file
is created atomically and then updated in place, one fixed-size record per write (see
:func:`mark`), never fsync'ed: it must survive its writer's death, not a power cut, and
loading fifty plugins must not pay fifty fsyncs. An unwritable cache directory only means
nothing is recorded.

Standard library only: :func:`collect_stale` runs in ``omni plugins list``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_core.text import shell_arg

BREADCRUMB_DIRNAME = "loading"
#: the health status of a plugin that was being loaded when its process died
CRASHED = "crashed"
#: every breadcrumb record is padded to this size, so each update is one write of one block
#: at offset 0 that replaces the whole record: no state in between is ever a torn record
RECORD_SIZE = 2048


@dataclass
class _Crumb:
    path: Path
    fd: int | None  #: kept open while loading, for the cheap in-place updates


#: breadcrumb directory -> this process's breadcrumb there (None: writing failed, stop trying)
_MINE: dict[Path, _Crumb | None] = {}


def _host() -> str:
    try:
        return socket.gethostname()
    except OSError:  # pragma: no cover
        return ""


def _record(plugin: str, distribution: str, version: str, step: str) -> bytes:
    data = {
        "pid": os.getpid(),
        "host": _host(),
        "plugin": plugin,
        "distribution": distribution,
        "version": version,
        "step": step,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    raw = json.dumps(data).encode("utf-8")
    if len(raw) > RECORD_SIZE:  # absurdly long names: keep the record whole, shorten the texts
        for key in ("step", "plugin", "distribution", "version"):
            data[key] = str(data[key])[:200]
        raw = json.dumps(data).encode("utf-8")
    return raw.ljust(RECORD_SIZE)  # JSON ignores the trailing spaces


def mark(cache_dir: Path, plugin: str, distribution: str, version: str, step: str) -> None:
    """Record that this process is about to run ``step`` of ``plugin``'s code.

    The first mark of a load creates the file atomically (:func:`omni_core.fsutil.atomic_write`:
    temporary name, rename); the next ones overwrite it in place with a single ``pwrite`` of a
    fixed-size record, which a process can only complete or not do at all. A rename per mark
    costs about half a millisecond: fifty plugins would add a tenth of a second to every load.
    """
    directory = cache_dir / BREADCRUMB_DIRNAME
    crumb = _MINE.get(directory, False)
    if crumb is None:
        return
    record = _record(plugin, distribution, version, step)
    try:
        if isinstance(crumb, _Crumb) and crumb.fd is not None:
            os.pwrite(crumb.fd, record, 0)
            return
        from omni_core.fsutil import atomic_write

        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{os.getpid()}.json"
        atomic_write(path, record, durable=False)
        fd = os.open(path, os.O_WRONLY) if hasattr(os, "pwrite") else None
        _MINE[directory] = _Crumb(path, fd)
    except OSError:  # FileWriteError included: nothing is recorded, nothing breaks
        _MINE[directory] = None


def clear(cache_dir: Path) -> None:
    """Loading finished cleanly: remove this process's breadcrumb."""
    crumb = _MINE.get(cache_dir / BREADCRUMB_DIRNAME)
    if crumb is None:
        return
    _MINE.pop(cache_dir / BREADCRUMB_DIRNAME, None)
    if crumb.fd is not None:
        try:
            os.close(crumb.fd)
        except OSError:
            pass
    try:
        crumb.path.unlink()
    except OSError:
        pass


@dataclass(frozen=True)
class Crash:
    """A run that ended while loading a plugin, as its breadcrumb told."""

    plugin: str
    distribution: str
    version: str
    step: str
    at: str

    @property
    def reason(self) -> str:
        return (
            f"the last omni run ended while loading plugin {self.plugin!r} ({self.distribution} {self.version}, "
            f"{self.step}); it may have called os._exit"
        )

    @property
    def fix(self) -> str:
        return f"disable it with `omni plugins disable {shell_arg(self.plugin)}`"

    def message(self) -> str:
        return f"{self.reason}; {self.fix}"


def _alive(pid: int, host: str) -> bool:
    if host and host != _host():
        return True  # another machine sharing the cache directory: cannot tell, leave it
    if pid == os.getpid():
        return False  # our pid, but we have not written yet: a dead process's reused pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def _parse(raw: str) -> tuple[Crash | None, str]:
    """The crash a breadcrumb tells of (None if unreadable) and the host that wrote it."""
    try:
        data: Any = json.loads(raw)
    except ValueError:
        return None, ""
    if not isinstance(data, dict):
        return None, ""
    host = data["host"] if isinstance(data.get("host"), str) else ""
    if not all(isinstance(data.get(k), str) for k in ("plugin", "distribution", "version", "step")):
        return None, host
    crash = Crash(data["plugin"], data["distribution"], data["version"], data["step"], str(data.get("at", "?")))
    return crash, host


def collect_stale(cache_dir: Path) -> list[Crash]:
    """The crashes left by dead processes: each is remembered as the plugin's health (status
    ``crashed``) and its breadcrumb removed. Cheap when there is none (one directory listing)."""
    directory = cache_dir / BREADCRUMB_DIRNAME
    try:
        entries = [e for e in os.scandir(directory) if e.name.endswith(".json")]
    except OSError:
        return []
    crumb = _MINE.get(directory)
    mine = crumb.path if crumb is not None else None
    crashes: list[Crash] = []
    stale: list[Path] = []
    for entry in entries:
        path = Path(entry.path)
        if path == mine:
            continue
        try:
            pid = int(entry.name[: -len(".json")])
            raw = path.read_text(encoding="utf-8", errors="replace")
        except (ValueError, OSError):
            continue
        crash, host = _parse(raw)
        if _alive(pid, host):
            continue
        stale.append(path)
        if crash is not None:
            crashes.append(crash)
    if crashes:
        from omni_core.state import HealthStore

        HealthStore(cache_dir).update(
            {
                (c.distribution, c.version, c.plugin): {"status": CRASHED, "reason": c.reason, "fix": c.fix}
                for c in crashes
            }
        )
    for path in stale:
        try:
            path.unlink()
        except OSError:
            pass
    return crashes


def remembered_crashes(cache_dir: Path) -> list[dict[str, str]]:
    """Every plugin whose last load ended its process, new breadcrumbs included: what
    ``omni doctor`` reports before it loads plugins itself (plugin, distribution, version,
    reason, fix, checked_at)."""
    collect_stale(cache_dir)
    from omni_core.state import HealthStore

    found = []
    for key, entry in HealthStore(cache_dir).read().items():
        if entry.get("status") != CRASHED:
            continue
        dist_version, _, plugin = key.partition("/")  # no "/" in a distribution or version
        dist, _, version = dist_version.partition("==")
        found.append(
            {
                "plugin": plugin,
                "distribution": dist,
                "version": version,
                "reason": str(entry.get("reason", "")),
                "fix": str(entry.get("fix", "")),
                "checked_at": str(entry.get("checked_at", "?")),
            }
        )
    return found
