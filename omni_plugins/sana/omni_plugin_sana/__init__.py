"""omni model family for Sana (text-to-image).

Importing this package imports nothing heavy: the family lives in
:mod:`omni_plugin_sana.family` and imports torch, diffusers and transformers only when it
builds or loads a model.
"""

__version__ = "0.1.0"
