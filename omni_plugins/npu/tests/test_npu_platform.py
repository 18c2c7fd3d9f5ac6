"""The npu platform's answers, from stand-ins for torch_npu and the torch.npu it registers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omni_plugin_npu.platform import NpuPlatform

from omni_core.testing import check_capabilities


def test_identity_and_flags():
    assert NpuPlatform.name == "npu" and NpuPlatform.device_type == "npu"
    assert NpuPlatform.visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    assert NpuPlatform.supports_offload is True and NpuPlatform.blocking_offload_copies is False


def test_answers_about_its_npus(fake_torch_npu):
    platform = NpuPlatform()
    assert platform.device_count() == 8
    assert platform.device_name(3) == "Ascend910B3"
    mem = platform.memory_info(0)
    assert mem.free_bytes == 60 * 2**30 and mem.total_bytes == 64 * 2**30
    assert platform.compute_capability() is None
    assert set(platform.supported_dtypes()) == {"float32", "bfloat16", "float16"}
    facts = platform.facts()
    assert facts["platform"] == "npu" and facts["device_count"] == 8
    assert facts["torch_npu_version"] == "2.6.0.post1" and facts["device_name"] == "Ascend910B3"
    assert facts["default_attention_chain"] == ["FLASH_ATTN", "TORCH_SDPA"]


def test_flash_attn_means_the_fused_kernel_here():
    platform = NpuPlatform()
    assert platform.default_attention_chain() == ("FLASH_ATTN", "TORCH_SDPA")
    assert platform.default_attention_chain(64, packed_mask_free=True)[-1] == "TORCH_SDPA"
    assert platform.resolve_attention_name("Flash_Attn") == "NPU_FUSED_ATTN"
    assert platform.resolve_attention_name("TORCH_SDPA") == "TORCH_SDPA"


def test_synchronize_and_seeding_reach_the_npus(fake_torch_npu):
    platform = NpuPlatform()
    platform.synchronize()
    platform.seed_everything(11)
    assert fake_torch_npu.npu.calls == [("synchronize", None), ("manual_seed_all", 11)]


def test_without_torch_npu_the_platform_fails_clearly(no_torch_npu):
    with pytest.raises(RuntimeError, match="needs torch_npu"):
        NpuPlatform().device_count()


_DEVICE = """
import json, sys, types, importlib.machinery
import torch
# what importing torch_npu does to torch: the PrivateUse1 backend becomes "npu"
torch.utils.rename_privateuse1_backend("npu")
fake = types.ModuleType("torch_npu")
fake.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
sys.modules["torch_npu"] = fake
from omni_plugin_npu.platform import NpuPlatform
print(json.dumps(str(NpuPlatform().device(3))))
"""


def test_devices_are_npu_devices():
    # in a fresh interpreter: renaming torch's PrivateUse1 backend cannot be undone
    proc = subprocess.run([sys.executable, "-c", _DEVICE], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == "npu:3"


def test_conformance_holds_when_the_hardware_is_present(omni_isolated, npu_machine, fake_torch_npu):
    assert check_capabilities("npu") == []
