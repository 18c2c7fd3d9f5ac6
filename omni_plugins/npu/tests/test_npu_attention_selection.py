"""FLASH_ATTN on an Ascend NPU: the platform's chain and alias through omni's attention selector."""

from __future__ import annotations

import pytest
from omni_plugin_npu.attention import NpuFusedAttentionBackend
from omni_plugin_npu.platform import NpuPlatform

from omni_core.attention.config import AttentionConfig, AttentionConfigError
from omni_core.attention.selector import CallProfile, explain_attention
from omni_core.selection import Outcome


def _candidate(explanation, name):
    return next(c for c in explanation.candidates if c.name == name)


def test_flash_attn_resolves_to_the_fused_kernel(npu_plugins, fake_torch_npu):
    choice, explanation = explain_attention(npu_plugins, NpuPlatform())
    assert choice is not None and choice.backend == "NPU_FUSED_ATTN" and not choice.explicit
    assert choice.backend_class is NpuFusedAttentionBackend
    fused = _candidate(explanation, "NPU_FUSED_ATTN")
    assert fused.outcome is Outcome.SELECTED
    assert "npu serves FLASH_ATTN with NPU_FUSED_ATTN" in fused.reason
    assert explanation.rule.startswith("defaulting to NPU_FUSED_ATTN")


def test_masked_gqa_causal_varlen_roles_keep_the_fused_kernel(npu_plugins, fake_torch_npu):
    call = CallProfile(head_size=128, dtype="bfloat16", causal=True, mask=True, varlen=True, gqa=True)
    choice, _ = explain_attention(npu_plugins, NpuPlatform(), call=call)
    assert choice is not None and choice.backend == "NPU_FUSED_ATTN"


def test_float64_roles_take_sdpa(npu_plugins, fake_torch_npu):
    choice, explanation = explain_attention(npu_plugins, NpuPlatform(), call=CallProfile(dtype="float64"))
    assert choice is not None and choice.backend == "TORCH_SDPA"
    assert "dtype float64" in _candidate(explanation, "NPU_FUSED_ATTN").reason


def test_without_torch_npu_it_falls_back_to_sdpa_and_says_why(npu_plugins, no_torch_npu):
    choice, explanation = explain_attention(npu_plugins, NpuPlatform())
    assert choice is not None and choice.backend == "TORCH_SDPA"
    fused = _candidate(explanation, "NPU_FUSED_ATTN")
    assert fused.outcome is Outcome.REJECTED
    assert "npu serves FLASH_ATTN with NPU_FUSED_ATTN; package(s) not installed: torch_npu" in fused.reason


def test_an_explicit_flash_attn_without_torch_npu_raises(npu_plugins, no_torch_npu):
    with pytest.raises(AttentionConfigError, match=r"FLASH_ATTN was chosen explicitly.*not installed: torch_npu"):
        explain_attention(npu_plugins, NpuPlatform(), AttentionConfig.parse("flash_attn"))


def test_an_explicit_flash_attn_runs_the_fused_kernel(npu_plugins, fake_torch_npu):
    choice, _ = explain_attention(npu_plugins, NpuPlatform(), AttentionConfig.parse("FLASH_ATTN"))
    assert choice is not None and choice.explicit and choice.backend == "NPU_FUSED_ATTN"


def test_the_fused_kernel_is_not_offered_off_the_npu(npu_plugins, fake_torch_npu):
    from omni_plugin_cpu.platform import CpuPlatform

    with pytest.raises(AttentionConfigError, match="runs on npu, not cpu"):
        explain_attention(npu_plugins, CpuPlatform(), AttentionConfig.parse("NPU_FUSED_ATTN"))
