"""What is installed, as the recovery commands see it: manifests plus remembered load health.

Reads declared metadata only (no plugin code, no torch) unless asked to load.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from omni_core import breadcrumb
from omni_core.config import Settings, current_settings
from omni_core.conflicts import Conflict, Offer, resolve
from omni_core.discovery import (
    HARDWARE_KINDS,
    Installed,
    PluginRecord,
    Status,
    discover,
    extension_filtered,
    scan_installed,
)
from omni_core.state import HealthStore


@dataclass
class Inventory:
    settings: Settings
    records: list[PluginRecord]
    conflicts: list[Conflict]
    loaded: bool
    #: last load outcome per plugin name, for plugins not loaded in this process
    health: dict[str, dict[str, Any]] = field(default_factory=dict)

    def effective_status(self, record: PluginRecord) -> tuple[Status, str, str]:
        """(status, reason, fix), taking the last remembered load into account."""
        if record.status is Status.OK and not record.loaded:
            last = self.health.get(record.name)
            remembered = _status(last.get("status")) if last else None
            if last and remembered is not None and remembered is not Status.OK:
                return (
                    remembered,
                    f"{last.get('reason', '')} (last load {last.get('checked_at', '?')})",
                    last.get("fix", ""),
                )
        return record.status, record.reason, record.fix

    def problems(self) -> list[str]:
        found = []
        for r in self.records:
            status, reason, _ = self.effective_status(r)
            if status.is_problem:
                found.append(f"plugin {r.name!r} from {r.distribution} {r.version}: {status}: {reason}")
        return found + [c.message() for c in self.conflicts]

    def record_dict(self, record: PluginRecord) -> dict[str, Any]:
        data = record.to_dict()
        status, reason, fix = self.effective_status(record)
        data.update(status=status.value, reason=reason, fix=fix, loaded=record.loaded)
        last = self.health.get(record.name)
        if not data["traceback"] and status is not record.status and last:  # the remembered failure's
            data["traceback"] = str(last.get("traceback") or "")
        data["last_load"] = last
        data["conflicts"] = [c.to_dict() for c in self.conflicts if any(o.plugin == record.name for o in c.offers)]
        return data


def _status(value: Any) -> Status | None:
    """A status remembered in the health store; None for a value this omni does not know."""
    try:
        return Status(value)
    except ValueError:
        return None


_SCAN: list[Installed] | None = None
_SCAN_ONCE = False


@contextmanager
def scan_once() -> Iterator[None]:
    """Within this block, every discovery reuses one scan of the installed plugins.

    ``omni`` discovers twice per run (plugin commands for the command line, then the command
    itself); reading every entry point and manifest once keeps that cost flat. Nothing is
    installed in between: ``omni install`` runs pip in a subprocess and rediscovers nothing.
    """
    global _SCAN, _SCAN_ONCE
    _SCAN, _SCAN_ONCE = None, True
    try:
        yield
    finally:
        _SCAN, _SCAN_ONCE = None, False


def installed_plugins(settings: Settings) -> list[Installed] | None:
    """The scan shared inside :func:`scan_once`, or None outside it (scan afresh)."""
    global _SCAN
    if not _SCAN_ONCE:
        return None
    if _SCAN is None:
        _SCAN = scan_installed(settings.cache_dir)
    return _SCAN


def take_inventory(load: bool = False) -> Inventory:
    """Discover plugins. With ``load=True`` import them now (isolated) for real outcomes."""
    settings = current_settings()
    if load:
        from omni_core.plugins import load_plugins

        plugin_set = load_plugins(settings)  # raises PluginLoadError in strict mode
        return Inventory(settings, plugin_set.records, plugin_set.conflicts, loaded=True)

    # a run that died while loading a plugin left a breadcrumb: it becomes that plugin's health
    breadcrumb.collect_stale(settings.cache_dir)
    records = discover(settings, installed_plugins(settings))
    store = HealthStore(settings.cache_dir)
    health = {}
    for r in records:
        last = store.lookup(r.distribution, r.version, r.name)
        if last:
            health[r.name] = last
    offers = [
        Offer(d.kind, d.name, d.priority, r.name, r.distribution, r.version, d)
        for r in records
        if r.status is Status.OK and r.manifest is not None
        for d in r.manifest.provides
        if (not r.hardware_only or d.kind in HARDWARE_KINDS) and extension_filtered(d.kind, d.name, settings) is None
    ]
    conflicts = resolve(offers, settings.pins).conflicts
    return Inventory(settings, records, conflicts, loaded=False, health=health)
