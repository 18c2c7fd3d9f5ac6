"""Settings that steer plugin loading: environment variables plus the persistent user config.

**One precedence, one reader.** Every setting with more than one source takes the first of:
explicit choices (command-line flags, a program's arguments: :class:`Overrides`) > a recipe
(engine settings only) > the environment > the config file > defaults. This module is the one
place that reads the environment (:meth:`Settings.from_env`, :meth:`EngineSettings.from_env`,
:func:`probe_timeout`, :func:`debugging`, :func:`config_dir`, :func:`cache_dir`); everything
else is handed the resulting objects. Nothing in omni writes ``os.environ``: the ``omni`` command hands its
``--strict`` / ``--safe-mode`` flags over with :func:`use_overrides`.

Environment (each overrides the config file):

==============================  =============================================================
``OMNI_STRICT_PLUGINS=1``       every plugin problem is an error (for CI and plugin authors)
``OMNI_SAFE_MODE=1``            load only the built-in plugins, no third-party code; the
                                built-ins load even if disabled, so this always recovers
``OMNI_PLUGINS=a,b``            load only these plugins (platforms are exempt, see below)
``OMNI_DISABLE_PLUGINS=a,b``    never load these plugins
``OMNI_<KIND>S=x,y``            per-kind allow-list of extension names, e.g. ``OMNI_MODELS``
``OMNI_DISABLE_<KIND>S=x``      per-kind deny-list, e.g. ``OMNI_DISABLE_ATTENTION_BACKENDS``
``OMNI_PLATFORM=name``          force one platform instead of probing (its probe still runs:
                                absent hardware is an error that quotes the probe)
``OMNI_ATTENTION_BACKEND=NAME``  attention backend for every role, below ``--attention-backend``
                                / ``Omni(attention_backend=)`` and a recipe's attention
``OMNI_CACHE_BACKEND=NAME``     cache backend of every image and video model, below
                                ``--cache-backend`` / ``Omni(cache=)`` and a recipe's cache
``OMNI_PROBE_TIMEOUT=5``        seconds each platform probe may take before it is recorded
                                as failed (default 5)
``OMNI_CONFIG_DIR``             where ``config.toml`` lives (default ``~/.config/omni``)
``OMNI_CACHE_DIR``              where load health and import timings are kept
``OMNI_DEBUG=1``                print the Python traceback of an internal error (for a bug
                                report); without it omni prints one line
==============================  =============================================================

``OMNI_PLUGINS`` narrows what extends omni but never removes the hardware: a plugin left out
by it that provides a platform still contributes its platforms and attention backends. Only
an explicit deny removes a platform.

The config file (written by ``omni plugins disable/enable/pin``)::

    platform = "cuda"                       # same as OMNI_PLATFORM
    [plugins]
    disabled = ["some-plugin"]
    [pins.attention_backend]                # who wins a name two plugins provide
    FLASH_ATTN = "omni-plugin-rocm"
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_core.errors import ConfigError
from omni_core.kinds import Kind

_TRUE = {"1", "true", "yes", "on"}
CONFIG_FILENAME = "config.toml"


def normalize_dist(name: str) -> str:
    """PEP 503 normalisation, so ``Omni_Plugin.CPU`` and ``omni-plugin-cpu`` compare equal."""
    return "-".join(name.replace("_", "-").replace(".", "-").lower().split("-"))


def _names(value: str | None) -> frozenset[str]:
    if not value:
        return frozenset()
    return frozenset(p.strip().casefold() for p in value.split(",") if p.strip())


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("OMNI_CONFIG_DIR"):
        return Path(env["OMNI_CONFIG_DIR"])
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "omni"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("OMNI_CACHE_DIR"):
        return Path(env["OMNI_CACHE_DIR"])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "omni"


#: how every config-file error ends: the file holds only choices the plugin commands made
CONFIG_FIX = "Fix it, or delete it to reset (it only holds choices made with `omni plugins disable/enable/pin`)"


def _invalid(path: Path, problem: str) -> ConfigError:
    return ConfigError(f"config file {path} is invalid: {problem}. {CONFIG_FIX}.")


def _lock_path(path: Path) -> Path:
    # beside the file, not the file itself: the atomic rename gives the file a new inode
    return path.with_name(f".{path.name}.lock")


@dataclass
class UserConfig:
    """The persistent user config file; missing file means defaults.

    :meth:`save` is a read-modify-write under a lock: it re-reads the file and applies only
    what changed since :meth:`load`, so concurrent ``omni plugins disable A`` and
    ``enable B`` both land. Any bad content or shape raises :class:`ConfigError`.
    """

    path: Path
    disabled: list[str] = field(default_factory=list)
    pins: dict[str, dict[str, str]] = field(default_factory=dict)
    platform: str | None = None
    #: what :meth:`load` read, so :meth:`save` writes only this process's changes
    _base: UserConfig | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def load(cls, path: Path) -> UserConfig:
        config = cls._read(path)
        config._base = cls(path, list(config.disabled), _copy_pins(config.pins), config.platform)
        return config

    @classmethod
    def _read(cls, path: Path) -> UserConfig:
        if not path.exists():
            return cls(path=path)
        if not path.is_file():
            raise _invalid(path, "it is not a file")
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"cannot read config file {path}: {exc.strerror or exc}. Make it readable, or delete it to reset."
            ) from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _invalid(path, f"not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise _invalid(path, f"not valid TOML ({exc})") from None
        unknown = set(data) - {"platform", "plugins", "pins"}
        if unknown:
            raise _invalid(path, f"unknown key(s) {sorted(unknown)}; the file holds platform, [plugins] and [pins]")
        plugins = data.get("plugins", {})
        if not isinstance(plugins, dict):
            raise _invalid(path, "plugins must be a table ([plugins] with disabled = [...])")
        if set(plugins) - {"disabled"}:
            raise _invalid(
                path, f"unknown key(s) {sorted(set(plugins) - {'disabled'})} in [plugins]; it holds disabled"
            )
        disabled = plugins.get("disabled", [])
        if not isinstance(disabled, list) or not all(isinstance(x, str) for x in disabled):
            raise _invalid(path, "[plugins] disabled must be a list of plugin names")
        raw_pins = data.get("pins", {})
        if not isinstance(raw_pins, dict):
            raise _invalid(path, "pins must be a table of [pins.<kind>] tables")
        pins: dict[str, dict[str, str]] = {}
        for kind_key, table in raw_pins.items():
            try:
                kind = Kind.parse(kind_key)
            except ValueError as exc:
                raise _invalid(path, f"[pins.{kind_key}]: {exc}") from None
            if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
                raise _invalid(path, f"[pins.{kind_key}] must map names to distribution names (strings)")
            pins[kind.value] = dict(table)
        platform = data.get("platform")
        if platform is not None and not isinstance(platform, str):
            raise _invalid(path, 'platform must be a string (a platform name, e.g. "cpu")')
        return cls(path=path, disabled=list(disabled), pins=pins, platform=platform or None)

    def save(self) -> None:
        """Write the changes made since :meth:`load` onto the file as it is now, atomically and
        under a lock. Raises :class:`ConfigError` if the file turned bad meanwhile, and
        :class:`~omni_core.fsutil.FileWriteError` if it cannot be written."""
        import tomli_w  # only needed when writing

        from omni_core.fsutil import FileWriteError, atomic_write_text, describe_os_error, file_lock

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FileWriteError(describe_os_error(exc, self.path)) from None
        with file_lock(_lock_path(self.path)):
            merged = self._merged_onto(self._read(self.path)) if self._base is not None else self
            data: dict[str, Any] = {}
            if merged.platform:
                data["platform"] = merged.platform
            data["plugins"] = {"disabled": sorted(set(merged.disabled))}
            pins = {k: dict(sorted(v.items())) for k, v in sorted(merged.pins.items()) if v}
            if pins:
                data["pins"] = pins
            atomic_write_text(self.path, tomli_w.dumps(data))
        self.disabled, self.pins, self.platform = list(merged.disabled), _copy_pins(merged.pins), merged.platform
        self._base = UserConfig(self.path, list(self.disabled), _copy_pins(self.pins), self.platform)

    def _merged_onto(self, current: UserConfig) -> UserConfig:
        """``current`` (the file now) plus what this object changed since it was loaded."""
        base = self._base
        assert base is not None
        mine = {d.casefold() for d in self.disabled}
        before = {d.casefold() for d in base.disabled}
        removed, added = before - mine, [d for d in self.disabled if d.casefold() not in before]
        disabled = [d for d in current.disabled if d.casefold() not in removed]
        have = {d.casefold() for d in disabled}
        disabled += [d for d in added if d.casefold() not in have]
        pins = _copy_pins(current.pins)
        for kind in set(base.pins) | set(self.pins):
            old, new = base.pins.get(kind, {}), self.pins.get(kind, {})
            table = pins.setdefault(kind, {})
            for name in [n for n in old if n not in new] + [n for n, v in new.items() if old.get(n) != v]:
                for key in [k for k in table if k.casefold() == name.casefold()]:
                    del table[key]  # names are case-insensitive
                if name in new:
                    table[name] = new[name]
        platform = self.platform if self.platform != base.platform else current.platform
        return UserConfig(self.path, disabled, {k: v for k, v in pins.items() if v}, platform)


def _copy_pins(pins: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    return {k: dict(v) for k, v in pins.items()}


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in _TRUE


def server_api_key(environ: Mapping[str, str] | None = None) -> str | None:
    """``OMNI_API_KEY``: the key ``omni serve`` requires when ``--api-key`` is not given (an
    environment variable keeps the key out of the process list)."""
    env = os.environ if environ is None else environ
    return (env.get("OMNI_API_KEY") or "").strip() or None


def debugging(environ: Mapping[str, str] | None = None) -> bool:
    """``OMNI_DEBUG=1``: print the traceback of an error. Read when an error is shown, not
    through :class:`Settings`: the error being shown may be that settings could not be read."""
    env = os.environ if environ is None else environ
    return _flag(env.get("OMNI_DEBUG"))


#: how long a platform probe may take before it is recorded as failed (``OMNI_PROBE_TIMEOUT``)
DEFAULT_PROBE_TIMEOUT_S = 5.0


def probe_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds each platform probe may take: ``OMNI_PROBE_TIMEOUT``, default 5."""
    import math

    env = os.environ if environ is None else environ
    raw = env.get("OMNI_PROBE_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_PROBE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            f"OMNI_PROBE_TIMEOUT={raw!r} is not a number of seconds above 0; set it to e.g. 5, or unset it"
        )
    return value


@dataclass(frozen=True)
class Overrides:
    """Explicit choices, the top of the precedence: they beat the environment and the config
    file. The ``omni`` command's ``--strict`` / ``--safe-mode`` flags, or a program's own
    arguments. ``None``: not given, the environment decides."""

    strict: bool | None = None
    safe_mode: bool | None = None
    platform: str | None = None


_OVERRIDES = Overrides()


def use_overrides(overrides: Overrides) -> None:
    """Apply ``overrides`` to every :func:`current_settings` of this process. The ``omni``
    command calls it once with its flags, instead of writing them into ``os.environ`` (where
    every child process would inherit them, and a reader of the environment would take a flag
    for the user's environment)."""
    global _OVERRIDES
    _OVERRIDES = overrides


def current_settings() -> Settings:
    """This process's settings: the environment and config file under the process's
    :class:`Overrides` (:func:`use_overrides`). Read afresh each call, so a config file changed
    by ``omni plugins disable`` in this process counts."""
    return Settings.from_env(overrides=_OVERRIDES)


@dataclass(frozen=True)
class EngineSettings:
    """The environment's layer of how a model runs. Explicit arguments and the recipe come first
    (:meth:`omni_core.generation.model.EngineOptions.build`), the platform's defaults last."""

    #: ``OMNI_ATTENTION_BACKEND``: the attention backend of every role none of the above chose
    attention_backend: str | None = None
    #: ``OMNI_CACHE_BACKEND``: the cache backend of every image and video model none of the above chose
    cache_backend: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EngineSettings:
        env = os.environ if environ is None else environ
        return cls(
            attention_backend=(env.get("OMNI_ATTENTION_BACKEND") or "").strip() or None,
            cache_backend=(env.get("OMNI_CACHE_BACKEND") or "").strip() or None,
        )


@dataclass(frozen=True)
class Settings:
    """Everything that decides which plugins load and who wins a name."""

    strict: bool = False
    safe_mode: bool = False
    allow_plugins: frozenset[str] | None = None
    deny_plugins: frozenset[str] = frozenset()
    allow_by_kind: Mapping[Kind, frozenset[str]] = field(default_factory=dict)
    deny_by_kind: Mapping[Kind, frozenset[str]] = field(default_factory=dict)
    #: (kind, casefolded name) -> normalised distribution name that wins that name
    pins: Mapping[tuple[Kind, str], str] = field(default_factory=dict)
    platform: str | None = None
    config_path: Path = field(default_factory=lambda: config_dir() / CONFIG_FILENAME)
    cache_dir: Path = field(default_factory=cache_dir)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, overrides: Overrides | None = None) -> Settings:
        """Settings from ``environ`` (default: this process's) and the config file it points at,
        under ``overrides`` (explicit choices beat both)."""
        env = os.environ if environ is None else environ
        given = overrides if overrides is not None else Overrides()
        path = config_dir(env) / CONFIG_FILENAME
        user = UserConfig.load(path)
        allow_plugins = _names(env.get("OMNI_PLUGINS")) or None
        deny = _names(env.get("OMNI_DISABLE_PLUGINS")) | {d.casefold() for d in user.disabled}
        allow_by_kind = {k: _names(env.get(k.allow_env)) for k in Kind if env.get(k.allow_env)}
        deny_by_kind = {k: _names(env.get(k.deny_env)) for k in Kind if env.get(k.deny_env)}
        pins = {
            (Kind.parse(kind), name.casefold()): normalize_dist(dist)
            for kind, table in user.pins.items()
            for name, dist in table.items()
        }
        return cls(
            strict=given.strict if given.strict is not None else _flag(env.get("OMNI_STRICT_PLUGINS")),
            safe_mode=given.safe_mode if given.safe_mode is not None else _flag(env.get("OMNI_SAFE_MODE")),
            allow_plugins=allow_plugins,
            deny_plugins=frozenset(deny),
            allow_by_kind=allow_by_kind,
            deny_by_kind=deny_by_kind,
            pins=pins,
            platform=(given.platform or env.get("OMNI_PLATFORM") or user.platform or None),
            config_path=path,
            cache_dir=cache_dir(env),
        )
