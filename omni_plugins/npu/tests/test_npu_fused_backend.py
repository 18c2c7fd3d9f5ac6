"""NPU_FUSED_ATTN's forward through the torch_npu stand-in, against a float64 reference."""

from __future__ import annotations

import itertools

import pytest
import torch
from omni_plugin_npu.attention import NpuFusedAttentionBackend, npu_block_mask, packed_fast_path_ends

from omni_core.attention import AttentionMetadata, contract_problems

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rand(*shape, dtype=torch.float16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def qkv(batch, sq, sk, hq, hkv, head, dtype=torch.float16, seed=0):
    return (
        rand(batch, sq, hq, head, dtype=dtype, seed=seed + 1),
        rand(batch, sk, hkv, head, dtype=dtype, seed=seed + 2),
        rand(batch, sk, hkv, head, dtype=dtype, seed=seed + 3),
    )


def err(out, ref):
    return (out.double() - ref).abs().max().item()


def test_the_backend_keeps_the_contract():
    assert contract_problems(NpuFusedAttentionBackend) == []
    b = NpuFusedAttentionBackend
    assert b.supports_mask and b.supports_causal and b.supports_gqa and b.supports_varlen
    assert b.device_types == ("npu",) and b.required_packages == ("torch_npu",)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("batch", "sq", "sk", "hq", "hkv", "head", "causal"),
    [
        (1, 16, 16, 4, 4, 64, False),
        (2, 33, 33, 8, 2, 64, False),  # GQA
        (2, 17, 17, 6, 1, 128, True),  # MQA, causal
        (1, 5, 12, 4, 4, 32, True),  # causal with fewer queries than keys: aligned to the end
        (2, 9, 31, 4, 2, 80, False),  # cross attention with GQA
    ],
)
def test_dense_parity(fake_torch_npu, reference, dtype, batch, sq, sk, hq, hkv, head, causal):
    q, k, v = qkv(batch, sq, sk, hq, hkv, head, dtype)
    out = NpuFusedAttentionBackend.create(hq, head, causal=causal, num_kv_heads=hkv).forward(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    assert err(out, reference(q, k, v, head**-0.5, causal)) < TOLERANCE[dtype]
    call = fake_torch_npu.calls[-1]
    assert call["layout"] == "BSND" and call["head_num"] == hq
    if causal:  # the compressed right-down causal mask, not a materialised (sq, sk) one
        assert call["sparse_mode"] == 3 and tuple(call["atten_mask"].shape) == (2048, 2048)
    else:
        assert call["sparse_mode"] == 0 and call["atten_mask"] is None


def test_softmax_scale_reaches_the_kernel(fake_torch_npu, reference):
    q, k, v = qkv(1, 8, 8, 2, 2, 64)
    out = NpuFusedAttentionBackend.create(2, 64, softmax_scale=0.05).forward(q, k, v)
    assert fake_torch_npu.calls[-1]["scale"] == 0.05
    assert err(out, reference(q, k, v, 0.05)) < 2e-3


def _keep(shape, seed):
    keep = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.4
    keep[..., 0] = True  # every query keeps a key
    return keep


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("mask_shape", "npu_shape"),
    [
        ((2, 1, 7, 9), (2, 1, 7, 9)),
        ((7, 9), (1, 1, 7, 9)),
        ((2, 4, 7, 9), (2, 4, 7, 9)),
        ((1, 4, 7, 9), (2, 4, 7, 9)),  # per-head without batch: the kernel needs the batch
        ((2, 1, 1, 9), (2, 1, 7, 9)),  # key padding
        ((9,), (1, 1, 7, 9)),
    ],
)
def test_boolean_masks_are_inverted_and_shaped_for_the_kernel(fake_torch_npu, reference, causal, mask_shape, npu_shape):
    q, k, v = qkv(2, 7, 9, 4, 2, 64, seed=10)
    keep = _keep(mask_shape, seed=11)
    out = NpuFusedAttentionBackend.create(4, 64, causal=causal, num_kv_heads=2).forward(
        q, k, v, AttentionMetadata(attn_mask=keep)
    )
    assert err(out, reference(q, k, v, 64**-0.5, causal, keep)) < 2e-3
    call = fake_torch_npu.calls[-1]
    assert tuple(call["atten_mask"].shape) == npu_shape and call["atten_mask"].dtype == torch.bool
    assert call["sparse_mode"] == (1 if causal else 0) and call["inner_precise"] == 2


def test_the_mask_convention_is_flipped_not_passed_through():
    keep = torch.tensor([[True, False, True]])
    blocked = npu_block_mask(keep, batch=1, heads=2, seq_q=1, seq_k=3, causal=False)
    assert blocked.tolist() == [[[[False, True, False]]]]
    causal = npu_block_mask(torch.ones(3, 3, dtype=torch.bool), 1, 1, 3, 3, causal=True)
    assert causal[0, 0].tolist() == [[False, True, True], [False, False, True], [False, False, False]]


@pytest.mark.parametrize("masked_value", [float("-inf"), torch.finfo(torch.float16).min, -1e4])
def test_additive_zero_or_minus_infinity_masks(fake_torch_npu, reference, masked_value):
    q, k, v = qkv(2, 6, 6, 2, 2, 64, seed=20)
    keep = _keep((2, 1, 6, 6), seed=21)
    additive = torch.zeros(2, 1, 6, 6).masked_fill(~keep, masked_value)
    out = NpuFusedAttentionBackend.create(2, 64).forward(q, k, v, AttentionMetadata(attn_mask=additive))
    assert err(out, reference(q, k, v, 64**-0.5, mask=keep)) < 2e-3


def test_an_additive_bias_is_refused_not_ignored(fake_torch_npu):
    q, k, v = qkv(1, 4, 4, 2, 2, 64)
    bias = torch.zeros(4, 4)
    bias[0, 1] = -0.5
    with pytest.raises(ValueError, match="carries a bias"):
        NpuFusedAttentionBackend.create(2, 64).forward(q, k, v, AttentionMetadata(attn_mask=bias))
    with pytest.raises(ValueError, match="does not broadcast"):
        NpuFusedAttentionBackend.create(2, 64).forward(
            q, k, v, AttentionMetadata(attn_mask=torch.ones(3, 4, dtype=torch.bool))
        )
    assert fake_torch_npu.calls == []


# --- variable length ---------------------------------------------------------------------------


def _packed(real, total, hq=4, hkv=2, seed=30):
    q, k, v = qkv(1, total, total, hq, hkv, 64, seed=seed)
    return q, k, v


def _segments_match(out, q, k, v, bounds, reference, causal=False):
    for a, b in itertools.pairwise(bounds):
        if b > a:
            assert err(out[:, a:b], reference(q[:, a:b], k[:, a:b], v[:, a:b], 64**-0.5, causal)) < 2e-3


@pytest.mark.parametrize(("real", "total"), [(10, 16), (10, 20), (16, 16)])
def test_the_packed_fast_path_is_one_tnd_call(fake_torch_npu, reference, real, total):
    q, k, v = _packed(real, total)
    cu = torch.tensor([0, real, total], dtype=torch.int32) if real < total else torch.tensor([0, total])
    extra = {
        "cu_seqlens_q": cu,
        "cu_seqlens_k": cu,
        "max_seqlen_q": real,
        "max_seqlen_k": real,
        "npu_attn_varlen": True,
    }
    out = NpuFusedAttentionBackend.create(4, 64, num_kv_heads=2).forward(q, k, v, AttentionMetadata(extra=extra))
    assert out.shape == q.shape
    assert len(fake_torch_npu.calls) == 1
    call = fake_torch_npu.calls[0]
    assert call["layout"] == "TND" and call["q_shape"] == (total, 4, 64)
    expected = [real, total] if real < total else [total]
    assert call["actual_seq_qlen"] == expected and call["actual_seq_kvlen"] == expected
    _segments_match(out, q, k, v, [0, real, total], reference)


BASE = {
    "cu_seqlens_q": torch.tensor([0, 10, 16], dtype=torch.int32),
    "max_seqlen_q": 10,
    "npu_attn_varlen": True,
}


@pytest.mark.parametrize(
    ("why", "change", "causal"),
    [
        ("no opt-in", {"npu_attn_varlen": False}, False),
        ("causal", {}, True),
        ("padding longer than the real segment", {"cu_seqlens_q": [0, 7, 16], "max_seqlen_q": 7}, False),
        ("max_seqlen not an int", {"max_seqlen_q": torch.tensor(10)}, False),
        ("more than one real segment", {"cu_seqlens_q": [0, 6, 10, 16], "max_seqlen_q": 6}, False),
        ("offsets disagree with max_seqlen", {"cu_seqlens_q": [0, 9, 16]}, False),
        ("[0, total] with a shorter max_seqlen", {"cu_seqlens_q": [0, 16]}, False),
        ("max_seqlen out of range", {"cu_seqlens_q": [0, 16], "max_seqlen_q": 17}, False),
    ],
)
def test_calls_off_the_fast_path_run_per_segment_and_stay_exact(fake_torch_npu, reference, why, change, causal):
    q, k, v = _packed(10, 16, seed=40)
    extra = {**BASE, **change}
    assert packed_fast_path_ends(q, k, extra, causal) is None, why
    out = NpuFusedAttentionBackend.create(4, 64, causal=causal, num_kv_heads=2).forward(
        q, k, v, AttentionMetadata(extra=extra)
    )
    cu = extra["cu_seqlens_q"]
    bounds = [int(x) for x in (cu.tolist() if hasattr(cu, "tolist") else cu)]
    assert [c["layout"] for c in fake_torch_npu.calls] == ["BSND"] * (len(bounds) - 1)
    _segments_match(out, q, k, v, bounds, reference, causal)


def test_unequal_query_and_key_lengths_leave_the_fast_path():
    q, k = rand(1, 16, 4, 64), rand(1, 12, 2, 64)
    extra = {"cu_seqlens_q": [0, 10, 16], "cu_seqlens_k": [0, 8, 12], "max_seqlen_q": 10, "npu_attn_varlen": True}
    assert packed_fast_path_ends(q, k, extra, causal=False) is None


def test_varlen_cross_attention_per_segment(fake_torch_npu, reference):
    q, k, v = rand(1, 6, 4, 64, seed=50), rand(1, 20, 4, 64, seed=51), rand(1, 20, 4, 64, seed=52)
    extra = {"cu_seqlens_q": [0, 4, 6], "cu_seqlens_k": [0, 9, 20]}
    out = NpuFusedAttentionBackend.create(4, 64, causal=True).forward(q, k, v, AttentionMetadata(extra=extra))
    for (a, b), (c, d) in (((0, 4), (0, 9)), ((4, 6), (9, 20))):
        assert err(out[:, a:b], reference(q[:, a:b], k[:, c:d], v[:, c:d], 64**-0.5, True)) < 2e-3


def test_what_it_does_not_do_fails_clearly(fake_torch_npu):
    impl = NpuFusedAttentionBackend.create(2, 64)
    x = rand(1, 4, 2, 64)
    with pytest.raises(ValueError, match="not both"):
        impl.forward(
            x, x, x, AttentionMetadata(attn_mask=torch.ones(4, 4, dtype=torch.bool), extra={"cu_seqlens_q": [0, 4]})
        )
    with pytest.raises(ValueError, match="not float64"):
        impl.forward(x.double(), x.double(), x.double())
    y = rand(2, 4, 2, 64)
    with pytest.raises(ValueError, match="batch 1"):
        impl.forward(y, y, y, AttentionMetadata(extra={"cu_seqlens_q": [0, 4]}))
    with pytest.raises(ValueError, match="rise from 0 to the packed length 4"):
        impl.forward(x, x, x, AttentionMetadata(extra={"cu_seqlens_q": [0, 3]}))
    assert fake_torch_npu.calls == []


def test_the_choice_from_the_selector_runs(npu_plugins, fake_torch_npu, reference):
    from omni_plugin_npu.platform import NpuPlatform

    from omni_core.attention.selector import select_attention

    impl = select_attention(npu_plugins, NpuPlatform()).create(8, 64, causal=True, num_kv_heads=2)
    q, k, v = qkv(2, 10, 10, 8, 2, 64, torch.bfloat16, seed=60)
    assert err(impl.forward(q, k, v), reference(q, k, v, 64**-0.5, True)) < TOLERANCE[torch.bfloat16]
