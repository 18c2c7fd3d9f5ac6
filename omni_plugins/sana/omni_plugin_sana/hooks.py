"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

This module is imported whenever omni loads plugins, so it imports nothing heavy (no torch,
no diffusers, not even :mod:`omni_plugin_sana.family`). Everything registered here is
declared, with the same fields, in ``omni_plugin.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import ModelRegistrar


@hookimpl
def omni_register_models(registry: ModelRegistrar) -> None:
    registry.register(
        "sana",
        "omni_plugin_sana.family:Sana",
        architectures=("SanaPipeline",),
        tasks=("text-to-image",),
    )
