"""TRTLLM_ATTN: FlashInfer's TRT-LLM ragged attention kernel, for datacenter Blackwell.

It runs on sm_100/sm_103 only, with head size 128, native GQA, packed ``cu_seqlens`` and no
attention mask (models opt into it per call site with packed, mask-free calls; the CUDA
platform lists it first in the automatic chain only then). An explicit choice anywhere else
raises: ``availability`` reports the GPU it needs.

Option blocks:

* ``quant`` (SAGE-style): ``dtype_qk`` in {int8, fp8_e4m3} (int8 on sm_100 only),
  ``q_block_size``/``k_block_size`` in {1, 4, 16} (defaults 1 and 16); V is always per-channel
  fp8. Not with causal attention.
* ``skip_softmax``: skip softmax blocks whose contribution is negligible. ``threshold`` is
  scaled by the key length; ``target_sparsity`` needs per-layer calibration
  (``impl.set_layer_calibration(a, b)``). ``disabled_until_timestep`` keeps attention dense
  while the call's ``metadata.extra["denoise_timestep"]`` (1 -> 0 over denoising) is above it.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, ClassVar

from omni_core.attention import AttentionImpl
from omni_plugin_cuda.attention import _common
from omni_plugin_cuda.attention._common import CudaAttentionBackend, CudaAttentionImpl, Packed

#: FlashInfer's TRT-LLM kernels need a zeroed scratch buffer; one per device, shared by layers
WORKSPACE_BYTES = 256 * 1024 * 1024
_WORKSPACES: dict[str, Any] = {}

SAGE_QK_DTYPES = ("int8", "fp8_e4m3")
#: quantisation needs a recent FlashInfer (trtllm_sage_attention_quantize)
SAGE_MIN_FLASHINFER = "0.6.18rc10"


def workspace(device: Any) -> Any:
    import torch

    key = str(device)
    ws = _WORKSPACES.get(key)
    if ws is None or ws.numel() < WORKSPACE_BYTES:
        ws = _WORKSPACES[key] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return ws


def ragged_attention(
    q: Any,
    k: Any,
    v: Any,
    cu_q: Any,
    cu_k: Any,
    max_q: int,
    max_k: int,
    scale: float,
    causal: bool,
    **kernel_kwargs: Any,
) -> Any:
    """``flashinfer.prefill.trtllm_ragged_attention_deepseek`` over packed ``(total, H, D)``
    tensors; returns ``(total_q, H, D)``."""
    import torch

    prefill = importlib.import_module("flashinfer.prefill")
    seq_lens = (cu_k[1:] - cu_k[:-1]).to(torch.int32).contiguous()
    return prefill.trtllm_ragged_attention_deepseek(
        query=q,
        key=k,
        value=v,
        workspace_buffer=workspace(q.device),
        seq_lens=seq_lens,
        max_q_len=max_q,
        max_kv_len=max_k,
        bmm1_scale=scale,
        bmm2_scale=1.0,
        o_sf_scale=-1.0,
        batch_size=cu_q.numel() - 1,
        window_left=-1,
        cum_seq_lens_q=cu_q,
        cum_seq_lens_kv=cu_k,
        enable_pdl=False,
        is_causal=causal,
        return_lse=False,
        **kernel_kwargs,
    )


def dense_as_packed(query: Any, key: Any, value: Any) -> tuple[Any, Any, Any, Packed]:
    """A dense ``(B, S, H, D)`` batch as one packed batch of B equal-length sequences."""
    import torch

    b, sq, hq, d = query.shape
    sk, hk = key.shape[1], key.shape[2]
    cu_q = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device=query.device)
    cu_k = torch.arange(0, (b + 1) * sk, sk, dtype=torch.int32, device=key.device)
    packed = Packed(cu_q, cu_k, list(range(0, (b + 1) * sq, sq)), list(range(0, (b + 1) * sk, sk)), sq, sk)
    return (
        query.reshape(b * sq, hq, d).contiguous(),
        key.reshape(b * sk, hk, d).contiguous(),
        value.reshape(b * sk, hk, value.shape[-1]).contiguous(),
        packed,
    )


class TrtllmAttentionImpl(CudaAttentionImpl):
    name: ClassVar[str] = "TRTLLM_ATTN"
    accepts_mask: ClassVar[bool] = False
    accepts_varlen: ClassVar[bool] = True
    #: per-layer skip-softmax calibration (a, b): factor = a * exp(b * target_sparsity)
    calibration: tuple[float, float] | None = None

    def configure(self) -> None:
        quant = self.block("quant")
        if quant is not None and self.causal:
            raise ValueError("TRTLLM_ATTN quantisation (SAGE) does not support causal attention")

    def set_layer_calibration(self, a: float, b: float) -> None:
        """Calibrated skip-softmax coefficients for this layer (needed by ``target_sparsity``)."""
        self.calibration = (float(a), float(b))

    def _skip_factor(self, max_kv_len: int, extra: dict[str, Any]) -> float | None:
        skip = self.block("skip_softmax")
        if skip is None:
            return None
        if skip.disabled_until_timestep > 0:
            timestep = extra.get("denoise_timestep")
            if timestep is None:
                raise ValueError(
                    "TRTLLM_ATTN skip_softmax.disabled_until_timestep is set, but the call passes no "
                    "metadata.extra['denoise_timestep'] (1 -> 0 over denoising); pass it or drop the option"
                )
            if float(timestep) > skip.disabled_until_timestep:
                return None  # early steps stay dense
        if skip.threshold is not None:
            return float(skip.threshold) * max_kv_len
        if self.calibration is None:
            raise RuntimeError(
                f"TRTLLM_ATTN skip_softmax.target_sparsity needs this layer's calibration ({self.prefix!r}): "
                "call set_layer_calibration(a, b), or give skip_softmax.threshold instead"
            )
        a, b = self.calibration
        return a * math.exp(b * float(skip.target_sparsity))

    def _check_gpu(self, query: Any) -> None:
        cc = _common.tensor_capability(query)
        quant = self.block("quant")
        if cc is None:
            return
        if cc not in TrtllmAttentionBackend.compute_capabilities:
            raise RuntimeError(f"TRTLLM_ATTN runs only on sm_100/sm_103, this tensor is on an {_common.sm(cc)} GPU")
        if quant is not None and quant.dtype_qk == "int8" and cc != (10, 0):
            raise ValueError(
                f"TRTLLM_ATTN int8 quantisation runs on sm_100 only (this GPU is {_common.sm(cc)}); "
                "use dtype_qk='fp8_e4m3'"
            )

    def _run(self, q: Any, k: Any, v: Any, packed: Packed, extra: dict[str, Any], out_dtype: Any) -> Any:
        kwargs: dict[str, Any] = {}
        factor = self._skip_factor(packed.max_k, extra)
        if factor is not None:
            # only when active: older FlashInfer builds lack these parameters
            kwargs.update(skip_softmax_threshold_scale_factor=factor, skip_all_rows_active_check=True)
        quant = self.block("quant")
        if quant is not None:
            flashinfer = importlib.import_module("flashinfer")
            prefill = importlib.import_module("flashinfer.prefill")
            quantize = getattr(prefill, "trtllm_sage_attention_quantize", None) or getattr(
                flashinfer, "trtllm_sage_attention_quantize", None
            )
            if quantize is None:
                raise ImportError(
                    f"TRTLLM_ATTN quantisation needs flashinfer >= {SAGE_MIN_FLASHINFER} "
                    f"(trtllm_sage_attention_quantize); installed: {getattr(flashinfer, '__version__', '?')}"
                )
            qb = quant.q_block_size or 1
            kb = quant.k_block_size or 16
            q, k, v, q_sf, k_sf, v_sf, *_ = quantize(
                q,
                k,
                v,
                q_block_size=qb,
                k_block_size=kb,
                qk_quant_dtype=_common.torch_dtype(quant.dtype_qk),
                smooth_k=True,
                cum_seq_lens_q=packed.cu_q,
                cum_seq_lens_kv=packed.cu_k,
            )
            kwargs.update(sage_attn_sfs=(q_sf, k_sf, None, v_sf), num_elts_per_sage_attn_blk=(qb, kb, 0, 1))
        out = ragged_attention(
            q, k, v, packed.cu_q, packed.cu_k, packed.max_q, packed.max_k, self.softmax_scale, self.causal, **kwargs
        )
        return out if out.dtype == out_dtype else out.to(out_dtype)

    def _dense(self, query: Any, key: Any, value: Any, mask: Any, extra: dict[str, Any]) -> Any:
        self._check_gpu(query)
        q, k, v, packed = dense_as_packed(query, key, value)
        out = self._run(q, k, v, packed, extra, query.dtype)
        return out.reshape(query.shape[0], query.shape[1], query.shape[2], value.shape[-1])

    def _varlen(self, query: Any, key: Any, value: Any, packed: Packed, extra: dict[str, Any]) -> Any:
        self._check_gpu(query)
        return self._run(query[0], key[0], value[0], packed, extra, query.dtype).unsqueeze(0)


class TrtllmAttentionBackend(CudaAttentionBackend):
    supported_head_sizes: ClassVar[tuple[int, ...]] = (128,)
    supports_mask: ClassVar[bool] = False
    supports_causal: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    supports_varlen: ClassVar[bool] = True
    required_packages: ClassVar[tuple[str, ...]] = ("torch", "flashinfer")
    install_hint: ClassVar[str] = "pip install 'omni-plugin-cuda[flashinfer]'"
    compute_capabilities: ClassVar[tuple[tuple[int, int], ...]] = ((10, 0), (10, 3))
    supported_options: ClassVar[frozenset[str]] = frozenset({"quant", "skip_softmax"})

    @classmethod
    def check_option_values(cls, spec: Any) -> None:
        quant = spec.quant
        if quant is None:
            return
        if quant.dtype_qk not in SAGE_QK_DTYPES:
            hint = " (float16/bfloat16 with dtype_vo is FLASHINFER_ATTN's quantisation)" if quant.dtype_qk else ""
            raise ValueError(
                f"TRTLLM_ATTN quant.dtype_qk must be one of {', '.join(SAGE_QK_DTYPES)}, not {quant.dtype_qk!r}{hint}"
            )
        if quant.dtype_vo not in (None, "fp8_e4m3"):
            raise ValueError(
                f"TRTLLM_ATTN quantises V to per-channel fp8_e4m3 always; quant.dtype_vo={quant.dtype_vo!r} "
                "cannot be honoured (leave it out)"
            )

    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return TrtllmAttentionImpl
