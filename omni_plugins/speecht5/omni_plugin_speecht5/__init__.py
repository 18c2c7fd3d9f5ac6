"""omni TTS adapter for SpeechT5: text -> mel spectrogram (autoregressive) -> HiFi-GAN waveform.

Importing this package imports nothing heavy; torch and transformers load with the model.
"""

__version__ = "0.1.0"
