"""Each backend's forward through a stand-in kernel package, against a float64 reference.

The stand-ins (``cuda_fakes``) compute on the CPU with the real kernels' signatures and
layouts, so these tests prove the plumbing: (B, S, H, D) in and out, GQA, causal attention
aligned to the end, packed variable-length batches, the softmax scale, masks, option blocks.
They say nothing about the real kernels' speed or numerics on a GPU (benchmarks/gpu_attention.py).
"""

from __future__ import annotations

import contextlib
import math
from itertools import pairwise

import cuda_fakes
import pytest
import torch
from omni_plugin_cuda.attention import _common, cudnn, trtllm
from omni_plugin_cuda.attention.cudnn import CudnnAttentionBackend
from omni_plugin_cuda.attention.flash_attention import FlashAttentionBackend
from omni_plugin_cuda.attention.flashinfer_prefill import FlashInferBackend
from omni_plugin_cuda.attention.sage import SageAttentionBackend
from omni_plugin_cuda.attention.sage3 import SageAttention3Backend
from omni_plugin_cuda.attention.trtllm import TrtllmAttentionBackend

from omni_core.attention import AttentionMetadata
from omni_core.attention.config import AttentionSpec
from omni_core.testing import reference_attention as reference

TOLERANCE = {torch.bfloat16: 2.5e-2, torch.float16: 4e-3}

# (batch, seq_q, seq_k, heads_q, heads_kv, head_dim, causal)
CASES = [
    pytest.param((2, 16, 16, 4, 4, 64, False), id="plain"),
    pytest.param((2, 33, 33, 8, 2, 64, True), id="gqa-causal"),
    pytest.param((1, 5, 12, 4, 4, 128, True), id="causal-end-aligned"),
    pytest.param((2, 9, 31, 6, 1, 128, False), id="mqa-cross"),
]


def rand(*shape, dtype=torch.bfloat16, seed=0):  # type: ignore[no-untyped-def]
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def qkv(batch, sq, sk, hq, hkv, head, dtype=torch.bfloat16):  # type: ignore[no-untyped-def]
    return (
        rand(batch, sq, hq, head, dtype=dtype, seed=1),
        rand(batch, sk, hkv, head, dtype=dtype, seed=2),
        rand(batch, sk, hkv, head, dtype=dtype, seed=3),
    )


def max_err(out, ref):  # type: ignore[no-untyped-def]
    return (out.double() - ref).abs().max().item()


def mean_rel_err(out, ref):  # type: ignore[no-untyped-def]
    return ((out.double() - ref).abs().mean() / ref.abs().mean()).item()


def check_dense(backend, case, dtype, scale=None, **create):  # type: ignore[no-untyped-def]
    batch, sq, sk, hq, hkv, head, causal = case
    q, k, v = qkv(batch, sq, sk, hq, hkv, head, dtype)
    impl = backend.create(hq, head, softmax_scale=scale, causal=causal, num_kv_heads=hkv, **create)
    out = impl.forward(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    err = max_err(out, reference(q, k, v, impl.softmax_scale, causal))
    assert err < TOLERANCE[dtype], err
    return impl


def check_varlen(backend, head=64, dtype=torch.bfloat16, **create):  # type: ignore[no-untyped-def]
    cu_q = torch.tensor([0, 3, 10, 15], dtype=torch.int64)  # int64 on purpose: the backend converts
    cu_k = torch.tensor([0, 5, 14, 19], dtype=torch.int64)  # keys >= queries: no empty causal rows
    q, k, v = (
        rand(1, 15, 4, head, dtype=dtype, seed=4),
        rand(1, 19, 2, head, dtype=dtype, seed=5),
        rand(1, 19, 2, head, dtype=dtype, seed=6),
    )
    impl = backend.create(4, head, num_kv_heads=2, causal=True, **create)
    out = impl.forward(q, k, v, AttentionMetadata(extra={"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}))
    assert out.shape == q.shape
    for (a, b), (c, d) in zip(pairwise(cu_q.tolist()), pairwise(cu_k.tolist()), strict=True):
        ref = reference(q[:, a:b], k[:, c:d], v[:, c:d], head**-0.5, causal=True)
        assert max_err(out[:, a:b], ref) < TOLERANCE[dtype]
    return impl


# --- FLASH_ATTN -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_flash_attn_dense(install, dtype, case):
    fa2 = install(cuda_fakes.flash_attn_modules())["flash_attn"]
    impl = check_dense(FlashAttentionBackend, case, dtype)
    assert impl.kernel == "fa2" and fa2.calls[-1]["fn"] == "flash_attn_func"
    assert fa2.calls[-1]["causal"] is case[-1]


def test_flash_attn_scale_and_varlen(install):
    fa2 = install(cuda_fakes.flash_attn_modules())["flash_attn"]
    impl = check_dense(FlashAttentionBackend, (1, 8, 8, 2, 2, 64, False), torch.float16, scale=0.05)
    assert fa2.calls[-1]["scale"] == 0.05 and impl.softmax_scale == 0.05
    check_varlen(FlashAttentionBackend)
    assert fa2.calls[-1]["fn"] == "flash_attn_varlen_func"


def test_flash_attn_prefers_fa3_and_unwraps_its_tuple(install):
    fa2 = install(cuda_fakes.flash_attn_modules())["flash_attn"]
    fa3 = install(cuda_fakes.flash_attn_3_modules())["flash_attn_interface"]
    impl = check_dense(FlashAttentionBackend, (2, 9, 9, 4, 2, 64, True), torch.bfloat16)
    check_varlen(FlashAttentionBackend)
    assert impl.kernel == "fa3" and [c["fn"] for c in fa3.calls] == ["flash_attn_func", "flash_attn_varlen_func"]
    assert fa2.calls == []


@pytest.mark.parametrize(
    ("capability", "kernel"), [((10, 0), "fa4"), ((12, 0), "fa4"), ((9, 0), "fa3"), ((8, 0), "fa2"), ((8, 9), "fa2")]
)
def test_flash_attn_kernel_generation_follows_the_gpu(install, monkeypatch, capability, kernel):
    install(cuda_fakes.flash_attn_4_modules())
    install(cuda_fakes.flash_attn_3_modules())
    monkeypatch.setattr(_common, "tensor_capability", lambda tensor: capability)
    impl = check_dense(FlashAttentionBackend, (1, 6, 6, 2, 2, 64, False), torch.bfloat16)
    assert impl.kernel == kernel


def test_flash_attn_on_blackwell_without_fa4_uses_fa2_never_fa3(install, monkeypatch):
    install(cuda_fakes.flash_attn_modules())
    fa3 = install(cuda_fakes.flash_attn_3_modules())["flash_attn_interface"]
    monkeypatch.setattr(_common, "tensor_capability", lambda tensor: (10, 0))
    impl = check_dense(FlashAttentionBackend, (1, 6, 6, 2, 2, 64, False), torch.bfloat16)
    assert impl.kernel == "fa2" and fa3.calls == []


def test_flash_attn_without_any_kernel_says_what_to_install():
    impl = FlashAttentionBackend.create(2, 64)
    q = rand(1, 4, 2, 64)
    with pytest.raises(ImportError, match=r"omni-plugin-cuda\[flash-attn\]"):
        impl.forward(q, q, q)


def test_flash_attn_rejects_a_mask_at_call_time(install):
    install(cuda_fakes.flash_attn_modules())
    q = rand(1, 4, 2, 64)
    with pytest.raises(ValueError, match="does not support attention masks"):
        FlashAttentionBackend.create(2, 64).forward(q, q, q, AttentionMetadata(attn_mask=torch.ones(4, 4).bool()))


def test_varlen_contract_violations_are_errors(install):
    install(cuda_fakes.flash_attn_modules())
    impl = FlashAttentionBackend.create(2, 64)
    x = rand(2, 4, 2, 64)
    with pytest.raises(ValueError, match="batch 1"):
        impl.forward(x, x, x, AttentionMetadata(extra={"cu_seqlens_q": torch.tensor([0, 4])}))
    y = rand(1, 6, 2, 64)
    with pytest.raises(ValueError, match="must cover the packed tensors"):
        impl.forward(y, y, y, AttentionMetadata(extra={"cu_seqlens_q": torch.tensor([0, 4])}))
    with pytest.raises(ValueError, match="same number"):
        extra = {"cu_seqlens_q": torch.tensor([0, 6]), "cu_seqlens_k": [0, 2, 6]}
        impl.forward(y, y, y, AttentionMetadata(extra=extra))
    with pytest.raises(ValueError, match="head size 64"):
        impl.forward(rand(1, 4, 2, 32), rand(1, 4, 2, 32), rand(1, 4, 2, 32))


# --- FLASHINFER_ATTN ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_flashinfer_dense(install, dtype, case):
    fi = install(cuda_fakes.flashinfer_modules())["flashinfer"]
    check_dense(FlashInferBackend, case, dtype)
    assert fi.calls[-1] == {"fn": "single_prefill_with_kv_cache", "mask": False, "causal": case[-1]}
    assert len(fi.calls) == case[0]  # one prefill per batch element


def test_flashinfer_scale_and_varlen(install):
    fi = install(cuda_fakes.flashinfer_modules())["flashinfer"]
    check_dense(FlashInferBackend, (1, 8, 8, 2, 2, 64, False), torch.float16, scale=0.05)
    fi.calls.clear()
    check_varlen(FlashInferBackend)
    assert len(fi.calls) == 3  # one prefill per packed sequence


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_flashinfer_masks_fold_causal_in(install, causal, kind):
    fi = install(cuda_fakes.flashinfer_modules())["flashinfer"]
    q, k, v = qkv(2, 10, 10, 4, 2, 64)
    keep = torch.rand(2, 1, 10, 10, generator=torch.Generator().manual_seed(7)) > 0.4
    keep[..., 0] = True
    mask = keep if kind == "bool" else torch.zeros(2, 1, 10, 10).masked_fill(~keep, float("-inf"))
    impl = FlashInferBackend.create(4, 64, causal=causal, num_kv_heads=2)
    out = impl.forward(q, k, v, AttentionMetadata(attn_mask=mask))
    assert max_err(out, reference(q, k, v, 64**-0.5, causal, keep)) < TOLERANCE[torch.bfloat16]
    assert all(c["mask"] and c["causal"] is False for c in fi.calls)


def test_flashinfer_refuses_masks_it_cannot_express(install):
    install(cuda_fakes.flashinfer_modules())
    q, k, v = qkv(1, 6, 6, 2, 2, 64)
    impl = FlashInferBackend.create(2, 64)
    per_head = torch.ones(1, 2, 6, 6, dtype=torch.bool)
    per_head[0, 1, :, 3] = False
    with pytest.raises(ValueError, match="differs per head"):
        impl.forward(q, k, v, AttentionMetadata(attn_mask=per_head))
    with pytest.raises(ValueError, match="additive bias"):
        impl.forward(q, k, v, AttentionMetadata(attn_mask=torch.full((6, 6), 0.5)))


def quant_spec(backend, **quant):  # type: ignore[no-untyped-def]
    return AttentionSpec(backend=backend, quant=quant)


def test_flashinfer_quant_runs_qk16_v8_through_the_ragged_kernel(install, monkeypatch):
    fi = install(cuda_fakes.flashinfer_modules())["flashinfer"]
    monkeypatch.setattr(trtllm, "WORKSPACE_BYTES", 1024)
    monkeypatch.setattr(trtllm, "_WORKSPACES", {})
    spec = quant_spec("FLASHINFER_ATTN", dtype_qk="float16", dtype_vo="fp8_e4m3")
    q, k, v = qkv(2, 12, 12, 4, 2, 128)
    impl = FlashInferBackend.create(4, 128, num_kv_heads=2, options=spec)
    assert impl.options is spec
    out = impl.forward(q, k, v)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert fi.calls[-1]["dtypes"] == (torch.float16, torch.float16, torch.float8_e4m3fn)
    assert mean_rel_err(out, reference(q, k, v, 128**-0.5)) < 3e-2


def test_flashinfer_quant_needs_head_128_and_datacenter_blackwell(install, monkeypatch):
    install(cuda_fakes.flashinfer_modules())
    spec = quant_spec("FLASHINFER_ATTN", dtype_qk="bfloat16", dtype_vo="fp8_e4m3")
    with pytest.raises(ValueError, match="head size 128"):
        FlashInferBackend.create(4, 64, options=spec)
    monkeypatch.setattr(_common, "tensor_capability", lambda tensor: (9, 0))
    q = rand(1, 4, 2, 128)
    with pytest.raises(RuntimeError, match="sm_100/sm_103 only"):
        FlashInferBackend.create(2, 128, options=spec).forward(q, q, q)


# --- CUDNN_ATTN -----------------------------------------------------------------------------


@pytest.fixture
def cudnn_kernels(monkeypatch):  # type: ignore[no-untyped-def]
    """Record the SDPA kernel CUDNN_ATTN pins, and let SDPA run on the CPU meanwhile."""
    pinned: list[str] = []

    def pinned_kernel(kernel: str):  # type: ignore[no-untyped-def]
        pinned.append(kernel)
        return contextlib.nullcontext()

    monkeypatch.setattr(cudnn, "pinned_kernel", pinned_kernel)
    return pinned


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_cudnn_dense_pins_the_cudnn_kernel(cudnn_kernels, dtype, case):
    check_dense(CudnnAttentionBackend, case, dtype)
    assert cudnn_kernels == ["CUDNN_ATTENTION"]


@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_masks_boolean_and_additive(cudnn_kernels, causal):
    q, k, v = qkv(2, 10, 14, 4, 2, 64)
    keep = torch.rand(2, 4, 10, 14, generator=torch.Generator().manual_seed(8)) > 0.4  # per head
    keep[..., -1] = True
    impl = CudnnAttentionBackend.create(4, 64, causal=causal, num_kv_heads=2)
    out = impl.forward(q, k, v, AttentionMetadata(attn_mask=keep))
    assert max_err(out, reference(q, k, v, 64**-0.5, causal, keep)) < TOLERANCE[torch.bfloat16]
    bias = torch.randn(1, 1, 10, 14, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    out = impl.forward(q, k, v, AttentionMetadata(attn_mask=bias))
    assert max_err(out, reference(q, k, v, 64**-0.5, causal, bias)) < TOLERANCE[torch.bfloat16]


def test_cudnn_scale_varlen_and_single_key(cudnn_kernels):
    check_dense(CudnnAttentionBackend, (1, 8, 8, 2, 2, 64, False), torch.float16, scale=0.05)
    check_varlen(CudnnAttentionBackend)
    cudnn_kernels.clear()
    check_dense(CudnnAttentionBackend, (1, 1, 1, 2, 2, 64, False), torch.bfloat16)
    assert cudnn_kernels == ["MATH"]  # cuDNN rejects a key/value length of 1


def test_cudnn_pinning_is_real():
    # unpatched: the CPU has no cuDNN kernel, and pinning leaves SDPA no fallback to run
    q = rand(1, 4, 2, 64)
    with pytest.raises(RuntimeError, match="No viable backend"):
        CudnnAttentionBackend.create(2, 64).forward(q, q, q)


# --- SAGE_ATTN / SAGE_ATTN_3 ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [c for c in CASES if c.values[0][1] == c.values[0][2] or not c.values[0][-1]])
def test_sage_dense_nhd(install, dtype, case):
    sage = install(cuda_fakes.sageattention_modules())["sageattention"]
    check_dense(SageAttentionBackend, case, dtype)
    assert sage.calls[-1]["layout"] == "NHD"


def test_sage_scale_varlen_and_unequal_causal(install):
    sage = install(cuda_fakes.sageattention_modules())["sageattention"]
    check_dense(SageAttentionBackend, (1, 8, 8, 2, 2, 64, False), torch.float16, scale=0.05)
    assert sage.calls[-1]["scale"] == 0.05
    with pytest.raises(ValueError, match="equal query and key lengths"):
        check_varlen(SageAttentionBackend)  # causal segments of unequal q/k lengths
    cu = torch.tensor([0, 3, 10])
    q, k, v = qkv(1, 10, 10, 4, 2, 64)
    out = SageAttentionBackend.create(4, 64, num_kv_heads=2, causal=True).forward(
        q, k, v, AttentionMetadata(extra={"cu_seqlens_q": cu})
    )
    for a, b in ((0, 3), (3, 10)):
        assert max_err(out[:, a:b], reference(q[:, a:b], k[:, a:b], v[:, a:b], 64**-0.5, True)) < 2.5e-2


@pytest.mark.parametrize("causal", [False, True])
def test_sage3_bhsd_and_keys_left_untouched(install, causal):
    sage3 = install(cuda_fakes.sageattn3_modules())["sageattn3"]
    q, k, v = qkv(2, 16, 16, 4, 4, 128)
    k_before = k.clone()
    impl = SageAttention3Backend.create(4, 128, causal=causal)
    out = impl.forward(q, k, v)
    assert torch.equal(k, k_before)  # the kernel centres its own copy
    assert max_err(out, reference(q, k, v, 128**-0.5, causal)) < TOLERANCE[torch.bfloat16]
    assert sage3.calls[-1]["causal"] is causal


def test_sage3_rejects_what_it_cannot_run():
    with pytest.raises(ValueError, match="grouped-query"):
        SageAttention3Backend.create(4, 128, num_kv_heads=2)
    with pytest.raises(ValueError, match="always scales by head_size"):
        SageAttention3Backend.create(4, 128, softmax_scale=0.05)
    assert SageAttention3Backend.unsupported_reason(gqa=True) == "does not support grouped-query attention"


# --- TRTLLM_ATTN ----------------------------------------------------------------------------


@pytest.fixture
def flashinfer_fake(install, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(trtllm, "WORKSPACE_BYTES", 1024)
    monkeypatch.setattr(trtllm, "_WORKSPACES", {})
    return install(cuda_fakes.flashinfer_modules())["flashinfer"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [c for c in CASES if c.values[0][5] == 128])
def test_trtllm_dense(flashinfer_fake, dtype, case):
    check_dense(TrtllmAttentionBackend, case, dtype)
    call = flashinfer_fake.calls[-1]
    assert call["fn"] == "trtllm_ragged_attention_deepseek" and call["skip_factor"] is None and not call["sage"]


def test_trtllm_scale_and_varlen(flashinfer_fake):
    check_dense(TrtllmAttentionBackend, (2, 8, 8, 2, 2, 128, False), torch.float16, scale=0.05)
    check_varlen(TrtllmAttentionBackend, head=128)


@pytest.mark.parametrize("dtype_qk", ["int8", "fp8_e4m3"])
def test_trtllm_sage_quantisation(flashinfer_fake, dtype_qk):
    spec = AttentionSpec(backend="TRTLLM_ATTN", quant={"dtype_qk": dtype_qk, "q_block_size": 4})
    q, k, v = qkv(2, 24, 24, 4, 2, 128)
    impl = TrtllmAttentionBackend.create(4, 128, num_kv_heads=2, options=spec)
    out = impl.forward(q, k, v)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    quantize, kernel = flashinfer_fake.calls[-2:]
    assert quantize == {"fn": "trtllm_sage_attention_quantize", "blocks": (4, 16)} and kernel["sage"]
    assert mean_rel_err(out, reference(q, k, v, 128**-0.5)) < 5e-2


def test_trtllm_quantisation_limits(flashinfer_fake, install, monkeypatch):
    spec = AttentionSpec(backend="TRTLLM_ATTN", quant={"dtype_qk": "int8"})
    with pytest.raises(ValueError, match="does not support causal"):
        TrtllmAttentionBackend.create(4, 128, causal=True, options=spec)
    q = rand(1, 4, 2, 128)
    monkeypatch.setattr(_common, "tensor_capability", lambda tensor: (10, 3))
    with pytest.raises(ValueError, match="int8 quantisation runs on sm_100 only"):
        TrtllmAttentionBackend.create(2, 128, options=spec).forward(q, q, q)
    monkeypatch.setattr(_common, "tensor_capability", lambda tensor: (9, 0))
    with pytest.raises(RuntimeError, match="runs only on sm_100/sm_103"):
        TrtllmAttentionBackend.create(2, 128).forward(q, q, q)
    monkeypatch.setattr(_common, "tensor_capability", lambda tensor: None)
    install(cuda_fakes.flashinfer_modules(with_sage_quantize=False))
    with pytest.raises(ImportError, match=r"flashinfer >= 0\.6\.18rc10"):
        TrtllmAttentionBackend.create(2, 128, options=spec).forward(q, q, q)


def test_trtllm_skip_softmax(flashinfer_fake):
    q, k, v = qkv(1, 16, 20, 2, 2, 128)
    threshold = TrtllmAttentionBackend.create(
        2, 128, options=AttentionSpec(backend="TRTLLM_ATTN", skip_softmax={"threshold": 0.01})
    )
    threshold.forward(q, k, v)
    assert flashinfer_fake.calls[-1]["skip_factor"] == pytest.approx(0.01 * 20)

    sparsity = TrtllmAttentionBackend.create(
        2, 128, prefix="blocks.3", options=AttentionSpec(backend="TRTLLM_ATTN", skip_softmax={"target_sparsity": 0.6})
    )
    with pytest.raises(RuntimeError, match="calibration"):
        sparsity.forward(q, k, v)
    sparsity.set_layer_calibration(2.0, 3.0)
    sparsity.forward(q, k, v)
    assert flashinfer_fake.calls[-1]["skip_factor"] == pytest.approx(2.0 * math.exp(3.0 * 0.6))

    gated = TrtllmAttentionBackend.create(
        2,
        128,
        options=AttentionSpec(backend="TRTLLM_ATTN", skip_softmax={"threshold": 0.5, "disabled_until_timestep": 0.5}),
    )
    with pytest.raises(ValueError, match="denoise_timestep"):
        gated.forward(q, k, v)
    gated.forward(q, k, v, AttentionMetadata(extra={"denoise_timestep": 0.9}))
    assert flashinfer_fake.calls[-1]["skip_factor"] is None  # early steps stay dense
    gated.forward(q, k, v, AttentionMetadata(extra={"denoise_timestep": 0.3}))
    assert flashinfer_fake.calls[-1]["skip_factor"] == pytest.approx(0.5 * 20)


def test_trtllm_rejects_masks(flashinfer_fake):
    q = rand(1, 4, 2, 128)
    with pytest.raises(ValueError, match="CUDNN_ATTN or TORCH_SDPA"):
        TrtllmAttentionBackend.create(2, 128).forward(q, q, q, AttentionMetadata(attn_mask=torch.ones(4, 4).bool()))
