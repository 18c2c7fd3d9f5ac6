"""Stable Diffusion 3 end to end on tiny checkpoints: ``make_tiny``, then ``Omni(dir).generate``
through the shared diffusion runtime (from_pretrained, attention routed through omni's
backends, numpy outputs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from omni_core.generation.request import GenerationOptionError

FOX = "a red fox in snow"


def test_large_generates_the_requested_size_deterministically(tiny_sd3: Any, open_sd3: Any) -> None:
    with open_sd3(tiny_sd3("sd3.5-large")) as omni:
        assert omni.family == "sd3.5-large"
        first = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=0)
        again = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=0)
        other = omni.generate(FOX, width=64, height=32, num_inference_steps=2, seed=1)
        cat = omni.generate(
            "a photo of a cat sitting on a wooden table", width=64, height=32, num_inference_steps=2, seed=0
        )
    pixels = first.images[0].pixels
    assert pixels.shape == (32, 64, 3) and pixels.dtype == np.uint8
    assert np.array_equal(pixels, again.images[0].pixels)
    assert not np.array_equal(pixels, other.images[0].pixels)
    assert not np.array_equal(pixels, cat.images[0].pixels)
    meta = first.metadata
    assert meta.family == "sd3.5-large"
    assert meta.request.guidance_scale == 3.5 and meta.request.seed == 0


def test_negative_prompts_run_real_classifier_free_guidance(
    tiny_sd3: Any, open_sd3: Any, transformer_batches: Any
) -> None:
    with open_sd3(tiny_sd3("sd3.5-large")) as omni:
        batches = transformer_batches(omni)
        plain = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0)
        negative = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0, negative_prompt="blurry")
        assert batches == [2, 2, 2, 2]  # conditional and unconditional together, each step
        unguided = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0, guidance_scale=1.0)
        assert batches[4:] == [1, 1]  # guidance 1 turns CFG off
        two = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0, num_outputs=2)
    assert not np.array_equal(plain.images[0].pixels, negative.images[0].pixels)
    assert not np.array_equal(plain.images[0].pixels, unguided.images[0].pixels)
    assert [img.pixels.shape for img in two.images] == [(32, 32, 3), (32, 32, 3)]


@pytest.mark.parametrize(
    ("family", "roles"),
    [
        ("sd3.5-large", {"sd3.joint": 4}),
        ("sd3-medium", {"sd3.joint": 4}),
        # SD 3.5 Medium's MMDiT-X block (block 0 in the tiny model) adds an image-only self-attention
        ("sd3.5-medium", {"sd3.joint": 4, "sd3.image_self": 2}),
    ],
)
def test_the_attention_roles_name_the_real_modules(
    tiny_sd3: Any, open_sd3: Any, family: str, roles: dict[str, int]
) -> None:
    with open_sd3(tiny_sd3(family), attention_backend="TORCH_SDPA") as omni:
        result = omni.generate(FOX, width=32, height=32, num_inference_steps=2, seed=0)
        calls = dict(omni.generation.router.calls)
    assert calls == {(role, "TORCH_SDPA"): n for role, n in roles.items()}
    assert result.metadata.attention == {role: "TORCH_SDPA" for role in roles}
    assert result.metadata.family == family


@pytest.mark.parametrize(("family", "steps", "guidance"), [("sd3.5-medium", 40, 4.5), ("sd3-medium", 28, 7.0)])
def test_each_release_has_its_own_defaults(
    tiny_sd3: Any, open_sd3: Any, transformer_batches: Any, family: str, steps: int, guidance: float
) -> None:
    with open_sd3(tiny_sd3(family)) as omni:
        profile = omni.generation.profile
        batches = transformer_batches(omni)
        result = omni.generate(FOX, width=32, height=32, num_inference_steps=1, seed=0)
    assert (profile.default_steps, profile.default_guidance) == (steps, guidance)
    assert result.metadata.request.guidance_scale == guidance and batches == [2]


def test_bad_options_are_refused_before_compute(tiny_sd3: Any, open_sd3: Any, transformer_batches: Any) -> None:
    with open_sd3(tiny_sd3("sd3.5-large")) as omni:
        batches = transformer_batches(omni)
        with pytest.raises(GenerationOptionError, match="width 40 is not allowed: it must be a multiple of 16"):
            omni.generate(FOX, width=40, height=32)
        with pytest.raises(GenerationOptionError, match=r"guidance_scale -1\.0 is negative"):
            omni.generate(FOX, width=32, height=32, guidance_scale=-1.0)
        with pytest.raises(GenerationOptionError, match="max_sequence_length 1024 is not allowed"):
            omni.generate(FOX, width=32, height=32, extra={"max_sequence_length": 1024})
        with pytest.raises(GenerationOptionError, match="unknown model option"):
            omni.generate(FOX, width=32, height=32, extra={"clip_skip": 2})
        assert batches == []
        short = omni.generate(FOX, width=32, height=32, num_inference_steps=1, seed=0, extra={"max_sequence_length": 8})
        full = omni.generate(FOX, width=32, height=32, num_inference_steps=1, seed=0)
    assert not np.array_equal(short.images[0].pixels, full.images[0].pixels)


def test_offload_declarations_name_real_modules(tiny_sd3: Any, open_sd3: Any) -> None:
    with open_sd3(tiny_sd3("sd3.5-medium")) as omni:
        plan = omni.generation.offload_plan()
    assert plan.dit_modules == ("transformer",) and plan.resident_modules == ("vae",)
    assert plan.encoder_modules == ("text_encoder", "text_encoder_2", "text_encoder_3")
    assert plan.block_attrs == ("transformer.transformer_blocks",)
    blocks = plan.module("transformer.transformer_blocks")
    assert type(blocks).__name__ == "ModuleList" and len(blocks) == 2
