"""The xpu platform's answers, from monkeypatched torch.xpu functions, and its attention chain."""

from __future__ import annotations

import pytest
from omni_plugin_xpu.platform import XpuPlatform

from omni_core.attention.config import AttentionConfig, AttentionConfigError
from omni_core.attention.selector import explain_attention
from omni_core.testing import check_capabilities


def test_identity_and_flags():
    assert XpuPlatform.name == "xpu" and XpuPlatform.device_type == "xpu"
    assert XpuPlatform.visible_devices_env == "ZE_AFFINITY_MASK"
    assert XpuPlatform.supports_offload is True
    # the XPU allocator cannot evict during async device-to-host copies
    assert XpuPlatform.blocking_offload_copies is True


def test_answers_about_its_gpus(xpu_torch):
    import torch

    platform = XpuPlatform()
    assert platform.device_count() == 2
    assert platform.device_name(1) == "Intel(R) Arc(TM) Pro B60 Graphics"
    mem = platform.memory_info(1)
    assert mem.free_bytes == 20 * 2**30 and mem.total_bytes == 24 * 2**30
    assert platform.supported_dtypes() == ("float32", "bfloat16", "float16")
    xpu_torch.has_fp64 = True
    assert "float64" in platform.supported_dtypes()
    assert platform.device(1) == torch.device("xpu", 1)
    assert platform.compute_capability() is None


def test_facts(xpu_torch):
    facts = XpuPlatform().facts()
    assert facts["platform"] == "xpu" and facts["device_count"] == 2
    assert facts["driver_version"] == "1.6.33578+11"
    assert facts["blocking_offload_copies"] is True and facts["supports_offload"] is True
    assert facts["default_attention_chain"] == ["TORCH_SDPA"]


def test_synchronize_and_seeding_reach_the_gpus(xpu_torch):
    platform = XpuPlatform()
    platform.synchronize()
    platform.seed_everything(5)
    assert xpu_torch.calls[0] == ("synchronize", None) and ("manual_seed_all", 5) in xpu_torch.calls


def test_a_torch_without_xpu_fails_clearly(monkeypatch):
    import torch

    monkeypatch.setattr(torch.xpu, "_is_compiled", lambda: False)
    with pytest.raises(RuntimeError, match="needs the XPU build of torch"):
        XpuPlatform().device_count()


def test_attention_defaults_to_sdpa(xpu_plugins, xpu_torch):
    platform = XpuPlatform()
    assert platform.default_attention_chain() == ("TORCH_SDPA",)
    assert platform.default_attention_chain(128, packed_mask_free=True) == ("TORCH_SDPA",)
    assert platform.resolve_attention_name("flash_attn") == "FLASH_ATTN"  # no vendor alias
    choice, explanation = explain_attention(xpu_plugins, platform)
    assert choice is not None and choice.backend == "TORCH_SDPA" and not choice.explicit
    assert "first in the default chain" in explanation.rule
    with pytest.raises(AttentionConfigError, match="FLASH_ATTN was chosen explicitly"):
        explain_attention(xpu_plugins, platform, AttentionConfig.parse("FLASH_ATTN"))


def test_conformance_holds_when_the_hardware_is_present(omni_isolated, xpu_machine, xpu_torch):
    assert check_capabilities("xpu") == []
