"""Recipes: a model's deploy settings in one reviewed YAML file (``recipes/<family>.yaml``).

A recipe pins what should not drift with defaults: the family (``model_class_name``), the
attention backend per role, the offload strategy and the generation settings the model was
tuned for. ``omni generate --recipe FILE`` applies it; explicit command-line options still
win over it. Unknown keys are errors, so a typo never silently does nothing::

    model: Qwen/Qwen-Image              # where the weights come from (documentation)
    model_class_name: QwenImagePipeline # pin: beats model_index.json
    attention:
      default: {backend: TORCH_SDPA}
    offload: [layerwise]
    cache: {backend: teacache, config: {rel_l1_thresh: 0.2}}
    generation: {num_inference_steps: 50, guidance_scale: 4.0, width: 1328, height: 1328}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from omni_core.attention.config import AttentionConfig

# defined in omni_core.errors (one error hierarchy); imported here so old imports keep working
from omni_core.errors import RecipeError as RecipeError
from omni_core.generation.request import GenerationRequest
from omni_core.pipeline.placement import PipelinePlacement


class CacheRecipe(BaseModel):
    """A recipe's cache profile: the backend (``omni plugins list`` shows them) and its options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = Field(min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: where the real weights are published (a hub id or URL): documentation, never fetched
    model: str = ""
    description: str = ""
    #: the family or pipeline class to use, whatever model_index.json says
    model_class_name: str | None = None
    attention: AttentionConfig = Field(default_factory=AttentionConfig)
    offload: tuple[str, ...] = ()
    offload_options: dict[str, Any] = Field(default_factory=dict)
    dtype: str | None = None
    #: the cache backend and its options (``--cache-backend`` and ``--cache-config`` win)
    cache: CacheRecipe | None = None
    #: default generation settings (any GenerationRequest field but the prompt)
    generation: dict[str, Any] = Field(default_factory=dict)
    #: for a multi-stage model: where its stages run and how payloads travel
    #: (:mod:`omni_core.pipeline.placement`)
    pipeline: PipelinePlacement | None = None

    @field_validator("attention", mode="before")
    @classmethod
    def _attention(cls, v: Any) -> Any:
        return AttentionConfig.model_validate(v) if isinstance(v, dict) else v

    @field_validator("generation")
    @classmethod
    def _generation_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(v) - (set(GenerationRequest.model_fields) - {"prompt", "image"}))
        if unknown:
            raise ValueError(f"unknown generation setting(s) {unknown}")
        return v


def load_recipe(path: str | Path) -> Recipe:
    import yaml  # type: ignore[import-untyped]

    path = Path(path).expanduser()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RecipeError(f"cannot read recipe {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path} must be a mapping of settings, got {type(data).__name__}")
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError.from_validation(exc, what=f"recipe {path}", model=Recipe, name=str(path)) from None
