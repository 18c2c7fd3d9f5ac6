"""TORCH_SDPA against a float64 reference written from the attention definition."""

from __future__ import annotations

import pytest
import torch
from omni_plugin_cpu.attention import TorchSDPABackend

from omni_core.attention import AttentionMetadata
from omni_core.testing import reference_attention as reference

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("batch", "sq", "sk", "hq", "hkv", "head", "causal"),
    [
        (1, 16, 16, 4, 4, 64, False),
        (2, 33, 33, 8, 2, 64, False),  # GQA
        (2, 17, 17, 6, 1, 40, True),  # MQA, odd head size, causal
        (1, 5, 12, 4, 4, 24, True),  # causal with fewer queries than keys: aligned to the end
        (2, 9, 31, 3, 3, 80, False),  # cross attention
    ],
)
def test_parity_with_reference(dtype, batch, sq, sk, hq, hkv, head, causal):
    q, k, v = (
        rand(batch, sq, hq, head, dtype=dtype, seed=1),
        rand(batch, sk, hkv, head, dtype=dtype, seed=2),
        rand(batch, sk, hkv, head, dtype=dtype, seed=3),
    )
    impl = TorchSDPABackend.create(hq, head, causal=causal, num_kv_heads=hkv)
    out = impl.forward(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    err = (out.double() - reference(q, k, v, head**-0.5, causal)).abs().max().item()
    assert err < TOLERANCE[dtype], err


@pytest.mark.parametrize("causal", [False, True])
def test_boolean_and_additive_masks(causal):
    q, k, v = rand(2, 10, 4, 32, seed=4), rand(2, 10, 4, 32, seed=5), rand(2, 10, 4, 32, seed=6)
    keep = torch.rand(2, 1, 10, 10, generator=torch.Generator().manual_seed(7)) > 0.4
    keep[..., 0] = True
    impl = TorchSDPABackend.create(4, 32, causal=causal)
    out_bool = impl.forward(q, k, v, AttentionMetadata(attn_mask=keep))
    ref = reference(q, k, v, 32**-0.5, causal, keep)
    assert (out_bool.double() - ref).abs().max().item() < 2e-5
    additive = torch.zeros(2, 1, 10, 10).masked_fill(~keep, float("-inf"))
    out_add = impl.forward(q, k, v, AttentionMetadata(attn_mask=additive))
    assert torch.allclose(out_add, out_bool, atol=1e-6)


def test_softmax_scale_is_honoured():
    q, k, v = rand(1, 8, 2, 16, seed=8), rand(1, 8, 2, 16, seed=9), rand(1, 8, 2, 16, seed=10)
    out = TorchSDPABackend.create(2, 16, softmax_scale=0.05).forward(q, k, v)
    assert (out.double() - reference(q, k, v, 0.05)).abs().max().item() < 2e-5
    default = TorchSDPABackend.create(2, 16).forward(q, k, v)
    assert not torch.allclose(out, default)


def test_variable_length_batch_matches_per_sequence_calls():
    lengths = [3, 7, 5]
    cu = torch.tensor([0, 3, 10, 15], dtype=torch.int32)
    q, k, v = rand(1, 15, 4, 32, seed=11), rand(1, 15, 2, 32, seed=12), rand(1, 15, 2, 32, seed=13)
    impl = TorchSDPABackend.create(4, 32, num_kv_heads=2, causal=True)
    packed = impl.forward(q, k, v, AttentionMetadata(extra={"cu_seqlens_q": cu, "cu_seqlens_k": cu}))
    start = 0
    for n in lengths:
        s = slice(start, start + n)
        ref = reference(q[:, s], k[:, s], v[:, s], 32**-0.5, causal=True)
        assert (packed[:, s].double() - ref).abs().max().item() < 2e-5
        start += n


def test_varlen_rejects_batched_input_and_mask():
    impl = TorchSDPABackend.create(2, 16)
    cu = torch.tensor([0, 4])
    x = rand(2, 4, 2, 16)
    with pytest.raises(ValueError, match="batch 1"):
        impl.forward(x, x, x, AttentionMetadata(extra={"cu_seqlens_q": cu}))
    y = rand(1, 4, 2, 16)
    with pytest.raises(ValueError, match="not both"):
        impl.forward(
            y, y, y, AttentionMetadata(attn_mask=torch.ones(4, 4, dtype=torch.bool), extra={"cu_seqlens_q": cu})
        )


def test_invalid_head_configuration_is_rejected():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        TorchSDPABackend.create(6, 16, num_kv_heads=4)
