"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

This module is imported whenever omni loads plugins, so it imports nothing heavy (no torch,
no diffusers, not even :mod:`omni_plugin_z_image.family`). Everything registered here is
declared, with the same fields, in ``omni_plugin.toml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import ModelRegistrar


@hookimpl
def omni_register_models(registry: ModelRegistrar) -> None:
    # Tongyi-MAI/Z-Image-Turbo and Tongyi-MAI/Z-Image publish the same model_index.json and the
    # same transformer, VAE and text-encoder configs; they differ in the flow-matching shift of
    # scheduler/scheduler_config.json: 3.0 for Turbo (distilled on that schedule), 6.0 for the
    # base model. The base model is recognised by its shift; anything else is served as Turbo.
    registry.register(
        "z-image-turbo",
        "omni_plugin_z_image.family:ZImageTurbo",
        architectures=("ZImagePipeline",),
        tasks=("text-to-image",),
    )
    registry.register(
        "z-image",
        "omni_plugin_z_image.family:ZImage",
        architectures=("ZImagePipeline",),
        tasks=("text-to-image",),
        config_match={"scheduler.shift": 6.0},
    )
