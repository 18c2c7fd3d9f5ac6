"""The reference attention: the attention contract written out in plain torch math, once.

Every numeric check of an attention backend compares against :func:`reference_attention`:
the conformance kit (:func:`omni_core.testing.check_plugin`; also exported as
``omni_core.testing.reference_attention``), the backend tests of the platform plugins, and the
``REFERENCE_ATTN`` backend of the CPU plugin, which is this function behind the backend
contract. It lives beside the contract, not in ``omni_core.testing`` (which needs pytest), so
that backend can use it at run time. Torch is imported when it is called, never at import.

The definition, for each batch ``b`` and query head ``h`` (kv head ``h // (Hq // Hkv)``)::

    scores = q @ k^T * scale                                        # (seq_q, seq_k)
    scores[i, j] = -inf  where causal and j > i + (seq_k - seq_q)   # aligned to the end
    scores[i, j] = -inf  where a boolean mask is False               # True = attend
    scores      += mask  for an additive float mask (-inf allowed)   # broadcast to (B, H, Sq, Sk)
    out = softmax(scores, dim=-1) @ v

**Fully masked rows.** A query row whose every key is masked (by the causal alignment, a
boolean mask, ``-inf`` in an additive mask, or any mix) has no softmax: a naive one gives NaN.
Here its output is **zeros**, which is what ``torch.nn.functional.scaled_dot_product_attention``
returns on the CPU for such rows (torch 2.x, boolean and additive masks alike, every float
dtype), so ``TORCH_SDPA`` and the reference agree, and a backend that returns NaN fails.
"""

from __future__ import annotations

from typing import Any


def reference_attention(
    query: Any,
    key: Any,
    value: Any,
    scale: float | None = None,
    causal: bool = False,
    mask: Any = None,
    *,
    dtype: Any = None,
) -> Any:
    """Attention by the definition above, on ``(batch, seq, heads, head_dim)`` tensors.

    ``scale`` defaults to ``head_dim ** -0.5``. ``mask`` is boolean (True = attend) or an
    additive float mask, broadcastable to ``(batch, heads, seq_q, seq_k)``. Computes and
    returns ``dtype`` (float64 by default, the ground truth tests compare against)."""
    import torch

    dtype = torch.float64 if dtype is None else dtype
    if scale is None:
        scale = query.shape[-1] ** -0.5
    # (B, S, H, D) -> (B, H, S, D), in the compute dtype
    q, k, v = (t.transpose(1, 2).to(dtype) for t in (query, key, value))
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # GQA/MQA: query head h reads kv head h // groups
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale  # (B, H, Sq, Sk)
    sq, sk = scores.shape[-2:]
    if causal:
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=scores.device).tril(diagonal=sk - sq)
        scores = scores.masked_fill(~allowed, float("-inf"))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(dtype)
    probs = scores.softmax(dim=-1)
    # a row with no key to attend to: zeros, as torch's SDPA returns on the CPU (softmax gives NaN)
    probs = probs.masked_fill(torch.isneginf(scores).all(dim=-1, keepdim=True), 0.0)
    return (probs @ v).transpose(1, 2)


def reference_attention_varlen(
    query: Any, key: Any, value: Any, cu_seqlens_q: Any, cu_seqlens_k: Any = None, **options: Any
) -> Any:
    """:func:`reference_attention` applied to each sequence of a packed variable-length batch
    (``(1, total, heads, dim)``, bounds in ``cu_seqlens_q/k``); positions outside every sequence
    are zero. ``options`` are those of :func:`reference_attention` (no ``mask``)."""
    import torch

    cu_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k
    bounds_q, bounds_k = [int(x) for x in cu_seqlens_q], [int(x) for x in cu_k]
    if len(bounds_q) != len(bounds_k):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must describe the same number of sequences")
    dtype = options.get("dtype") or torch.float64
    out = torch.zeros(query.shape, dtype=dtype, device=query.device)
    for i in range(len(bounds_q) - 1):
        q0, q1, k0, k1 = bounds_q[i], bounds_q[i + 1], bounds_k[i], bounds_k[i + 1]
        out[:, q0:q1] = reference_attention(query[:, q0:q1], key[:, k0:k1], value[:, k0:k1], **options)
    return out
