"""Speech: the text-to-speech adapter contract and the runtime that drives every adapter.

An adapter (one per TTS family, contributed by a plugin through
``omni_register_tts_adapters``) says which models it serves, shapes and validates requests,
and runs its model. The runtime (:class:`omni_core.speech.engine.SpeechEngine`) owns the
order every request goes through, for autoregressive and non-autoregressive models alike::

    normalize -> validate (core rules, then the adapter's) -> sampling (defaults merged with
    the adapter's overrides, never replaced) -> build -> generate / stream -> speed ->
    resample -> encode

Nothing here imports torch; numpy and soundfile are imported when audio is processed.
"""

from omni_core.speech.adapter import AdapterContext, TTSAdapter
from omni_core.speech.request import (
    AUDIO_FORMATS,
    PreparedRequest,
    SpeechRequest,
    SpeechRequestError,
    TTSCapabilities,
)

__all__ = [
    "AUDIO_FORMATS",
    "AdapterContext",
    "PreparedRequest",
    "SpeechRequest",
    "SpeechRequestError",
    "TTSAdapter",
    "TTSCapabilities",
]
