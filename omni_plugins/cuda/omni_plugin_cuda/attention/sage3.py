"""SAGE_ATTN_3: SageAttention 3 (``sageattn3.sageattn3_blackwell``), FP4 microscaling on Blackwell.

Lossy, so never chosen automatically. The kernel takes ``(batch, heads, seq, head_dim)``,
assumes as many key/value heads as query heads (GQA/MQA calls are declared unsupported, so
automatic selection passes it over and an explicit choice is rejected), always scales by
``head_dim ** -0.5`` (a custom softmax scale is rejected when the layer is built) and
centres K in place (it gets its own copy). No masks, no variable-length batches; causal
attention needs equal query and key lengths.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, ClassVar

from omni_core.attention import AttentionImpl
from omni_plugin_cuda.attention._common import CudaAttentionBackend, CudaAttentionImpl


class SageAttention3Impl(CudaAttentionImpl):
    name: ClassVar[str] = "SAGE_ATTN_3"
    accepts_mask: ClassVar[bool] = False
    accepts_varlen: ClassVar[bool] = False

    def configure(self) -> None:
        expected = self.head_size**-0.5
        if not math.isclose(self.softmax_scale, expected, rel_tol=1e-6):
            raise ValueError(
                f"SAGE_ATTN_3 always scales by head_size ** -0.5 ({expected:.6g}); this layer asks for "
                f"{self.softmax_scale:.6g}"
            )

    def _dense(self, query: Any, key: Any, value: Any, mask: Any, extra: dict[str, Any]) -> Any:
        import torch

        if key.shape[2] != query.shape[2]:
            raise ValueError(
                f"SAGE_ATTN_3 needs as many key/value heads as query heads ({key.shape[2]} != {query.shape[2]})"
            )
        if self.causal and query.shape[1] != key.shape[1]:
            raise ValueError("SAGE_ATTN_3 causal attention needs equal query and key lengths")
        kernel = importlib.import_module("sageattn3").sageattn3_blackwell
        q = query.transpose(1, 2).contiguous()
        k = key.transpose(1, 2).clone(memory_format=torch.contiguous_format)  # centred in place by the kernel
        v = value.transpose(1, 2).contiguous()
        out = kernel(q, k, v, is_causal=self.causal)
        return out.transpose(1, 2)


class SageAttention3Backend(CudaAttentionBackend):
    supported_head_sizes: ClassVar[tuple[int, ...]] = (64, 128)
    supports_mask: ClassVar[bool] = False
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = False
    supports_varlen: ClassVar[bool] = False
    lossy: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("torch", "sageattn3")
    install_hint: ClassVar[str] = "build sageattn3 from SageAttention's sageattention3_blackwell directory"
    min_compute_capability: ClassVar[tuple[int, int] | None] = (10, 0)

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return SageAttention3Impl
