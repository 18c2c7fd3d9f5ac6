"""Typed attention configuration: which backend each attention role uses, with options.

Precedence for a call site with role ``r`` and category ``c``: ``per_role[r]`` >
``per_role[c]`` > ``default`` > the platform's default chain > ``TORCH_SDPA``. Roles are
strings a model declares per call site (``"ltx2.audio_to_video"``); common categories are
``"self"`` and ``"cross"``. Option blocks are validated by the chosen backend, which rejects
blocks it does not understand: an option is never silently ignored.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# defined in omni_core.errors (one error hierarchy); imported here so old imports keep working
from omni_core.errors import AttentionConfigError as AttentionConfigError

OPTION_BLOCKS = ("quant", "skip_softmax", "block_sparse")


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QuantOptions(_Block):
    """Quantised attention. Which dtypes are valid depends on the backend."""

    dtype_qk: str | None = None
    dtype_vo: str | None = None
    q_block_size: Literal[1, 4, 16] | None = None
    k_block_size: Literal[1, 4, 16] | None = None


class SkipSoftmaxOptions(_Block):
    """Skip softmax blocks whose contribution is negligible. Give a sparsity or a threshold."""

    target_sparsity: float | None = Field(default=None, ge=0.0, le=1.0)
    threshold: float | None = Field(default=None, ge=0.0)
    disabled_until_timestep: float = Field(default=0.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _one_of(self) -> SkipSoftmaxOptions:
        if (self.target_sparsity is None) == (self.threshold is None):
            raise ValueError("give exactly one of target_sparsity or threshold")
        return self


class BlockSparseOptions(_Block):
    sparsity: float = Field(default=0.8, ge=0.0, le=1.0)
    start_step: int = Field(default=0, ge=0)
    #: layers that stay dense, e.g. "0-3,38"
    skip_layers: str = ""

    @field_validator("skip_layers")
    @classmethod
    def _layers(cls, v: str) -> str:
        if v and not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", v.replace(" ", "")):
            raise ValueError('skip_layers is a list of layers and ranges such as "0-3,38"')
        return v


class AttentionSpec(_Block):
    """One role's choice: a backend name (None = automatic) and its option blocks."""

    backend: str | None = None
    quant: QuantOptions | None = None
    skip_softmax: SkipSoftmaxOptions | None = None
    block_sparse: BlockSparseOptions | None = None

    @field_validator("backend")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return v.strip().upper() if v and v.strip() else None

    def option_blocks(self) -> set[str]:
        return {name for name in OPTION_BLOCKS if getattr(self, name) is not None}


class AttentionConfig(_Block):
    default: AttentionSpec = AttentionSpec()
    per_role: dict[str, AttentionSpec] = Field(default_factory=dict)

    @classmethod
    def parse(cls, value: Any = None, *, backend: str | None = None) -> AttentionConfig:
        """From None, a backend name, a JSON string or a dict; ``backend`` is the global
        shorthand for ``default.backend`` (``--attention-backend`` / ``OMNI_ATTENTION_BACKEND``)."""
        if isinstance(value, AttentionConfig):
            config = value
        else:
            data: Any = value
            if isinstance(value, str):
                text = value.strip()
                try:
                    data = json.loads(text) if text.startswith("{") else {"default": {"backend": text}}
                except json.JSONDecodeError as exc:
                    raise AttentionConfigError(f"attention config is not valid JSON: {exc}") from None
            try:
                config = cls.model_validate(data or {})
            except ValidationError as exc:
                raise AttentionConfigError.from_validation(exc, what="attention config", model=cls) from None
        if backend:
            given = config.default.backend
            if given and given != backend.strip().upper():
                raise AttentionConfigError(
                    f"the attention backend is given twice ({given} in the config, {backend} as the global "
                    "option); pass one of them"
                )
            config = config.model_copy(update={"default": config.default.model_copy(update={"backend": backend})})
            config = cls.model_validate(config.model_dump())
        return config

    def spec_for(self, role: str, category: str | None = None) -> tuple[AttentionSpec, str]:
        """The spec governing ``role`` and where it came from."""
        if role in self.per_role:
            return self.per_role[role], f"per_role[{role!r}]"
        if category and category in self.per_role:
            return self.per_role[category], f"per_role[{category!r}]"
        return self.default, "default"


def layered_attention(
    explicit: Any = None,
    *,
    backend: str | None = None,
    recipe: AttentionConfig | None = None,
    environment: str | None = None,
) -> AttentionConfig:
    """The attention config one run uses, by the one precedence: explicit choices (``--attention-backend``
    / ``--attention-config``, ``Omni(attention_backend=, attention=)``) > the recipe's ``attention`` >
    the environment (``OMNI_ATTENTION_BACKEND``) > the platform's default chain (applied later, by
    the selector, for roles left without a backend).

    An explicit config or backend replaces the recipe's attention as a whole (``--attention-backend``
    is the backend "for every role"); the environment only fills the default backend that the
    layers above left unset, so a recipe's per-role choices stay."""
    if explicit is not None or backend:
        config = AttentionConfig.parse(explicit, backend=backend)
    else:
        config = recipe if recipe is not None else AttentionConfig()
    if environment and config.default.backend is None:
        config = AttentionConfig.parse(config, backend=environment)
    return config
