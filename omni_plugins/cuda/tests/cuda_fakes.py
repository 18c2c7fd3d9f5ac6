"""Stand-ins for the CUDA kernel packages, for tests on machines without a GPU.

Each fake keeps the real function's name, signature and tensor layout, checks its inputs the
way the real kernel does (layout, dtype, int32 ``cu_seqlens``, GQA head grouping), computes
attention with plain torch math on the CPU, and records its calls. A backend that passed the
wrong layout, dropped the scale or mis-aligned causal attention therefore produces a wrong
answer against the tests' float64 reference, exactly as it would on the GPU.

Install them with ``monkeypatch.setitem(sys.modules, name, module)`` (see ``conftest.py``).
"""

from __future__ import annotations

import importlib.machinery
import types
from typing import Any

import torch

HALF = (torch.float16, torch.bfloat16)


def module(name: str, *, package: bool = False, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        mod.__path__ = []
    mod.calls = []
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


def attend(q: Any, k: Any, v: Any, scale: float, causal: bool, keep: Any = None) -> Any:
    """Attention the way the vendor kernels define it, on ``(seq, heads, dim)`` tensors in
    float32: query head ``h`` reads key/value head ``h // (Hq / Hkv)``; causal attention is
    aligned to the bottom-right; ``keep`` is a boolean ``(seq_q, seq_k)`` mask. The math is the
    conformance kit's reference."""
    from omni_core.testing import reference_attention

    assert q.shape[1] % k.shape[1] == 0, f"query heads {q.shape[1]} not a multiple of kv heads {k.shape[1]}"
    mask = None if keep is None else keep.to(torch.bool)
    return reference_attention(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), scale, causal, mask, dtype=torch.float32
    )[0]


def _check_cu(cu: Any, total: int, name: str) -> list[int]:
    assert isinstance(cu, torch.Tensor) and cu.dtype == torch.int32, f"{name} must be an int32 tensor"
    assert cu.dim() == 1 and cu.stride(0) == 1, f"{name} must be contiguous 1-D"
    bounds = cu.tolist()
    assert bounds[0] == 0 and bounds[-1] == total, f"{name} {bounds} does not cover {total} tokens"
    return bounds


def _packed(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal) -> Any:  # type: ignore[no-untyped-def]
    assert q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "varlen kernels take (total, heads, dim)"
    bq, bk = _check_cu(cu_q, q.shape[0], "cu_seqlens_q"), _check_cu(cu_k, k.shape[0], "cu_seqlens_k")
    assert len(bq) == len(bk)
    assert isinstance(max_q, int) and isinstance(max_k, int)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float32)
    for i in range(len(bq) - 1):
        assert bq[i + 1] - bq[i] <= max_q and bk[i + 1] - bk[i] <= max_k
        out[bq[i] : bq[i + 1]] = attend(q[bq[i] : bq[i + 1]], k[bk[i] : bk[i + 1]], v[bk[i] : bk[i + 1]], scale, causal)
    return out


def _check_bshd(q: Any, k: Any, v: Any) -> None:
    assert q.dim() == 4 and k.dim() == 4 and v.dim() == 4, "(batch, seq, heads, dim) tensors expected"
    assert q.dtype in HALF and q.dtype == k.dtype == v.dtype, "inputs must be float16 or bfloat16, all the same"
    assert q.shape[0] == k.shape[0] and k.shape == v.shape and q.shape[-1] == k.shape[-1]
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1, "last dimension must be contiguous"


# --- flash-attn -------------------------------------------------------------------------------


def flash_attn_modules() -> dict[str, types.ModuleType]:
    """FA2 as ``flash_attn``: returns the output tensor."""
    mod = module("flash_attn", package=True, __version__="2.8.3")

    def flash_attn_func(
        q,
        k,
        v,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
    ):  # type: ignore[no-untyped-def]
        _check_bshd(q, k, v)
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        mod.calls.append({"fn": "flash_attn_func", "scale": softmax_scale, "causal": causal, "shape": tuple(q.shape)})
        out = torch.stack([attend(q[b], k[b], v[b], scale, causal) for b in range(q.shape[0])])
        return out.to(q.dtype)

    def flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
        block_table=None,
    ):  # type: ignore[no-untyped-def]
        assert q.dtype in HALF
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        mod.calls.append({"fn": "flash_attn_varlen_func", "scale": softmax_scale, "causal": causal})
        out = _packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal)
        return out.to(q.dtype)

    mod.flash_attn_func, mod.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    return {"flash_attn": mod}


def flash_attn_3_modules() -> dict[str, types.ModuleType]:
    """FA3 as ``flash_attn_interface``: returns ``(out, softmax_lse)`` like its older releases."""
    mod = module("flash_attn_interface")

    def flash_attn_func(
        q,
        k,
        v,
        softmax_scale=None,
        causal=False,
        qv=None,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        window_size=(-1, -1),
        softcap=0.0,
        num_splits=1,
        pack_gqa=None,
        deterministic=False,
        sm_margin=0,
    ):  # type: ignore[no-untyped-def]
        _check_bshd(q, k, v)
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        mod.calls.append({"fn": "flash_attn_func", "scale": softmax_scale, "causal": causal})
        out = torch.stack([attend(q[b], k[b], v[b], scale, causal) for b in range(q.shape[0])]).to(q.dtype)
        return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    def flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        seqused_q=None,
        seqused_k=None,
        softmax_scale=None,
        causal=False,
        qv=None,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        window_size=(-1, -1),
        softcap=0.0,
        num_splits=1,
        pack_gqa=None,
        deterministic=False,
        sm_margin=0,
    ):  # type: ignore[no-untyped-def]
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        mod.calls.append({"fn": "flash_attn_varlen_func", "scale": softmax_scale, "causal": causal})
        out = _packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal)
        return out.to(q.dtype), torch.zeros(q.shape[1], q.shape[0])

    mod.flash_attn_func, mod.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    return {"flash_attn_interface": mod}


def flash_attn_4_modules() -> dict[str, types.ModuleType]:
    """FA4 (CuTe) as ``flash_attn.cute`` next to FA2; keyword-only after q, k, v; returns (out, lse)."""
    mods = flash_attn_modules()
    cute = module("flash_attn.cute", package=True)

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), **kwargs):  # type: ignore[no-untyped-def]
        _check_bshd(q, k, v)
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        cute.calls.append({"fn": "flash_attn_func", "scale": softmax_scale, "causal": causal})
        out = torch.stack([attend(q[b], k[b], v[b], scale, causal) for b in range(q.shape[0])]).to(q.dtype)
        return out, None

    def flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        max_seqlen_q=None,
        max_seqlen_k=None,
        seqused_q=None,
        seqused_k=None,
        page_table=None,
        softmax_scale=None,
        causal=False,
        **kwargs,
    ):  # type: ignore[no-untyped-def]
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        cute.calls.append({"fn": "flash_attn_varlen_func", "scale": softmax_scale, "causal": causal})
        out = _packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal)
        return out.to(q.dtype), None

    cute.flash_attn_func, cute.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    mods["flash_attn"].cute = cute
    mods["flash_attn.cute"] = cute
    return mods


# --- flashinfer -------------------------------------------------------------------------------


def _fp8_dtype() -> Any:
    return torch.float8_e4m3fn


def flashinfer_modules(*, with_sage_quantize: bool = True) -> dict[str, types.ModuleType]:
    """``flashinfer`` with ``single_prefill_with_kv_cache`` and ``flashinfer.prefill`` with the
    TRT-LLM ragged kernel and the SAGE quantiser."""
    fi = module("flashinfer", package=True, __version__="0.6.18")
    prefill = module("flashinfer.prefill")

    def single_prefill_with_kv_cache(
        q,
        k,
        v,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        kv_layout="NHD",
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        rope_scale=None,
        rope_theta=None,
        backend="auto",
        return_lse=False,
    ):  # type: ignore[no-untyped-def]
        assert q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "single prefill takes (seq, heads, dim)"
        assert q.dtype in HALF and q.dtype == k.dtype == v.dtype
        if kv_layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        else:
            assert kv_layout == "NHD"
        if custom_mask is not None:
            assert custom_mask.dtype == torch.bool and tuple(custom_mask.shape) == (q.shape[0], k.shape[0])
            causal = False  # FlashInfer: a custom mask replaces the causal mode
        scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
        fi.calls.append({"fn": "single_prefill_with_kv_cache", "mask": custom_mask is not None, "causal": causal})
        return attend(q, k, v, scale, causal, custom_mask).to(q.dtype)

    def trtllm_sage_attention_quantize(
        q,
        k,
        v,
        q_block_size=1,
        k_block_size=16,
        qk_quant_dtype=torch.int8,
        smooth_k=True,
        cum_seq_lens_q=None,
        cum_seq_lens_kv=None,
    ):  # type: ignore[no-untyped-def]
        assert q.dim() == 3 and cum_seq_lens_q is not None and cum_seq_lens_kv is not None
        limit = 127.0 if qk_quant_dtype == torch.int8 else 448.0

        def quant(t: Any, scale: Any) -> Any:
            x = t.float() / scale
            return (
                x.round().clamp(-limit, limit).to(qk_quant_dtype)
                if qk_quant_dtype == torch.int8
                else x.to(qk_quant_dtype)
            )

        if smooth_k:  # a constant shift of every key leaves each softmax row unchanged
            k = k.float() - k.float().mean(dim=0, keepdim=True)
        q_sf = q.float().abs().amax().clamp_min(1e-6) / limit
        k_sf = k.float().abs().amax().clamp_min(1e-6) / limit
        v_sf = v.float().abs().amax(dim=0).clamp_min(1e-6) / 448.0  # per channel: (heads, dim)
        fi.calls.append({"fn": "trtllm_sage_attention_quantize", "blocks": (q_block_size, k_block_size)})
        return quant(q, q_sf), quant(k, k_sf), (v.float() / v_sf).to(_fp8_dtype()), q_sf, k_sf, v_sf, None

    def trtllm_ragged_attention_deepseek(
        query,
        key,
        value,
        workspace_buffer,
        seq_lens,
        max_q_len,
        max_kv_len,
        bmm1_scale,
        bmm2_scale,
        o_sf_scale,
        batch_size,
        window_left,
        cum_seq_lens_q,
        cum_seq_lens_kv,
        enable_pdl,
        is_causal,
        return_lse,
        attention_sinks=None,
        skip_softmax_threshold_scale_factor=None,
        skip_all_rows_active_check=False,
        sage_attn_sfs=None,
        num_elts_per_sage_attn_blk=None,
        out=None,
        lse=None,
    ):  # type: ignore[no-untyped-def]
        assert query.dim() == 3 and query.shape[-1] == 128, "TRT-LLM ragged attention: (total, heads, 128)"
        assert workspace_buffer.dtype == torch.uint8 and workspace_buffer.numel() > 0
        assert seq_lens.dtype == torch.int32 and seq_lens.numel() == batch_size
        assert cum_seq_lens_q.numel() == batch_size + 1 == cum_seq_lens_kv.numel()
        assert torch.equal(seq_lens, cum_seq_lens_kv[1:] - cum_seq_lens_kv[:-1])
        assert bmm2_scale == 1.0 and window_left == -1 and not return_lse
        q, k, v = query, key, value
        if sage_attn_sfs is not None:
            q_sf, k_sf, _, v_sf = sage_attn_sfs
            assert len(num_elts_per_sage_attn_blk) == 4
            q, k, v = q.float() * q_sf, k.float() * k_sf, v.float() * v_sf
            out_dtype = torch.bfloat16
        else:
            assert query.dtype in HALF and key.dtype == query.dtype
            assert value.dtype in (*HALF, _fp8_dtype())
            out_dtype = query.dtype
        fi.calls.append(
            {
                "fn": "trtllm_ragged_attention_deepseek",
                "dtypes": (query.dtype, key.dtype, value.dtype),
                "causal": is_causal,
                "skip_factor": skip_softmax_threshold_scale_factor,
                "sage": sage_attn_sfs is not None,
            }
        )
        result = _packed(q, k, v, cum_seq_lens_q, cum_seq_lens_kv, max_q_len, max_kv_len, bmm1_scale, is_causal)
        return result.to(out_dtype)

    fi.single_prefill_with_kv_cache = single_prefill_with_kv_cache
    prefill.single_prefill_with_kv_cache = single_prefill_with_kv_cache
    prefill.trtllm_ragged_attention_deepseek = trtllm_ragged_attention_deepseek
    prefill.calls = fi.calls
    if with_sage_quantize:
        prefill.trtllm_sage_attention_quantize = trtllm_sage_attention_quantize
    fi.prefill = prefill
    return {"flashinfer": fi, "flashinfer.prefill": prefill}


# --- SageAttention ----------------------------------------------------------------------------


def sageattention_modules() -> dict[str, types.ModuleType]:
    mod = module("sageattention", __version__="2.2.0")

    def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **kwargs):  # type: ignore[no-untyped-def]
        if tensor_layout == "HND":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        else:
            assert tensor_layout == "NHD"
        _check_bshd(q, k, v)
        scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
        mod.calls.append({"fn": "sageattn", "layout": tensor_layout, "causal": is_causal, "scale": sm_scale})
        out = torch.stack([attend(q[b], k[b], v[b], scale, is_causal) for b in range(q.shape[0])]).to(q.dtype)
        return out.transpose(1, 2) if tensor_layout == "HND" else out

    mod.sageattn = sageattn
    return {"sageattention": mod}


def sageattn3_modules() -> dict[str, types.ModuleType]:
    mod = module("sageattn3")

    def sageattn3_blackwell(q, k, v, attn_mask=None, is_causal=False, per_block_mean=True, **kwargs):  # type: ignore[no-untyped-def]
        assert q.dim() == 4 and q.shape[1] == k.shape[1], "(batch, heads, seq, dim) with as many kv heads as q heads"
        assert attn_mask is None
        k.sub_(k.mean(dim=-2, keepdim=True))  # the real kernel centres K in place
        mod.calls.append({"fn": "sageattn3_blackwell", "causal": is_causal})
        bshd = [t.transpose(1, 2) for t in (q, k, v)]
        scale = q.shape[-1] ** -0.5
        out = torch.stack([attend(bshd[0][b], bshd[1][b], bshd[2][b], scale, is_causal) for b in range(q.shape[0])])
        return out.transpose(1, 2).to(q.dtype)

    mod.sageattn3_blackwell = sageattn3_blackwell
    return {"sageattn3": mod}
