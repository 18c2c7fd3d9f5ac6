"""SAGE_ATTN: SageAttention 2 (``sageattention.sageattn``), INT8 Q/K with FP16 accumulation.

Lossy, so never chosen automatically: name it explicitly. It takes ``(batch, seq, heads,
head_dim)`` directly (``tensor_layout="NHD"``), supports GQA natively and a custom softmax
scale. No masks. Causal attention needs equal query and key lengths, where the top-left and
end alignments agree. Variable-length batches run one call per sequence. SageAttention is
built from source (``pip install 'omni-plugin-cuda[sage]'`` needs a CUDA toolchain).
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from omni_core.attention import AttentionImpl
from omni_plugin_cuda.attention._common import CudaAttentionBackend, CudaAttentionImpl, Packed


class SageAttentionImpl(CudaAttentionImpl):
    name: ClassVar[str] = "SAGE_ATTN"
    accepts_mask: ClassVar[bool] = False
    accepts_varlen: ClassVar[bool] = True

    def _call(self, query: Any, key: Any, value: Any) -> Any:
        if self.causal and query.shape[1] != key.shape[1]:
            raise ValueError(
                "SAGE_ATTN causal attention needs equal query and key lengths "
                f"(got {query.shape[1]} and {key.shape[1]}); choose FLASH_ATTN or TORCH_SDPA for this role"
            )
        sageattention = importlib.import_module("sageattention")
        return sageattention.sageattn(
            query, key, value, tensor_layout="NHD", is_causal=self.causal, sm_scale=self.softmax_scale
        )

    def _dense(self, query: Any, key: Any, value: Any, mask: Any, extra: dict[str, Any]) -> Any:
        return self._call(query, key, value)

    def _varlen(self, query: Any, key: Any, value: Any, packed: Packed, extra: dict[str, Any]) -> Any:
        import torch

        pieces = [self._call(query[:, sq], key[:, sk], value[:, sk]) for sq, sk in packed.segments()]
        return torch.cat(pieces, dim=1)


class SageAttentionBackend(CudaAttentionBackend):
    #: SageAttention 2 pads head sizes up to 64 or 128 and stops there
    supported_head_sizes: ClassVar[tuple[int, ...]] = tuple(range(8, 129, 8))
    supports_mask: ClassVar[bool] = False
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    supports_varlen: ClassVar[bool] = True
    lossy: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("torch", "sageattention")
    install_hint: ClassVar[str] = "pip install 'omni-plugin-cuda[sage]' (builds from source)"
    min_compute_capability: ClassVar[tuple[int, int] | None] = (8, 0)

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return SageAttentionImpl
