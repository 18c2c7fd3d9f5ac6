"""ROCM_AITER_FA's forward through the aiter stand-in, against a float64 reference."""

from __future__ import annotations

import pytest
import torch
from omni_plugin_rocm.attention import RocmAiterFlashAttentionBackend

from omni_core.attention import AttentionMetadata, contract_problems

TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rand(*shape, dtype=torch.float16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_the_backend_keeps_the_contract():
    assert contract_problems(RocmAiterFlashAttentionBackend) == []
    assert RocmAiterFlashAttentionBackend.name == "ROCM_AITER_FA"
    assert RocmAiterFlashAttentionBackend.supports_mask is False
    assert RocmAiterFlashAttentionBackend.supports_gqa and RocmAiterFlashAttentionBackend.supports_varlen


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
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
def test_dense_parity(fake_aiter, reference, dtype, batch, sq, sk, hq, hkv, head, causal):
    q, k, v = (
        rand(batch, sq, hq, head, dtype=dtype, seed=1),
        rand(batch, sk, hkv, head, dtype=dtype, seed=2),
        rand(batch, sk, hkv, head, dtype=dtype, seed=3),
    )
    impl = RocmAiterFlashAttentionBackend.create(hq, head, causal=causal, num_kv_heads=hkv)
    out = impl.forward(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    err = (out.double() - reference(q, k, v, head**-0.5, causal)).abs().max().item()
    assert err < TOLERANCE[dtype], err
    name, kwargs = fake_aiter.calls[-1]
    assert name == "flash_attn_func" and kwargs["causal"] is causal


def test_softmax_scale_reaches_the_kernel(fake_aiter, reference):
    q, k, v = rand(1, 8, 2, 64, seed=4), rand(1, 8, 2, 64, seed=5), rand(1, 8, 2, 64, seed=6)
    out = RocmAiterFlashAttentionBackend.create(2, 64, softmax_scale=0.05).forward(q, k, v)
    assert fake_aiter.calls[-1][1]["softmax_scale"] == 0.05
    assert (out.double() - reference(q, k, v, 0.05)).abs().max().item() < 2e-3


def test_a_bare_tensor_return_is_accepted_too(fake_aiter, reference, monkeypatch):
    # newer AITER versions return the output alone when no lse is asked for
    tupled = fake_aiter.flash_attn_func
    monkeypatch.setattr(fake_aiter, "flash_attn_func", lambda *a, **kw: tupled(*a, **kw)[0])
    q = rand(1, 6, 2, 64, seed=7)
    out = RocmAiterFlashAttentionBackend.create(2, 64).forward(q, q, q)
    assert out.shape == q.shape
    assert (out.double() - reference(q, q, q, 64**-0.5)).abs().max().item() < 2e-3


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("as_list", [False, True])
def test_packed_variable_length_batches(fake_aiter, reference, causal, as_list):
    lengths = [3, 7, 5]
    cu = [0, 3, 10, 15] if as_list else torch.tensor([0, 3, 10, 15], dtype=torch.int64)
    q, k, v = rand(1, 15, 4, 64, seed=8), rand(1, 15, 2, 64, seed=9), rand(1, 15, 2, 64, seed=10)
    impl = RocmAiterFlashAttentionBackend.create(4, 64, causal=causal, num_kv_heads=2)
    out = impl.forward(q, k, v, AttentionMetadata(extra={"cu_seqlens_q": cu, "cu_seqlens_k": cu}))
    assert out.shape == q.shape
    name, kwargs = fake_aiter.calls[-1]
    assert name == "flash_attn_varlen_func"
    assert kwargs["cu_seqlens_q"].dtype == torch.int32 and kwargs["max_seqlen_q"] == 7
    start = 0
    for n in lengths:
        s = slice(start, start + n)
        ref = reference(q[:, s], k[:, s], v[:, s], 64**-0.5, causal)
        assert (out[:, s].double() - ref).abs().max().item() < 2e-3
        start += n


def test_varlen_cross_attention_with_given_max_seqlens(fake_aiter, reference):
    cu_q, cu_k = torch.tensor([0, 4, 6], dtype=torch.int32), torch.tensor([0, 9, 20], dtype=torch.int32)
    q, k, v = rand(1, 6, 4, 64, seed=11), rand(1, 20, 4, 64, seed=12), rand(1, 20, 4, 64, seed=13)
    extra = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": 4, "max_seqlen_k": 11}
    out = RocmAiterFlashAttentionBackend.create(4, 64).forward(q, k, v, AttentionMetadata(extra=extra))
    assert fake_aiter.calls[-1][1]["max_seqlen_k"] == 11
    for (a, b), (c, d) in (((0, 4), (0, 9)), ((4, 6), (9, 20))):
        ref = reference(q[:, a:b], k[:, c:d], v[:, c:d], 64**-0.5)
        assert (out[:, a:b].double() - ref).abs().max().item() < 2e-3


def test_what_it_does_not_do_fails_clearly(fake_aiter):
    impl = RocmAiterFlashAttentionBackend.create(2, 64)
    x = rand(1, 4, 2, 64)
    with pytest.raises(ValueError, match="does not take attention masks"):
        impl.forward(x, x, x, AttentionMetadata(attn_mask=torch.ones(4, 4, dtype=torch.bool)))
    with pytest.raises(ValueError, match="not float32"):
        impl.forward(x.float(), x.float(), x.float())
    y = rand(2, 4, 2, 64)
    with pytest.raises(ValueError, match="batch 1"):
        impl.forward(y, y, y, AttentionMetadata(extra={"cu_seqlens_q": [0, 4]}))
    with pytest.raises(ValueError, match="up to 256"):
        RocmAiterFlashAttentionBackend.create(2, 512)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        RocmAiterFlashAttentionBackend.create(6, 64, num_kv_heads=4)
    assert fake_aiter.calls == []  # nothing reached the kernel


def test_the_choice_from_the_selector_runs(rocm_plugins, rocm_torch, fake_aiter, reference):
    from omni_plugin_rocm.platform import RocmPlatform

    from omni_core.attention.selector import select_attention

    choice = select_attention(rocm_plugins, RocmPlatform())
    impl = choice.create(8, 64, causal=True, num_kv_heads=2)
    q, k, v = rand(2, 10, 8, 64, seed=14), rand(2, 10, 2, 64, seed=15), rand(2, 10, 2, 64, seed=16)
    out = impl.forward(q, k, v)
    assert impl.prefix == "self"
    assert (out.double() - reference(q, k, v, 64**-0.5, True)).abs().max().item() < 2e-3
