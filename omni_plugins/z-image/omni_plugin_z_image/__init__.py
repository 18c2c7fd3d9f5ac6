"""omni model family for Z-Image and Z-Image-Turbo (diffusers ``ZImagePipeline``).

Importing this package imports nothing heavy: the families live in
:mod:`omni_plugin_z_image.family` and import torch, diffusers and transformers only when they
build or load a model.
"""

__version__ = "0.1.0"
