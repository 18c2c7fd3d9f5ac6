"""The ``npu`` platform: Huawei Ascend NPUs driven through torch_npu (CANN).

The probe looks for the Ascend driver's device nodes (``/dev/davinci<N>``) and asks
``importlib.util.find_spec("torch_npu")`` whether torch_npu is installed, without importing it:
importing torch_npu imports torch and initialises CANN, which breaks forked workers.

The platform's methods import torch_npu when they run; importing it registers ``torch.npu``
and the ``"npu"`` device type with torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any, ClassVar

from omni_core.platforms import MemoryInfo, Platform, ProbeResult

#: where the Ascend driver creates one ``davinci<N>`` node per NPU (plus ``davinci_manager``)
DEV_DIR = Path("/dev")
VISIBLE_ENV = "ASCEND_RT_VISIBLE_DEVICES"


def davinci_devices() -> list[str]:
    """The NPU device nodes, ``davinci0``, ``davinci1``, ... (``davinci_manager`` is not one)."""
    names = [p.name for p in DEV_DIR.glob("davinci[0-9]*") if re.fullmatch(r"davinci\d+", p.name)]
    return sorted(names, key=lambda n: int(n.removeprefix("davinci")))


def probe() -> ProbeResult:
    """Claims the machine when an Ascend NPU device node exists and torch_npu is installed."""
    devices = davinci_devices()
    if not devices:
        return ProbeResult(False, f"no {DEV_DIR}/davinci<N> device node: no Ascend NPU (or its driver) here")
    npus = f"{len(devices)} Ascend NPU(s) ({', '.join(str(DEV_DIR / d) for d in devices)})"
    if importlib.util.find_spec("torch_npu") is None:
        return ProbeResult(
            False, f"{npus} found, but torch_npu is not installed; install the torch_npu that matches torch and CANN"
        )
    return ProbeResult(True, f"{npus}; torch_npu installed")


def _torch_npu() -> Any:
    """torch with torch_npu loaded (which registers ``torch.npu``), or a clear error."""
    try:
        import torch
        import torch_npu  # noqa: F401 - importing it registers torch.npu and the "npu" device
    except ImportError as exc:
        raise RuntimeError(
            f"the npu platform needs torch_npu (and the CANN toolkit it loads), but importing it failed: {exc}; "
            "install the torch_npu that matches torch and CANN, or choose another platform with OMNI_PLATFORM"
        ) from exc
    return torch


class NpuPlatform(Platform):
    """Ascend NPUs. Constructing it is cheap; every method imports torch_npu when it runs."""

    device_type: ClassVar[str] = "npu"
    visible_devices_env: ClassVar[str | None] = VISIBLE_ENV
    supports_offload: ClassVar[bool] = True
    #: asking for FLASH_ATTN on an NPU runs torch_npu's fused attention
    attention_aliases: ClassVar[dict[str, str]] = {"FLASH_ATTN": "NPU_FUSED_ATTN"}

    def device_count(self) -> int:
        return int(_torch_npu().npu.device_count())

    def device(self, local_rank: int = 0) -> Any:
        return _torch_npu().device("npu", local_rank)

    def device_name(self, index: int = 0) -> str:
        return str(_torch_npu().npu.get_device_name(index))

    def memory_info(self, index: int = 0) -> MemoryInfo:
        free, total = _torch_npu().npu.mem_get_info(index)
        return MemoryInfo(free_bytes=int(free), total_bytes=int(total))

    def supported_dtypes(self) -> tuple[str, ...]:
        return ("float32", "bfloat16", "float16")

    def default_attention_chain(self, head_size: int | None = None, packed_mask_free: bool = False) -> tuple[str, ...]:
        # FLASH_ATTN resolves to NPU_FUSED_ATTN here (attention_aliases); SDPA is the last resort
        return ("FLASH_ATTN", "TORCH_SDPA")

    def autocast(self, dtype: str) -> contextlib.AbstractContextManager[Any]:
        torch = _torch_npu()
        context: contextlib.AbstractContextManager[Any] = torch.autocast(device_type="npu", dtype=getattr(torch, dtype))
        return context

    def synchronize(self) -> None:
        _torch_npu().npu.synchronize()

    def seed_everything(self, seed: int) -> None:
        super().seed_everything(seed)
        _torch_npu().npu.manual_seed_all(seed)

    def facts(self) -> dict[str, Any]:
        facts = super().facts()
        import torch_npu

        facts["torch_npu_version"] = getattr(torch_npu, "__version__", "?")
        facts["visible_devices"] = f"{VISIBLE_ENV}={os.environ.get(VISIBLE_ENV, '')}"
        return facts
