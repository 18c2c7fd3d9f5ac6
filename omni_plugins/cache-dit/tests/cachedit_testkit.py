"""Test helpers (a module name unique across plugins): the requests each family runs, and a
counter of real passes through a block that cache-dit skips when it reuses a step."""

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
#: a profile that reuses on tiny random weights (their residuals change by 5-50% a step, so the
#: threshold is high) in a fixed rhythm: steps 0 and 1 computed, then three reused for each one
#: computed (the families' tiny transformers have two blocks per list: Fn shrinks to 1)
EAGER = {"residual_diff_threshold": 0.9, "max_warmup_steps": 2, "max_continuous_cached_steps": 3}


def middle_block(omni: Any) -> Any:
    """The first block of the first declared list that cache-dit may skip (the one after the
    Fn blocks, which always run)."""
    backend = omni.generation.cache
    blocks = getattr(omni.generation.pipeline.transformer, backend.block_names[0])
    return blocks[backend.profile.Fn_compute_blocks]


class PassCounter:
    """Counts the runs of a block's attention: once per transformer call that really computes
    the block (a reused step skips it)."""

    def __init__(self, block: Any) -> None:
        self.count = 0
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


def own_attributes(module: Any) -> set[str]:
    """The names a module holds on itself (what a hook library may add and must take back)."""
    return set(vars(module))
