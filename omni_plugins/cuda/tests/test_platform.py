"""The CUDA platform's answers, through torch.cuda (monkeypatched: no GPU here)."""

from __future__ import annotations

import pytest
from omni_plugin_cuda.platform import CudaPlatform, cuda_attention_chain

from omni_core.platforms import MemoryInfo

BLACKWELL_CHAIN = ("CUDNN_ATTN", "FLASHINFER_ATTN", "FLASH_ATTN", "TORCH_SDPA")


def test_identity():
    platform = CudaPlatform()
    assert (platform.name, platform.device_type) == ("cuda", "cuda")
    assert platform.visible_devices_env == "CUDA_VISIBLE_DEVICES"
    assert platform.supports_offload is True


def test_answers_about_the_gpus(gpu):
    record = gpu(capability=(9, 0), count=2, memory=(10 * 2**30, 80 * 2**30))
    platform = CudaPlatform()
    assert platform.device_count() == 2
    assert platform.device_name(1) == "NVIDIA H100 80GB HBM3"
    assert platform.memory_info(0) == MemoryInfo(10 * 2**30, 80 * 2**30)
    assert platform.compute_capability() == (9, 0)
    assert platform.supported_dtypes() == ("bfloat16", "float32", "float16", "float64")
    assert str(platform.device(1)) == "cuda:1"
    platform.synchronize()
    assert record["synchronize"] == 1
    platform.seed_everything(7)
    assert record["seeds"] and set(record["seeds"]) == {7}


def test_without_bf16_hardware_bf16_is_not_offered(gpu):
    gpu(capability=(7, 5), bf16=False)
    assert "bfloat16" not in CudaPlatform().supported_dtypes()


def test_every_answer_is_safe_without_a_device(gpu):
    record = gpu(count=0)
    platform = CudaPlatform()
    assert platform.device_count() == 0
    assert platform.compute_capability() is None
    assert platform.memory_info() == MemoryInfo(0, 0)
    assert platform.device_name() == "no CUDA device"
    assert "bfloat16" not in platform.supported_dtypes()
    assert platform.default_attention_chain(128, True) == ("TORCH_SDPA",)
    platform.synchronize()
    assert record["synchronize"] == 0 and record["capability_of"] == []


def test_the_real_cpu_build_reports_no_device():
    platform = CudaPlatform()  # torch here is the CPU build: no monkeypatching
    assert platform.device_count() == 0 and platform.compute_capability() is None
    facts = platform.facts()
    assert facts["device_count"] == 0 and facts["cuda_version"] is None and facts["cudnn_version"] is None


def test_facts_add_cuda_and_cudnn_versions(gpu):
    gpu(capability=(10, 0), count=1, cudnn=91000, name="NVIDIA B200")
    facts = CudaPlatform().facts()
    assert facts["platform"] == "cuda" and facts["device_count"] == 1
    assert facts["cuda_version"] == "12.8" and facts["cudnn_version"] == 91000
    assert facts["device_name"] == "NVIDIA B200" and facts["compute_capability"] == (10, 0)
    assert facts["devices"] == [{"index": 0, "name": "NVIDIA B200", "compute_capability": (10, 0)}]
    assert facts["default_attention_chain"] == list(BLACKWELL_CHAIN)
    assert facts["attention_chain_head128_packed"] == ["TRTLLM_ATTN", *BLACKWELL_CHAIN]


@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (8, 9), (9, 0)])
@pytest.mark.parametrize(("head_size", "packed"), [(128, True), (128, False), (64, True), (None, False)])
def test_ampere_ada_hopper_chain_is_flash_attn_then_sdpa(gpu, capability, head_size, packed):
    gpu(capability=capability)
    assert CudaPlatform().default_attention_chain(head_size, packed) == ("FLASH_ATTN", "TORCH_SDPA")


@pytest.mark.parametrize("capability", [(10, 0), (10, 3)])
def test_datacenter_blackwell_puts_trtllm_first_only_for_packed_head_128(gpu, capability):
    gpu(capability=capability)
    platform = CudaPlatform()
    assert platform.default_attention_chain(128, True) == ("TRTLLM_ATTN", *BLACKWELL_CHAIN)
    assert platform.default_attention_chain(128, False) == BLACKWELL_CHAIN
    assert platform.default_attention_chain(64, True) == BLACKWELL_CHAIN
    assert platform.default_attention_chain(None, True) == BLACKWELL_CHAIN
    assert platform.default_attention_chain() == BLACKWELL_CHAIN


@pytest.mark.parametrize("capability", [(12, 0), (12, 1)])
def test_consumer_blackwell_never_gets_trtllm(gpu, capability):
    gpu(capability=capability)
    platform = CudaPlatform()
    for head_size in (64, 128, None):
        for packed in (False, True):
            assert platform.default_attention_chain(head_size, packed) == BLACKWELL_CHAIN


@pytest.mark.parametrize("capability", [(7, 0), (7, 5), (6, 1)])
def test_older_gpus_use_sdpa(gpu, capability):
    gpu(capability=capability)
    assert CudaPlatform().default_attention_chain(128, True) == ("TORCH_SDPA",)


def test_chain_function_directly():
    assert cuda_attention_chain(None, 128, True) == ("TORCH_SDPA",)
    assert cuda_attention_chain((11, 0), 128, True) == BLACKWELL_CHAIN  # a later arch: Blackwell-like, no TRTLLM
    for cc in [(7, 5), (8, 0), (9, 0), (10, 0), (12, 0), (12, 1)]:
        assert cuda_attention_chain(cc)[-1] == "TORCH_SDPA"
