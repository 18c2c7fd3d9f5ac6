"""What omni remembers between runs: each plugin's last load outcome and import timings.

``omni plugins list`` and ``omni plugins show`` import no plugin code, so they report load
problems and import times from here, as seen by the last command that loaded plugins.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

HEALTH_FILENAME = "plugin-health.json"


def _key(distribution: str, version: str, plugin: str) -> str:
    return f"{distribution}=={version}/{plugin}"


class HealthStore:
    def __init__(self, cache_dir: Path) -> None:
        self.path = cache_dir / HEALTH_FILENAME
        #: what :meth:`lookup` reads, loaded once (a listing looks up every plugin)
        self._snapshot: dict[str, Any] | None = None

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def lookup(self, distribution: str, version: str, plugin: str) -> dict[str, Any] | None:
        if self._snapshot is None:
            self._snapshot = self.read()
        entry = self._snapshot.get(_key(distribution, version, plugin))
        return entry if isinstance(entry, dict) else None

    def update(self, entries: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        """Merge entries in; a read-only cache directory is not an error, just forgetful."""
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
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
            tmp.replace(self.path)
        except OSError:
            pass
        self._snapshot = None
