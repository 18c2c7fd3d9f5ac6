"""The diffusion runtime registers no extension of its own: family plugins subclass
:class:`omni_plugin_diffusion.DiffusersFamily` and register their models. It is a plugin so
that ``omni plugins list`` shows it and its manifest's catalog can name family plugins."""
