"""The modulated input of each transformer design: what its first block feeds its attention,
read from that block's own arguments (``values``: the block's forward arguments by name).

A family names one of these in its TeaCache declaration (``extractor``); its coefficients
were fitted on the same quantity, so the two go together. torch is not imported here: the
tensors come from the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def flux(block: Any, values: dict[str, Any]) -> Any:
    """FLUX's dual-stream block: its ``norm1`` (AdaLayerNormZero) of the image tokens, scaled
    and shifted by the timestep (and guidance, pooled text) embedding ``temb``."""
    modulated, *_ = block.norm1(values["hidden_states"], emb=values["temb"])
    return modulated


def wan(block: Any, values: dict[str, Any]) -> Any:
    """Wan's block: the timestep projection it receives as ``temb`` (the published Wan
    coefficients of the "retention steps" mode were fitted on it)."""
    return values["temb"]


def qwen_image(block: Any, values: dict[str, Any]) -> Any:
    """Qwen-Image's dual-stream block: its ``img_norm1`` of the image tokens, modulated by the
    first half of ``img_mod(temb)``."""
    first, _ = block.img_mod(values["temb"]).chunk(2, dim=-1)
    modulated, _ = block._modulate(block.img_norm1(values["hidden_states"]), first, values.get("modulate_index"))
    return modulated


#: by the name a family's declaration uses
EXTRACTORS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "flux": flux,
    "wan": wan,
    "qwen-image": qwen_image,
}
