"""Hook implementations: register names and lazy references only, never import torch here."""

from omni_core import hookimpl

#: registered name -> backend class; every one runs on CUDA devices only
ATTENTION_BACKENDS = (
    ("FLASH_ATTN", "omni_plugin_cuda.attention.flash_attention:FlashAttentionBackend"),
    ("FLASHINFER_ATTN", "omni_plugin_cuda.attention.flashinfer_prefill:FlashInferBackend"),
    ("CUDNN_ATTN", "omni_plugin_cuda.attention.cudnn:CudnnAttentionBackend"),
    ("SAGE_ATTN", "omni_plugin_cuda.attention.sage:SageAttentionBackend"),
    ("SAGE_ATTN_3", "omni_plugin_cuda.attention.sage3:SageAttention3Backend"),
    ("TRTLLM_ATTN", "omni_plugin_cuda.attention.trtllm:TrtllmAttentionBackend"),
)


@hookimpl
def omni_register_platforms(registry):  # type: ignore[no-untyped-def]
    # Above the CPU (-100): when the probe finds an NVIDIA GPU and a CUDA build of torch,
    # this platform wins; the probe reads files only (no torch import, no NVML).
    registry.register(
        "cuda",
        "omni_plugin_cuda.platform:CudaPlatform",
        probe="omni_plugin_cuda.probe:probe",
        priority=10,
    )


@hookimpl
def omni_register_attention_backends(registry):  # type: ignore[no-untyped-def]
    for name, ref in ATTENTION_BACKENDS:
        registry.register(name, ref, device_types=("cuda",))
