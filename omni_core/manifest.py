"""Declared plugin metadata: what a plugin provides, readable without importing its code.

Every plugin package ships an ``omni_plugin.toml`` next to its ``__init__.py``::

    omni_api = ">=1.0,<2"                 # plugin API range it supports (not a core version)
    description = "CPU platform and the TORCH_SDPA attention backend"
    requires_hardware = []                # e.g. ["cuda"]: shown by `omni doctor`

    [catalog]                             # optional: names other distributions serve, for hints
    "omni-plugin-flux" = ["FluxPipeline"]

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
import json
import math
import os
import re
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_core.errors import ManifestError, ReferenceFormatError
from omni_core.kinds import Kind
from omni_core.lazy import check_ref

MANIFEST_FILENAME = "omni_plugin.toml"
_TOP_LEVEL_KEYS = {"omni_api", "description", "requires_hardware", "catalog"} | {k.value for k in Kind}
_COMMON_KEYS = {"name", "ref", "priority"}
#: what an extension name may look like, in a manifest and in a registration alike (the
#: registrar validates against the same pattern): names reach terminals and command lines
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
NAME_MAX_LENGTH = 100
_NAME_RE = re.compile(NAME_PATTERN)


def fold(name: str) -> str:
    """The key names and aliases are compared by, everywhere: case-insensitive."""
    return name.casefold()


def names_of(item: Any, *, architectures: bool = False) -> tuple[str, ...]:
    """The names an extension answers to: its name, then its aliases (then, with
    ``architectures``, the checkpoint class names a model serves). ``item`` is a registered
    spec or a manifest :class:`Declared` entry; the one alias matcher of registries and model
    resolution."""
    fields = item.fields if isinstance(item, Declared) else None

    def get(attr: str) -> tuple[str, ...]:
        value = fields.get(attr, ()) if fields is not None else getattr(item, attr, ())
        return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else ()

    return (item.name, *get("aliases"), *(get("architectures") if architectures else ()))


def answers_to(item: Any, query: str, *, architectures: bool = False) -> bool:
    """Whether ``query`` names ``item`` (see :func:`names_of`), case-insensitively."""
    key = fold(query)
    return any(fold(n) == key for n in names_of(item, architectures=architectures))


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
        return (self.kind, fold(self.name))


@dataclass(frozen=True)
class Manifest:
    """A plugin's declared metadata."""

    omni_api: str
    description: str = ""
    requires_hardware: tuple[str, ...] = ()
    provides: tuple[Declared, ...] = ()
    path: str = ""
    #: names served by *other* distributions, so "unknown model" errors can say what to install:
    #: distribution -> names (``[catalog]`` table, e.g. ``"omni-plugin-flux" = ["FluxPipeline"]``)
    catalog: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

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

    catalog = data.get("catalog", {})
    if not isinstance(catalog, dict) or not all(
        isinstance(names, list) and all(isinstance(n, str) for n in names) for names in catalog.values()
    ):
        raise ManifestError(f'{source}: [catalog] maps a distribution to a list of names, e.g. "omni-plugin-x" = ["A"]')

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
        catalog={dist: tuple(names) for dist, names in catalog.items()},
    )


def _parse_declared(kind: Kind, item: Any, source: str) -> Declared:
    where = f"{source}: [[{kind.value}]]"
    if not isinstance(item, dict):
        raise ManifestError(f"{where} entries must be tables")
    name, ref, priority = item.get("name"), item.get("ref"), item.get("priority", 0)
    if not isinstance(name, str) or not name.strip():
        raise ManifestError(f"{where} entry without a name")
    if not _NAME_RE.match(name.strip()) or len(name.strip()) > NAME_MAX_LENGTH:
        raise ManifestError(
            f"{where} name {name!r} is not a valid name: letters, digits, '_', '.', '-', "
            f"starting with a letter or digit, at most {NAME_MAX_LENGTH} characters"
        )
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


def read_manifest(module: str, cache: ManifestCache | None = None) -> Manifest:
    """Locate and parse the manifest of the plugin whose hook module is ``module``.

    With a ``cache``, an unchanged file's TOML is not parsed again; it is validated all the same.
    """
    path = locate_manifest(module)
    try:
        data = cache.read(path) if cache is not None else tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ManifestError(
            f"{path}: not valid UTF-8 (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            "TOML files must be UTF-8"
        ) from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ManifestError(f"{path}: {exc}") from None
    try:
        if not isinstance(data, dict):  # a cache entry of the wrong shape
            raise ManifestError(f"{path}: not a TOML table")
        return parse_manifest(data, str(path))
    except ManifestError:
        if cache is None:
            raise
        # what came from the cache may be a corrupt entry, not the file: judge the file itself
        return read_manifest(module, None)


MANIFEST_CACHE_FILENAME = "manifest-cache.json"
_CACHE_FORMAT = 1
#: a file written this recently may change again within its timestamps' resolution: not cached
_SETTLE_NS = 2_000_000_000


def _plain(value: Any) -> bool:
    """Whether ``value`` survives a JSON round trip unchanged (TOML dates do not)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (str, int))  # bool is an int


class ManifestCache:
    """Parsed manifests kept between runs in the cache directory (``OMNI_CACHE_DIR``), so that
    discovery does not parse every installed plugin's TOML again on every command.

    An entry is used only while its file keeps the same inode, size, mtime and ctime (ctime
    changes with every write and cannot be set back), and a file written in the last two
    seconds is not cached at all, so an edited manifest is always read afresh. Only the TOML
    parse is saved: :func:`parse_manifest` validates the data on every use. An unreadable or
    unwritable cache directory just means nothing is remembered.
    """

    def __init__(self, cache_dir: Path) -> None:
        self.path = cache_dir / MANIFEST_CACHE_FILENAME
        self._entries: dict[str, Any] | None = None
        self._dirty = False

    def _load(self) -> dict[str, Any]:
        if self._entries is None:
            try:
                raw: bytes | None = self.path.read_bytes()
            except OSError:
                raw = None
            try:
                data = json.loads(raw.decode("utf-8")) if raw is not None else None
            except (ValueError, RecursionError):  # corrupt: ignored, rewritten on save
                data = None
            ok = isinstance(data, dict) and data.get("format") == _CACHE_FORMAT
            manifests = data.get("manifests") if ok and isinstance(data, dict) else None
            # entries of the wrong shape are dropped here; :meth:`read` checks each one again
            self._entries = (
                {k: v for k, v in manifests.items() if isinstance(v, dict)} if isinstance(manifests, dict) else {}
            )
            self._dirty = raw is not None and (not ok or len(self._entries) != len(manifests or {}))
        return self._entries

    def read(self, path: Path) -> dict[str, Any]:
        """The parsed TOML of ``path``; raises what reading and parsing it would raise."""
        st = path.stat()  # before reading: a write after it changes the stamp
        stamp = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        key = str(path)
        entries = self._load()
        hit = entries.get(key)
        if isinstance(hit, dict) and hit.get("stamp") == stamp and isinstance(hit.get("data"), dict):
            return hit["data"]  # type: ignore[no-any-return]
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > _SETTLE_NS and _plain(data):
            entries[key] = {"stamp": stamp, "data": data}
            self._dirty = True
        elif entries.pop(key, None) is not None:
            self._dirty = True
        return data

    def save(self) -> None:
        """Write the cache back if anything changed, dropping entries for files now gone."""
        if not self._dirty or self._entries is None:
            return
        from omni_core.fsutil import atomic_write_text

        entries = {k: v for k, v in self._entries.items() if os.path.exists(k)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            data = json.dumps({"format": _CACHE_FORMAT, "manifests": entries})
            atomic_write_text(self.path, data, durable=False)  # a cache: no fsync, never half-written
        except OSError:  # FileWriteError included: a cache that cannot be written just forgets
            pass
        self._dirty = False
