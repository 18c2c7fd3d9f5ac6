"""Cache-DiT for omni's diffusion runtime (:mod:`omni_plugin_cache_dit.backend`)."""
