"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

Imported whenever omni loads plugins, so it imports nothing heavy (no torch, no diffusers,
not :mod:`omni_plugin_ltx_video.family`). Everything registered here is declared, with the
same fields, in ``omni_plugin.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import ModelRegistrar


@hookimpl
def omni_register_models(registry: ModelRegistrar) -> None:
    registry.register(
        "ltx-video",
        "omni_plugin_ltx_video.family:LTXVideo",
        architectures=("LTXPipeline",),
        tasks=("text-to-video",),
    )
