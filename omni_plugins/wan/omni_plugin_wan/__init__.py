"""omni's Wan video families (Wan 2.1 / 2.2, text-to-video and image-to-video).

The family classes live in :mod:`omni_plugin_wan.family`; importing this package imports
nothing heavy."""
