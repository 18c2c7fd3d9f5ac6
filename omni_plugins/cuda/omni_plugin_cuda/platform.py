"""The CUDA platform: NVIDIA GPUs through torch's CUDA build.

Every method imports torch inside itself, so building the platform object is cheap, and
each one answers sensibly on a machine where torch sees no device (no capability, no
memory, nothing to synchronise) instead of raising.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from omni_core.platforms import MemoryInfo, Platform

#: datacenter Blackwell (B200/GB200, B300/GB300): the only GPUs TRTLLM_ATTN's kernels run on
TRTLLM_CAPABILITIES = ((10, 0), (10, 3))
#: every Blackwell part the default chain knows: datacenter plus RTX 50xx / RTX PRO (12.0)
#: and DGX Spark GB10 (12.1)
BLACKWELL_CAPABILITIES = (*TRTLLM_CAPABILITIES, (12, 0), (12, 1))
TRTLLM_HEAD_SIZE = 128


def cuda_attention_chain(
    capability: tuple[int, int] | None, head_size: int | None = None, packed_mask_free: bool = False
) -> tuple[str, ...]:
    """The automatic attention order for a GPU of ``capability`` (None: no GPU).

    * Blackwell (sm_100/103/120/121): TRTLLM_ATTN (sm_100/103 only, head size 128, and only
      when the model opts into packed, mask-free calls) -> CUDNN_ATTN -> FLASHINFER_ATTN ->
      FLASH_ATTN -> TORCH_SDPA. Later architectures (major >= 10) not in the table are
      treated like Blackwell without TRTLLM_ATTN.
    * Hopper / Ada / Ampere (sm_80 .. sm_90): FLASH_ATTN -> TORCH_SDPA; CUDNN_ATTN and
      FLASHINFER_ATTN are explicit-only there.
    * Older GPUs, or none: TORCH_SDPA.

    The selector skips backends that are not installed or cannot serve the call, so listing
    one here never forces it.
    """
    if capability is None:
        return ("TORCH_SDPA",)
    cc = (int(capability[0]), int(capability[1]))
    if cc in BLACKWELL_CAPABILITIES or cc[0] >= 10:
        chain: tuple[str, ...] = ("CUDNN_ATTN", "FLASHINFER_ATTN", "FLASH_ATTN", "TORCH_SDPA")
        if cc in TRTLLM_CAPABILITIES and head_size == TRTLLM_HEAD_SIZE and packed_mask_free:
            chain = ("TRTLLM_ATTN", *chain)
        return chain
    if cc >= (8, 0):
        return ("FLASH_ATTN", "TORCH_SDPA")
    return ("TORCH_SDPA",)


class CudaPlatform(Platform):
    device_type: ClassVar[str] = "cuda"
    visible_devices_env: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    supports_offload: ClassVar[bool] = True

    def device_count(self) -> int:
        import torch

        return int(torch.cuda.device_count())

    def device_name(self, index: int = 0) -> str:
        if self.device_count() == 0:
            return "no CUDA device"
        import torch

        return str(torch.cuda.get_device_name(index))

    def memory_info(self, index: int = 0) -> MemoryInfo:
        if self.device_count() == 0:
            return MemoryInfo(0, 0)
        import torch

        free, total = torch.cuda.mem_get_info(index)
        return MemoryInfo(int(free), int(total))

    def supported_dtypes(self) -> tuple[str, ...]:
        dtypes = ["float32", "float16", "float64"]
        if self.device_count():
            import torch

            # native bf16 (Ampere and later), not the slow emulation older GPUs offer
            if torch.cuda.is_bf16_supported(including_emulation=False):
                dtypes.insert(0, "bfloat16")
        return tuple(dtypes)

    def compute_capability(self, index: int = 0) -> tuple[int, int] | None:
        if self.device_count() == 0:
            return None
        import torch

        major, minor = torch.cuda.get_device_capability(index)
        return (int(major), int(minor))

    def default_attention_chain(self, head_size: int | None = None, packed_mask_free: bool = False) -> tuple[str, ...]:
        return cuda_attention_chain(self.compute_capability(), head_size, packed_mask_free)

    def synchronize(self) -> None:
        if self.device_count() == 0:
            return
        import torch

        torch.cuda.synchronize()

    def seed_everything(self, seed: int) -> None:
        super().seed_everything(seed)
        import torch

        # torch.manual_seed seeds the CUDA generators too; said explicitly so the platform's
        # contract does not rest on that. Lazy: applied when CUDA initialises.
        torch.cuda.manual_seed_all(seed)

    def facts(self) -> dict[str, Any]:
        import torch

        facts = super().facts()
        facts["torch_version"] = str(torch.__version__)
        facts["cuda_version"] = torch.version.cuda
        facts["cudnn_version"] = torch.backends.cudnn.version()
        env = self.visible_devices_env or ""
        facts["visible_devices"] = os.environ.get(env)
        count = facts["device_count"]
        if count:
            facts["devices"] = [
                {"index": i, "name": self.device_name(i), "compute_capability": self.compute_capability(i)}
                for i in range(count)
            ]
            facts["attention_chain_head128_packed"] = list(self.default_attention_chain(128, True))
        return facts
