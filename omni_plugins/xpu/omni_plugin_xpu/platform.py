"""The ``xpu`` platform: Intel GPUs (Arc, Data Center GPU Max, Battlemage B60) through ``torch.xpu``.

The probe reads files only: the PCI vendor of each DRM render node in sysfs, and the installed
torch's ``version.py`` (or its XPU runtime library), found without importing torch. It imports
neither torch nor intel_extension_for_pytorch and initialises no Level Zero driver, so it is
safe in every process, forked workers included.

Intel's allocator cannot evict memory while an asynchronous device-to-host copy is in flight,
so this platform asks for **blocking** offload copies (``blocking_offload_copies``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from omni_core.platforms import MemoryInfo, Platform, ProbeResult
from omni_core.platforms.probing import torch_build_info, torch_package_dir

#: one ``renderD<N>`` entry per GPU render node, with its PCI device under ``device/``
DRM_DIR = Path("/sys/class/drm")
INTEL_VENDOR_ID = "0x8086"
VISIBLE_ENV = "ZE_AFFINITY_MASK"


def intel_render_nodes() -> list[str]:
    """The DRM render nodes whose PCI vendor is Intel (``0x8086``)."""
    nodes = []
    for node in sorted(DRM_DIR.glob("renderD*")):
        vendor = node / "device" / "vendor"
        if not vendor.is_file():
            continue  # a virtual render node (vgem, virtio without PCI): no vendor, not an Intel GPU
        if vendor.read_text(encoding="ascii", errors="replace").strip().lower() == INTEL_VENDOR_ID:
            nodes.append(node.name)
    return nodes


def torch_xpu_build(torch_dir: Path) -> str | None:
    """How the torch at ``torch_dir`` shows it was built with XPU support, or None if it was not:
    ``version.py``'s ``xpu`` (the SYCL toolchain version), else the XPU runtime library."""
    xpu = torch_build_info(torch_dir).get("xpu")
    if xpu:
        return f"xpu = {xpu}"
    libraries = sorted((torch_dir / "lib").glob("libtorch_xpu*"))
    return libraries[0].name if libraries else None


def probe() -> ProbeResult:
    """Claims the machine when an Intel GPU render node exists and torch was built with XPU."""
    nodes = intel_render_nodes()
    if not nodes:
        return ProbeResult(False, f"no Intel GPU: no {DRM_DIR}/renderD*/device/vendor reads {INTEL_VENDOR_ID}")
    gpus = f"{len(nodes)} Intel GPU render node(s) ({', '.join(nodes)})"
    torch_dir = torch_package_dir()
    if torch_dir is None:
        return ProbeResult(False, f"{gpus} found, but torch is not installed; install the XPU build of torch")
    build = torch_xpu_build(torch_dir)
    version = torch_build_info(torch_dir).get("__version__", "?")
    if build is None:
        return ProbeResult(
            False,
            f"{gpus} found, but torch {version} at {torch_dir} was built without XPU "
            "(version.py has xpu = None and there is no libtorch_xpu); install the XPU build of torch",
        )
    return ProbeResult(True, f"{gpus}; torch {version} built with XPU ({build})")


class XpuPlatform(Platform):
    """Intel GPUs. Constructing it is cheap; every method imports torch when it runs."""

    device_type: ClassVar[str] = "xpu"
    visible_devices_env: ClassVar[str | None] = VISIBLE_ENV
    supports_offload: ClassVar[bool] = True
    #: the XPU allocator cannot evict during an async device-to-host copy: copies must block
    blocking_offload_copies: ClassVar[bool] = True

    @staticmethod
    def _torch() -> Any:
        import torch

        is_compiled = getattr(torch.xpu, "_is_compiled", None)
        if is_compiled is not None and not is_compiled():
            raise RuntimeError(
                f"the xpu platform needs the XPU build of torch, but torch {torch.__version__} was built without "
                "XPU support; install the XPU build or choose another platform with OMNI_PLATFORM"
            )
        return torch

    def device_count(self) -> int:
        return int(self._torch().xpu.device_count())

    def device_name(self, index: int = 0) -> str:
        return str(self._torch().xpu.get_device_name(index))

    def memory_info(self, index: int = 0) -> MemoryInfo:
        free, total = self._torch().xpu.mem_get_info(index)
        return MemoryInfo(free_bytes=int(free), total_bytes=int(total))

    def supported_dtypes(self) -> tuple[str, ...]:
        torch = self._torch()
        if not torch.xpu.device_count():
            return ("float32", "bfloat16", "float16")
        props = torch.xpu.get_device_properties(0)
        dtypes = ["float32"]
        if getattr(props, "has_bfloat16_conversions", True):
            dtypes.append("bfloat16")
        if getattr(props, "has_fp16", True):
            dtypes.append("float16")
        if getattr(props, "has_fp64", False):  # Data Center GPU Max has it; Arc and B60 do not
            dtypes.append("float64")
        return tuple(dtypes)

    def default_attention_chain(self, head_size: int | None = None, packed_mask_free: bool = False) -> tuple[str, ...]:
        return ("TORCH_SDPA",)

    def synchronize(self) -> None:
        self._torch().xpu.synchronize()

    def seed_everything(self, seed: int) -> None:
        super().seed_everything(seed)
        self._torch().xpu.manual_seed_all(seed)

    def facts(self) -> dict[str, Any]:
        facts = super().facts()
        if facts["device_count"]:
            props = self._torch().xpu.get_device_properties(0)
            facts["driver_version"] = getattr(props, "driver_version", None)
        facts["blocking_offload_copies"] = self.blocking_offload_copies
        facts["visible_devices"] = f"{VISIBLE_ENV}={os.environ.get(VISIBLE_ENV, '')}"
        return facts
