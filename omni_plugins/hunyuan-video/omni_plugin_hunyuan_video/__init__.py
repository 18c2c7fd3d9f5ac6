"""omni model families for HunyuanVideo and HunyuanVideo 1.5 (text-to-video).

Importing this package imports nothing heavy: the families live in
:mod:`omni_plugin_hunyuan_video.family` and import torch, diffusers and transformers only
when they build or load a model.
"""

__version__ = "0.1.0"
