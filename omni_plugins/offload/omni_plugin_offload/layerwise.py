"""``layerwise``: a window of transformer blocks on the device, the next block prefetched.

The blocks are the entries of the plan's ``block_attrs`` lists (dotted paths such as
``transformer.transformer_blocks``; several lists are walked in order as one sequence
``B0 .. Bn-1``). Everything else stays on the device: the denoiser's non-block parameters
(embeddings, norms, projections), the encoders and the VAE. With ``window = 1``::

    B0 runs    device: B0 B1       host: B2 .. Bn-1
    B1 runs    device: B1 B2       host: B0 B3 .. Bn-1      (B0 evicted, B2 prefetched)
    ...
    Bn-1 runs  device: Bn-1 B0     host: B1 .. Bn-2         (the next step starts at B0)

In general, when block ``i`` runs, blocks ``i .. i+window-1`` are resident and block
``i+window`` is being prefetched (indices wrap around). A forward pre-hook on each block
evicts what left the window, loads block ``i`` if it is not there yet (a block called out of
order is loaded synchronously), and starts the prefetch.

On CUDA-like devices the prefetch runs on a side stream from pinned host memory and the main
stream waits for it only when the block is about to run. Elsewhere (the CPU, and platforms
that ask for blocking copies) every copy is synchronous.
"""

from __future__ import annotations

from typing import Any, ClassVar

from omni_core.offload import OffloadConfigError
from omni_plugin_offload.base import HookingOffloader, Layout, _is_module
from omni_plugin_offload.store import device_streams

DIT = "dit_modules"


class LayerwiseOffloader(HookingOffloader):
    """Transformer blocks stream through the device in a window; the rest stays resident."""

    extra_options: ClassVar[dict[str, str]] = {
        "window": "int >= 1: blocks resident from the running one on (default 1); the next one is prefetched",
    }

    def __init__(self, plan: Any, device: Any, options: dict[str, Any] | None = None) -> None:
        super().__init__(plan, device, options)
        self._window = 1
        self._stream: Any = None
        self._non_blocking = False

    def _window_option(self) -> int:
        window = self.options.get("window", 1)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise OffloadConfigError(f"offload strategy 'layerwise': window must be an integer >= 1, not {window!r}")
        return window

    def _layout(self) -> Layout:
        self._check_options()
        window = self._window_option()
        device = self._torch_device()
        self._check_groups_disjoint()
        dit = self._modules(self.plan.dit_modules, DIT)
        encoders = self._modules(self.plan.encoder_modules, "encoder_modules")
        resident = self._modules(self.plan.resident_modules, "resident_modules")
        if not self.plan.block_attrs:
            raise OffloadConfigError(
                "offload strategy 'layerwise' needs the model's transformer block lists, and its plan declares "
                "none (block_attrs); use model_cpu for this model"
            )
        blocks: list[tuple[str, Any]] = []
        where: dict[int, str] = {}
        for path, block_list in self._block_lists():
            for index, block in enumerate(block_list):
                name = f"{path}.{index}"
                if id(block) in where:
                    raise OffloadConfigError(f"offload plan lists block {name!r} twice (also as {where[id(block)]!r})")
                where[id(block)] = name
                blocks.append((name, block))
        declared = {*self.plan.dit_modules, *self.plan.encoder_modules, *self.plan.resident_modules}
        others = [
            (name, obj)
            for name, obj in self.plan.components.items()
            if name not in declared and obj is not None and _is_module(obj)
        ]
        stays = dit + encoders + resident + others
        inside_blocks = {id(m) for _, block in blocks for m in block.modules()}
        units, tied = self._assign(
            blocks, [m for _, m in stays], device, skip_modules=inside_blocks, copy_on_cpu=self.copy_on_cpu
        )
        return Layout(
            units=units,
            resident=stays,
            extra={"device": device, "window": window, "blocks": [b for _, b in blocks], "tied": tied},
        )

    def _install(self, layout: Layout) -> None:

        device = layout.extra["device"]
        self._device, self._window = device, layout.extra["window"]
        blocking = bool(self.options.get("blocking", False))
        streams = device_streams(device)  # None on the CPU: copies there are synchronous
        pin = streams is not None and bool(self.options.get("pin_memory", True))
        self._non_blocking = pin and not blocking
        if streams is not None and not blocking:
            self._stream = streams.Stream(device=device)
        for unit in layout.units:
            self._units.append(unit)
            unit.park(pin_memory=pin)
        for tensor in layout.extra["tied"]:
            tensor.data = tensor.data.to(device)
        for _, module in layout.resident:  # parked blocks are empty on the device already
            module.to(device)
        self._resident_names = tuple(name for name, _ in layout.resident)
        self._advance(0, record=False)  # the first step starts at block 0: load its window now
        for index, block in enumerate(layout.extra["blocks"]):
            self._hook(block, self._block_hook(index))

    def _block_hook(self, index: int) -> Any:
        return lambda: self._advance(index)

    def _advance(self, index: int, record: bool = True) -> None:
        """Block ``index`` is about to run: evict what left the window, make it resident, prefetch."""
        units = self._units
        count = len(units)
        targets = list(dict.fromkeys((index + k) % count for k in range(self._window + 1)))
        keep = set(targets)
        for position, unit in enumerate(units):
            if position not in keep and unit.resident:
                unit.evict()
        main = None
        if self._stream is not None:
            main = device_streams(self._device).current_stream(self._device)
        current = units[index]
        current.materialise(non_blocking=self._non_blocking)  # a miss (out of order) loads it here
        for position in targets[1:]:
            units[position].materialise(stream=self._stream, main_stream=main, non_blocking=self._non_blocking)
        if main is not None:
            current.wait(main)
        if record:
            self._record(current.name)

    def _sync(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def _after_teardown(self) -> None:
        self._stream, self._resident_names = None, ()
