"""omni plugin ``bark``: the text-to-speech adapter for Bark checkpoints (``BarkModel``).

omni reads ``omni_plugin.toml`` beside this file without importing anything, then imports
:mod:`omni_plugin_bark.hooks`; the adapter (:mod:`omni_plugin_bark.adapter`) is imported
only when a Bark model is served, and torch/transformers only when it loads. Keep this file
free of imports so loading the plugin stays cheap.
"""

__version__ = "0.1.0"
