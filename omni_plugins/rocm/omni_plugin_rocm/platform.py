"""The ``rocm`` platform: AMD GPUs driven through ROCm/HIP.

The probe looks only at files: the KFD device node, the KFD topology in sysfs, and the text
of the installed torch's ``version.py``. It imports neither torch nor amdsmi and initialises
no driver, so it is safe in every process, forked workers included. It raises when what it
reads is malformed: omni records the error instead of silently falling back to the CPU.

The platform's methods ask torch: a ROCm build of torch exposes HIP devices as ``torch.cuda``
(device type ``"cuda"``), with the GPU architecture in ``gcnArchName``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from omni_core.platforms import MemoryInfo, Platform, ProbeResult
from omni_core.platforms.probing import torch_build_info, torch_package_dir

#: the ROCm kernel driver's compute device node; present when amdgpu's KFD is loaded
KFD_DEVICE = Path("/dev/kfd")
#: one directory per topology node (CPUs and GPUs), each with a ``properties`` file
KFD_TOPOLOGY_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
VISIBLE_ENV = "HIP_VISIBLE_DEVICES"


def gfx_name(target_version: int) -> str:
    """``90402`` (KFD's ``gfx_target_version``) -> ``"gfx942"``; ``90010`` -> ``"gfx90a"``."""
    major, minor, step = target_version // 10000, (target_version // 100) % 100, target_version % 100
    return f"gfx{major}{minor:x}{step:x}"


def _node_architecture(properties: Path) -> str | None:
    """The GPU architecture of one topology node, or None for a CPU node.

    A malformed file raises (ValueError naming it): that is a broken driver, not "no GPU"."""
    values: dict[str, str] = {}
    for line in properties.read_text(encoding="ascii", errors="replace").splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            values[key] = value.strip()
    try:
        if "gfx_target_version" in values:
            version = int(values["gfx_target_version"])
            return gfx_name(version) if version else None
        # kernels older than 5.x do not publish gfx_target_version; GPUs have SIMDs
        return "gfx (unknown)" if int(values.get("simd_count", "0")) > 0 else None
    except ValueError:
        raise ValueError(f"{properties}: unreadable KFD node properties (gfx_target_version/simd_count)") from None


def gpu_architectures() -> list[str]:
    """Architectures of the GPU nodes in the KFD topology, one entry per GPU (CPU nodes skipped)."""
    if not KFD_TOPOLOGY_NODES.is_dir():
        return []
    archs = []
    for properties in sorted(KFD_TOPOLOGY_NODES.glob("*/properties")):
        arch = _node_architecture(properties)
        if arch is not None:
            archs.append(arch)
    return archs


def hidden_by_env() -> str | None:
    """Why the environment hides every GPU from this process (``HIP_VISIBLE_DEVICES=-1``), or None."""
    for name in (VISIBLE_ENV, "ROCR_VISIBLE_DEVICES"):
        value = os.environ.get(name)
        if value is None:
            continue
        first = value.split(",")[0].strip()
        if first == "" or first.startswith("-"):
            return f"{name}={value!r} hides every GPU from this process"
    return None


def probe() -> ProbeResult:
    """Claims the machine when an AMD GPU is visible through KFD and torch is a ROCm build."""
    if not KFD_DEVICE.exists():
        return ProbeResult(False, f"{KFD_DEVICE} not found: no ROCm kernel driver (amdgpu KFD) is loaded")
    archs = gpu_architectures()
    if not archs:
        return ProbeResult(False, f"{KFD_DEVICE} exists but the KFD topology ({KFD_TOPOLOGY_NODES}) lists no GPU")
    gpus = f"{len(archs)} AMD GPU(s) ({', '.join(sorted(set(archs)))})"
    hidden = hidden_by_env()
    if hidden:
        return ProbeResult(False, f"{gpus} found, but {hidden}")
    torch_dir = torch_package_dir()
    if torch_dir is None:
        return ProbeResult(False, f"{gpus} found, but torch is not installed; install a ROCm build of torch")
    build = torch_build_info(torch_dir)
    hip = build.get("hip")
    if not hip:
        return ProbeResult(
            False,
            f"{gpus} found, but torch {build.get('__version__', '?')} at {torch_dir} is not a ROCm build "
            "(its version.py has hip = None); install a ROCm build of torch",
        )
    return ProbeResult(True, f"{gpus} through {KFD_DEVICE}; torch {build.get('__version__', '?')} built for HIP {hip}")


class RocmPlatform(Platform):
    """AMD GPUs. Constructing it is cheap; every method imports torch when it runs."""

    #: a ROCm build of torch drives HIP devices through torch.cuda, as device type "cuda"
    device_type: ClassVar[str] = "cuda"
    visible_devices_env: ClassVar[str | None] = VISIBLE_ENV
    supports_offload: ClassVar[bool] = True
    #: asking for FLASH_ATTN on ROCm runs AITER's flash attention
    attention_aliases: ClassVar[dict[str, str]] = {"FLASH_ATTN": "ROCM_AITER_FA"}

    @staticmethod
    def _torch() -> Any:
        import torch

        if not getattr(torch.version, "hip", None):
            raise RuntimeError(
                f"the rocm platform needs a ROCm build of torch, but torch {torch.__version__} was built "
                "without HIP (torch.version.hip is None); install the ROCm build of torch or choose another "
                "platform with OMNI_PLATFORM"
            )
        return torch

    def device_count(self) -> int:
        return int(self._torch().cuda.device_count())

    def device_name(self, index: int = 0) -> str:
        return str(self._torch().cuda.get_device_name(index))

    def memory_info(self, index: int = 0) -> MemoryInfo:
        free, total = self._torch().cuda.mem_get_info(index)
        return MemoryInfo(free_bytes=int(free), total_bytes=int(total))

    def supported_dtypes(self) -> tuple[str, ...]:
        return ("float32", "bfloat16", "float16", "float64")

    def compute_capability(self, index: int = 0) -> tuple[int, int] | None:
        major, minor = self._torch().cuda.get_device_capability(index)
        return (int(major), int(minor))

    def gcn_arch_name(self, index: int = 0) -> str:
        """The full HIP architecture string, e.g. ``gfx942:sramecc+:xnack-``."""
        return str(self._torch().cuda.get_device_properties(index).gcnArchName)

    def gcn_arch(self, index: int = 0) -> str:
        """The GPU architecture without feature flags, e.g. ``gfx942`` (MI300) or ``gfx950`` (MI350)."""
        return self.gcn_arch_name(index).split(":", 1)[0].strip()

    def default_attention_chain(self, head_size: int | None = None, packed_mask_free: bool = False) -> tuple[str, ...]:
        # FLASH_ATTN resolves to ROCM_AITER_FA here (attention_aliases); SDPA is the last resort
        return ("FLASH_ATTN", "TORCH_SDPA")

    def synchronize(self) -> None:
        self._torch().cuda.synchronize()

    def seed_everything(self, seed: int) -> None:
        super().seed_everything(seed)
        self._torch().cuda.manual_seed_all(seed)

    def facts(self) -> dict[str, Any]:
        facts = super().facts()
        torch = self._torch()
        facts["hip_version"] = torch.version.hip
        if facts["device_count"]:
            facts["gcn_arch_name"] = self.gcn_arch_name(0)
        facts["visible_devices"] = f"{VISIBLE_ENV}={os.environ.get(VISIBLE_ENV, '')}"
        return facts
