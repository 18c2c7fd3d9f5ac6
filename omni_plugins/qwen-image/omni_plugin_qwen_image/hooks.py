"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

This module is imported whenever omni loads plugins, so it imports nothing heavy (no torch,
no diffusers, not even :mod:`omni_plugin_qwen_image.family`). Everything registered here is
declared, with the same fields, in ``omni_plugin.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import ModelRegistrar


@hookimpl
def omni_register_models(registry: ModelRegistrar) -> None:
    # Qwen/Qwen-Image and Qwen/Qwen-Image-2512 share the pipeline class and the component
    # configs: one family serves both, so no config predicate is needed.
    registry.register(
        "qwen-image",
        "omni_plugin_qwen_image.family:QwenImage",
        architectures=("QwenImagePipeline",),
        tasks=("text-to-image",),
    )
