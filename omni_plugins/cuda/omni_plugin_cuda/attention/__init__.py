"""CUDA attention backends, one module each. Kernel packages are imported on first use."""
