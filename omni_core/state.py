"""What omni remembers between runs: each plugin's last load outcome and import timings.

``omni plugins list`` and ``omni plugins show`` import no plugin code, so they report load
problems and import times from here, as seen by the last command that loaded plugins.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

HEALTH_FILENAME = "plugin-health.json"


def _key(distribution: str, version: str, plugin: str) -> str:
    return f"{distribution}=={version}/{plugin}"


#: the fields an entry holds and the type each must have; anything else is dropped on read
_TEXT_FIELDS = ("status", "reason", "fix", "checked_at", "traceback")


def _clean_entry(entry: Any) -> dict[str, Any] | None:
    """An entry with only well-typed fields, or None: the file is a cache, and a hand-edited or
    corrupt one must read as "nothing remembered", never crash a command."""
    if not isinstance(entry, dict):
        return None
    clean: dict[str, Any] = {k: entry[k] for k in _TEXT_FIELDS if isinstance(entry.get(k), str)}
    imports = entry.get("imports")
    clean["imports"] = (
        {
            ref: float(sec)
            for ref, sec in imports.items()
            if isinstance(ref, str) and isinstance(sec, int | float) and not isinstance(sec, bool)
        }
        if isinstance(imports, dict)
        else {}
    )
    return clean


class HealthStore:
    """``plugin-health.json`` in the cache directory. Corrupt or wrong-shaped content is
    ignored (and rewritten by the next update); updates are serialised by a lock, so
    concurrent commands lose no entry."""

    def __init__(self, cache_dir: Path) -> None:
        self.path = cache_dir / HEALTH_FILENAME
        #: what :meth:`lookup` reads, loaded once (a listing looks up every plugin)
        self._snapshot: dict[str, Any] | None = None

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_bytes().decode("utf-8"))
        except (OSError, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return {}
        if not isinstance(data, dict):
            return {}
        entries = {key: _clean_entry(entry) for key, entry in data.items()}
        return {key: entry for key, entry in entries.items() if entry is not None}

    def lookup(self, distribution: str, version: str, plugin: str) -> dict[str, Any] | None:
        if self._snapshot is None:
            self._snapshot = self.read()
        entry = self._snapshot.get(_key(distribution, version, plugin))
        return entry if isinstance(entry, dict) else None

    def update(self, entries: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        """Merge entries in; a read-only cache directory is not an error, just forgetful."""
        from omni_core.fsutil import atomic_write_text, file_lock

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return
        try:
            with file_lock(self.path.with_name(f".{self.path.name}.lock"), timeout=10.0):
                data = self.read()
                now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                for (dist, version, plugin), entry in entries.items():
                    key = _key(dist, version, plugin)
                    merged = dict(data.get(key) or {})
                    timings = dict(merged.get("imports") or {})
                    timings.update(entry.pop("imports", {}) or {})
                    merged.update(entry)
                    merged["imports"] = timings
                    merged.setdefault("checked_at", now)
                    if "status" in entry:
                        merged["checked_at"] = now
                    data[key] = merged
                # a cache: no fsync (a power cut just forgets), but never half-written
                atomic_write_text(self.path, json.dumps(data, indent=1, sort_keys=True), durable=False)
        except OSError:  # FileWriteError included: remembering is best effort
            pass
        self._snapshot = None
