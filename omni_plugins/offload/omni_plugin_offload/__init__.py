"""omni's memory offload strategies.

* ``model_cpu`` (:class:`omni_plugin_offload.model_cpu.ModelCpuOffloader`): the denoiser
  group and the encoder group take turns on the compute device; the VAE stays.
* ``layerwise`` (:class:`omni_plugin_offload.layerwise.LayerwiseOffloader`): a window of
  transformer blocks on the device, the next block prefetched; everything else stays.

Nothing is imported here: omni imports this package whenever it loads plugins, and the
strategy modules only when a strategy is used.
"""
