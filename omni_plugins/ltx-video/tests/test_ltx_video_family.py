"""The LTX-Video family, run for real on CPU with tiny random weights through ``Omni.generate``."""

from __future__ import annotations

import fnmatch
import json
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omni_core import Omni
from omni_core.generation.request import GenerationOptionError

PROMPT = "a red fox in snow"
RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "ltx-video.yaml"
#: a small run: 64x64 px is 2x2 latents (32x VAE), 9 frames are 2 latent frames (8x VAE)
SMALL = {"width": 64, "height": 64, "num_frames": 9, "num_inference_steps": 2}


@contextmanager
def _counting(pipeline: Any, *names: str):  # type: ignore[no-untyped-def]
    calls: Counter[str] = Counter()
    handles = [getattr(pipeline, name).register_forward_hook(lambda *_, _n=name: calls.update([_n])) for name in names]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def test_ltx_video_end_to_end(tiny_ltx: Path, ltx_plugins: Any, tmp_path: Path) -> None:
    from PIL import Image

    from omni_core.generation.media import probe_video

    with Omni(tiny_ltx, plugins=ltx_plugins, progress=False) as omni:
        assert (omni.family, omni.kind) == ("ltx-video", "text-to-video")
        first = omni.generate(PROMPT, **SMALL, seed=0)
        again = omni.generate(PROMPT, **SMALL, seed=0)
        other = omni.generate(PROMPT, **SMALL, seed=1)
        wide = omni.generate(PROMPT, width=96, height=64, num_frames=17, num_inference_steps=2, seed=0)
        router = omni.generation.router  # type: ignore[attr-defined]
        calls = dict(router.calls)

    video = first.videos[0]
    assert first.images == [] and len(first.videos) == 1
    assert video.frames.shape == (9, 64, 64, 3) and video.frames.dtype == np.uint8
    assert (video.num_frames, video.width, video.height, video.fps) == (9, 64, 64, 25)
    assert np.array_equal(video.frames, again.videos[0].frames), "the same seed must give identical pixels"
    assert not np.array_equal(video.frames, other.videos[0].frames), "a different seed must differ"
    assert wide.videos[0].frames.shape == (17, 64, 96, 3)

    meta = first.metadata
    assert meta.family == "ltx-video"
    assert (meta.request.num_inference_steps, meta.request.guidance_scale, meta.request.fps) == (2, 3.0, 25)
    assert meta.attention == {"self": "TORCH_SDPA", "cross": "TORCH_SDPA"}
    # the last run: 2 steps x (conditional + unconditional, batched) x 2 blocks, per role
    assert calls == {("self", "TORCH_SDPA"): 4, ("cross", "TORCH_SDPA"): 4}

    (mp4,) = first.save(tmp_path / "fox.mp4")
    probe = probe_video(mp4)
    assert (probe["codec"], probe["size"], probe["frames"]) == ("h264", (64, 64), 9)
    assert probe["fps"] == pytest.approx(25)
    (gif,) = first.save(tmp_path / "fox.gif")
    with Image.open(gif) as img:
        assert (img.n_frames, img.size) == (9, (64, 64))
    (wide_mp4,) = wide.save(tmp_path / "wide.mp4")
    assert probe_video(wide_mp4)["size"] == (96, 64)


def test_frame_rate_is_a_model_input(tiny_ltx: Path, ltx_plugins: Any) -> None:
    """LTX scales its temporal RoPE by the frame rate, so fps changes the pixels, not just the file."""
    with Omni(tiny_ltx, plugins=ltx_plugins, progress=False) as omni:
        pipeline = omni.generation.pipeline  # type: ignore[attr-defined]
        seen: list[Any] = []
        handle = pipeline.transformer.register_forward_pre_hook(
            lambda _m, args, kwargs: seen.append(kwargs.get("rope_interpolation_scale")), with_kwargs=True
        )
        try:
            at25 = omni.generate(PROMPT, **SMALL, seed=0)
            at12 = omni.generate(PROMPT, **SMALL, seed=0, fps=12)
        finally:
            handle.remove()
    assert seen[0][0] == pytest.approx(8 / 25) and seen[-1][0] == pytest.approx(8 / 12)
    assert at12.videos[0].fps == 12 and at12.metadata.request.fps == 12
    assert not np.array_equal(at25.videos[0].frames, at12.videos[0].frames)


def test_bad_options_are_refused_before_compute(tiny_ltx: Path, ltx_plugins: Any) -> None:
    with Omni(tiny_ltx, plugins=ltx_plugins, progress=False) as omni:
        pipeline = omni.generation.pipeline  # type: ignore[attr-defined]
        with _counting(pipeline, "text_encoder", "transformer", "vae") as calls:
            for fields, rule in (
                ({"width": 48}, "width 48 is not allowed: it must be a multiple of 32"),
                ({"height": 80}, "height 80 is not allowed"),
                ({"num_frames": 5}, r"num_frames 5 is not allowed: this model takes 8\*k\+1"),
                ({"num_frames": 10}, "num_frames 10 is not allowed"),
                ({"extra": {"guidance_scale_2": 1.0}}, "unknown model option"),
                ({"image": np.zeros((64, 64, 3), np.uint8)}, "an input image is not used"),
            ):
                with pytest.raises(GenerationOptionError, match=rule):
                    omni.generate(PROMPT, **{**SMALL, **fields})
        assert not calls, f"a refused request reached the model: {dict(calls)}"
        # declared model options pass through to the pipeline
        plain = omni.generate(PROMPT, **SMALL, seed=0)
        rescaled = omni.generate(PROMPT, **SMALL, seed=0, extra={"guidance_rescale": 0.7})
        assert not np.array_equal(plain.videos[0].frames, rescaled.videos[0].frames)


def test_resolution_and_declarations(tiny_ltx: Path, ltx_plugins: Any) -> None:
    from omni_plugin_diffusion.attention import is_attention_module
    from omni_plugin_ltx_video.family import LTXVideo

    from omni_core.generation.resolve import resolve_model

    index = json.loads((tiny_ltx / "model_index.json").read_text())
    assert index["_class_name"] == "LTXPipeline" and index["vae"] == ["diffusers", "AutoencoderKLLTXVideo"]
    resolution = resolve_model(ltx_plugins, tiny_ltx)
    assert (resolution.family, resolution.rule) == ("ltx-video", "model_index")
    assert resolve_model(ltx_plugins, tiny_ltx, model_class_name="LTXPipeline").family == "ltx-video"

    pipeline = LTXVideo.pipeline_type().from_pretrained(str(tiny_ltx))
    # the tiny VAE has the real compression: 32x in space, 8x in time
    assert (pipeline.vae_spatial_compression_ratio, pipeline.vae_temporal_compression_ratio) == (32, 8)
    roles = set()
    for path, module in pipeline.transformer.named_modules():
        if path and is_attention_module(module):
            site = f"transformer.{path}"
            assert any(fnmatch.fnmatchcase(site, p) for p, _, _ in LTXVideo.attention_roles), site
            roles.add(LTXVideo.role_for(site))
    assert roles == {("self", "self"), ("cross", "cross")}
    assert len(pipeline.transformer.transformer_blocks) == 2

    p = LTXVideo.profile
    assert (p.default_width, p.default_height, p.default_frames, p.default_fps) == (704, 480, 161, 25)
    assert (p.default_steps, p.default_guidance, p.size_multiple, p.frames_step, p.frames_offset) == (50, 3.0, 32, 8, 1)


def test_recipe(tiny_ltx: Path, ltx_plugins: Any) -> None:
    from omni_plugin_ltx_video.family import LTXVideo

    from omni_core.generation.recipe import load_recipe
    from omni_core.generation.request import GenerationRequest

    recipe = load_recipe(RECIPE)
    assert (recipe.model, recipe.model_class_name) == ("Lightricks/LTX-Video", "ltx-video")
    assert recipe.attention.default.backend == "TORCH_SDPA"
    resolved = LTXVideo.profile.resolve(GenerationRequest(prompt=PROMPT, **recipe.generation))
    assert (resolved.width, resolved.height, resolved.num_frames, resolved.fps) == (704, 480, 161, 25)

    # as deployed on the tiny checkpoint: explicit options win over the recipe's size and dtype
    with Omni(tiny_ltx, recipe=RECIPE, plugins=ltx_plugins, dtype="float32", progress=False) as omni:
        assert omni.explain().rule == "the recipe's model_class_name pin names the family ltx-video"
        result = omni.generate(PROMPT, **SMALL, seed=0)
    assert result.metadata.request.negative_prompt == recipe.generation["negative_prompt"]
    assert result.videos[0].frames.shape == (9, 64, 64, 3)
