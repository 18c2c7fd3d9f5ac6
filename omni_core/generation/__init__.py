"""Image and video generation: the request, the family contract, resolution and outputs.

* :mod:`~omni_core.generation.request` - :class:`GenerationRequest` and a family's
  :class:`GenerationProfile` (defaults and limits, checked before any compute)
* :mod:`~omni_core.generation.model` - :class:`GenerationModel`, what a family plugin provides
* :mod:`~omni_core.generation.resolve` - which family serves a checkpoint, explained
* :mod:`~omni_core.generation.outputs` - typed results; :mod:`~omni_core.generation.media`
  writes PNG, MP4 (H.264) and GIF with the generation's metadata
* :mod:`~omni_core.generation.recipe` - deploy recipes (``recipes/<family>.yaml``)

Nothing here imports torch or diffusers; the runtime that does is a plugin.
"""

from omni_core.generation.model import EngineOptions, GenerationEngine, GenerationModel
from omni_core.generation.outputs import GeneratedImage, GeneratedVideo, GenerationMetadata, GenerationResult
from omni_core.generation.request import (
    GenerationOptionError,
    GenerationProfile,
    GenerationRequest,
    ResolvedGeneration,
)

__all__ = [
    "EngineOptions",
    "GeneratedImage",
    "GeneratedVideo",
    "GenerationEngine",
    "GenerationMetadata",
    "GenerationModel",
    "GenerationOptionError",
    "GenerationProfile",
    "GenerationRequest",
    "GenerationResult",
    "ResolvedGeneration",
]
