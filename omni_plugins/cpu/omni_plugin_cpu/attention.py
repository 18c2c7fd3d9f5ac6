"""TORCH_SDPA: torch's scaled_dot_product_attention behind omni's attention contract.

It is the reference kernel and every platform's last resort: it runs on any device torch
supports, honours masks, GQA, causal attention and variable-length batches.
"""

from __future__ import annotations

from typing import Any, ClassVar

from omni_core.attention import AttentionBackend, AttentionImpl, AttentionMetadata


class TorchSDPAImpl(AttentionImpl):
    def forward(self, query: Any, key: Any, value: Any, metadata: AttentionMetadata | None = None) -> Any:
        extra = metadata.extra if metadata is not None else {}
        mask = metadata.attn_mask if metadata is not None else None
        cu_q, cu_k = extra.get("cu_seqlens_q"), extra.get("cu_seqlens_k")
        if cu_q is not None:
            return self._varlen(query, key, value, cu_q, cu_k if cu_k is not None else cu_q, mask)
        return self._dense(query, key, value, mask)

    def _dense(self, query: Any, key: Any, value: Any, mask: Any) -> Any:
        import torch
        import torch.nn.functional as F

        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # -> (B, H, S, D)
        sq, sk = q.shape[-2], k.shape[-2]
        is_causal = self.causal
        if self.causal and (mask is not None or sq != sk):
            # SDPA's is_causal aligns to the top-left and cannot be combined with a mask;
            # omni aligns causal attention to the end, so build the mask explicitly.
            causal = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
            if mask is None:
                mask = causal
            elif mask.dtype == torch.bool:
                mask = mask & causal
            else:
                mask = mask.masked_fill(~causal, float("-inf"))
            is_causal = False
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=is_causal,
            scale=self.softmax_scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.transpose(1, 2)

    def _varlen(self, query: Any, key: Any, value: Any, cu_q: Any, cu_k: Any, mask: Any) -> Any:
        import torch

        if query.shape[0] != 1:
            raise ValueError("variable-length attention takes packed inputs of batch 1: (1, total, heads, dim)")
        if mask is not None:
            raise ValueError("pass either cu_seqlens (variable length) or attn_mask, not both")
        bounds_q, bounds_k = [int(x) for x in cu_q], [int(x) for x in cu_k]
        if len(bounds_q) != len(bounds_k):
            raise ValueError("cu_seqlens_q and cu_seqlens_k must describe the same number of sequences")
        pieces = []
        for i in range(len(bounds_q) - 1):
            q = query[:, bounds_q[i] : bounds_q[i + 1]]
            k = key[:, bounds_k[i] : bounds_k[i + 1]]
            v = value[:, bounds_k[i] : bounds_k[i + 1]]
            pieces.append(self._dense(q, k, v, None))
        return torch.cat(pieces, dim=1)


class TorchSDPABackend(AttentionBackend):
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16", "float64")
    supports_mask: ClassVar[bool] = True
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    supports_varlen: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("torch",)

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return TorchSDPAImpl
