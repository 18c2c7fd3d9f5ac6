"""Qwen2.5-Omni for omni: a thinker, a talker and a token2wav stage on transformers.

Importing this package imports nothing heavy: the stages (:mod:`omni_plugin_qwen_omni.stages`)
import torch and transformers only in the process that runs them.
"""

__version__ = "0.1.0"
