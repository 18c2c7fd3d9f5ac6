"""The CPU platform: the machine's processor and memory, answered without any vendor SDK."""

from __future__ import annotations

import os
import platform as _platform
from typing import Any, ClassVar

from omni_core.platforms import MemoryInfo, Platform, ProbeResult


def probe() -> ProbeResult:
    """The CPU is always present; priority -100 lets any claiming accelerator win."""
    return ProbeResult(True, f"{os.cpu_count() or 1} logical CPU(s)")


def _meminfo() -> dict[str, int]:
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return values


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine() or "cpu"


class CpuPlatform(Platform):
    device_type: ClassVar[str] = "cpu"
    # Host and device memory are one here, so offload saves nothing, but the strategies run
    # (real evictions and hooks): a recipe that names offload works on a CPU machine too.
    supports_offload: ClassVar[bool] = True

    def device_count(self) -> int:
        return 1

    def device(self, local_rank: int = 0) -> Any:
        import torch

        return torch.device("cpu")  # one device whatever the rank

    def device_name(self, index: int = 0) -> str:
        return _cpu_model()

    def memory_info(self, index: int = 0) -> MemoryInfo:
        info = _meminfo()
        if "MemTotal" in info:
            return MemoryInfo(info.get("MemAvailable", info.get("MemFree", 0)), info["MemTotal"])
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return MemoryInfo(pages * page, pages * page)

    def supported_dtypes(self) -> tuple[str, ...]:
        return ("float32", "bfloat16", "float16", "float64")

    def default_attention_chain(self, head_size: int | None = None, packed_mask_free: bool = False) -> tuple[str, ...]:
        return ("TORCH_SDPA",)

    def facts(self) -> dict[str, Any]:
        facts = super().facts()
        facts["logical_cpus"] = os.cpu_count()
        facts["machine"] = _platform.machine()
        return facts
