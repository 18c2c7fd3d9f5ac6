"""CUDNN_ATTN: torch's scaled_dot_product_attention pinned to the cuDNN kernel.

Pinning one kernel matters: with a priority list, SDPA's dispatcher can disable cuDNN for
a masked call when another kernel rejects the mask, and fall through to the slow MATH kernel.
Pinned, a call cuDNN cannot run fails loudly instead of being silently slow. It honours
boolean and additive masks (suits mask-heavy DiTs), GQA (keys/values are expanded to the
query heads first) and causal attention aligned to the end. Needs cuDNN >= 9.5.

One shape goes to SDPA's MATH kernel instead, because cuDNN rejects it: a key/value length
of 1 (warm-up passes and some image-conditioning layers); the result is the same attention.
Note that cuDNN attention breaks under ``torch.compile`` with a symbolic head_dim.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

from omni_core.attention import AttentionImpl, Availability
from omni_core.platforms import Platform
from omni_plugin_cuda.attention._common import CudaAttentionBackend, CudaAttentionImpl, Packed

MIN_CUDNN = 90500  # cuDNN 9.5.0 as torch.backends.cudnn.version() reports it


def pinned_kernel(kernel: str) -> contextlib.AbstractContextManager[Any]:
    """A context in which SDPA may use only ``kernel`` (an ``SDPBackend`` member name)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, kernel)])


def sdpa(query: Any, key: Any, value: Any, mask: Any, causal: bool, scale: float) -> Any:
    """SDPA over ``(B, S, H, D)`` tensors with omni's semantics, cuDNN pinned."""
    import torch
    import torch.nn.functional as F

    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # -> (B, H, S, D)
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    sq, sk = q.shape[-2], k.shape[-2]
    is_causal = causal
    if causal and (mask is not None or sq != sk):
        # SDPA's is_causal aligns to the top-left and excludes a mask: build it, end-aligned
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        if mask is None:
            mask = keep
        elif mask.dtype == torch.bool:
            mask = mask & keep
        else:
            mask = mask.masked_fill(~keep, float("-inf"))
        is_causal = False
    with pinned_kernel("CUDNN_ATTENTION" if sk > 1 else "MATH"):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)
    return out.transpose(1, 2)


class CudnnAttentionImpl(CudaAttentionImpl):
    name: ClassVar[str] = "CUDNN_ATTN"
    accepts_mask: ClassVar[bool] = True
    accepts_varlen: ClassVar[bool] = True

    def _dense(self, query: Any, key: Any, value: Any, mask: Any, extra: dict[str, Any]) -> Any:
        return sdpa(query, key, value, mask, self.causal, self.softmax_scale)

    def _varlen(self, query: Any, key: Any, value: Any, packed: Packed, extra: dict[str, Any]) -> Any:
        import torch

        pieces = [
            sdpa(query[:, sq], key[:, sk], value[:, sk], None, self.causal, self.softmax_scale)
            for sq, sk in packed.segments()
        ]
        return torch.cat(pieces, dim=1)


class CudnnAttentionBackend(CudaAttentionBackend):
    #: cuDNN's fused attention: head_dim a multiple of 8, at most 256
    supported_head_sizes: ClassVar[tuple[int, ...]] = tuple(range(8, 257, 8))
    supports_mask: ClassVar[bool] = True
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    supports_varlen: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("torch",)
    min_compute_capability: ClassVar[tuple[int, int] | None] = (8, 0)

    @classmethod
    def more_availability(cls, platform: Platform) -> Availability:
        if platform.device_count() > 0:
            import torch

            version = torch.backends.cudnn.version()
            if version is None or version < MIN_CUDNN:
                have = "no cuDNN" if version is None else f"cuDNN {version // 10000}.{version // 100 % 100}"
                return Availability(False, f"needs cuDNN >= 9.5, torch has {have}")
        return Availability(True, "available")

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return CudnnAttentionImpl
