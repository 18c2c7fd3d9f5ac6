"""FLASH_ATTN: FlashAttention behind omni's attention contract.

One name, several kernel generations; the one used is picked per GPU on the first call:

* Blackwell (sm_100 and later): FA4, the CuTe kernels in ``flash_attn.cute``, else FA2.
  FA3 wheels ship Hopper kernels only.
* Hopper (sm_90): FA3 (``flash_attn_interface``), else FA2, else FA4.
* Ampere / Ada (sm_80 .. sm_89): FA2 (``flash_attn``), else FA3.
* Tensors not on a GPU (tests with stand-in kernels): FA3, else FA2.

All of them take ``(batch, seq, heads, head_dim)``, support GQA/MQA natively, align causal
attention to the end (bottom-right) like omni, and take packed variable-length batches as
``(total, heads, head_dim)`` with int32 ``cu_seqlens``. None takes an attention mask, so the
backend declares no mask support: automatic selection passes it over for masked calls and
an explicit choice for a masked call is rejected.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from omni_core.attention import AttentionImpl, Availability
from omni_core.platforms import Platform
from omni_plugin_cuda.attention import _common
from omni_plugin_cuda.attention._common import CudaAttentionBackend, CudaAttentionImpl, Packed

#: kernel generation -> module that exports flash_attn_func / flash_attn_varlen_func
KERNEL_MODULES = {"fa4": "flash_attn.cute", "fa3": "flash_attn_interface", "fa2": "flash_attn"}


def kernel_order(capability: tuple[int, int] | None) -> tuple[str, ...]:
    """Kernel generations to try, best first, for a GPU of ``capability``."""
    if capability is None:
        return ("fa3", "fa2")
    if capability[0] >= 10:
        return ("fa4", "fa2")
    if capability[0] == 9:
        return ("fa3", "fa2", "fa4")
    return ("fa2", "fa3")


def load_kernels(capability: tuple[int, int] | None) -> tuple[str, Any, Any]:
    """``(generation, flash_attn_func, flash_attn_varlen_func)`` of the best importable kernel."""
    tried = []
    for generation in kernel_order(capability):
        module_name = KERNEL_MODULES[generation]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            tried.append(f"{module_name} ({type(exc).__name__}: {exc})")
            continue
        dense, varlen = getattr(module, "flash_attn_func", None), getattr(module, "flash_attn_varlen_func", None)
        if dense is None or varlen is None:
            tried.append(f"{module_name} (no flash_attn_func/flash_attn_varlen_func)")
            continue
        return generation, dense, varlen
    where = _common.sm(capability) if capability else "this device"
    raise ImportError(
        f"FLASH_ATTN found no FlashAttention kernel usable on {where}; tried {'; '.join(tried)}. "
        "Install one: pip install 'omni-plugin-cuda[flash-attn]' (FA2), FA3 from the flash-attention "
        "hopper/ directory, or flash-attn-4 on Blackwell"
    )


class FlashAttentionImpl(CudaAttentionImpl):
    name: ClassVar[str] = "FLASH_ATTN"
    accepts_mask: ClassVar[bool] = False
    accepts_varlen: ClassVar[bool] = True
    #: the kernel generation in use ("fa2", "fa3", "fa4"), known after the first call
    kernel: str | None = None
    _dense_fn: Any = None
    _varlen_fn: Any = None

    def _kernels(self, query: Any) -> tuple[Any, Any]:
        if self._dense_fn is None:
            self.kernel, self._dense_fn, self._varlen_fn = load_kernels(_common.tensor_capability(query))
        return self._dense_fn, self._varlen_fn

    def _dense(self, query: Any, key: Any, value: Any, mask: Any, extra: dict[str, Any]) -> Any:
        dense, _ = self._kernels(query)
        out = dense(query, key, value, softmax_scale=self.softmax_scale, causal=self.causal)
        return _common.first_tensor(out)

    def _varlen(self, query: Any, key: Any, value: Any, packed: Packed, extra: dict[str, Any]) -> Any:
        _, varlen = self._kernels(query)
        out = varlen(
            query[0],
            key[0],
            value[0],
            cu_seqlens_q=packed.cu_q,
            cu_seqlens_k=packed.cu_k,
            max_seqlen_q=packed.max_q,
            max_seqlen_k=packed.max_k,
            softmax_scale=self.softmax_scale,
            causal=self.causal,
        )
        return _common.first_tensor(out).unsqueeze(0)


class FlashAttentionBackend(CudaAttentionBackend):
    #: every multiple of 8 up to 256 (FA2 pads other sizes itself; FA3/FA4 need multiples of 8)
    supported_head_sizes: ClassVar[tuple[int, ...]] = tuple(range(8, 257, 8))
    supports_mask: ClassVar[bool] = False
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    supports_varlen: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("torch",)
    alternative_packages: ClassVar[tuple[str, ...]] = ("flash_attn_interface", "flash_attn")
    install_hint: ClassVar[str] = "pip install 'omni-plugin-cuda[flash-attn]' (or flash-attn-4 on Blackwell)"
    min_compute_capability: ClassVar[tuple[int, int] | None] = (8, 0)

    @classmethod
    def more_availability(cls, platform: Platform) -> Availability:
        cc = platform.compute_capability()
        if cc is not None and cc[0] >= 10 and not _common.installed("flash_attn"):
            return Availability(
                False,
                f"on {_common.sm(cc)} FLASH_ATTN needs flash-attn (FA4's flash_attn.cute, or FA2): the installed "
                "flash_attn_interface (FA3) ships Hopper kernels only",
            )
        return Availability(True, "available")

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return FlashAttentionImpl
