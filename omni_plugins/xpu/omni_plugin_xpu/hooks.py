"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

Imported whenever omni loads plugins, so it imports nothing heavy (no torch, no Level Zero or
SYCL call). Everything registered here is declared, field by field, in ``omni_plugin.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import PlatformRegistrar


@hookimpl
def omni_register_platforms(registry: PlatformRegistrar) -> None:
    # Above the CPU (-100); the probe claims only an Intel GPU render node with an XPU build of torch.
    registry.register(
        "xpu",
        "omni_plugin_xpu.platform:XpuPlatform",
        probe="omni_plugin_xpu.platform:probe",
        priority=10,
    )
