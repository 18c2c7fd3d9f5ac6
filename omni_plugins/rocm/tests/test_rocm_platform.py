"""The rocm platform's answers, from a stand-in ROCm build of torch (torch.cuda over HIP)."""

from __future__ import annotations

import pytest
from omni_plugin_rocm.platform import RocmPlatform

from omni_core.testing import check_capabilities


def test_identity_and_flags():
    assert RocmPlatform.name == "rocm"
    assert RocmPlatform.device_type == "cuda"  # what torch calls HIP devices
    assert RocmPlatform.visible_devices_env == "HIP_VISIBLE_DEVICES"
    assert RocmPlatform.supports_offload is True
    assert RocmPlatform.blocking_offload_copies is False


def test_answers_about_its_gpus(rocm_torch):
    import torch

    platform = RocmPlatform()
    assert platform.device_count() == 2
    assert platform.device_name(1) == "AMD Instinct MI300X"
    mem = platform.memory_info(0)
    assert mem.total_bytes == 192 * 2**30 and mem.free_bytes == 150 * 2**30
    assert platform.compute_capability(0) == (9, 4)
    assert platform.gcn_arch_name(0) == "gfx942:sramecc+:xnack-"
    assert platform.gcn_arch(0) == "gfx942"
    assert {"float32", "bfloat16", "float16"} <= set(platform.supported_dtypes())
    assert platform.device(1) == torch.device("cuda", 1)


def test_facts_include_the_hip_version_and_architecture(rocm_torch):
    facts = RocmPlatform().facts()
    assert facts["platform"] == "rocm" and facts["device_count"] == 2
    assert facts["hip_version"] == "6.4.43482-0f2d60242"
    assert facts["gcn_arch_name"] == "gfx942:sramecc+:xnack-"
    assert facts["compute_capability"] == (9, 4)
    assert facts["default_attention_chain"] == ["FLASH_ATTN", "TORCH_SDPA"]
    assert facts["device_name"] == "AMD Instinct MI300X"


def test_flash_attn_means_aiter_here():
    platform = RocmPlatform()
    assert platform.default_attention_chain() == ("FLASH_ATTN", "TORCH_SDPA")
    assert platform.default_attention_chain(head_size=128, packed_mask_free=True)[-1] == "TORCH_SDPA"
    assert platform.resolve_attention_name("flash_attn") == "ROCM_AITER_FA"
    assert platform.resolve_attention_name(" FLASH_ATTN ") == "ROCM_AITER_FA"
    assert platform.resolve_attention_name("torch_sdpa") == "TORCH_SDPA"


def test_synchronize_and_seeding_reach_the_gpus(rocm_torch):
    import torch

    platform = RocmPlatform()
    platform.synchronize()
    platform.seed_everything(7)
    assert ("synchronize", None) in rocm_torch.calls and ("manual_seed_all", 7) in rocm_torch.calls
    a = torch.randn(3)
    platform.seed_everything(7)
    assert torch.equal(a, torch.randn(3))


def test_a_torch_without_hip_fails_clearly(monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(RuntimeError, match="needs a ROCm build of torch"):
        RocmPlatform().device_count()


def test_conformance_holds_when_the_hardware_is_present(omni_isolated, rocm_machine, rocm_torch):
    # the probe claims, so the kit also checks what the platform answers about its devices
    assert check_capabilities("rocm") == []
