"""omni's LTX-Video family (text-to-video).

The family class lives in :mod:`omni_plugin_ltx_video.family`; importing this package
imports nothing heavy."""
