"""REFERENCE_ATTN: the attention definition written out in plain torch math, for parity checks.

It is deliberately simple and slow: it materialises the full ``(batch, heads, seq_q, seq_k)``
score matrix, so its memory grows with ``seq_q * seq_k``. It is never chosen automatically
(no platform lists it in its default chain); name it explicitly to compare another backend
against it.

The definition, for each batch ``b`` and query head ``h`` (kv head ``h // (Hq // Hkv)``)::

    scores = q @ k^T * softmax_scale                      # (seq_q, seq_k)
    scores[i, j] = -inf  where causal and j > i + (seq_k - seq_q)   # aligned to the end
    scores[i, j] = -inf  where a boolean mask is False     # True = attend
    scores      += mask  for an additive float mask        # broadcast to (B, H, Sq, Sk)
    out = softmax(scores, dim=-1) @ v

Computation happens in float32 (float64 for float64 inputs); the output has the input dtype.
A query row whose keys are all masked (by causal alignment or by the mask) gets an output of
zeros, which is what ``TORCH_SDPA`` returns on CPU for such rows (a naive softmax would give
NaN). Variable-length batches (``cu_seqlens_q``/``cu_seqlens_k`` in ``metadata.extra``, packed
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
        import torch

        dtype = compute_dtype(query.dtype)
        # (B, S, H, D) -> (B, H, S, D), in the compute dtype
        q, k, v = (t.transpose(1, 2).to(dtype) for t in (query, key, value))
        groups = q.shape[1] // k.shape[1]
        if groups > 1:  # GQA/MQA: query head h reads kv head h // groups
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)

        scores = (q @ k.transpose(-1, -2)) * self.softmax_scale  # (B, H, Sq, Sk)
        sq, sk = scores.shape[-2:]
        if self.causal:
            allowed = torch.ones(sq, sk, dtype=torch.bool, device=scores.device).tril(diagonal=sk - sq)
            scores = scores.masked_fill(~allowed, float("-inf"))
        if mask is not None:
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, float("-inf"))
            else:
                scores = scores + mask.to(dtype)

        probs = scores.softmax(dim=-1)
        # Rows with no key to attend to: zeros, as TORCH_SDPA returns (softmax would give NaN).
        no_key = torch.isneginf(scores).all(dim=-1, keepdim=True)
        probs = probs.masked_fill(no_key, 0.0)
        out = probs @ v  # (B, H, Sq, D)
        return out.transpose(1, 2).to(query.dtype)


class ReferenceBackend(AttentionBackend):
    name: ClassVar[str] = "REFERENCE_ATTN"
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16", "float64")
    supports_mask: ClassVar[bool] = True
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    supports_varlen: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("torch",)

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return ReferenceAttentionImpl
