"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

Imported whenever omni loads plugins, so it imports nothing heavy (no torch, no amdsmi, no
aiter). Everything registered here is declared, field by field, in ``omni_plugin.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import AttentionBackendRegistrar, PlatformRegistrar


@hookimpl
def omni_register_platforms(registry: PlatformRegistrar) -> None:
    # Above the CPU (-100). The probe claims only an AMD GPU seen through /dev/kfd with a ROCm
    # build of torch, so it never claims the machines the CUDA platform claims.
    registry.register(
        "rocm",
        "omni_plugin_rocm.platform:RocmPlatform",
        probe="omni_plugin_rocm.platform:probe",
        priority=10,
    )


@hookimpl
def omni_register_attention_backends(registry: AttentionBackendRegistrar) -> None:
    # ROCm torch reports its GPUs as device type "cuda". The rocm platform serves the shared
    # name FLASH_ATTN with this backend (RocmPlatform.attention_aliases).
    registry.register(
        "ROCM_AITER_FA",
        "omni_plugin_rocm.attention:RocmAiterFlashAttentionBackend",
        device_types=("cuda",),
    )
