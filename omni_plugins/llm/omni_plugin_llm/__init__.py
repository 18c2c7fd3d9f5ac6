"""omni pipeline model for plain language models (decoder-only causal LMs).

Importing this package imports nothing heavy: the model family lives in
:mod:`omni_plugin_llm.model` and the stage engine in :mod:`omni_plugin_llm.engine`, which
imports torch and transformers only when it loads a model.
"""

__version__ = "0.1.0"
