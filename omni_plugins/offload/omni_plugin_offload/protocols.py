"""What a component implements to run model-level offload itself."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class OwnsModelCpuOffload(Protocol):
    """A component (a custom pipeline or model object) that moves its own weights.

    When any component of an :class:`~omni_core.offload.OffloadPlan` provides this method,
    ``model_cpu`` calls it with the compute device and installs no hooks of its own. If the
    component also has ``disable_omni_model_cpu_offload()``, ``disable()`` calls it.
    """

    def enable_omni_model_cpu_offload(self, device: Any) -> None: ...
