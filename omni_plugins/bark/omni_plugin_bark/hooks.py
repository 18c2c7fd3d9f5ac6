"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

Imported whenever omni loads plugins, so it imports nothing heavy (no torch, no transformers,
not even :mod:`omni_plugin_bark.adapter`). Everything registered here is declared, with the
same fields, in ``omni_plugin.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import TTSAdapterRegistrar


@hookimpl
def omni_register_tts_adapters(registry: TTSAdapterRegistrar) -> None:
    registry.register(
        "bark",
        "omni_plugin_bark.adapter:BarkAdapter",
        stage_keys=("bark",),
        model_archs=("BarkModel",),
        detect_priority=100,
    )
