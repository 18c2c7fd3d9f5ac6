"""What both strategies share: reading and validating the plan, options, hook bookkeeping and
the enable/disable lifecycle (validate everything first, roll back on any failure)."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omni_core.offload import OffloadConfigError, Offloader, ResidencyEvent
from omni_plugin_offload.store import Unit, storable_problem, unit_tensors


def _is_module(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


@dataclass
class Layout:
    """A validated plan, resolved to modules and units. Building it changes nothing."""

    #: units the strategy moves in and out, in order
    units: list[Unit] = field(default_factory=list)
    #: (name, module) kept on the compute device throughout
    resident: list[tuple[str, Any]] = field(default_factory=list)
    #: anything strategy-specific
    extra: dict[str, Any] = field(default_factory=dict)


class HookingOffloader(Offloader, abc.ABC):
    """An offloader that parks units in host stores and swaps them from forward pre-hooks."""

    #: options every strategy accepts, with what they mean (listed in errors)
    common_options: ClassVar[dict[str, str]] = {
        "record": "bool: record a ResidencyEvent from every hook (tests, diagnostics)",
        "blocking": "bool: synchronous host<->device copies (platforms with blocking_offload_copies)",
        "pin_memory": "bool: pinned host stores (default: on for CUDA-like devices)",
    }
    extra_options: ClassVar[dict[str, str]] = {}
    #: on the CPU, materialise by copying (as on an accelerator) instead of viewing the host
    #: store; tests set it to run the accelerator's code path on the CPU
    copy_on_cpu: ClassVar[bool] = False

    def __init__(self, plan: Any, device: Any, options: dict[str, Any] | None = None) -> None:
        super().__init__(plan, device, options)
        self._handles: list[Any] = []
        self._units: list[Unit] = []
        self._resident_names: tuple[str, ...] = ()
        self._enabled = False
        self._device: Any = None

    # -- options and plan ---------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        return bool(self.options.get("record", False))

    def _torch_device(self) -> Any:
        import torch

        try:
            device = torch.device(self.device if self.device is not None else "cpu")
        except (RuntimeError, TypeError) as exc:
            raise OffloadConfigError(
                f"offload strategy {self.name!r}: bad compute device {self.device!r}: {exc}"
            ) from None
        if device.type == "meta":
            raise OffloadConfigError(f"offload strategy {self.name!r}: cannot compute on the meta device")
        return device

    def _check_options(self) -> None:
        known = {**self.common_options, **self.extra_options}
        unknown = sorted(set(self.options) - set(known))
        if unknown:
            listing = "; ".join(f"{k} ({v})" for k, v in known.items())
            raise OffloadConfigError(f"offload strategy {self.name!r}: unknown option(s) {unknown}; known: {listing}")
        for key in ("record", "blocking", "pin_memory"):
            if key in self.options and not isinstance(self.options[key], bool):
                raise OffloadConfigError(
                    f"offload strategy {self.name!r}: option {key!r} must be true or false, not {self.options[key]!r}"
                )

    def _component(self, name: str, group: str) -> Any:
        """The component called ``name``, or None for an absent optional component (declared but
        not loaded). An unknown name is an error naming it and the known ones."""
        components = self.plan.components
        if name not in components:
            known = ", ".join(sorted(components)) or "none"
            raise OffloadConfigError(
                f"offload plan lists {name!r} in {group}, but the model has no component {name!r} (components: {known})"
            )
        return components[name]

    def _modules(self, names: tuple[str, ...], group: str) -> list[tuple[str, Any]]:
        out = []
        for name in names:
            obj = self._component(name, group)
            if obj is not None and _is_module(obj):
                out.append((name, obj))
        return out

    def _check_groups_disjoint(self) -> None:
        groups = {
            "dit_modules": self.plan.dit_modules,
            "encoder_modules": self.plan.encoder_modules,
            "resident_modules": self.plan.resident_modules,
        }
        seen: dict[str, str] = {}
        for group, names in groups.items():
            for name in names:
                if name in seen and seen[name] != group:
                    raise OffloadConfigError(f"offload plan lists component {name!r} in both {seen[name]} and {group}")
                seen[name] = group

    def _block_lists(self) -> list[tuple[str, Any]]:
        """(dotted path, list of blocks) for each ``block_attrs`` entry, validated: each path
        resolves, under a ``dit_modules`` component, to a non-empty list of modules."""
        out = []
        for path in self.plan.block_attrs:
            head, *rest = path.split(".")
            if not head or not rest or not all(rest):
                raise OffloadConfigError(
                    f"offload plan block path {path!r} must be '<component>.<attribute>', "
                    "e.g. 'transformer.transformer_blocks'"
                )
            node = self._component(head, f"block_attrs (block path {path!r})")
            if head not in self.plan.dit_modules:
                raise OffloadConfigError(
                    f"offload plan block path {path!r} is not under a dit_modules component "
                    f"({', '.join(self.plan.dit_modules) or 'none'})"
                )
            if node is None:
                raise OffloadConfigError(f"offload plan block path {path!r}: component {head!r} is not loaded")
            walked = head
            for part in rest:
                if not hasattr(node, part):
                    raise OffloadConfigError(
                        f"offload plan block path {path!r} does not resolve: {walked} ({type(node).__name__}) "
                        f"has no attribute {part!r}"
                    )
                node = getattr(node, part)
                walked += f".{part}"
            import torch

            if not isinstance(node, (torch.nn.ModuleList, torch.nn.Sequential)):
                raise OffloadConfigError(
                    f"offload plan block path {path!r} is a {type(node).__name__}, not a ModuleList of blocks"
                )
            if len(node) == 0:
                raise OffloadConfigError(f"offload plan block path {path!r} is an empty {type(node).__name__}")
            out.append((path, node))
        return out

    @staticmethod
    def _assign(
        members: list[tuple[str, Any]],
        resident: list[Any],
        device: Any,
        skip_modules: set[int] | None = None,
        copy_on_cpu: bool = False,
    ) -> tuple[list[Unit], list[Any]]:
        """Units for ``members`` ((name, module) pairs) and the tensors that must stay resident.

        A tensor reachable from more than one unit, or from a unit and a resident module
        (``resident``, walked without entering ``skip_modules``), is tied: evicting it with one
        unit would empty it under the other, so it is kept out of every unit and stays on the
        device. Every other tensor must be storable (plain dense weights)."""
        per_unit = [(name, unit_tensors([module])) for name, module in members]
        count: dict[int, int] = {}
        for _, tensors in per_unit:
            for tensor in tensors:
                count[id(tensor)] = count.get(id(tensor), 0) + 1
        resident_ids = {id(t) for t in unit_tensors(resident, skip_modules=skip_modules)}
        tied_ids = {i for i, c in count.items() if c > 1} | (resident_ids & count.keys())
        units, tied, tied_seen = [], [], set()
        for name, tensors in per_unit:
            own = []
            for tensor in tensors:
                if id(tensor) in tied_ids:
                    if id(tensor) not in tied_seen and id(tensor) not in resident_ids:
                        tied_seen.add(id(tensor))
                        tied.append(tensor)
                    continue
                problem = storable_problem(tensor)
                if problem:
                    raise OffloadConfigError(f"cannot offload {name!r}: it holds {problem}")
                own.append(tensor)
            units.append(Unit(name, own, device, copy=True if copy_on_cpu else None))
        return units, tied

    @abc.abstractmethod
    def _layout(self) -> Layout:
        """Validate the plan and options and resolve them; must not change anything."""

    @abc.abstractmethod
    def _install(self, layout: Layout) -> None:
        """Park the units, move the resident parts, install the hooks. Record every hook handle
        in ``self._handles`` and every unit in ``self._units`` *as soon as* it is created, so a
        failure part-way is rolled back by :meth:`_teardown`."""

    # -- lifecycle ----------------------------------------------------------------------------

    def check(self) -> None:
        self._layout()

    def enable(self) -> None:
        if self._enabled:
            raise OffloadConfigError(f"offload strategy {self.name!r} is already enabled; call disable() first")
        layout = self._layout()  # every check runs here, before anything is touched
        try:
            self._install(layout)
        except BaseException:
            self._teardown()
            raise
        self._enabled = True

    def disable(self) -> None:
        if not self._enabled:
            return
        self._teardown()
        self._enabled = False

    def is_enabled(self) -> bool:
        return self._enabled

    def _teardown(self) -> None:
        """Remove every hook this offloader installed and give every unit its weights back."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._sync()
        units, self._units = self._units, []
        for unit in units:
            unit.restore()
        self._after_teardown()

    def _sync(self) -> None:
        """Wait for in-flight copies (strategies with a side stream override this)."""

    def _after_teardown(self) -> None:
        """Reset strategy state after the hooks are gone."""

    # -- hooks --------------------------------------------------------------------------------

    def _hook(self, module: Any, fn: Callable[[], None]) -> None:
        def pre_hook(_module: Any, _args: Any) -> None:
            fn()

        # prepend: weights must be in place before any other pre-hook (attention routing, ...) looks
        self._handles.append(module.register_forward_pre_hook(pre_hook, prepend=True))

    def _record(self, unit: str) -> None:
        if self.recording:
            self.events.append(ResidencyEvent(module=unit, resident=self.resident()))

    def resident(self) -> tuple[str, ...]:
        if not self._enabled and not self._handles:
            return tuple(name for name, obj in self.plan.components.items() if obj is not None and _is_module(obj))
        return self._resident_names + tuple(u.name for u in self._units if u.resident)
