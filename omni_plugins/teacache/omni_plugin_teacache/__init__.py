"""TeaCache for omni's diffusion runtime (:mod:`omni_plugin_teacache.backend`)."""
