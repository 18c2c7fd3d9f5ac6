"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

This module is imported whenever omni loads plugins, so it imports nothing heavy (no torch,
no diffusers, not even :mod:`omni_plugin_hunyuan_video.family`). Everything registered here
is declared, with the same fields, in ``omni_plugin.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import ModelRegistrar


@hookimpl
def omni_register_models(registry: ModelRegistrar) -> None:
    # The two generations have distinct pipeline classes, so model_index.json's _class_name
    # tells them apart without a config predicate.
    registry.register(
        "hunyuan-video",
        "omni_plugin_hunyuan_video.family:HunyuanVideo",
        architectures=("HunyuanVideoPipeline",),
        tasks=("text-to-video",),
    )
    registry.register(
        "hunyuan-video-1.5",
        "omni_plugin_hunyuan_video.family:HunyuanVideo15",
        architectures=("HunyuanVideo15Pipeline",),
        tasks=("text-to-video",),
    )
