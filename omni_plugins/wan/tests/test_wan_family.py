"""The Wan families, run for real on CPU with tiny random weights through ``Omni.generate``."""

from __future__ import annotations

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
RECIPES = Path(__file__).resolve().parents[3] / "recipes"
#: a small run: 32x32 px is 2x2 latent patches, 5 frames are 2 latent frames
SMALL = {"width": 32, "height": 32, "num_frames": 5, "num_inference_steps": 2}


def _image(seed: int, size: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


@contextmanager
def _counting(pipeline: Any, *names: str):  # type: ignore[no-untyped-def]
    """Count forward calls of the named pipeline components while inside."""
    calls: Counter[str] = Counter()
    handles = [getattr(pipeline, name).register_forward_hook(lambda *_, _n=name: calls.update([_n])) for name in names]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def _gif_frames(path: Path) -> tuple[int, tuple[int, int]]:
    from PIL import Image

    with Image.open(path) as gif:
        return gif.n_frames, gif.size


# -- text-to-video ---------------------------------------------------------------------------


def test_wan21_t2v_end_to_end(tiny_wan21_t2v: Path, wan_plugins: Any, tmp_path: Path) -> None:
    from omni_core.generation.media import probe_video

    with Omni(tiny_wan21_t2v, plugins=wan_plugins, progress=False) as omni:
        assert omni.kind == "text-to-video"
        first = omni.generate(PROMPT, **SMALL, seed=0)
        again = omni.generate(PROMPT, **SMALL, seed=0)
        other = omni.generate(PROMPT, **SMALL, seed=1)
        longer = omni.generate(PROMPT, width=48, height=32, num_frames=9, num_inference_steps=2, seed=0)

    assert first.images == [] and len(first.videos) == 1
    video = first.videos[0]
    assert video.frames.shape == (5, 32, 32, 3) and video.frames.dtype == np.uint8
    assert (video.num_frames, video.width, video.height, video.fps) == (5, 32, 32, 16)
    assert np.array_equal(video.frames, again.videos[0].frames), "the same seed must give identical pixels"
    assert not np.array_equal(video.frames, other.videos[0].frames), "a different seed must differ"
    assert longer.videos[0].frames.shape == (9, 32, 48, 3)

    meta = first.metadata
    assert meta.family == "wan2.1-t2v"
    assert (meta.request.guidance_scale, meta.request.fps, meta.request.seed) == (5.0, 16, 0)
    assert meta.attention == {"self": "TORCH_SDPA", "cross": "TORCH_SDPA"}

    (mp4,) = first.save(tmp_path / "fox.mp4")
    probe = probe_video(mp4)
    assert (probe["codec"], probe["size"], probe["frames"]) == ("h264", (32, 32), 5)
    assert probe["fps"] == pytest.approx(16)
    (gif,) = first.save(tmp_path / "fox.gif")
    assert _gif_frames(gif) == (5, (32, 32))
    (named,) = longer.save(tmp_path)  # a directory: named after family and seed, MP4 by default
    assert named.name == "wan2.1-t2v-seed0.mp4" and probe_video(named)["frames"] == 9


def test_wan22_t2v_resolves_by_boundary_ratio_and_runs_both_experts(
    tiny_wan22_t2v: Path, tiny_wan21_t2v: Path, wan_plugins: Any
) -> None:
    index = json.loads((tiny_wan22_t2v / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline" and index["boundary_ratio"] == 0.875
    assert index["transformer_2"] == ["diffusers", "WanTransformer3DModel"]

    with Omni(tiny_wan22_t2v, plugins=wan_plugins, progress=False) as omni:
        assert omni.family == "wan2.2-t2v"
        explanation = omni.explain().render()
        assert "model_index.boundary_ratio matches" in explanation and "wan2.1-t2v" in explanation
        pipeline = omni.generation.pipeline  # type: ignore[attr-defined]
        # 2 steps: the first timestep (~1000) is above the boundary (875), the second below it
        with _counting(pipeline, "transformer", "transformer_2") as calls:
            result = omni.generate(PROMPT, **SMALL, seed=0)
        assert calls == {"transformer": 2, "transformer_2": 2}  # each step: conditional + unconditional
        again = omni.generate(PROMPT, **SMALL, seed=0, extra={"guidance_scale_2": 3.0})
        changed = omni.generate(PROMPT, **SMALL, seed=0, extra={"guidance_scale_2": 7.0})

    assert result.metadata.family == "wan2.2-t2v"
    assert result.metadata.request.guidance_scale == 4.0 and result.metadata.request.num_frames == 5
    assert result.videos[0].frames.shape == (5, 32, 32, 3)
    # the low-noise expert's default guidance is 3.0: passing it explicitly changes nothing
    assert np.array_equal(result.videos[0].frames, again.videos[0].frames)
    assert not np.array_equal(result.videos[0].frames, changed.videos[0].frames)

    # Wan 2.1 has one expert: the option is refused before compute
    with Omni(tiny_wan21_t2v, plugins=wan_plugins, progress=False) as omni:
        with pytest.raises(GenerationOptionError, match="guidance_scale_2"):
            omni.generate(PROMPT, **SMALL, extra={"guidance_scale_2": 3.0})


def test_bad_options_are_refused_before_compute(tiny_wan21_t2v: Path, wan_plugins: Any) -> None:
    with Omni(tiny_wan21_t2v, plugins=wan_plugins, progress=False) as omni:
        pipeline = omni.generation.pipeline  # type: ignore[attr-defined]
        with _counting(pipeline, "text_encoder", "transformer", "vae") as calls:
            for fields, rule in (
                ({"width": 40}, "width 40 is not allowed: it must be a multiple of 16"),
                ({"height": 24}, "height 24 is not allowed"),
                ({"num_frames": 6}, r"num_frames 6 is not allowed: this model takes 4\*k\+1"),
                ({"num_frames": 4097}, "at most 4093"),
                ({"image": _image(0)}, "an input image is not used by this model"),
                ({"fps": 0}, "fps 0 is not allowed"),
            ):
                with pytest.raises(GenerationOptionError, match=rule):
                    omni.generate(PROMPT, **{**SMALL, **fields})
        assert not calls, f"a refused request reached the model: {dict(calls)}"


# -- image-to-video --------------------------------------------------------------------------


def test_wan21_i2v_needs_an_image_and_animates_it(tiny_wan21_i2v: Path, wan_plugins: Any, tmp_path: Path) -> None:
    from omni_core.generation.media import probe_video

    index = json.loads((tiny_wan21_i2v / "model_index.json").read_text())
    assert index["image_encoder"] == ["transformers", "CLIPVisionModel"]
    assert index["boundary_ratio"] is None

    with Omni(tiny_wan21_i2v, plugins=wan_plugins, progress=False) as omni:
        assert omni.family == "wan2.1-i2v" and omni.kind == "image-to-video"
        pipeline = omni.generation.pipeline  # type: ignore[attr-defined]
        with _counting(pipeline, "text_encoder", "image_encoder", "transformer", "vae") as calls:
            with pytest.raises(GenerationOptionError, match="animates an input image: pass image=PATH"):
                omni.generate(PROMPT, **SMALL, seed=0)
        assert not calls, f"a request without an image reached the model: {dict(calls)}"

        image_path = tmp_path / "start.png"
        from PIL import Image

        Image.fromarray(_image(0)).save(image_path)
        with _counting(pipeline, "image_encoder", "transformer") as calls:
            first = omni.generate(PROMPT, **SMALL, seed=0, image=image_path)
        assert calls["image_encoder"] == 1 and calls["transformer"] == 4
        same = omni.generate(PROMPT, **SMALL, seed=0, image=_image(0))
        other_image = omni.generate(PROMPT, **SMALL, seed=0, image=_image(1))
        with pytest.raises(GenerationOptionError, match="cannot read the input image"):
            omni.generate(PROMPT, **SMALL, seed=0, image=tmp_path / "missing.png")

    video = first.videos[0]
    assert video.frames.shape == (5, 32, 32, 3) and video.fps == 16
    assert first.metadata.family == "wan2.1-i2v"
    assert first.metadata.request.summary()["image"] == str(image_path)
    assert np.array_equal(video.frames, same.videos[0].frames), "a path and an array of one image must agree"
    assert not np.array_equal(video.frames, other_image.videos[0].frames), "the input image must matter"
    (mp4,) = first.save(tmp_path / "anim.mp4")
    assert probe_video(mp4)["frames"] == 5
    (gif,) = first.save(tmp_path / "anim.gif")
    assert _gif_frames(gif) == (5, (32, 32))


def test_wan22_i2v_resolves_and_runs(tiny_wan22_i2v: Path, wan_plugins: Any) -> None:
    index = json.loads((tiny_wan22_i2v / "model_index.json").read_text())
    assert index["boundary_ratio"] == 0.9 and index["image_encoder"] == [None, None]
    with Omni(tiny_wan22_i2v, plugins=wan_plugins, progress=False) as omni:
        assert omni.family == "wan2.2-i2v"
        pipeline = omni.generation.pipeline  # type: ignore[attr-defined]
        with _counting(pipeline, "transformer", "transformer_2") as calls:
            result = omni.generate(PROMPT, **SMALL, seed=0, image=_image(2))
    assert calls == {"transformer": 2, "transformer_2": 2}
    assert result.videos[0].frames.shape == (5, 32, 32, 3)
    assert result.metadata.family == "wan2.2-i2v" and result.metadata.request.guidance_scale == 3.5


# -- resolution, declarations, recipes ------------------------------------------------------


def test_resolution_rules(
    tiny_wan21_t2v: Path, tiny_wan22_t2v: Path, tiny_wan21_i2v: Path, tiny_wan22_i2v: Path, wan_plugins: Any
) -> None:
    from omni_core.generation.resolve import resolve_model

    expected = {
        tiny_wan21_t2v: "wan2.1-t2v",
        tiny_wan22_t2v: "wan2.2-t2v",
        tiny_wan21_i2v: "wan2.1-i2v",
        tiny_wan22_i2v: "wan2.2-i2v",
    }
    for directory, family in expected.items():
        resolution = resolve_model(wan_plugins, directory)
        assert (resolution.family, resolution.rule) == (family, "model_index")
    # a 2.1 checkpoint writes boundary_ratio: null, which counts as absent
    account = resolve_model(wan_plugins, tiny_wan21_t2v).explanation.render()
    assert "model_index.boundary_ratio is absent" in account
    # a family named outright wins over the checkpoint; a pipeline class name still goes by predicate
    assert resolve_model(wan_plugins, tiny_wan21_t2v, model_class_name="wan2.2-t2v").family == "wan2.2-t2v"
    assert resolve_model(wan_plugins, tiny_wan22_t2v, model_class_name="WanPipeline").family == "wan2.2-t2v"
    assert resolve_model(wan_plugins, tiny_wan21_t2v, recipe_pin="wan2.1-t2v").rule == "recipe"


def test_declared_roles_and_offload_cover_the_real_modules(tiny_wan22_t2v: Path, tiny_wan21_i2v: Path) -> None:
    import fnmatch

    from omni_plugin_diffusion.attention import is_attention_module
    from omni_plugin_wan.family import Wan21ImageToVideo, Wan22TextToVideo

    for family, directory in ((Wan22TextToVideo, tiny_wan22_t2v), (Wan21ImageToVideo, tiny_wan21_i2v)):
        pipeline = family.pipeline_type().from_pretrained(str(directory))
        seen = set()
        for component in family.dit_modules:
            for path, module in getattr(pipeline, component).named_modules():
                if path and is_attention_module(module):
                    site = f"{component}.{path}"
                    # every site is claimed by an explicit pattern, not the fallback
                    assert any(fnmatch.fnmatchcase(site, p) for p, _, _ in family.attention_roles), site
                    seen.add(family.role_for(site))
        assert seen == {("self", "self"), ("cross", "cross")}
        for attr in family.block_attrs:
            component, name = attr.split(".")
            assert len(getattr(getattr(pipeline, component), name)) == 2
        for name in (*family.dit_modules, *family.encoder_modules, *family.resident_modules):
            assert getattr(pipeline, name) is not None, name
    assert Wan22TextToVideo.dit_modules == ("transformer", "transformer_2")
    assert Wan21ImageToVideo.encoder_modules == ("text_encoder", "image_encoder")


def test_real_defaults() -> None:
    from omni_plugin_wan.family import Wan21ImageToVideo, Wan21TextToVideo, Wan22ImageToVideo, Wan22TextToVideo

    defaults = {
        Wan21TextToVideo: (832, 480, 81, 16, 50, 5.0),
        Wan22TextToVideo: (1280, 720, 81, 16, 40, 4.0),
        Wan21ImageToVideo: (832, 480, 81, 16, 50, 5.0),
        Wan22ImageToVideo: (1280, 720, 81, 16, 40, 3.5),
    }
    for family, want in defaults.items():
        p = family.profile
        assert (p.default_width, p.default_height, p.default_frames, p.default_fps) == want[:4]
        assert (p.default_steps, p.default_guidance) == want[4:]
        assert (p.size_multiple, p.frames_step, p.frames_offset) == (16, 4, 1)


@pytest.mark.parametrize("name", ["wan2.1-t2v", "wan2.2-t2v", "wan2.1-i2v", "wan2.2-i2v"])
def test_recipe_pins_the_family_and_fits_its_profile(name: str, wan_plugins: Any) -> None:
    from omni_core.generation.recipe import load_recipe
    from omni_core.generation.request import GenerationRequest

    recipe = load_recipe(RECIPES / f"{name}.yaml")
    assert recipe.model_class_name == name
    assert recipe.model.startswith("Wan-AI/")
    assert recipe.attention.default.backend == "TORCH_SDPA"
    (entry,) = [e for e in wan_plugins.models if e.name == name]
    family = entry.load()
    fields: dict[str, Any] = {"prompt": PROMPT, **recipe.generation}
    if family.profile.needs_image:
        fields["image"] = _image(0)
    resolved = family.profile.resolve(GenerationRequest(**fields))
    assert resolved.num_frames == family.profile.default_frames


def test_wan22_recipe_runs_with_model_cpu_offload(tiny_wan22_t2v: Path, wan_offload_plugins: Any) -> None:
    """The recipe as deployed (pin, attention, model_cpu offload, negative prompt, guidance_scale_2),
    on the tiny checkpoint: explicit options still win over the recipe's size and dtype."""
    recipe = RECIPES / "wan2.2-t2v.yaml"
    with Omni(tiny_wan22_t2v, recipe=recipe, plugins=wan_offload_plugins, dtype="float32", progress=False) as omni:
        assert omni.family == "wan2.2-t2v"
        assert omni.explain().rule == "the recipe's model_class_name pin names the family wan2.2-t2v"
        result = omni.generate(PROMPT, **SMALL, seed=0)
        plan = omni.generation.offload_plan()  # type: ignore[attr-defined]
    meta = result.metadata
    assert meta.offload == "model_cpu" and meta.family == "wan2.2-t2v"
    assert meta.request.negative_prompt is not None and meta.request.negative_prompt.startswith("色调艳丽")
    assert meta.request.extra == {"guidance_scale_2": 3.0} and meta.request.guidance_scale == 4.0
    assert result.videos[0].frames.shape == (5, 32, 32, 3)
    assert plan.dit_modules == ("transformer", "transformer_2")
    assert plan.block_attrs == ("transformer.blocks", "transformer_2.blocks")
