"""``model_cpu``: model-level CPU offload. The denoiser group and the encoder group take turns.

Residency over one generation (``T`` = the plan's ``dit_modules``, ``E`` = its
``encoder_modules``, ``V`` = its ``resident_modules``)::

    enable()            host: T E      device: V
    text encoders run   host: T        device: V E
    denoising steps     host: E        device: V T      (every step: T already resident)
    VAE decode          host: E        device: V T
    next prompt         host: T        device: V E

A forward pre-hook on each component (and on its direct children, for pipelines that call a
component through a method other than ``forward``) makes that component's group resident and
evicts the other group first, so at most one group plus the resident modules is on the
device. Module components the plan does not name stay resident.

If a component provides ``enable_omni_model_cpu_offload(device)``
(:class:`~omni_plugin_offload.protocols.OwnsModelCpuOffload`), the model moves its own weights:
this strategy calls it and installs nothing.
"""

from __future__ import annotations

from typing import Any

from omni_core.offload import OffloadConfigError
from omni_plugin_offload.base import HookingOffloader, Layout, _is_module
from omni_plugin_offload.protocols import OwnsModelCpuOffload
from omni_plugin_offload.store import device_streams, same_device

DIT, ENCODERS = "dit_modules", "encoder_modules"


class ModelCpuOffloader(HookingOffloader):
    """The denoisers and the encoders take turns on the compute device; the VAE stays."""

    def __init__(self, plan: Any, device: Any, options: dict[str, Any] | None = None) -> None:
        super().__init__(plan, device, options)
        self._group_of: dict[str, str] = {}
        self._active: str | None = None
        self._owners: list[tuple[str, Any]] = []
        self._pin = False

    def _layout(self) -> Layout:
        self._check_options()
        device = self._torch_device()
        self._check_groups_disjoint()
        dit = self._modules(self.plan.dit_modules, DIT)
        encoders = self._modules(self.plan.encoder_modules, ENCODERS)
        resident = self._modules(self.plan.resident_modules, "resident_modules")
        self._block_lists()  # a plan is valid or not, whichever strategy reads it
        owners = [
            (name, obj)
            for name, obj in self.plan.components.items()
            if obj is not None and isinstance(obj, OwnsModelCpuOffload)
        ]
        if owners:
            return Layout(extra={"device": device, "owners": owners})
        declared = {*self.plan.dit_modules, *self.plan.encoder_modules, *self.plan.resident_modules}
        others = [
            (name, obj)
            for name, obj in self.plan.components.items()
            if name not in declared and obj is not None and _is_module(obj)
        ]
        members, modules, group_of = [], {}, {}
        for group, pairs in ((DIT, dit), (ENCODERS, encoders)):
            for name, module in pairs:
                members.append((name, module))
                modules[name], group_of[name] = module, group
        if not members:
            raise OffloadConfigError(
                "offload strategy 'model_cpu': the plan names no loaded denoiser (dit_modules) or encoder "
                "(encoder_modules) to offload"
            )
        units, tied = self._assign(members, [m for _, m in resident + others], device, copy_on_cpu=self.copy_on_cpu)
        return Layout(
            units=units,
            resident=resident + others,
            extra={"device": device, "modules": modules, "group_of": group_of, "tied": tied},
        )

    def _install(self, layout: Layout) -> None:
        device = layout.extra["device"]
        self._device = device
        for name, owner in layout.extra.get("owners", ()):
            owner.enable_omni_model_cpu_offload(device)
            self._owners.append((name, owner))
        if self._owners:
            return
        for _, module in layout.resident:
            module.to(device)
        for tensor in layout.extra["tied"]:
            tensor.data = tensor.data.to(device)
        self._resident_names = tuple(name for name, _ in layout.resident)
        self._pin = device_streams(device) is not None and bool(self.options.get("pin_memory", True))
        for unit in layout.units:
            self._units.append(unit)
            unit.park(pin_memory=self._pin)
        self._group_of = dict(layout.extra["group_of"])
        for unit in layout.units:
            module = layout.extra["modules"][unit.name]
            group = self._group_of[unit.name]
            self._hook(module, self._turn_hook(group, unit.name, root=True))
            for child in module.children():
                self._hook(child, self._turn_hook(group, unit.name, root=False))

    def _turn_hook(self, group: str, unit: str, *, root: bool) -> Any:
        return lambda: self._turn(group, unit, root)

    def _turn(self, group: str, unit: str, root: bool) -> None:
        swapped = self._active != group
        if swapped:
            for other in self._units:  # evict first: the device never holds both groups
                if self._group_of[other.name] != group and other.resident:
                    other.evict()
            blocking = bool(self.options.get("blocking", False))
            for member in self._units:
                if self._group_of[member.name] == group:
                    member.materialise(non_blocking=self._pin and not blocking)
            self._active = group
        if root or swapped:
            self._record(unit)

    def _after_teardown(self) -> None:
        owners, self._owners = self._owners, []
        for _, owner in owners:
            disable = getattr(owner, "disable_omni_model_cpu_offload", None)
            if callable(disable):
                disable()
        self._active, self._group_of, self._resident_names = None, {}, ()

    def resident(self) -> tuple[str, ...]:
        if self._owners:  # the model moves its own weights: look where they are
            return tuple(
                name
                for name, obj in self.plan.components.items()
                if obj is not None and _is_module(obj) and _on_device(obj, self._device)
            )
        return super().resident()


def _on_device(module: Any, device: Any) -> bool:
    tensors = list(module.parameters())
    return bool(tensors) and all(t.numel() > 0 and same_device(t.device, device) for t in tensors)
