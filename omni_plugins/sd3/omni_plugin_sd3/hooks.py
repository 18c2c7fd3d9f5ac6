"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

This module is imported whenever omni loads plugins, so it imports nothing heavy (no torch,
no diffusers, not even :mod:`omni_plugin_sd3.family`). Everything registered here is
declared, with the same fields, in ``omni_plugin.toml``.

The three releases share ``StableDiffusion3Pipeline`` and are told apart by their transformer
config, never by load order: SD 3.5 Medium has a 384-wide position table
(``transformer.pos_embed_max_size`` 384, the others 192), SD 3 Medium has no QK-norm
(``transformer.qk_norm`` absent or null, the 3.5 releases ``"rms_norm"``). SD 3.5 Large has
no predicate and serves the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import ModelRegistrar

PIPELINE = ("StableDiffusion3Pipeline",)
TEXT_TO_IMAGE = ("text-to-image",)


@hookimpl
def omni_register_models(registry: ModelRegistrar) -> None:
    registry.register(
        "sd3.5-large",
        "omni_plugin_sd3.family:SD35Large",
        architectures=PIPELINE,
        tasks=TEXT_TO_IMAGE,
    )
    registry.register(
        "sd3.5-medium",
        "omni_plugin_sd3.family:SD35Medium",
        architectures=PIPELINE,
        tasks=TEXT_TO_IMAGE,
        config_match={"transformer.pos_embed_max_size": 384},
    )
    registry.register(
        "sd3-medium",
        "omni_plugin_sd3.family:SD3Medium",
        architectures=PIPELINE,
        tasks=TEXT_TO_IMAGE,
        config_match={"transformer.qk_norm": {"exists": False}},
    )
