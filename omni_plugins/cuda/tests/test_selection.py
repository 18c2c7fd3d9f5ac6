"""Availability, automatic and explicit selection through omni's real selector and plugin set,
option-block validation, and ``omni explain attention --platform cuda`` end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cuda_fakes
import pytest
from omni_plugin_cuda.attention.cudnn import CudnnAttentionBackend
from omni_plugin_cuda.attention.flash_attention import FlashAttentionBackend
from omni_plugin_cuda.attention.flashinfer_prefill import FlashInferBackend
from omni_plugin_cuda.attention.sage3 import SageAttention3Backend
from omni_plugin_cuda.attention.trtllm import TrtllmAttentionBackend
from omni_plugin_cuda.platform import CudaPlatform

from omni_core.attention.config import AttentionConfig, AttentionConfigError, AttentionSpec
from omni_core.attention.selector import CallProfile, explain_attention, select_attention
from omni_core.plugins import load_plugins
from omni_core.selection import Outcome
from omni_core.testing import isolated_settings

CALL = CallProfile(head_size=128, dtype="bfloat16")


@pytest.fixture
def plugins(omni_isolated):  # type: ignore[no-untyped-def]
    plugin_set = load_plugins(isolated_settings())
    assert {"cpu", "cuda"} <= {r.name for r in plugin_set.records if r.status.value == "ok"}
    return plugin_set


def outcomes(explanation):  # type: ignore[no-untyped-def]
    return {c.name: (c.outcome, c.reason) for c in explanation.candidates}


# --- availability -----------------------------------------------------------------------------


def test_availability_reasons_from_the_most_fundamental(gpu, install):
    class Cpu(CudaPlatform):
        name = "cpu"
        device_type = "cpu"

    assert FlashAttentionBackend.availability(Cpu()).reason == "runs on cuda, not cpu"
    gpu(count=0)
    assert FlashAttentionBackend.availability(CudaPlatform()).reason == "needs a CUDA GPU; cuda reports none"
    gpu(capability=(7, 5))
    old_gpu = FlashAttentionBackend.availability(CudaPlatform())
    assert "needs compute capability >= 8.0, this GPU is sm_75" in old_gpu.reason
    gpu(capability=(9, 0))
    missing = FlashAttentionBackend.availability(CudaPlatform())
    assert not missing.ok and "none of flash_attn_interface, flash_attn is installed" in missing.reason
    assert "omni-plugin-cuda[flash-attn]" in missing.reason
    install(cuda_fakes.flash_attn_3_modules())
    assert FlashAttentionBackend.availability(CudaPlatform()).ok
    gpu(capability=(10, 0))
    blackwell = FlashAttentionBackend.availability(CudaPlatform())
    assert not blackwell.ok and "FA3) ships Hopper kernels only" in blackwell.reason
    install(cuda_fakes.flash_attn_modules())
    assert FlashAttentionBackend.availability(CudaPlatform()).ok


def test_a_rocm_build_of_torch_is_not_an_nvidia_gpu(gpu, install, monkeypatch):
    import torch

    install(cuda_fakes.flash_attn_modules())
    gpu(capability=(9, 4))  # what torch.cuda reports for an MI300X under ROCm
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    for backend in (FlashAttentionBackend, CudnnAttentionBackend):
        result = backend.availability(CudaPlatform())
        assert not result.ok and "ROCm (HIP 6.4.43482) build" in result.reason


def test_trtllm_runs_on_datacenter_blackwell_only(gpu, install):
    install(cuda_fakes.flashinfer_modules())
    for cc, ok in (((9, 0), False), ((10, 0), True), ((10, 3), True), ((12, 0), False), ((12, 1), False)):
        gpu(capability=cc)
        result = TrtllmAttentionBackend.availability(CudaPlatform())
        assert result.ok is ok, (cc, result)
        if not ok:
            assert result.reason == f"runs only on sm_100/sm_103, this GPU is sm_{cc[0]}{cc[1]}"


def test_cudnn_needs_9_5_but_asks_only_when_a_gpu_exists(gpu):
    gpu(capability=(10, 0), cudnn=90400)
    assert CudnnAttentionBackend.availability(CudaPlatform()).reason == "needs cuDNN >= 9.5, torch has cuDNN 9.4"
    gpu(capability=(10, 0), cudnn=90500)
    assert CudnnAttentionBackend.availability(CudaPlatform()).ok
    gpu(capability=(10, 0), cudnn=None)
    assert "no cuDNN" in CudnnAttentionBackend.availability(CudaPlatform()).reason
    gpu(count=0, cudnn=None)
    assert CudnnAttentionBackend.availability(CudaPlatform()).reason == "needs a CUDA GPU; cuda reports none"


def test_sage3_needs_blackwell(gpu, install):
    install(cuda_fakes.sageattn3_modules())
    gpu(capability=(9, 0))
    assert "needs compute capability >= 10.0" in SageAttention3Backend.availability(CudaPlatform()).reason
    gpu(capability=(12, 0))
    assert SageAttention3Backend.availability(CudaPlatform()).ok


# --- automatic selection ----------------------------------------------------------------------


def test_hopper_without_kernels_defaults_to_sdpa_and_says_why(plugins, gpu):
    gpu(capability=(9, 0))
    choice, explanation = explain_attention(plugins, CudaPlatform(), call=CALL)
    assert choice is not None and choice.backend == "TORCH_SDPA" and choice.spec is None
    found = outcomes(explanation)
    assert found["FLASH_ATTN"][0] is Outcome.REJECTED and "none of flash_attn_interface" in found["FLASH_ATTN"][1]
    for explicit_only in ("CUDNN_ATTN", "FLASHINFER_ATTN", "SAGE_ATTN", "TRTLLM_ATTN"):
        assert found[explicit_only][0] is Outcome.NOT_CONSIDERED


def test_hopper_with_flash_attn_picks_it_but_passes_it_over_for_masks(plugins, gpu, install):
    gpu(capability=(9, 0))
    install(cuda_fakes.flash_attn_modules())
    platform = CudaPlatform()
    assert select_attention(plugins, platform, call=CALL).backend == "FLASH_ATTN"
    masked = CallProfile(head_size=128, dtype="bfloat16", mask=True)
    choice, explanation = explain_attention(plugins, platform, call=masked)
    assert choice is not None and choice.backend == "TORCH_SDPA"
    assert outcomes(explanation)["FLASH_ATTN"] == (Outcome.REJECTED, "does not support attention masks")
    with pytest.raises(
        AttentionConfigError, match=r"FLASH_ATTN was chosen explicitly .* does not support attention mask"
    ):
        select_attention(plugins, platform, AttentionConfig.parse("flash_attn"), call=masked)
    fp32 = CallProfile(head_size=128, dtype="float32")
    assert select_attention(plugins, platform, call=fp32).backend == "TORCH_SDPA"


def test_blackwell_chain_through_the_selector(plugins, gpu, install):
    install(cuda_fakes.flashinfer_modules())
    gpu(capability=(10, 0), cudnn=91000)
    platform = CudaPlatform()
    packed = CallProfile(head_size=128, dtype="bfloat16", packed_mask_free=True)
    assert select_attention(plugins, platform, call=packed).backend == "TRTLLM_ATTN"
    assert select_attention(plugins, platform, call=CALL).backend == "CUDNN_ATTN"
    gpu(capability=(10, 0), cudnn=90100)
    choice, explanation = explain_attention(plugins, platform, call=CALL)
    assert choice is not None and choice.backend == "FLASHINFER_ATTN"
    assert "needs cuDNN >= 9.5" in outcomes(explanation)["CUDNN_ATTN"][1]
    gpu(capability=(12, 0), cudnn=91000)
    assert select_attention(plugins, platform, call=packed).backend == "CUDNN_ATTN"  # never TRTLLM on sm_120


def test_lossy_backends_are_explicit_only(plugins, gpu, install):
    install(cuda_fakes.sageattention_modules())
    gpu(capability=(9, 0))
    platform = CudaPlatform()
    assert select_attention(plugins, platform, call=CALL).backend == "TORCH_SDPA"
    choice = select_attention(plugins, platform, AttentionConfig.parse("sage_attn"), call=CALL)
    assert choice.backend == "SAGE_ATTN" and choice.explicit


# --- explicit choices that cannot run ---------------------------------------------------------


def test_explicit_trtllm_off_datacenter_blackwell_raises(plugins, gpu, install):
    install(cuda_fakes.flashinfer_modules())
    gpu(capability=(9, 0))
    with pytest.raises(AttentionConfigError, match=r"TRTLLM_ATTN was chosen explicitly .* runs only on sm_100/sm_103"):
        select_attention(plugins, CudaPlatform(), AttentionConfig.parse("TRTLLM_ATTN"), call=CALL)
    gpu(capability=(10, 0))
    with pytest.raises(AttentionConfigError, match=r"head size 64 not in \[128\]"):
        select_attention(plugins, CudaPlatform(), AttentionConfig.parse("TRTLLM_ATTN"), call=CallProfile(head_size=64))


def test_explicit_sage3_with_gqa_raises(plugins, gpu, install):
    install(cuda_fakes.sageattn3_modules())
    gpu(capability=(12, 0))
    gqa = CallProfile(head_size=128, dtype="bfloat16", gqa=True)
    with pytest.raises(AttentionConfigError, match="does not support grouped-query attention"):
        select_attention(plugins, CudaPlatform(), AttentionConfig.parse("SAGE_ATTN_3"), call=gqa)


def test_explicit_choice_without_the_package_names_the_extra(plugins, gpu):
    gpu(capability=(9, 0))
    with pytest.raises(AttentionConfigError, match=r"flashinfer.*omni-plugin-cuda\[flashinfer\]"):
        select_attention(plugins, CudaPlatform(), AttentionConfig.parse("FLASHINFER_ATTN"), call=CALL)


# --- option blocks ----------------------------------------------------------------------------


def config(backend: str, **blocks) -> AttentionConfig:  # type: ignore[no-untyped-def]
    return AttentionConfig.parse({"default": {"backend": backend, **blocks}})


def test_flashinfer_rejects_sage_dtypes(plugins, gpu, install):
    install(cuda_fakes.flashinfer_modules())
    gpu(capability=(10, 0))
    with pytest.raises(AttentionConfigError, match=r"dtype_qk must be one of float16, bfloat16, not 'int8'.*TRTLLM"):
        select_attention(plugins, CudaPlatform(), config("FLASHINFER_ATTN", quant={"dtype_qk": "int8"}), call=CALL)
    for bad, match in (
        ({"dtype_vo": "int8"}, "dtype_vo must be one of"),
        ({"dtype_qk": "float16", "k_block_size": 16}, "block sizes belong to TRTLLM_ATTN"),
        ({}, "needs dtype_qk and/or dtype_vo"),
    ):
        with pytest.raises(ValueError, match=match):
            FlashInferBackend.validate_options(AttentionSpec(backend="FLASHINFER_ATTN", quant=bad))
    with pytest.raises(ValueError, match="does not support option block"):
        FlashInferBackend.validate_options(AttentionSpec(backend="FLASHINFER_ATTN", skip_softmax={"threshold": 0.1}))


def test_trtllm_rejects_flashinfer_dtypes(plugins, gpu, install):
    install(cuda_fakes.flashinfer_modules())
    gpu(capability=(10, 0))
    with pytest.raises(AttentionConfigError, match=r"dtype_qk must be one of int8, fp8_e4m3, not 'bfloat16'"):
        select_attention(plugins, CudaPlatform(), config("TRTLLM_ATTN", quant={"dtype_qk": "bfloat16"}), call=CALL)
    with pytest.raises(ValueError, match="per-channel fp8_e4m3 always"):
        TrtllmAttentionBackend.validate_options(
            AttentionSpec(backend="TRTLLM_ATTN", quant={"dtype_qk": "int8", "dtype_vo": "bfloat16"})
        )
    with pytest.raises(ValueError, match="does not support option block"):
        TrtllmAttentionBackend.validate_options(AttentionSpec(backend="TRTLLM_ATTN", block_sparse={}))


def test_torch_sdpa_with_quant_raises(plugins, gpu):
    gpu(capability=(9, 0))
    with pytest.raises(AttentionConfigError, match=r"TORCH_SDPA does not support option block\(s\) \['quant'\]"):
        select_attention(plugins, CudaPlatform(), config("TORCH_SDPA", quant={"dtype_qk": "float16"}), call=CALL)


def test_accepted_options_reach_the_layer(plugins, gpu, install):
    install(cuda_fakes.flashinfer_modules())
    gpu(capability=(10, 0))
    cfg = config("TRTLLM_ATTN", quant={"dtype_qk": "fp8_e4m3"}, skip_softmax={"threshold": 0.2})
    choice = select_attention(plugins, CudaPlatform(), cfg, call=CALL)
    impl = choice.create(8, 128, num_kv_heads=2)
    assert impl.options == cfg.default and impl.block("quant").dtype_qk == "fp8_e4m3"
    assert impl.block("skip_softmax").threshold == 0.2 and impl.prefix == "self"
    plain = select_attention(plugins, CudaPlatform(), AttentionConfig.parse("TRTLLM_ATTN"), call=CALL)
    assert plain.create(8, 128).options is None


# --- the CLI, end to end ----------------------------------------------------------------------


def omni(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    env.update(OMNI_CONFIG_DIR=str(tmp_path / "config"), OMNI_CACHE_DIR=str(tmp_path / "cache"))
    env["OMNI_PLUGINS"] = "cpu,cuda"  # this plugin and the reference backend, whatever else is installed
    exe = Path(sys.executable).with_name("omni")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, check=False)


def test_omni_explain_attention_on_the_cuda_platform(tmp_path):
    auto = omni(tmp_path, "explain", "attention", "--platform", "cuda", "--role", "self")
    assert auto.returncode == 0, auto.stderr
    assert "platform cuda" in auto.stdout and "=> TORCH_SDPA" in auto.stdout
    explicit = omni(tmp_path, "explain", "attention", "--platform", "cuda", "--attention-backend", "flash_attn")
    assert explicit.returncode != 0
    text = explicit.stdout + explicit.stderr
    assert "FLASH_ATTN was chosen explicitly" in text and "needs a CUDA GPU; cuda reports none" in text
