"""FLASHINFER_ATTN: FlashInfer's prefill kernels behind omni's attention contract.

* Dense calls run ``flashinfer.single_prefill_with_kv_cache`` once per batch element on
  ``(seq, heads, head_dim)`` ("NHD") tensors; GQA is native and causal attention is aligned
  to the end (bottom-right) like omni's.
* Masks go in as FlashInfer's boolean ``custom_mask`` (one per batch element, shared by all
  heads); an additive mask is accepted when it only holds 0 and -inf. With a mask the causal
  part is folded into it. Per-head masks and true additive biases raise (CUDNN_ATTN takes them).
* Variable-length batches run one prefill per sequence.
* The ``quant`` block (``dtype_qk`` in {float16, bfloat16}, ``dtype_vo`` e.g. fp8_e4m3: QK16/V8)
  runs FlashInfer's TRT-LLM ragged kernel, which takes mixed Q/K and V dtypes: head size 128
  on sm_100/sm_103 only, without masks. FlashInfer >= 0.6.16rc1 is needed for mixed dtypes.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from omni_core.attention import AttentionImpl
from omni_plugin_cuda.attention import _common
from omni_plugin_cuda.attention._common import CudaAttentionBackend, CudaAttentionImpl, Packed

QK_DTYPES = ("float16", "bfloat16")
VO_DTYPES = ("float16", "bfloat16", "fp8_e4m3")
QUANT_HEAD_SIZE = 128
QUANT_CAPABILITIES = ((10, 0), (10, 3))


class FlashInferImpl(CudaAttentionImpl):
    name: ClassVar[str] = "FLASHINFER_ATTN"
    accepts_mask: ClassVar[bool] = True
    accepts_varlen: ClassVar[bool] = True

    def configure(self) -> None:
        if self.block("quant") is not None and self.head_size != QUANT_HEAD_SIZE:
            raise ValueError(
                "FLASHINFER_ATTN quantisation runs FlashInfer's TRT-LLM ragged kernel, which needs head size "
                f"{QUANT_HEAD_SIZE} (on sm_100/sm_103); this layer has head size {self.head_size}"
            )

    def _prefill(self, q: Any, k: Any, v: Any, keep: Any = None) -> Any:
        flashinfer = importlib.import_module("flashinfer")
        kwargs: dict[str, Any] = {"kv_layout": "NHD", "sm_scale": self.softmax_scale, "causal": self.causal}
        if keep is not None:
            kwargs["custom_mask"] = keep
            kwargs["causal"] = False  # folded into the mask
        return flashinfer.single_prefill_with_kv_cache(q, k, v, **kwargs)

    def _dense(self, query: Any, key: Any, value: Any, mask: Any, extra: dict[str, Any]) -> Any:
        import torch

        if self.block("quant") is not None:
            if mask is not None:
                raise ValueError("FLASHINFER_ATTN quantisation takes no attention mask")
            return self._quantized_dense(query, key, value)
        batch, sq, sk = query.shape[0], query.shape[1], key.shape[1]
        keep = None
        if mask is not None:
            keep = _common.keep_mask(self.name, mask, batch, sq, sk).to(query.device)
            if self.causal:
                keep = keep & _common.end_aligned_causal(sq, sk, query.device)
        outs = [
            self._prefill(query[b], key[b], value[b], None if keep is None else keep[b].contiguous())
            for b in range(batch)
        ]
        return torch.stack(outs, dim=0)

    def _varlen(self, query: Any, key: Any, value: Any, packed: Packed, extra: dict[str, Any]) -> Any:
        import torch

        if self.block("quant") is not None:
            return self._quantized(query[0], key[0], value[0], packed, query).unsqueeze(0)
        pieces = [self._prefill(query[0, sq], key[0, sk], value[0, sk]) for sq, sk in packed.segments()]
        return torch.cat(pieces, dim=0).unsqueeze(0)

    def _quantized_dense(self, query: Any, key: Any, value: Any) -> Any:
        from omni_plugin_cuda.attention.trtllm import dense_as_packed

        q, k, v, packed = dense_as_packed(query, key, value)
        out = self._quantized(q, k, v, packed, query)
        return out.reshape(query.shape[0], query.shape[1], query.shape[2], value.shape[-1])

    def _quantized(self, q: Any, k: Any, v: Any, packed: Packed, like: Any) -> Any:
        from omni_plugin_cuda.attention.trtllm import ragged_attention

        cc = _common.tensor_capability(like)
        if cc is not None and cc not in QUANT_CAPABILITIES:
            raise RuntimeError(
                f"FLASHINFER_ATTN quantisation runs on sm_100/sm_103 only, this tensor is on an {_common.sm(cc)} GPU"
            )
        quant = self.block("quant")
        dtype_qk = _common.torch_dtype(quant.dtype_qk) if quant.dtype_qk else q.dtype
        dtype_vo = _common.torch_dtype(quant.dtype_vo) if quant.dtype_vo else dtype_qk
        out = ragged_attention(
            q.to(dtype_qk),
            k.to(dtype_qk),
            v.to(dtype_vo),
            packed.cu_q,
            packed.cu_k,
            packed.max_q,
            packed.max_k,
            self.softmax_scale,
            self.causal,
        )
        return out if out.dtype == like.dtype else out.to(like.dtype)


class FlashInferBackend(CudaAttentionBackend):
    #: the head sizes FlashInfer's prefill kernels are built and tested for
    supported_head_sizes: ClassVar[tuple[int, ...]] = (64, 128, 256)
    supports_mask: ClassVar[bool] = True
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    supports_varlen: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("torch", "flashinfer")
    install_hint: ClassVar[str] = "pip install 'omni-plugin-cuda[flashinfer]'"
    min_compute_capability: ClassVar[tuple[int, int] | None] = (8, 0)
    supported_options: ClassVar[frozenset[str]] = frozenset({"quant"})

    @classmethod
    def check_option_values(cls, spec: Any) -> None:
        quant = spec.quant
        if quant is None:
            return
        if quant.dtype_qk is None and quant.dtype_vo is None:
            raise ValueError("FLASHINFER_ATTN quant needs dtype_qk and/or dtype_vo")
        if quant.dtype_qk is not None and quant.dtype_qk not in QK_DTYPES:
            sage = quant.dtype_qk in ("int8", "fp8_e4m3")
            hint = " (int8/fp8_e4m3 Q/K is TRTLLM_ATTN's SAGE quantisation)" if sage else ""
            raise ValueError(
                f"FLASHINFER_ATTN quant.dtype_qk must be one of {', '.join(QK_DTYPES)}, not {quant.dtype_qk!r}{hint}"
            )
        if quant.dtype_vo is not None and quant.dtype_vo not in VO_DTYPES:
            raise ValueError(
                f"FLASHINFER_ATTN quant.dtype_vo must be one of {', '.join(VO_DTYPES)}, not {quant.dtype_vo!r}"
            )
        if quant.q_block_size is not None or quant.k_block_size is not None:
            raise ValueError(
                "FLASHINFER_ATTN quant takes no q_block_size/k_block_size: block sizes belong to "
                "TRTLLM_ATTN's SAGE quantisation"
            )

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return FlashInferImpl
