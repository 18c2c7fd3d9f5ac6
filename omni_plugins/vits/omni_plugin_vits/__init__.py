"""omni TTS adapter for the VITS / MMS-TTS family.

Importing this package imports nothing heavy: the adapter lives in
:mod:`omni_plugin_vits.adapter` and imports torch and transformers only when it loads a model.
"""

__version__ = "0.1.0"
