"""Hook implementations: names and lazy references only (no torch, no transformers here)."""

from omni_core import hookimpl


@hookimpl
def omni_register_tts_adapters(registry):  # type: ignore[no-untyped-def]
    registry.register(
        "speecht5",
        "omni_plugin_speecht5.adapter:SpeechT5Adapter",
        stage_keys=("speecht5",),
        model_archs=("SpeechT5ForTextToSpeech",),
        detect_priority=100,
    )
