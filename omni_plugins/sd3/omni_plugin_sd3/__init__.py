"""omni model families for Stable Diffusion 3 and 3.5.

Importing this package imports nothing heavy: the families live in
:mod:`omni_plugin_sd3.family` and import torch and diffusers only when they build or load a model.
"""

__version__ = "0.1.0"
