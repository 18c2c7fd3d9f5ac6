"""omni on AMD GPUs (ROCm): the ``rocm`` platform and the ``ROCM_AITER_FA`` attention backend.

Importing this package is cheap: it imports neither torch nor any AMD library.
"""
