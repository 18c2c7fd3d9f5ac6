"""omni TTS adapter for Piper voices (ONNX models run by piper-tts on onnxruntime).

Importing this package imports nothing heavy: the adapter lives in
:mod:`omni_plugin_piper.adapter` and imports piper (and with it onnxruntime) only when it
loads a voice.
"""

__version__ = "0.1.0"
