"""omni on Huawei Ascend NPUs: the ``npu`` platform and the ``NPU_FUSED_ATTN`` attention backend.

Importing this package is cheap: it imports neither torch nor torch_npu.
"""
