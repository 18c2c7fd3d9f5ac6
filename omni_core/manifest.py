"""Declared plugin metadata: what a plugin provides, readable without importing its code.

Every plugin package ships an ``omni_plugin.toml`` next to its ``__init__.py``::

    omni_api = ">=1.0,<2"                 # plugin API range it supports (not a core version)
    description = "CPU platform and the TORCH_SDPA attention backend"
    requires_hardware = []                # e.g. ["cuda"]: shown by `omni doctor`

    [[platform]]                          # one array of tables per extension kind
    name = "cpu"
    ref = "omni_plugin_cpu.platform:CpuPlatform"   # lazy: imported on first use
    probe = "omni_plugin_cpu.platform:probe"       # kind-specific fields sit beside it
    priority = -100

``omni plugins list`` reads only these files. When the plugin is loaded, the core checks that
its hooks register exactly what the manifest declares.
"""

from __future__ import annotations

import importlib.util
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_core.errors import ManifestError, ReferenceFormatError
from omni_core.kinds import Kind
from omni_core.lazy import check_ref

MANIFEST_FILENAME = "omni_plugin.toml"
_TOP_LEVEL_KEYS = {"omni_api", "description", "requires_hardware"} | {k.value for k in Kind}
_COMMON_KEYS = {"name", "ref", "priority"}


@dataclass(frozen=True)
class Declared:
    """One extension as declared in a manifest."""

    kind: Kind
    name: str
    ref: str
    priority: int = 0
    #: kind-specific fields (``probe`` for platforms, ``help`` for commands, ...)
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[Kind, str]:
        return (self.kind, self.name.casefold())


@dataclass(frozen=True)
class Manifest:
    """A plugin's declared metadata."""

    omni_api: str
    description: str = ""
    requires_hardware: tuple[str, ...] = ()
    provides: tuple[Declared, ...] = ()
    path: str = ""

    def of_kind(self, kind: Kind) -> list[Declared]:
        return [d for d in self.provides if d.kind is kind]

    @property
    def kinds(self) -> list[Kind]:
        return [k for k in Kind if any(d.kind is k for d in self.provides)]


def parse_manifest(data: Mapping[str, Any], source: str = "<manifest>") -> Manifest:
    """Validate a manifest's parsed TOML. Raises :class:`ManifestError` naming the field."""
    unknown = set(data) - _TOP_LEVEL_KEYS
    if unknown:
        raise ManifestError(f"{source}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOP_LEVEL_KEYS)}")
    api = data.get("omni_api")
    if not isinstance(api, str) or not api.strip():
        raise ManifestError(f'{source}: missing "omni_api", the plugin API range it supports, e.g. ">=1.0,<2"')
    description = data.get("description", "")
    hardware = data.get("requires_hardware", [])
    if not isinstance(description, str):
        raise ManifestError(f"{source}: description must be a string")
    if not isinstance(hardware, list) or not all(isinstance(h, str) for h in hardware):
        raise ManifestError(f"{source}: requires_hardware must be a list of strings")

    provides: list[Declared] = []
    seen: set[tuple[Kind, str]] = set()
    for kind in Kind:
        items = data.get(kind.value, [])
        if not isinstance(items, list):
            raise ManifestError(f"{source}: [{kind.value}] must be an array of tables ([[{kind.value}]])")
        for item in items:
            declared = _parse_declared(kind, item, source)
            if declared.key in seen:
                raise ManifestError(f"{source}: {kind.label} {declared.name!r} is declared twice")
            seen.add(declared.key)
            provides.append(declared)
    return Manifest(
        omni_api=api.strip(),
        description=description,
        requires_hardware=tuple(hardware),
        provides=tuple(provides),
        path=source,
    )


def _parse_declared(kind: Kind, item: Any, source: str) -> Declared:
    where = f"{source}: [[{kind.value}]]"
    if not isinstance(item, dict):
        raise ManifestError(f"{where} entries must be tables")
    name, ref, priority = item.get("name"), item.get("ref"), item.get("priority", 0)
    if not isinstance(name, str) or not name.strip():
        raise ManifestError(f"{where} entry without a name")
    if not isinstance(ref, str):
        raise ManifestError(f"{where} {name!r} needs ref = 'package.module:attribute'")
    try:
        check_ref(ref)
    except ReferenceFormatError as exc:
        raise ManifestError(f"{where} {name!r}: {exc}") from None
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ManifestError(f"{where} {name!r}: priority must be an integer")
    extra = {k: v for k, v in item.items() if k not in _COMMON_KEYS}
    return Declared(kind=kind, name=name.strip(), ref=ref, priority=priority, fields=extra)


def locate_manifest(module: str) -> Path:
    """Find ``omni_plugin.toml`` in the top-level package of ``module`` without importing it."""
    top = module.split(":")[0].split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError) as exc:
        raise ManifestError(f"cannot locate package {top!r}: {exc}") from None
    if spec is None:
        raise ManifestError(f"package {top!r} is not importable from this environment")
    for location in spec.submodule_search_locations or ():
        candidate = Path(location) / MANIFEST_FILENAME
        if candidate.is_file():
            return candidate
    raise ManifestError(
        f"package {top!r} ships no {MANIFEST_FILENAME}; every omni plugin declares what it "
        "provides there (see `omni new-plugin` for a template), and it must be listed as "
        "package data in the plugin's pyproject.toml"
    )


def read_manifest(module: str) -> Manifest:
    """Locate and parse the manifest of the plugin whose hook module is ``module``."""
    path = locate_manifest(module)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ManifestError(f"{path}: {exc}") from None
    return parse_manifest(data, str(path))
