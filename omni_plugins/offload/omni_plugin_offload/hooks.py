"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

This module is imported whenever omni loads plugins, so it imports nothing heavy (no torch,
not even the strategy modules). Everything registered here is declared, with the same
fields, in ``omni_plugin.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import OffloaderRegistrar


@hookimpl
def omni_register_offloaders(registry: OffloaderRegistrar) -> None:
    registry.register(
        "model_cpu",
        "omni_plugin_offload.model_cpu:ModelCpuOffloader",
        incompatible_with=("layerwise",),
    )
    registry.register(
        "layerwise",
        "omni_plugin_offload.layerwise:LayerwiseOffloader",
        incompatible_with=("model_cpu",),
    )
