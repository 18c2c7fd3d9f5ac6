"""ROCM_AITER_FA: AMD AITER's flash attention behind omni's attention contract.

The rocm platform serves the shared name ``FLASH_ATTN`` with it. It calls
``aiter.flash_attn_func`` for dense batches and ``aiter.flash_attn_varlen_func`` for packed
variable-length batches (``cu_seqlens_q/k`` in ``metadata.extra``). Both take the
``(batch, seq, heads, head_dim)`` layout omni uses (packed: ``(total, heads, head_dim)``),
grouped-query attention natively, and align causal masks to the end, as omni does.

What it does not do, it declares: no attention masks (the selector passes it over for roles
that need one), float16/bfloat16 only, head sizes up to 256, and only on gfx942 (MI300) and
gfx950 (MI350); availability asks the platform for the GPU architecture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from omni_core.attention import AttentionBackend, AttentionImpl, AttentionMetadata, Availability

if TYPE_CHECKING:
    from omni_core.platforms import Platform


def _first(out: Any) -> Any:
    """AITER returns the output alone or ``(out, lse, ...)`` depending on version and flags."""
    return out[0] if isinstance(out, (tuple, list)) else out


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


class RocmAiterFlashAttentionImpl(AttentionImpl):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        softmax_scale: float | None = None,
        causal: bool = False,
        num_kv_heads: int | None = None,
        prefix: str = "",
    ) -> None:
        limit = RocmAiterFlashAttentionBackend.max_head_size
        if head_size > limit:
            raise ValueError(f"ROCM_AITER_FA supports head sizes up to {limit}, not {head_size}")
        super().__init__(num_heads, head_size, softmax_scale, causal, num_kv_heads, prefix)

    def forward(self, query: Any, key: Any, value: Any, metadata: AttentionMetadata | None = None) -> Any:
        extra = metadata.extra if metadata is not None else {}
        mask = metadata.attn_mask if metadata is not None else None
        if mask is not None:
            raise ValueError(
                "ROCM_AITER_FA does not take attention masks; use TORCH_SDPA for roles that pass attn_mask "
                "(or pack the batch and pass cu_seqlens_q/k instead of a padding mask)"
            )
        dtype = _dtype_name(query)
        if dtype not in RocmAiterFlashAttentionBackend.supported_dtypes:
            raise ValueError(
                f"ROCM_AITER_FA computes in {'/'.join(RocmAiterFlashAttentionBackend.supported_dtypes)}, "
                f"not {dtype}; cast q/k/v or use TORCH_SDPA"
            )
        import aiter

        if extra.get("cu_seqlens_q") is not None:
            return self._varlen(aiter, query, key, value, extra)
        out = aiter.flash_attn_func(
            query, key, value, dropout_p=0.0, softmax_scale=self.softmax_scale, causal=self.causal
        )
        return _first(out)

    def _varlen(self, aiter: Any, query: Any, key: Any, value: Any, extra: dict[str, Any]) -> Any:
        import torch

        if query.shape[0] != 1 or key.shape[0] != 1:
            raise ValueError("variable-length attention takes packed inputs of batch 1: (1, total, heads, dim)")
        cu_q = torch.as_tensor(extra["cu_seqlens_q"], dtype=torch.int32, device=query.device)
        cu_k_given = extra.get("cu_seqlens_k")
        cu_k = cu_q if cu_k_given is None else torch.as_tensor(cu_k_given, dtype=torch.int32, device=query.device)
        if cu_q.shape != cu_k.shape:
            raise ValueError("cu_seqlens_q and cu_seqlens_k must describe the same number of sequences")
        max_q = extra.get("max_seqlen_q")
        max_k = extra.get("max_seqlen_k")
        if max_q is None:  # reading the offsets costs a device sync; callers that know pass it
            max_q = int((cu_q[1:] - cu_q[:-1]).max())
        if max_k is None:
            max_k = max_q if cu_k_given is None else int((cu_k[1:] - cu_k[:-1]).max())
        out = aiter.flash_attn_varlen_func(
            query[0],
            key[0],
            value[0],
            cu_q,
            cu_k,
            int(max_q),
            int(max_k),
            dropout_p=0.0,
            softmax_scale=self.softmax_scale,
            causal=self.causal,
        )
        return _first(out).unsqueeze(0)


class RocmAiterFlashAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16")
    supports_mask: ClassVar[bool] = False
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    supports_varlen: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("aiter",)
    #: GPU architectures AITER's flash attention kernels are built and validated for
    supported_archs: ClassVar[tuple[str, ...]] = ("gfx942", "gfx950")
    #: the largest head size the CK flash-attention kernels take
    max_head_size: ClassVar[int] = 256

    @classmethod
    def availability(cls, platform: Platform) -> Availability:
        base = super().availability(platform)
        if not base.ok:
            return base
        gcn_arch = getattr(platform, "gcn_arch", None)
        if not callable(gcn_arch):
            return Availability(
                False, f"needs an AMD GPU (the rocm platform); {platform.name} reports no GPU architecture"
            )
        arch = str(gcn_arch())
        if arch not in cls.supported_archs:
            return Availability(
                False, f"AITER flash attention runs on {'/'.join(cls.supported_archs)} (MI300/MI350), not {arch}"
            )
        return Availability(True, f"aiter installed, {arch}")

    @classmethod
    def unsupported_reason(
        cls,
        *,
        head_size: int | None = None,
        dtype: str | None = None,
        causal: bool = False,
        mask: bool = False,
        varlen: bool = False,
        gqa: bool = False,
    ) -> str | None:
        if head_size is not None and head_size > cls.max_head_size:
            return f"head size {head_size} is above {cls.max_head_size}"
        return super().unsupported_reason(
            head_size=head_size, dtype=dtype, causal=causal, mask=mask, varlen=varlen, gqa=gqa
        )

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return RocmAiterFlashAttentionImpl
