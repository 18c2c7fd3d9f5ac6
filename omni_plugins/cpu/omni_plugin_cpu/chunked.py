"""CHUNKED_ATTN: memory-bounded attention for long sequences on CPU.

It walks over blocks of queries and, for each, over blocks of keys, keeping a running row
maximum, a running softmax denominator and a running weighted sum of values (the "online
softmax" of FlashAttention). The score matrix of one step is ``(batch, heads, block_q,
block_k)``, so the memory beyond the inputs and the output is bounded by the block sizes
instead of growing with ``seq_q * seq_k``.

It is pure torch, so the bound holds whatever kernel torch would pick. On CPU with torch 2.13,
``TORCH_SDPA`` itself already runs a fused, memory-bounded kernel for float32/float16/bfloat16
and float64 calls with or without masks, and is faster (see ``benchmarks/attention_cpu.py``);
use this backend where that is not so, or as a readable statement of the algorithm.

* Block sizes: :attr:`ChunkedAttentionImpl.chunk_size_q` / ``chunk_size_k`` (class
  attributes, 512 each; subclass or set them to change the default), overridden per call by
  ``metadata.extra["chunk_size_q"]`` / ``["chunk_size_k"]``. A step's scores take at most
  ``batch * heads * chunk_size_q * chunk_size_k`` elements (24 MiB in float32 for 24 heads).
  A query block shorter than ``chunk_size_q`` (a short query sequence, decoding, the last
  block) gets proportionally wider key blocks, as long as neither its scores nor its key and
  value blocks outgrow ``chunk_size_q * chunk_size_k`` elements per query group: one decode
  call over 8k keys (24 query heads over 8 kv heads, head_dim 128) takes 2 steps rather than
  16. The defaults were measured on a 2-core AVX-512 Xeon with torch 2.13 (24 heads,
  head_dim 64/128): 512 x 512 and 256 x 512 cost the same CPU time, about 1.2x TORCH_SDPA
  single-threaded, and 512 x 512 takes half the steps (each step is several torch ops, each
  a parallel region, which is what costs most when other processes compete for the cores);
  1024 x 1024 blocks (96 MiB) were 1.3-1.7x slower, the element-wise softmax passes then
  running from main memory rather than cache.
* GQA/MQA: the ``Hq // Hkv`` query heads that share a kv head are stacked along the row
  axis of one matrix product, so key/value heads are never repeated.
* Causal attention is aligned to the end (query ``i`` sees keys ``j <= i + seq_k - seq_q``);
  key blocks that no query of the current block can see are skipped, and blocks every query
  fully sees are not masked at all.
* Masks (boolean, True = attend, or additive float) broadcastable to ``(batch, heads, seq_q,
  seq_k)`` are sliced per block without being expanded.
* Variable-length batches (``cu_seqlens_q``/``cu_seqlens_k``, packed batch 1) run each
  sequence separately; as with ``TORCH_SDPA`` they cannot be combined with ``attn_mask``.
* Computation happens in float32 (float64 for float64 inputs); the output has the input dtype.
* A query row whose keys are all masked gets an output of zeros. That is what ``TORCH_SDPA``
  returns on CPU for such rows (torch 2.13, every float dtype, boolean and ``-inf`` additive
  masks alike); a naive softmax would give NaN. The parity tests pin this down.
"""

from __future__ import annotations

from typing import Any, ClassVar

from omni_core.attention import AttentionBackend, AttentionImpl, AttentionMetadata
from omni_plugin_cpu.reference import check_shapes, compute_dtype, varlen_bounds


def _block_size(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive integer, not {value!r}")
    return value


def _mask_as_4d(mask: Any, shape: tuple[int, int, int, int]) -> Any:
    """``mask`` with leading size-1 dims added up to 4; checks it broadcasts to ``shape``."""
    import torch

    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise ValueError(f"attn_mask must be boolean (True = attend) or an additive float mask, not {mask.dtype}")
    if mask.dim() > 4:
        raise ValueError(f"attn_mask has {mask.dim()} dims; it must broadcast to (batch, heads, seq_q, seq_k)")
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    for size, want, what in zip(mask.shape, shape, ("batch", "heads", "seq_q", "seq_k"), strict=True):
        if size not in (1, want):
            raise ValueError(
                f"attn_mask of shape {tuple(mask.shape)} does not broadcast to (batch, heads, seq_q, seq_k) = "
                f"{shape}: {what} is {size}, expected 1 or {want}"
            )
    return mask


class ChunkedAttentionImpl(AttentionImpl):
    #: default number of queries per block (``metadata.extra["chunk_size_q"]`` overrides it)
    chunk_size_q: ClassVar[int] = 512
    #: default number of keys per block (``metadata.extra["chunk_size_k"]`` overrides it)
    chunk_size_k: ClassVar[int] = 512

    def forward(self, query: Any, key: Any, value: Any, metadata: AttentionMetadata | None = None) -> Any:
        import torch

        check_shapes(query, key, value)
        extra = metadata.extra if metadata is not None else {}
        mask = metadata.attn_mask if metadata is not None else None
        block_q = _block_size(extra.get("chunk_size_q", self.chunk_size_q), "chunk_size_q")
        block_k = _block_size(extra.get("chunk_size_k", self.chunk_size_k), "chunk_size_k")
        if extra.get("cu_seqlens_q") is not None:
            bounds = varlen_bounds(query, mask, extra["cu_seqlens_q"], extra.get("cu_seqlens_k"))
            out = torch.zeros_like(query)  # positions outside every sequence stay zero
            for q0, q1, k0, k1 in bounds:
                out[:, q0:q1] = self._dense(query[:, q0:q1], key[:, k0:k1], value[:, k0:k1], None, block_q, block_k)
            return out
        return self._dense(query, key, value, mask, block_q, block_k)

    def _dense(self, query: Any, key: Any, value: Any, mask: Any, block_q: int, block_k: int) -> Any:
        import torch

        batch, seq_q, heads, dim = query.shape
        seq_k, kv_heads = key.shape[1], key.shape[2]
        groups = heads // kv_heads
        dtype = compute_dtype(query.dtype)
        device = query.device
        out = torch.empty_like(query)
        if mask is not None:
            mask = _mask_as_4d(mask, (batch, heads, seq_q, seq_k))
        offset = seq_k - seq_q  # causal: query i sees keys j <= i + offset
        neg_inf = float("-inf")
        pairs = batch * kv_heads  # one (query group, kv head) pair per matrix of a batched product
        keys = key.transpose(1, 2)  # (B, Hkv, Sk, D), a view
        values = value.transpose(1, 2)
        budget = block_q * block_k  # elements per (batch, kv head) and step, for scores and for keys

        def key_width(rows: int) -> int:
            # A query block with fewer rows (decoding, a short or last block) takes wider key
            # blocks, as long as neither its scores nor its key block outgrow the budget.
            return max(block_k, min(budget // rows, groups * budget // dim))

        # Buffers reused by every step: allocating fresh blocks each time would make the
        # allocator hand the pages back to the OS and fault them in again.
        buffer = torch.empty(pairs * groups * min(budget, min(block_q, seq_q) * seq_k), dtype=dtype, device=device)
        # Key/value blocks are copied into (B * Hkv, cols, D) unless a view already is that
        # (batch 1 in the compute dtype).
        copy_kv = batch > 1 or key.dtype != dtype
        fewest_rows = seq_q - (max(seq_q - 1, 0) // block_q) * block_q  # rows of the last query block
        kv_elements = pairs * min(seq_k, key_width(max(fewest_rows, 1))) * dim if copy_kv else 0
        key_buffer = torch.empty(kv_elements, dtype=dtype, device=device)
        value_buffer = torch.empty(kv_elements, dtype=dtype, device=device)

        def kv_block(source: Any, target: Any, j0: int, j1: int) -> Any:
            block = source[:, :, j0:j1]  # (B, Hkv, cols, D), a view
            if not copy_kv:
                return block.reshape(pairs, j1 - j0, dim)
            return target[: pairs * (j1 - j0) * dim].view(batch, kv_heads, j1 - j0, dim).copy_(block).flatten(0, 1)

        for i0 in range(0, seq_q, block_q):
            i1 = min(i0 + block_q, seq_q)
            rows = i1 - i0
            # (B, rows, Hq, D) -> (B * Hkv, G * rows, D): the G query heads of one kv head stacked
            # along the rows, so one product against that kv head serves all of them (no repeats).
            q = query[:, i0:i1].to(dtype).reshape(batch, rows, kv_heads, groups, dim)
            q = q.permute(0, 2, 3, 1, 4).reshape(pairs, groups * rows, dim)
            acc = torch.zeros(pairs, groups * rows, dim, dtype=dtype, device=device)
            row_max = torch.full((pairs, groups * rows, 1), neg_inf, dtype=dtype, device=device)
            row_sum = torch.zeros(pairs, groups * rows, 1, dtype=dtype, device=device)
            # Causal: the last query of this block sees keys < i1 + offset; later blocks are skipped.
            key_stop = min(seq_k, i1 + offset) if self.causal else seq_k
            width = key_width(rows)

            for j0 in range(0, key_stop, width):
                j1 = min(j0 + width, seq_k)
                cols = j1 - j0
                k = kv_block(keys, key_buffer, j0, j1)
                v = kv_block(values, value_buffer, j0, j1)
                scores = buffer[: pairs * groups * rows * cols].view(pairs, groups * rows, cols)
                # scores = softmax_scale * q @ k^T, written into the reused buffer (beta=0: its old
                # contents are ignored)
                torch.baddbmm(scores, q, k.transpose(1, 2), beta=0, alpha=self.softmax_scale, out=scores)
                grid = scores.view(batch, kv_heads, groups, rows, cols)  # same memory, per-head view
                if self.causal and j1 - 1 > i0 + offset:  # some query of the block must not see some key
                    last_visible = torch.arange(i0, i1, device=device)[:, None] + offset  # per query row
                    visible = torch.arange(j0, j1, device=device) <= last_visible
                    grid.masked_fill_(~visible, neg_inf)
                if mask is not None:
                    part = mask[:, :, i0:i1] if mask.shape[2] != 1 else mask
                    part = part[..., j0:j1] if part.shape[3] != 1 else part
                    # (mB, 1 or Hq, r, c) -> (mB, 1 or Hkv, 1 or G, r, c), matching `grid`
                    part = part.unsqueeze(2) if part.shape[1] == 1 else part.unflatten(1, (kv_heads, groups))
                    if part.dtype == torch.bool:
                        grid.masked_fill_(~part, neg_inf)
                    else:
                        grid.add_(part.to(dtype))

                new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
                # A row with nothing visible yet keeps max -inf; subtract 0 there so exp gives 0, not NaN.
                safe_max = new_max.masked_fill(torch.isneginf(new_max), 0.0)
                probs = scores.sub_(safe_max).exp_()  # in place: the block's scores become weights
                rescale = (row_max - safe_max).exp_()
                row_sum.mul_(rescale).add_(probs.sum(dim=-1, keepdim=True))
                acc.mul_(rescale).baddbmm_(probs, v)  # acc = acc * rescale + probs @ v
                row_max = new_max

            # Rows that saw no key have row_sum 0 and acc 0: their output is 0, as with TORCH_SDPA.
            block = acc.div_(row_sum.masked_fill_(row_sum == 0, 1.0)).view(batch, kv_heads, groups, rows, dim)
            # (B, Hkv, G, rows, D) -> the output's (B, rows, Hq, D), in one copy (and cast)
            out[:, i0:i1].unflatten(2, (kv_heads, groups)).permute(0, 2, 3, 1, 4).copy_(block)
        return out


class ChunkedBackend(AttentionBackend):
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16", "float64")
    supports_mask: ClassVar[bool] = True
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    supports_varlen: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("torch",)

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return ChunkedAttentionImpl
