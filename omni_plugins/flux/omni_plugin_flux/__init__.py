"""omni model families for FLUX.1 and FLUX.2.

Importing this package imports nothing heavy: the families live in
:mod:`omni_plugin_flux.family` and import torch and diffusers only when they build or load a model.
"""

__version__ = "0.1.0"
