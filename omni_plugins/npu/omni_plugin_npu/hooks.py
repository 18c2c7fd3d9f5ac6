"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

Imported whenever omni loads plugins, so it imports nothing heavy (no torch, no torch_npu, no
CANN call). Everything registered here is declared, field by field, in ``omni_plugin.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import AttentionBackendRegistrar, PlatformRegistrar


@hookimpl
def omni_register_platforms(registry: PlatformRegistrar) -> None:
    # Above the CPU (-100); the probe claims only when /dev/davinci<N> exists and torch_npu is installed.
    registry.register(
        "npu",
        "omni_plugin_npu.platform:NpuPlatform",
        probe="omni_plugin_npu.platform:probe",
        priority=10,
    )


@hookimpl
def omni_register_attention_backends(registry: AttentionBackendRegistrar) -> None:
    # The npu platform serves the shared name FLASH_ATTN with this backend (NpuPlatform.attention_aliases).
    registry.register(
        "NPU_FUSED_ATTN",
        "omni_plugin_npu.attention:NpuFusedAttentionBackend",
        device_types=("npu",),
    )
