"""REFERENCE_ATTN: the reference attention of the conformance kit behind the backend contract.

The math is :func:`omni_core.attention.reference.reference_attention`, the one definition every
backend is checked against (causal aligned to the end, boolean and additive masks, GQA, and
zeros for a query row whose keys are all masked, as ``TORCH_SDPA`` returns on CPU). It is
deliberately simple and slow: it materialises the full ``(batch, heads, seq_q, seq_k)`` score
matrix, so its memory grows with ``seq_q * seq_k``. It is never chosen automatically (no
platform lists it in its default chain); name it explicitly to compare another backend against
it.

Computation happens in float32 (float64 for float64 inputs); the output has the input dtype.
Variable-length batches (``cu_seqlens_q``/``cu_seqlens_k`` in ``metadata.extra``, packed
inputs of batch 1) apply the definition to each sequence separately; as with ``TORCH_SDPA``
they cannot be combined with ``attn_mask``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from omni_core.attention import AttentionBackend, AttentionImpl, AttentionMetadata


def compute_dtype(dtype: Any) -> Any:
    """float64 stays float64; everything else is computed in float32."""
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def varlen_bounds(query: Any, mask: Any, cu_q: Any, cu_k: Any) -> list[tuple[int, int, int, int]]:
    """``[(q_start, q_end, k_start, k_end), ...]`` of a packed variable-length batch, validated."""
    if query.shape[0] != 1:
        raise ValueError("variable-length attention takes packed inputs of batch 1: (1, total, heads, dim)")
    if mask is not None:
        raise ValueError("pass either cu_seqlens (variable length) or attn_mask, not both")
    bounds_q = [int(x) for x in cu_q]
    bounds_k = [int(x) for x in (cu_k if cu_k is not None else cu_q)]
    if len(bounds_q) != len(bounds_k):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must describe the same number of sequences")
    return [(bounds_q[i], bounds_q[i + 1], bounds_k[i], bounds_k[i + 1]) for i in range(len(bounds_q) - 1)]


def check_shapes(query: Any, key: Any, value: Any) -> None:
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("query, key and value must be (batch, seq, heads, head_dim)")
    if key.shape != value.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must have the same shape")
    if query.shape[0] != key.shape[0] or query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query {tuple(query.shape)} and key {tuple(key.shape)} differ in batch or head_dim")
    if query.shape[2] % key.shape[2]:
        raise ValueError(f"query heads ({query.shape[2]}) must be a multiple of key/value heads ({key.shape[2]})")


class ReferenceAttentionImpl(AttentionImpl):
    def forward(self, query: Any, key: Any, value: Any, metadata: AttentionMetadata | None = None) -> Any:
        import torch

        check_shapes(query, key, value)
        extra = metadata.extra if metadata is not None else {}
        mask = metadata.attn_mask if metadata is not None else None
        if extra.get("cu_seqlens_q") is not None:
            bounds = varlen_bounds(query, mask, extra["cu_seqlens_q"], extra.get("cu_seqlens_k"))
            out = torch.zeros_like(query)  # positions outside every sequence stay zero
            for q0, q1, k0, k1 in bounds:
                out[:, q0:q1] = self._dense(query[:, q0:q1], key[:, k0:k1], value[:, k0:k1], None)
            return out
        return self._dense(query, key, value, mask)

    def _dense(self, query: Any, key: Any, value: Any, mask: Any) -> Any:
        from omni_core.attention.reference import reference_attention

        out = reference_attention(
            query, key, value, scale=self.softmax_scale, causal=self.causal, mask=mask, dtype=compute_dtype(query.dtype)
        )
        return out.to(query.dtype)


class ReferenceBackend(AttentionBackend):
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16", "float64")
    supports_mask: ClassVar[bool] = True
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    supports_varlen: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("torch",)

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return ReferenceAttentionImpl
