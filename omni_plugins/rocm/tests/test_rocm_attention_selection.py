"""FLASH_ATTN on ROCm: the platform's chain and alias through omni's attention selector."""

from __future__ import annotations

import pytest
from omni_plugin_rocm.attention import RocmAiterFlashAttentionBackend
from omni_plugin_rocm.platform import RocmPlatform

from omni_core.attention.config import AttentionConfig, AttentionConfigError
from omni_core.attention.selector import CallProfile, explain_attention
from omni_core.selection import Outcome


def _candidate(explanation, name):
    return next(c for c in explanation.candidates if c.name == name)


def test_flash_attn_resolves_to_aiter_on_an_mi300(rocm_plugins, rocm_torch, fake_aiter):
    choice, explanation = explain_attention(rocm_plugins, RocmPlatform())
    assert choice is not None and choice.backend == "ROCM_AITER_FA"
    assert choice.backend_class is RocmAiterFlashAttentionBackend
    assert choice.explicit is False
    aiter = _candidate(explanation, "ROCM_AITER_FA")
    assert aiter.outcome is Outcome.SELECTED
    assert "rocm serves FLASH_ATTN with ROCM_AITER_FA" in aiter.reason
    assert _candidate(explanation, "TORCH_SDPA").outcome is Outcome.NOT_CONSIDERED
    assert explanation.rule.startswith("defaulting to ROCM_AITER_FA")
    assert "rocm serves FLASH_ATTN with ROCM_AITER_FA" in explanation.render()


def test_without_aiter_it_falls_back_to_sdpa_and_says_why(rocm_plugins, rocm_torch, no_aiter):
    choice, explanation = explain_attention(rocm_plugins, RocmPlatform())
    assert choice is not None and choice.backend == "TORCH_SDPA"
    aiter = _candidate(explanation, "ROCM_AITER_FA")
    assert aiter.outcome is Outcome.REJECTED
    assert "rocm serves FLASH_ATTN with ROCM_AITER_FA" in aiter.reason
    assert "package(s) not installed: aiter" in aiter.reason
    assert "defaulting to TORCH_SDPA" in explanation.rule and "ROCM_AITER_FA" in explanation.rule


def test_an_explicit_flash_attn_without_aiter_raises_with_the_reason(rocm_plugins, rocm_torch, no_aiter):
    config = AttentionConfig.parse("FLASH_ATTN")
    with pytest.raises(AttentionConfigError, match=r"FLASH_ATTN was chosen explicitly.*not installed: aiter"):
        explain_attention(rocm_plugins, RocmPlatform(), config)


def test_an_explicit_flash_attn_runs_aiter(rocm_plugins, rocm_torch, fake_aiter):
    choice, explanation = explain_attention(
        rocm_plugins, RocmPlatform(), AttentionConfig.parse({"per_role": {"cross": {"backend": "flash_attn"}}}), "cross"
    )
    assert choice is not None and choice.explicit and choice.backend == "ROCM_AITER_FA"
    assert "explicit" in _candidate(explanation, "ROCM_AITER_FA").reason


def test_other_gpu_architectures_fall_back(rocm_plugins, rocm_torch, fake_aiter):
    rocm_torch.arch = "gfx90a:sramecc+:xnack-"  # MI250
    choice, explanation = explain_attention(rocm_plugins, RocmPlatform())
    assert choice is not None and choice.backend == "TORCH_SDPA"
    assert "runs on gfx942/gfx950" in _candidate(explanation, "ROCM_AITER_FA").reason
    assert "not gfx90a" in _candidate(explanation, "ROCM_AITER_FA").reason
    with pytest.raises(AttentionConfigError, match="not gfx90a"):
        explain_attention(rocm_plugins, RocmPlatform(), AttentionConfig.parse("ROCM_AITER_FA"))


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (CallProfile(mask=True), "does not support attention masks"),
        (CallProfile(dtype="float32"), "dtype float32"),
        (CallProfile(head_size=512), "head size 512 is above 256"),
    ],
)
def test_calls_aiter_cannot_serve_take_sdpa(rocm_plugins, rocm_torch, fake_aiter, call, why):
    choice, explanation = explain_attention(rocm_plugins, RocmPlatform(), call=call)
    assert choice is not None and choice.backend == "TORCH_SDPA"
    assert why in _candidate(explanation, "ROCM_AITER_FA").reason


def test_calls_aiter_serves(rocm_plugins, rocm_torch, fake_aiter):
    call = CallProfile(head_size=128, dtype="bfloat16", causal=True, varlen=True, gqa=True)
    choice, _ = explain_attention(rocm_plugins, RocmPlatform(), call=call)
    assert choice is not None and choice.backend == "ROCM_AITER_FA"


def test_aiter_is_not_offered_off_amd_gpus(rocm_plugins, fake_aiter):
    from omni_plugin_cpu.platform import CpuPlatform

    with pytest.raises(AttentionConfigError, match="runs on cuda, not cpu"):
        explain_attention(rocm_plugins, CpuPlatform(), AttentionConfig.parse("ROCM_AITER_FA"))


def test_an_nvidia_gpu_is_not_an_aiter_target(fake_aiter):
    from omni_core.platforms import MemoryInfo, Platform

    class NvidiaLike(Platform):  # device type "cuda", but no AMD architecture to report
        name = "cuda"
        device_type = "cuda"

        def device_count(self):
            return 1

        def device_name(self, index=0):
            return "NVIDIA H200"

        def memory_info(self, index=0):
            return MemoryInfo(0, 0)

        def supported_dtypes(self):
            return ("float32",)

    availability = RocmAiterFlashAttentionBackend.availability(NvidiaLike())
    assert availability.ok is False and "reports no GPU architecture" in availability.reason
