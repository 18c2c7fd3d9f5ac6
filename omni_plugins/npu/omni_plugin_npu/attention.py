"""NPU_FUSED_ATTN: ``torch_npu.npu_fusion_attention`` behind omni's attention contract.

The npu platform serves the shared name ``FLASH_ATTN`` with it. How a call maps onto the
fused kernel:

* **Layout.** omni's ``(batch, seq, heads, head_dim)`` is the kernel's ``BSND`` layout; it is
  passed as is. Grouped-query attention is native (fewer key/value heads than query heads).
* **Masks.** omni's boolean masks mean True = attend; the kernel's ``atten_mask`` means
  True = masked out, so the mask is inverted. Additive float masks are accepted when every
  entry is 0 (attend) or at most -1e4 (``-inf``, the dtype minimum: masked out); a general
  additive bias is refused with a clear error. A mask is brought to one of the shapes the
  kernel takes (``[B, N, Sq, Sk]``, ``[B, 1, Sq, Sk]``, ``[1, 1, Sq, Sk]``).
* **Causal.** Without a mask, causal attention uses the kernel's compressed 2048x2048
  upper-triangular mask with ``sparse_mode=3`` (right-down causal: aligned to the end, as
  omni defines it). With a mask, the causal block is folded into the full mask
  (``sparse_mode=1``).
* **Variable length** (``cu_seqlens_q/k`` in ``metadata.extra``, packed batch of 1). When the
  model opts in with ``extra["npu_attn_varlen"]`` and the call matches the packed fast path
  (see :func:`packed_fast_path_ends`), one ``TND`` call with ``actual_seq_qlen/kvlen`` does
  it; anything else runs one call per segment. Either way the result is exact; the fast path
  never raises on a mismatch, it just is not taken.
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar, TypeGuard

from omni_core.attention import AttentionBackend, AttentionImpl, AttentionMetadata

#: side of the compressed causal mask ``sparse_mode`` 2/3 take
COMPRESSED_MASK_SIZE = 2048
#: additive mask entries at or below this are "masked out" (-inf, a dtype's minimum, -1e4 style)
MASKED_OUT_AT_OR_BELOW = -1e4

_compressed_causal_masks: dict[str, Any] = {}


def compressed_causal_mask(device: Any) -> Any:
    """The shared ``[2048, 2048]`` upper-triangular block mask (True = masked) for sparse_mode 3,
    built once per device."""
    key = str(device)
    mask = _compressed_causal_masks.get(key)
    if mask is None:
        import torch

        size = COMPRESSED_MASK_SIZE
        mask = torch.triu(torch.ones(size, size, dtype=torch.bool, device=device), diagonal=1).contiguous()
        _compressed_causal_masks[key] = mask
    return mask


def npu_block_mask(mask: Any, batch: int, heads: int, seq_q: int, seq_k: int, causal: bool) -> Any:
    """omni's mask (bool True = attend, or additive 0/-inf) as the kernel's ``atten_mask``:
    bool, True = masked out, shaped ``[B, N, Sq, Sk]``, ``[B, 1, Sq, Sk]`` or ``[1, 1, Sq, Sk]``,
    with the end-aligned causal block folded in when ``causal``."""
    import torch

    if mask.dtype == torch.bool:
        keep = mask
    elif mask.is_floating_point():
        masked_out = mask <= MASKED_OUT_AT_OR_BELOW
        if bool(((mask != 0) & ~masked_out).any()):
            raise ValueError(
                "NPU_FUSED_ATTN takes boolean masks (True = attend) or additive masks whose entries are 0 or "
                f"<= {MASKED_OUT_AT_OR_BELOW:g} (-inf); this additive mask carries a bias, which the fused kernel "
                "cannot apply. Use TORCH_SDPA for this role."
            )
        keep = ~masked_out
    else:
        raise TypeError(f"attn_mask must be bool (True = attend) or an additive float mask, not {mask.dtype}")
    if keep.dim() > 4:
        raise ValueError(f"attn_mask has {keep.dim()} dimensions; it must broadcast to (batch, heads, seq_q, seq_k)")
    while keep.dim() < 4:
        keep = keep.unsqueeze(0)
    target = (batch, heads, seq_q, seq_k)
    if any(got not in (1, want) for got, want in zip(keep.shape, target, strict=True)):
        raise ValueError(
            f"attn_mask of shape {tuple(mask.shape)} does not broadcast to (batch, heads, seq_q, seq_k) = {target}"
        )
    mask_heads = heads if keep.shape[1] == heads else 1
    # the kernel takes [B, N, ...] but not [1, N, ...]: per-head masks carry the batch too
    mask_batch = batch if keep.shape[0] == batch or mask_heads == heads else 1
    blocked = ~keep.expand(mask_batch, mask_heads, seq_q, seq_k)
    if causal:
        rows = torch.arange(seq_q, device=keep.device).unsqueeze(1)
        cols = torch.arange(seq_k, device=keep.device).unsqueeze(0)
        blocked = blocked | (cols > rows + (seq_k - seq_q))
    return blocked.contiguous()


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _entries(cu: Any) -> int:
    """How many offsets ``cu`` holds, from host-side metadata only (no device sync)."""
    if isinstance(cu, (list, tuple)):
        return len(cu)
    shape = getattr(cu, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) == 1 else -1


def _host_values(cu: Any) -> list[int] | None:
    """The offsets when reading them costs no device sync (a list, or a CPU tensor); else None."""
    if isinstance(cu, (list, tuple)):
        return [int(x) for x in cu]
    device = getattr(cu, "device", None)
    if device is not None and getattr(device, "type", None) == "cpu":
        return [int(x) for x in cu.tolist()]
    return None


def packed_fast_path_ends(query: Any, key: Any, extra: dict[str, Any], causal: bool) -> list[int] | None:
    """Cumulative segment ends for the single packed ``TND`` call, or None when the call does not
    fit the fast path (the caller then runs one call per segment; nothing raises).

    The fast path needs: the model's ``extra["npu_attn_varlen"]`` opt-in; batch 1; non-causal;
    ``cu_seqlens`` of ``[0, real, total]`` (a real segment then padding) or ``[0, total]``;
    equal query and key lengths; an integer ``max_seqlen`` (the real length, ``used``) with
    ``0 < used <= total``; and padding no longer than the real segment. Offsets readable without
    a device sync are checked against that layout too.
    """
    if not extra.get("npu_attn_varlen") or causal:
        return None
    if query.shape[0] != 1 or key.shape[0] != 1:
        return None
    total = int(query.shape[1])
    if int(key.shape[1]) != total:
        return None
    cu_q = extra.get("cu_seqlens_q")
    cu_k = extra.get("cu_seqlens_k")
    cu_k = cu_q if cu_k is None else cu_k
    used = extra.get("max_seqlen_q")
    used_k = extra.get("max_seqlen_k", used)
    if cu_q is None or not _is_int(used) or used_k != used:
        return None
    entries = _entries(cu_q)
    if entries not in (2, 3) or _entries(cu_k) != entries:
        return None
    if not 0 < used <= total or total - used > used:
        return None
    if entries == 2 and used != total:
        return None
    expected = [0, total] if entries == 2 else [0, used, total]
    for cu in (cu_q, cu_k):
        values = _host_values(cu)
        if values is not None and values != expected:
            return None
    return [total] if used == total else [used, total]


def _offsets(cu: Any, length: int, what: str) -> list[int]:
    values = cu.tolist() if hasattr(cu, "tolist") else list(cu)
    bounds = [int(x) for x in values]
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != length or any(b < a for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"{what} must rise from 0 to the packed length {length}, got {bounds}")
    return bounds


class NpuFusedAttentionImpl(AttentionImpl):
    def forward(self, query: Any, key: Any, value: Any, metadata: AttentionMetadata | None = None) -> Any:
        extra = metadata.extra if metadata is not None else {}
        mask = metadata.attn_mask if metadata is not None else None
        dtype = str(query.dtype).removeprefix("torch.")
        if dtype not in NpuFusedAttentionBackend.supported_dtypes:
            raise ValueError(
                f"NPU_FUSED_ATTN computes in {'/'.join(NpuFusedAttentionBackend.supported_dtypes)}, not {dtype}; "
                "cast q/k/v or use TORCH_SDPA"
            )
        if extra.get("cu_seqlens_q") is None:
            return self._dense(query, key, value, mask)
        if mask is not None:
            raise ValueError("pass either cu_seqlens (variable length) or attn_mask, not both")
        if query.shape[0] != 1 or key.shape[0] != 1:
            raise ValueError("variable-length attention takes packed inputs of batch 1: (1, total, heads, dim)")
        ends = packed_fast_path_ends(query, key, extra, self.causal)
        if ends is not None:
            return self._packed(query, key, value, ends)
        return self._per_segment(query, key, value, extra)

    def _dense(self, query: Any, key: Any, value: Any, mask: Any) -> Any:
        import torch_npu

        batch, seq_q, heads, _ = query.shape
        seq_k = key.shape[1]
        if mask is not None:
            blocked = npu_block_mask(mask.to(query.device), batch, heads, seq_q, seq_k, self.causal)
            # a mask can leave a row with nothing to attend to: inner_precise=2 corrects such rows
            options: dict[str, Any] = {
                "atten_mask": blocked,
                "sparse_mode": 1 if self.causal else 0,
                "inner_precise": 2,
            }
        elif self.causal:
            options = {
                "atten_mask": compressed_causal_mask(query.device),
                "sparse_mode": 3,  # right-down causal: aligned to the end when seq_q != seq_k
                "inner_precise": 2 if seq_q > seq_k else 0,
            }
        else:
            options = {"sparse_mode": 0}
        out = torch_npu.npu_fusion_attention(
            query.contiguous(),
            key.contiguous(),
            value.contiguous(),
            heads,
            input_layout="BSND",
            scale=float(self.softmax_scale),
            keep_prob=1.0,
            **options,
        )
        return out[0]

    def _packed(self, query: Any, key: Any, value: Any, ends: list[int]) -> Any:
        import torch_npu

        out = torch_npu.npu_fusion_attention(
            query[0].contiguous(),
            key[0].contiguous(),
            value[0].contiguous(),
            query.shape[2],
            input_layout="TND",
            scale=float(self.softmax_scale),
            keep_prob=1.0,
            sparse_mode=0,
            actual_seq_qlen=list(ends),
            actual_seq_kvlen=list(ends),
        )
        return out[0].unsqueeze(0)

    def _per_segment(self, query: Any, key: Any, value: Any, extra: dict[str, Any]) -> Any:
        import torch

        cu_q = extra["cu_seqlens_q"]
        cu_k = extra.get("cu_seqlens_k")
        bounds_q = _offsets(cu_q, query.shape[1], "cu_seqlens_q")
        bounds_k = _offsets(cu_q if cu_k is None else cu_k, key.shape[1], "cu_seqlens_k")
        if len(bounds_q) != len(bounds_k):
            raise ValueError("cu_seqlens_q and cu_seqlens_k must describe the same number of sequences")
        pieces = [
            self._dense(query[:, a:b], key[:, c:d], value[:, c:d], None)
            for (a, b), (c, d) in zip(itertools.pairwise(bounds_q), itertools.pairwise(bounds_k), strict=True)
            if b > a
        ]
        return torch.cat(pieces, dim=1)


class NpuFusedAttentionBackend(AttentionBackend):
    #: the kernel's documented input dtypes (Atlas A2/A3)
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16", "float32")
    supports_mask: ClassVar[bool] = True
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    supports_varlen: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("torch_npu",)

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return NpuFusedAttentionImpl
