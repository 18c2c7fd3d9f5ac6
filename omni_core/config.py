"""Settings that steer plugin loading: environment variables plus the persistent user config.

Environment (each overrides the config file):

==============================  =============================================================
``OMNI_STRICT_PLUGINS=1``       every plugin problem is an error (for CI and plugin authors)
``OMNI_SAFE_MODE=1``            load only the built-in plugins, no third-party code
``OMNI_PLUGINS=a,b``            load only these plugins (platforms are exempt, see below)
``OMNI_DISABLE_PLUGINS=a,b``    never load these plugins
``OMNI_<KIND>S=x,y``            per-kind allow-list of extension names, e.g. ``OMNI_MODELS``
``OMNI_DISABLE_<KIND>S=x``      per-kind deny-list, e.g. ``OMNI_DISABLE_ATTENTION_BACKENDS``
``OMNI_PLATFORM=name``          force one platform instead of probing
``OMNI_CONFIG_DIR``             where ``config.toml`` lives (default ``~/.config/omni``)
``OMNI_CACHE_DIR``              where load health and import timings are kept
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


@dataclass
class UserConfig:
    """The persistent user config file; missing file means defaults."""

    path: Path
    disabled: list[str] = field(default_factory=list)
    pins: dict[str, dict[str, str]] = field(default_factory=dict)
    platform: str | None = None

    @classmethod
    def load(cls, path: Path) -> UserConfig:
        if not path.is_file():
            return cls(path=path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}. Fix the file or delete it to reset.") from None
        unknown = set(data) - {"platform", "plugins", "pins"}
        if unknown:
            raise ConfigError(
                f"{path}: unknown key(s) {sorted(unknown)}; the file holds platform, [plugins] disabled and [pins]"
            )
        plugins = data.get("plugins", {})
        disabled = plugins.get("disabled", []) if isinstance(plugins, dict) else None
        if not isinstance(disabled, list) or not all(isinstance(x, str) for x in disabled):
            raise ConfigError(f"{path}: [plugins] disabled must be a list of plugin names")
        pins: dict[str, dict[str, str]] = {}
        for kind_key, table in (data.get("pins") or {}).items():
            try:
                kind = Kind.parse(kind_key)
            except ValueError as exc:
                raise ConfigError(f"{path}: [pins.{kind_key}]: {exc}") from None
            if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
                raise ConfigError(f"{path}: [pins.{kind_key}] maps names to distribution names")
            pins[kind.value] = dict(table)
        platform = data.get("platform")
        if platform is not None and not isinstance(platform, str):
            raise ConfigError(f"{path}: platform must be a string")
        return cls(path=path, disabled=list(disabled), pins=pins, platform=platform)

    def save(self) -> None:
        import tomli_w  # only needed when writing

        data: dict[str, Any] = {}
        if self.platform:
            data["platform"] = self.platform
        data["plugins"] = {"disabled": sorted(set(self.disabled))}
        if self.pins:
            data["pins"] = {k: dict(sorted(v.items())) for k, v in sorted(self.pins.items()) if v}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(tomli_w.dumps(data), encoding="utf-8")
        tmp.replace(self.path)


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
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
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
            strict=env.get("OMNI_STRICT_PLUGINS", "").strip().lower() in _TRUE,
            safe_mode=env.get("OMNI_SAFE_MODE", "").strip().lower() in _TRUE,
            allow_plugins=allow_plugins,
            deny_plugins=frozenset(deny),
            allow_by_kind=allow_by_kind,
            deny_by_kind=deny_by_kind,
            pins=pins,
            platform=(env.get("OMNI_PLATFORM") or user.platform or None),
            config_path=path,
            cache_dir=cache_dir(env),
        )
