"""Host-side weight stores: what an offloaded unit's weights become while it is evicted.

A :class:`Unit` is one thing an offloader moves as a whole: a pipeline component (``model_cpu``)
or one transformer block (``layerwise``). When it is parked, each of its parameters and buffers
is copied into a host store (one packed flat buffer per dtype, each tensor a view at an aligned
offset; pinned memory on CUDA-like devices) and then *evicted*: the tensor's ``.data`` becomes
``torch.empty(0)`` of its dtype on the compute device, so the module really holds no weights
but still reports its device and dtype. *Materialising* puts the weights back: on an
accelerator, one host-to-device copy per dtype into a fresh device buffer that the tensors
view; on the CPU (one memory) the tensors view the store itself, with no copy.

The Parameter and buffer objects are never replaced, only their ``.data``: tied weights, optimiser
references and anything else holding a parameter keep seeing the same object.

torch is imported inside the methods: this module is imported only when a strategy runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: byte alignment of each tensor inside a packed buffer (vectorised kernels want aligned rows)
ALIGN_BYTES = 256


@dataclass
class _Slot:
    tensor: Any  # the Parameter or buffer whose ``.data`` is swapped
    dtype: Any
    shape: tuple[int, ...]
    offset: int
    numel: int


def unit_tensors(modules: list[Any], skip_modules: set[int] | None = None) -> list[Any]:
    """The parameters and buffers of ``modules`` (recursively), each object once, in module order.
    Submodules whose ``id`` is in ``skip_modules`` (and everything under them) are left out."""
    skip = skip_modules or set()
    seen: set[int] = set()
    out = []
    stack = list(reversed(modules))
    visited: set[int] = set()
    while stack:
        module = stack.pop()
        if id(module) in skip or id(module) in visited:
            continue
        visited.add(id(module))
        for tensor in (*module._parameters.values(), *module._buffers.values()):
            if tensor is not None and id(tensor) not in seen:
                seen.add(id(tensor))
                out.append(tensor)
        stack.extend(reversed([m for m in module._modules.values() if m is not None]))
    return out


def same_device(actual: Any, wanted: Any) -> bool:
    """``actual`` is ``wanted``; an index-less ``wanted`` (``cuda``) matches any index."""
    return actual.type == wanted.type and (wanted.index is None or actual.index == wanted.index)


def storable_problem(tensor: Any) -> str | None:
    """Why ``tensor`` cannot be parked in a host store, or None."""
    import torch

    data = tensor.data
    if type(data) is not torch.Tensor:
        return f"a {type(data).__name__} tensor subclass (quantised weights cannot be packed)"
    if data.device.type == "meta":
        return "a tensor on the meta device (weights not loaded)"
    if data.is_sparse or data.layout is not torch.strided:
        return f"a {data.layout} tensor"
    return None


class Unit:
    """One unit of residency: a name, its tensors, and their host store once parked."""

    def __init__(self, name: str, tensors: list[Any], device: torch.device, *, copy: bool | None = None) -> None:
        self.name = name
        self.device = device
        self.tensors = tensors
        #: materialise by copying into fresh device buffers (default: everywhere but the CPU)
        self.copy = device.type != "cpu" if copy is None else copy
        #: the weights are where the modules use them (before parking, wherever they were)
        self.resident = True
        #: the host store exists and the tensors' ``.data`` are managed by this unit
        self.parked = False
        self._flats: dict[Any, torch.Tensor] = {}
        self._slots: list[_Slot] = []
        self._pending: Any = None  # a CUDA event while an asynchronous copy is in flight

    # -- the store --------------------------------------------------------------------------

    def park(self, *, pin_memory: bool = False) -> None:
        """Copy the weights into the packed host store and evict them from the modules."""
        import torch

        totals: dict[Any, int] = {}
        slots = []
        for tensor in self.tensors:
            data = tensor.data
            dtype, numel = data.dtype, data.numel()
            align = max(1, ALIGN_BYTES // data.element_size())
            offset = -(-totals.get(dtype, 0) // align) * align
            slots.append(_Slot(tensor, dtype, tuple(data.shape), offset, numel))
            totals[dtype] = offset + numel
        flats = {dtype: torch.empty(total, dtype=dtype, pin_memory=pin_memory) for dtype, total in totals.items()}
        for slot in slots:
            flats[slot.dtype][slot.offset : slot.offset + slot.numel].view(slot.shape).copy_(slot.tensor.data)
        self._flats, self._slots, self.parked = flats, slots, True
        self.evict()

    def _view(self, flat: torch.Tensor, slot: _Slot) -> torch.Tensor:
        return flat[slot.offset : slot.offset + slot.numel].view(slot.shape)

    def evict(self) -> None:
        """Leave every tensor of the unit empty (zero elements, same dtype, on the compute device)."""
        import torch

        for slot in self._slots:
            slot.tensor.data = torch.empty(0, dtype=slot.dtype, device=self.device)
        self._pending = None
        self.resident = False

    def materialise(self, *, stream: Any = None, main_stream: Any = None, non_blocking: bool = False) -> None:
        """Put the weights back on the compute device.

        CPU: the tensors view the store (one memory, nothing to copy). Elsewhere (or with
        ``copy``): one copy per dtype into a fresh device buffer the tensors view. With
        ``stream`` (CUDA-like devices) the copy runs on that side stream, and :meth:`wait`
        makes the main stream wait for it.
        """
        if self.resident:
            return
        if not self.copy:
            for slot in self._slots:
                slot.tensor.data = self._view(self._flats[slot.dtype], slot)
            self.resident = True
            return

        if stream is not None:
            streams = device_streams(self.device)
            with streams.stream(stream):
                device_flats = {d: f.to(self.device, non_blocking=True, copy=True) for d, f in self._flats.items()}
                event = streams.Event()
                event.record(stream)
            for flat in device_flats.values():
                # allocated on the side stream, used on the main one: the allocator must not
                # reuse this memory before the main stream is done with it
                flat.record_stream(main_stream)
            self._pending = event
        else:
            device_flats = {d: f.to(self.device, non_blocking=non_blocking, copy=True) for d, f in self._flats.items()}
        for slot in self._slots:
            slot.tensor.data = self._view(device_flats[slot.dtype], slot)
        self.resident = True

    def wait(self, main_stream: Any) -> None:
        """Make the main stream wait for this unit's in-flight copy, if any."""
        if self._pending is not None:
            main_stream.wait_event(self._pending)
            self._pending = None

    def restore(self) -> None:
        """Give every tensor its own copy of its weights on the compute device and drop the store."""
        if not self.parked:
            return
        if self._pending is not None:
            self._pending.synchronize()
            self._pending = None
        for slot in self._slots:
            slot.tensor.data = self._view(self._flats[slot.dtype], slot).to(self.device, copy=True)
        self._flats, self._slots = {}, []
        self.parked, self.resident = False, True


def device_streams(device: Any) -> Any | None:
    """The torch device module with streams for ``device`` (its ``Stream``, ``current_stream``,
    ``stream`` and ``Event``), or None where copies are synchronous (the CPU). Asked through
    torch's device-generic accessor, so no vendor module is named here."""
    import torch

    if device.type == "cpu":
        return None
    module = torch.get_device_module(device.type)
    return module if hasattr(module, "Stream") and hasattr(module, "current_stream") else None
