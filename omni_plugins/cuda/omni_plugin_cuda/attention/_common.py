"""What the CUDA attention backends share: availability on CUDA, call validation and the
small tensor helpers every kernel wrapper needs.

Nothing here imports torch or a kernel package at module level: backend classes are loaded
to answer questions (``omni explain attention``) on machines that may have neither.
"""

from __future__ import annotations

import abc
import importlib.util
import sys
from itertools import pairwise
from typing import Any, ClassVar

from omni_core.attention import AttentionBackend, AttentionImpl, AttentionMetadata, Availability
from omni_core.platforms import Platform

#: torch dtypes by the names option blocks use
QUANT_DTYPES = {
    "float16": "float16",
    "bfloat16": "bfloat16",
    "fp8_e4m3": "float8_e4m3fn",
    "int8": "int8",
}


def installed(module: str) -> bool:
    """Whether the top-level import name ``module`` is importable, without importing it."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def hip_build() -> str | None:
    """The HIP version when the installed torch is a ROCm build (None for CUDA builds, and
    when torch is not installed)."""
    if not installed("torch"):
        return None
    import torch

    return getattr(torch.version, "hip", None)


def sm(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def tensor_capability(tensor: Any) -> tuple[int, int] | None:
    """The compute capability of the GPU ``tensor`` lives on; None for a tensor off CUDA."""
    if not getattr(tensor, "is_cuda", False):
        return None
    import torch

    major, minor = torch.cuda.get_device_capability(tensor.device)
    return (int(major), int(minor))


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, QUANT_DTYPES.get(name, name))


def end_aligned_causal(sq: int, sk: int, device: Any) -> Any:
    """Boolean keep-mask of causal attention aligned to the end: query ``i`` sees keys
    ``0 .. i + (sk - sq)``, so the last query sees every key."""
    import torch

    return torch.ones(sq, sk, dtype=torch.bool, device=device).tril(diagonal=sk - sq)


def first_tensor(result: Any) -> Any:
    """Kernels that return ``(out, lse)`` in some versions and ``out`` in others."""
    return result[0] if isinstance(result, (tuple, list)) else result


class CudaAttentionBackend(AttentionBackend):
    """Base of the CUDA backends: availability checks the device type, then the GPU's compute
    capability, then the packages (so the most fundamental reason is the one reported)."""

    supported_dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16")
    #: any one of these import names will do (e.g. FA3's ``flash_attn_interface`` or FA2)
    alternative_packages: ClassVar[tuple[str, ...]] = ()
    #: how to install the kernel, appended to "not installed" reasons
    install_hint: ClassVar[str] = ""
    #: exact compute capabilities it runs on; empty means any within the min/max bounds
    compute_capabilities: ClassVar[tuple[tuple[int, int], ...]] = ()

    @classmethod
    def availability(cls, platform: Platform) -> Availability:
        if platform.device_type not in cls.device_types:
            return Availability(False, f"runs on {'/'.join(cls.device_types)}, not {platform.device_type}")
        hip = hip_build()
        if hip:
            # ROCm builds of torch drive AMD GPUs as device type "cuda" too
            return Availability(False, f"needs NVIDIA CUDA; this torch is a ROCm (HIP {hip}) build")
        if cls.compute_capabilities or cls.min_compute_capability or cls.max_compute_capability:
            cc = platform.compute_capability()
            if cc is None:
                return Availability(False, f"needs a CUDA GPU; {platform.name} reports none")
            if cls.compute_capabilities and cc not in cls.compute_capabilities:
                wanted = "/".join(sm(c) for c in cls.compute_capabilities)
                return Availability(False, f"runs only on {wanted}, this GPU is {sm(cc)}")
            low, high = cls.min_compute_capability, cls.max_compute_capability
            if low and cc < low:
                return Availability(False, f"needs compute capability >= {low[0]}.{low[1]}, this GPU is {sm(cc)}")
            if high and cc > high:
                return Availability(False, f"needs compute capability <= {high[0]}.{high[1]}, this GPU is {sm(cc)}")
        hint = f"; {cls.install_hint}" if cls.install_hint else ""
        missing = [p for p in cls.required_packages if not installed(p)]
        if missing:
            return Availability(False, f"package(s) not installed: {', '.join(missing)}{hint}")
        if cls.alternative_packages and not any(installed(p) for p in cls.alternative_packages):
            return Availability(False, f"none of {', '.join(cls.alternative_packages)} is installed{hint}")
        return cls.more_availability(platform)

    @classmethod
    def more_availability(cls, platform: Platform) -> Availability:
        """Backend-specific checks after the common ones (override where needed)."""
        return Availability(True, "available")

    @classmethod
    def create(
        cls,
        num_heads: int,
        head_size: int,
        softmax_scale: float | None = None,
        causal: bool = False,
        num_kv_heads: int | None = None,
        prefix: str = "",
        options: Any = None,
    ) -> AttentionImpl:
        impl = super().create(num_heads, head_size, softmax_scale, causal, num_kv_heads, prefix, options=options)
        if isinstance(impl, CudaAttentionImpl):
            impl.configure()
        return impl


class CudaAttentionImpl(AttentionImpl):
    """Validates the call against the contract, then runs ``_dense`` or ``_varlen``.

    Subclasses set ``name`` and what they accept, and implement the kernel calls on tensors
    in the ``(batch, seq, heads, head_dim)`` layout.
    """

    name: ClassVar[str] = ""
    accepts_mask: ClassVar[bool] = False
    accepts_varlen: ClassVar[bool] = False

    def configure(self) -> None:
        """Check the option blocks and layer parameters once, when the layer is built.
        Raise ``ValueError`` for a combination the kernel cannot run."""

    def block(self, name: str) -> Any:
        """The option block ``name`` of this layer's spec, or None."""
        return getattr(self.options, name, None) if self.options is not None else None

    def forward(self, query: Any, key: Any, value: Any, metadata: AttentionMetadata | None = None) -> Any:
        mask = metadata.attn_mask if metadata is not None else None
        extra = metadata.extra if metadata is not None else {}
        self._check_layout(query, key, value)
        if mask is not None and not self.accepts_mask:
            raise ValueError(
                f"{self.name} does not support attention masks; choose a mask-capable backend "
                "(CUDNN_ATTN or TORCH_SDPA) for this role"
            )
        packed = varlen_bounds(self.name, query, key, mask, extra)
        if packed is not None:
            if not self.accepts_varlen:
                raise ValueError(f"{self.name} does not support variable-length batches (cu_seqlens)")
            return self._varlen(query, key, value, packed, extra)
        return self._dense(query, key, value, mask, extra)

    def _check_layout(self, query: Any, key: Any, value: Any) -> None:
        if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
            raise ValueError(f"{self.name} takes (batch, seq, heads, head_dim) tensors")
        if key.shape[:3] != value.shape[:3] or query.shape[0] != key.shape[0]:
            raise ValueError(
                f"{self.name}: key {tuple(key.shape)} and value {tuple(value.shape)} must match query "
                f"{tuple(query.shape)} in batch, and each other in seq and heads"
            )
        if query.shape[-1] != self.head_size or key.shape[-1] != self.head_size:
            raise ValueError(f"{self.name} was built for head size {self.head_size}, got {query.shape[-1]}")
        if query.shape[2] % key.shape[2]:
            raise ValueError(f"query heads ({query.shape[2]}) must be a multiple of key heads ({key.shape[2]})")

    @abc.abstractmethod
    def _dense(self, query: Any, key: Any, value: Any, mask: Any, extra: dict[str, Any]) -> Any:
        """One kernel call over (batch, seq, heads, head_dim) tensors."""

    def _varlen(self, query: Any, key: Any, value: Any, packed: Packed, extra: dict[str, Any]) -> Any:
        """Packed variable-length batches; only backends declaring ``supports_varlen`` get here."""
        raise ValueError(f"{self.name} does not take variable-length batches (cu_seqlens); use TORCH_SDPA")


class Packed:
    """A variable-length batch: ``cu_seqlens`` on the tensors' device (int32) and on the host."""

    def __init__(self, cu_q: Any, cu_k: Any, bounds_q: list[int], bounds_k: list[int], max_q: int, max_k: int):
        self.cu_q, self.cu_k = cu_q, cu_k
        self.bounds_q, self.bounds_k = bounds_q, bounds_k
        self.max_q, self.max_k = max_q, max_k

    def segments(self) -> list[tuple[slice, slice]]:
        return [
            (slice(self.bounds_q[i], self.bounds_q[i + 1]), slice(self.bounds_k[i], self.bounds_k[i + 1]))
            for i in range(len(self.bounds_q) - 1)
        ]

    @property
    def count(self) -> int:
        return len(self.bounds_q) - 1


def varlen_bounds(name: str, query: Any, key: Any, mask: Any, extra: dict[str, Any]) -> Packed | None:
    """The packed batch described by ``extra`` (``cu_seqlens_q``/``_k``, optional
    ``max_seqlen_q``/``_k``), or None for a dense call. Packed inputs are ``(1, total, H, D)``;
    ``cu_seqlens_k`` defaults to ``cu_seqlens_q``."""
    cu_q, cu_k = extra.get("cu_seqlens_q"), extra.get("cu_seqlens_k")
    if cu_q is None:
        if cu_k is not None:
            raise ValueError(f"{name}: cu_seqlens_k was given without cu_seqlens_q")
        return None
    if query.shape[0] != 1:
        raise ValueError("variable-length attention takes packed inputs of batch 1: (1, total, heads, dim)")
    if mask is not None:
        raise ValueError("pass either cu_seqlens (variable length) or attn_mask, not both")
    import torch

    cu_k = cu_q if cu_k is None else cu_k
    dev_q = torch.as_tensor(cu_q).to(device=query.device, dtype=torch.int32).contiguous()
    dev_k = torch.as_tensor(cu_k).to(device=key.device, dtype=torch.int32).contiguous()
    bounds_q, bounds_k = [int(x) for x in dev_q.tolist()], [int(x) for x in dev_k.tolist()]
    if len(bounds_q) != len(bounds_k) or len(bounds_q) < 2:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must describe the same number (>= 1) of sequences")
    if bounds_q[0] != 0 or bounds_k[0] != 0 or any(b < a for a, b in pairwise(bounds_q)):
        raise ValueError("cu_seqlens must start at 0 and never decrease")
    if any(b < a for a, b in pairwise(bounds_k)):
        raise ValueError("cu_seqlens must start at 0 and never decrease")
    if bounds_q[-1] != query.shape[1] or bounds_k[-1] != key.shape[1]:
        raise ValueError(
            f"cu_seqlens must cover the packed tensors: they end at {bounds_q[-1]} (q) and {bounds_k[-1]} (k), "
            f"the tensors hold {query.shape[1]} and {key.shape[1]} tokens"
        )
    lengths_q = [b - a for a, b in pairwise(bounds_q)]
    lengths_k = [b - a for a, b in pairwise(bounds_k)]
    max_q = int(extra.get("max_seqlen_q") or max(lengths_q))
    max_k = int(extra.get("max_seqlen_k") or max(lengths_k))
    if max_q < max(lengths_q) or max_k < max(lengths_k):
        raise ValueError("max_seqlen_q/max_seqlen_k are smaller than the longest sequence in cu_seqlens")
    return Packed(dev_q, dev_k, bounds_q, bounds_k, max_q, max_k)


def keep_mask(name: str, mask: Any, batch: int, sq: int, sk: int) -> Any:
    """A boolean keep-mask ``(batch, sq, sk)`` shared by all heads, from a boolean mask or an
    additive one that only holds 0 and -inf. Masks that differ per head, or additive biases,
    raise: kernels with a boolean custom-mask input cannot honour them."""
    import torch

    m = mask
    if m.dtype != torch.bool:
        finite_zero = m == 0
        if not bool((finite_zero | torch.isneginf(m)).all()):
            raise ValueError(
                f"{name} takes boolean masks (or additive ones of only 0/-inf); this additive bias needs "
                "CUDNN_ATTN or TORCH_SDPA"
            )
        m = finite_zero
    while m.dim() < 4:
        m = m.unsqueeze(0)
    if m.dim() != 4:
        raise ValueError(f"{name}: attn_mask must broadcast to (batch, heads, seq_q, seq_k)")
    if m.shape[1] != 1:
        if not bool((m == m[:, :1]).all()):
            raise ValueError(f"{name} applies one mask to every head; this mask differs per head (use CUDNN_ATTN)")
        m = m[:, :1]
    try:
        return m[:, 0].expand(batch, sq, sk)
    except RuntimeError as exc:
        shape = tuple(mask.shape)
        raise ValueError(f"{name}: attn_mask {shape} does not broadcast to ({batch}, H, {sq}, {sk})") from exc
