"""Test helpers (a module name unique across plugins): the requests each family runs, and a
counter of real block-stack passes."""

from __future__ import annotations

from typing import Any

#: family -> (a small request with enough steps to cache, how many transformer calls a step makes)
REQUESTS: dict[str, tuple[dict[str, Any], int]] = {
    "flux1-schnell": ({"width": 64, "height": 64, "num_inference_steps": 20}, 1),
    # classifier-free guidance: a conditional and an unconditional call per step
    "wan2.1-t2v": ({"width": 64, "height": 64, "num_frames": 5, "num_inference_steps": 20}, 2),
    "qwen-image": ({"width": 64, "height": 64, "num_inference_steps": 20}, 2),
}
FAMILIES = tuple(REQUESTS)
#: a threshold high enough that tiny random weights reuse steps (the families' own are tuned
#: on real weights)
EAGER = {"rel_l1_thresh": 50.0}


def first_block(omni: Any) -> Any:
    """The first block of the transformer's first declared block list."""
    engine = omni.generation
    transformer = engine.pipeline.transformer
    name = engine.cache.block_paths[0] if engine.cache is not None else None
    for candidate in filter(None, (name, "transformer_blocks", "blocks")):
        blocks = getattr(transformer, candidate, None)
        if blocks is not None:
            return blocks[0]
    raise AssertionError("no block list")


class PassCounter:
    """Counts the runs of the first block's attention: it runs only when the block stack is
    really computed (a reused step skips it), once per transformer call that computes."""

    def __init__(self, omni: Any) -> None:
        self.count = 0
        block = first_block(omni)
        attention = getattr(block, "attn", None) or block.attn1  # FLUX and Qwen-Image; Wan
        self.handle = attention.register_forward_pre_hook(self._seen)

    def _seen(self, *_: Any) -> None:
        self.count += 1

    def close(self) -> None:
        self.handle.remove()


def pixels(result: Any) -> Any:
    import numpy as np

    if result.videos:
        return np.stack([v.frames for v in result.videos])
    return np.stack([image.pixels for image in result.images])
