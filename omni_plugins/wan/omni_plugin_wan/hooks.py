"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

Imported whenever omni loads plugins, so it imports nothing heavy (no torch, no diffusers,
not :mod:`omni_plugin_wan.family`). Everything registered here is declared, with the same
fields, in ``omni_plugin.toml``.

Wan 2.1 and Wan 2.2 A14B checkpoints name the same pipeline class in ``model_index.json``;
2.2's carries ``boundary_ratio`` (where denoising passes to its second expert,
``transformer_2``), which 2.1's lacks. The 2.2 families claim checkpoints with that key, the
2.1 families serve the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import ModelRegistrar

TWO_EXPERTS = {"model_index.boundary_ratio": {"exists": True}}


@hookimpl
def omni_register_models(registry: ModelRegistrar) -> None:
    registry.register(
        "wan2.1-t2v",
        "omni_plugin_wan.family:Wan21TextToVideo",
        architectures=("WanPipeline",),
        tasks=("text-to-video",),
    )
    registry.register(
        "wan2.2-t2v",
        "omni_plugin_wan.family:Wan22TextToVideo",
        architectures=("WanPipeline",),
        tasks=("text-to-video",),
        config_match=TWO_EXPERTS,
    )
    registry.register(
        "wan2.1-i2v",
        "omni_plugin_wan.family:Wan21ImageToVideo",
        architectures=("WanImageToVideoPipeline",),
        tasks=("image-to-video",),
    )
    registry.register(
        "wan2.2-i2v",
        "omni_plugin_wan.family:Wan22ImageToVideo",
        architectures=("WanImageToVideoPipeline",),
        tasks=("image-to-video",),
        config_match=TWO_EXPERTS,
    )
