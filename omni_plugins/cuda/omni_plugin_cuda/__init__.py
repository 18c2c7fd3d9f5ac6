"""omni on NVIDIA GPUs: the CUDA platform and its attention backends.

Importing this package is cheap: it imports neither torch nor any vendor library. The
platform, the probe and every backend are registered as lazy ``module:attr`` strings.
"""
