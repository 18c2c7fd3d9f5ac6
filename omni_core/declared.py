"""Hooks for a plugin whose registrations are static: its manifest says it all (plugin API 1.1).

The plugin's hook module is one line::

    from omni_core.declared import *  # noqa: F403  (registers what omni_plugin.toml declares)

and ``omni_plugin.toml`` (in the same top-level package, where the core finds it) declares
every extension once, with all its fields. Each ``omni_register_*`` hook below registers
exactly the entries of its kind that the plugin's manifest declares: the core hands each
registrar the plugin's own declared entries, so one set of functions serves every plugin.
The class attributes those entries imply (``name``, ``stage_keys``, ``device_types``, ...) are
set on the classes by the core (:mod:`omni_core.identity`); the classes do not repeat them.

A plugin that decides at load time what to register (from the environment, a scan of its
package, a loop) keeps hand-written hooks instead; the core then checks that what they
register equals the manifest, field by field, as in plugin API 1.0.

This module needs plugin API 1.1: declare ``omni_api = ">=1.1,<2"``, so that an older core
reports the plugin ``incompatible`` (with the fix) instead of failing to import it.
"""

from __future__ import annotations

from typing import Any

from omni_core.hookspecs import hookimpl

__all__ = [
    "omni_register_attention_backends",
    "omni_register_cache_backends",
    "omni_register_commands",
    "omni_register_connectors",
    "omni_register_executors",
    "omni_register_models",
    "omni_register_offloaders",
    "omni_register_platforms",
    "omni_register_stage_engines",
    "omni_register_tts_adapters",
]

#: marks a hook implementation as this module's, so the core can tell a declared-style plugin
DECLARED_MARK = "__omni_declared__"


def _declared(function: Any) -> Any:
    setattr(function, DECLARED_MARK, True)
    return hookimpl(function)


@_declared
def omni_register_platforms(registry: Any) -> None:
    registry.register_declared()


@_declared
def omni_register_attention_backends(registry: Any) -> None:
    registry.register_declared()


@_declared
def omni_register_models(registry: Any) -> None:
    registry.register_declared()


@_declared
def omni_register_tts_adapters(registry: Any) -> None:
    registry.register_declared()


@_declared
def omni_register_connectors(registry: Any) -> None:
    registry.register_declared()


@_declared
def omni_register_offloaders(registry: Any) -> None:
    registry.register_declared()


@_declared
def omni_register_executors(registry: Any) -> None:
    registry.register_declared()


@_declared
def omni_register_stage_engines(registry: Any) -> None:
    registry.register_declared()


@_declared
def omni_register_cache_backends(registry: Any) -> None:
    registry.register_declared()


@_declared
def omni_register_commands(registry: Any) -> None:
    registry.register_declared()
