"""omni's CPU platform and TORCH_SDPA attention backend. Importing this package is cheap."""
