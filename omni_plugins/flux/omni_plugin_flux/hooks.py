"""Hook implementations: register names and lazy ``"module:attribute"`` references only.

This module is imported whenever omni loads plugins, so it imports nothing heavy (no torch,
no diffusers, not even :mod:`omni_plugin_flux.family`). Everything registered here is
declared, with the same fields, in ``omni_plugin.toml``.

Siblings sharing a pipeline class are told apart by ``config_match`` predicates read from
the checkpoint, never by load order:

* ``FluxPipeline``: ``flux1-dev`` has a guidance embedding (``transformer.guidance_embeds``
  true), ``flux1-schnell`` has none (false);
* ``Flux2KleinPipeline``: ``flux2-klein`` is step-distilled (``model_index.is_distilled``
  true); ``flux2-klein-base`` has no predicate and serves the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_core import hookimpl

if TYPE_CHECKING:
    from omni_core.registry import ModelRegistrar

TEXT_TO_IMAGE = ("text-to-image",)


@hookimpl
def omni_register_models(registry: ModelRegistrar) -> None:
    registry.register(
        "flux1-dev",
        "omni_plugin_flux.family:Flux1Dev",
        architectures=("FluxPipeline",),
        tasks=TEXT_TO_IMAGE,
        config_match={"transformer.guidance_embeds": True},
    )
    registry.register(
        "flux1-schnell",
        "omni_plugin_flux.family:Flux1Schnell",
        architectures=("FluxPipeline",),
        tasks=TEXT_TO_IMAGE,
        config_match={"transformer.guidance_embeds": False},
    )
    registry.register(
        "flux2-dev",
        "omni_plugin_flux.family:Flux2Dev",
        architectures=("Flux2Pipeline",),
        tasks=TEXT_TO_IMAGE,
    )
    registry.register(
        "flux2-klein",
        "omni_plugin_flux.family:Flux2Klein",
        architectures=("Flux2KleinPipeline",),
        tasks=TEXT_TO_IMAGE,
        config_match={"model_index.is_distilled": True},
    )
    registry.register(
        "flux2-klein-base",
        "omni_plugin_flux.family:Flux2KleinBase",
        architectures=("Flux2KleinPipeline",),
        tasks=TEXT_TO_IMAGE,
    )
