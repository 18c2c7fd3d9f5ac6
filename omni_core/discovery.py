"""Find installed plugins through one entry-point group, reading only their declared metadata.

Nothing here imports plugin code (or torch): this is what ``omni plugins list`` runs.
A plugin distribution declares itself in its ``pyproject.toml``::

    [project.entry-points."omni.plugins"]
    cpu = "omni_plugin_cpu.hooks"     # plugin name = module holding the hook implementations
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from omni_core._version import PLUGIN_API_VERSION
from omni_core.config import Settings, normalize_dist
from omni_core.conflicts import Provider
from omni_core.errors import ManifestError
from omni_core.kinds import Kind
from omni_core.manifest import Manifest, ManifestCache, read_manifest
from omni_core.text import shell_arg

ENTRY_POINT_GROUP = "omni.plugins"

#: What a platform plugin left out by ``OMNI_PLUGINS`` still contributes: narrowing the models
#: or commands never takes away the hardware, nor the attention kernels that run on it.
HARDWARE_KINDS = frozenset({Kind.PLATFORM, Kind.ATTENTION_BACKEND})
#: a header name as the email parser accepts it (printable ASCII but the colon)
_HEADER_NAME = re.compile(r"[\041-\071\073-\176]+")

#: Distributions that ``OMNI_SAFE_MODE=1`` still loads: the embedded default that ships with omni.
BUILTIN_DISTRIBUTIONS = frozenset({"omni-plugin-cpu"})


class Status(enum.StrEnum):
    """Where a plugin stands. Everything but ``ok`` means it contributes nothing."""

    OK = "ok"
    DISABLED = "disabled"  # filtered out on purpose (safe mode, deny or allow lists)
    INCOMPATIBLE = "incompatible"  # its omni_api range excludes this core
    INVALID_MANIFEST = "invalid-manifest"
    DUPLICATE_NAME = "duplicate-name"  # two distributions use one plugin name (a built-in keeps its own)
    IMPORT_FAILED = "import-failed"
    HOOK_FAILED = "hook-failed"
    METADATA_MISMATCH = "metadata-mismatch"  # registered something other than it declared
    #: an earlier run ended (os._exit) while loading it; only ever read back from the health
    #: store (omni_core.breadcrumb writes it), never the outcome of a load in this process
    CRASHED = "crashed"

    def __str__(self) -> str:
        return self.value

    @property
    def is_problem(self) -> bool:
        """A problem is something broken; a plugin disabled on purpose is not one."""
        return self not in (Status.OK, Status.DISABLED)


@dataclass
class PluginRecord:
    """One discovered plugin, its declared metadata and its current status."""

    name: str
    module: str
    distribution: str
    version: str
    manifest: Manifest | None = None
    status: Status = Status.OK
    reason: str = ""
    fix: str = ""
    #: left out by OMNI_PLUGINS, but still contributes its hardware layer (HARDWARE_KINDS)
    hardware_only: bool = False
    #: set when the plugin was imported in this process
    loaded: bool = False
    import_seconds: float | None = None
    #: something is wrong but the plugin still works (an unknown hook, a heavy import, a crash in
    #: an earlier run): a problem in strict mode only where said
    warnings: list[str] = field(default_factory=list)
    #: plain information (left out by OMNI_PLUGINS but hardware kept, what was also wrong with a
    #: disabled plugin, another distribution refused for using its name)
    notes: list[str] = field(default_factory=list)
    #: the end of the traceback of a failed hook, for ``omni plugins show`` and ``--json``
    traceback: str = ""
    #: heavy modules (torch, ...) that appeared while it was imported and registered
    heavy_imports: list[str] = field(default_factory=list)

    @property
    def builtin(self) -> bool:
        return normalize_dist(self.distribution) in BUILTIN_DISTRIBUTIONS

    @property
    def who(self) -> Provider:
        return Provider(self.name, self.distribution, self.version)

    @property
    def provider(self) -> str:
        return str(self.who)

    def fail(self, status: Status, reason: str, fix: str = "") -> None:
        self.status, self.reason, self.fix = status, reason, fix

    def problem(self) -> str:
        return f"plugin {self.name!r} from {self.distribution} {self.version}: {self.status}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        provides = []
        if self.manifest is not None:
            provides = [
                {"kind": d.kind.value, "name": d.name, "ref": d.ref, "priority": d.priority, **d.fields}
                for d in self.manifest.provides
            ]
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
            "builtin": self.builtin,
            "status": self.status.value,
            "reason": self.reason,
            "fix": self.fix,
            "hardware_only": self.hardware_only,
            "omni_api": self.manifest.omni_api if self.manifest else None,
            "description": self.manifest.description if self.manifest else "",
            "requires_hardware": list(self.manifest.requires_hardware) if self.manifest else [],
            "provides": provides,
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "traceback": self.traceback,
            "heavy_imports": list(self.heavy_imports),
        }


@functools.lru_cache(maxsize=64)
def api_compatible(spec: str, version: str = PLUGIN_API_VERSION) -> bool:
    """Whether a plugin's ``omni_api`` range admits ``version`` (this core's plugin API by
    default). Raises ``ValueError`` (packaging's InvalidSpecifier) for a malformed range."""
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec).contains(version, prereleases=True)


@dataclass(frozen=True)
class ApiCheck:
    """The one verdict on a plugin's ``omni_api`` range: discovery, ``omni install`` and the
    conformance kit all use :func:`check_api_range`, so they say the same thing."""

    ok: bool
    #: ``incompatible`` or ``invalid-manifest`` when not ok
    status: Status | None = None
    reason: str = ""
    fix: str = ""


def check_api_range(omni_api: str, distribution: str = "the plugin") -> ApiCheck:
    """Whether ``omni_api`` admits this core's plugin API, and if not, why and the fix."""
    try:
        ok = api_compatible(omni_api)
    except Exception:
        return ApiCheck(
            False,
            Status.INVALID_MANIFEST,
            f"omni_api {omni_api!r} is not a version range",
            'write a range such as omni_api = ">=1.1,<2"',
        )
    if ok:
        return ApiCheck(True)
    return ApiCheck(
        False,
        Status.INCOMPATIBLE,
        f"supports omni plugin API {omni_api}, this core provides {PLUGIN_API_VERSION}",
        f"upgrade the plugin (pip install -U {distribution}) or install a matching omni-core",
    )


@dataclass(frozen=True)
class Installed:
    """One plugin as found on disk, before any setting applies: its entry point, its
    distribution and its manifest (or why the manifest could not be read)."""

    name: str
    module: str
    distribution: str
    version: str
    manifest: Manifest | None = None
    manifest_error: str = ""


def _name_version(dist: metadata.Distribution) -> tuple[str, str]:
    """``(dist.name, dist.version)``, reading only the metadata headers.

    ``dist.name`` and ``dist.version`` each run the whole metadata file, long description
    included, through the email parser. The two headers sit before the first blank line; any
    header block that is not plain ``Key: value`` lines (folded lines, carriage returns, a
    missing header) goes through ``dist.metadata`` as before, so the result is the same.
    """
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO")  # what dist.metadata reads
    if text:
        head = text.split("\n\n", 1)[0]
        found: dict[str, str] = {}
        for line in head.split("\n"):
            if not line:  # the blank line ending the headers
                break
            key, sep, value = line.partition(":")
            if not sep or "\r" in line or not _HEADER_NAME.fullmatch(key):
                found.clear()  # not a plain header line: let the email parser decide
                break
            found.setdefault(key.lower(), value.lstrip(" \t"))
        if "name" in found and "version" in found:
            return found["name"], found["version"]
    meta = dist.metadata
    return meta["Name"], meta["Version"]


def _entry_points() -> list[tuple[metadata.EntryPoint, str, str]]:
    """(entry point, distribution name, version); each distribution's metadata is parsed once."""
    seen: set[tuple[str, str]] = set()
    found = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        try:
            dist_name, version = _name_version(dist) if dist is not None else ("?", "?")
        except Exception:  # unreadable metadata (not UTF-8, say): list it, never fail the listing
            dist_name, version = f"unknown distribution of {ep.value}", "?"
        if not isinstance(dist_name, str) or not isinstance(version, str):  # a header missing
            dist_name, version = str(dist_name or f"unknown distribution of {ep.value}"), str(version or "?")
        key = (normalize_dist(dist_name), ep.name)
        if key in seen:  # the same distribution visible twice on sys.path
            continue
        seen.add(key)
        found.append((ep, dist_name if dist is not None else "unknown", version))
    return found


def scan_installed(cache_dir: Path | None = None) -> list[Installed]:
    """Read every installed plugin's entry point and manifest. Imports no plugin code.

    With ``cache_dir``, parsed manifests are remembered there (see :class:`ManifestCache`).
    """
    cache = ManifestCache(cache_dir) if cache_dir is not None else None
    found = []
    for ep, dist_name, version in _entry_points():
        try:
            found.append(Installed(ep.name, ep.value, dist_name, version, read_manifest(ep.value, cache)))
        except ManifestError as exc:
            found.append(Installed(ep.name, ep.value, dist_name, version, None, str(exc)))
    if cache is not None:
        cache.save()
    return found


def discover(settings: Settings, installed: Sequence[Installed] | None = None) -> list[PluginRecord]:
    """Every installed plugin with its manifest and the status knowable without importing it.

    ``installed`` reuses an earlier :func:`scan_installed` (one process that discovers twice
    need not read every manifest twice); by default the environment is scanned now.
    """
    records: list[PluginRecord] = []
    for item in scan_installed(settings.cache_dir) if installed is None else installed:
        record = PluginRecord(
            name=item.name,
            module=item.module,
            distribution=item.distribution,
            version=item.version,
        )
        records.append(record)
        if item.manifest is None:
            record.fail(
                Status.INVALID_MANIFEST,
                item.manifest_error,
                f"reinstall or fix {record.distribution}; `omni plugins disable {shell_arg(record.name)}` skips it",
            )
            continue
        record.manifest = item.manifest
        _apply_api_range(record)
    _flag_duplicate_names(records)
    for record in records:
        # also for plugins already found broken: disabling one is how a user silences it
        _apply_filters(record, settings)
    return sorted(records, key=lambda r: (r.name, r.distribution))


def _apply_api_range(record: PluginRecord) -> None:
    assert record.manifest is not None
    check = check_api_range(record.manifest.omni_api, record.distribution)
    if not check.ok:
        assert check.status is not None
        record.fail(check.status, check.reason, check.fix)


def _flag_duplicate_names(records: list[PluginRecord]) -> None:
    """Two distributions using one plugin name (case-insensitively) are both refused, except
    that a built-in plugin's name can never be taken: the built-in stays and only the other
    distribution is refused. Otherwise installing a package that calls itself ``CPU`` would
    switch off the embedded default, in safe mode too."""
    by_name: dict[str, list[PluginRecord]] = {}
    for r in records:
        by_name.setdefault(r.name.casefold(), []).append(r)
    for group in by_name.values():
        if len(group) < 2:
            continue
        builtin = next((r for r in group if r.builtin), None)
        if builtin is not None:
            for r in group:
                if r.builtin:
                    continue
                r.fail(
                    Status.DUPLICATE_NAME,
                    f"plugin name {r.name!r} belongs to the built-in plugin {builtin.name!r} "
                    f"({builtin.distribution} {builtin.version}); {r.distribution} {r.version} is refused "
                    "and the built-in keeps working",
                    f"uninstall {r.distribution} (`omni uninstall {shell_arg(r.distribution)}`) "
                    "or ask its authors to rename its plugin",
                )
                builtin.notes.append(f"{r.distribution} {r.version} also calls its plugin {r.name!r}; it was refused")
            continue
        providers = ", ".join(f"{r.distribution} {r.version}" for r in group)
        for r in group:
            r.fail(
                Status.DUPLICATE_NAME,
                f"plugin name {r.name!r} is used by several distributions: {providers}",
                "uninstall all but one of them (`omni uninstall DIST`)",
            )


def _disable(record: PluginRecord, reason: str, fix: str = "") -> None:
    if record.status.is_problem:  # keep what was wrong, for `omni plugins show`
        record.notes.append(f"also {record.status}: {record.reason}")
    record.fail(Status.DISABLED, reason, fix)


def _apply_filters(record: PluginRecord, settings: Settings) -> None:
    name = record.name.casefold()
    if settings.safe_mode:
        # Safe mode is the way back to a working machine, so it loads the built-ins whatever
        # the deny and allow lists say (a `omni plugins disable cpu` included).
        if not record.builtin:
            _disable(record, "safe mode (OMNI_SAFE_MODE=1) loads built-in plugins only")
        return
    if name in settings.deny_plugins:
        _disable(
            record,
            "disabled by OMNI_DISABLE_PLUGINS or `omni plugins disable`",
            f"`omni plugins enable {shell_arg(record.name)}`",
        )
    elif settings.allow_plugins is not None and name not in settings.allow_plugins:
        if record.manifest is not None and record.manifest.of_kind(Kind.PLATFORM):
            # the hardware layer is exempt from OMNI_PLUGINS, so a broken one stays a problem
            if record.status is Status.OK:
                record.hardware_only = True
                record.notes.append("not in OMNI_PLUGINS: contributes its platforms and attention backends only")
        else:
            _disable(record, "not in OMNI_PLUGINS", f"add {shell_arg(record.name)} to OMNI_PLUGINS")


def extension_filtered(kind: Kind, name: str, settings: Settings) -> str | None:
    """Why a per-kind allow/deny list removes ``name``, or None when it stays."""
    key = name.casefold()
    if key in settings.deny_by_kind.get(kind, frozenset()):
        return f"removed by {kind.deny_env}"
    allow = settings.allow_by_kind.get(kind)
    if allow is not None and key not in allow:
        return f"not in {kind.allow_env}"
    return None
