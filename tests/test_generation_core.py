"""Image and video generation in the core: request rules, family resolution, recipes.

Everything here is torch-free: resolution reads JSON configs and registered specs only."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from omni_core.conflicts import Provider
from omni_core.generation.recipe import RecipeError, load_recipe
from omni_core.generation.request import GenerationOptionError, GenerationProfile, GenerationRequest
from omni_core.generation.resolve import ModelResolutionError, ambiguous_families, resolve_model
from omni_core.kinds import Kind
from omni_core.manifest import parse_manifest
from omni_core.plugins import build_registries
from omni_core.registry import ModelRegistrar, ModelSpec, Registry

VIDEO = GenerationProfile(
    task="text-to-video",
    default_width=832,
    default_height=480,
    default_steps=50,
    default_guidance=5.0,
    default_frames=81,
    frames_step=4,
    frames_offset=1,
    max_frames=121,
    default_fps=16,
)
IMAGE = GenerationProfile(
    task="text-to-image",
    default_width=1024,
    default_height=1024,
    default_steps=4,
    default_guidance=0.0,
    uses_guidance=False,
    supports_negative_prompt=False,
    size_multiple=16,
    max_outputs=4,
)


# -- request rules ---------------------------------------------------------------------------


def test_defaults_fill_every_unset_field() -> None:
    resolved = VIDEO.resolve(GenerationRequest(prompt="waves", seed=3))
    assert (resolved.width, resolved.height, resolved.num_frames, resolved.fps) == (832, 480, 81, 16)
    assert (resolved.num_inference_steps, resolved.guidance_scale, resolved.seed) == (50, 5.0, 3)


def test_a_seed_is_drawn_and_reported_when_none_is_given() -> None:
    seeds = {IMAGE.resolve(GenerationRequest(prompt="x")).seed for _ in range(5)}
    assert len(seeds) > 1 and all(isinstance(s, int) for s in seeds)


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"width": 1000}, "width 1000 is not allowed: it must be a multiple of 16"),
        ({"height": 8}, "height 8 is not allowed"),
        ({"num_inference_steps": 0}, "num_inference_steps 0 is not allowed: it must be between 1"),
        ({"guidance_scale": 3.5}, "guidance_scale is not used by this model"),
        ({"negative_prompt": "blurry"}, "negative_prompt is not supported"),
        ({"num_outputs": 9}, "num_outputs 9 is not allowed"),
        ({"num_frames": 9}, "num_frames applies to video models only"),
        ({"image": "cat.png"}, "an input image is not used by this model"),
        ({"extra": {"flow_shift": 3}}, "unknown model option(s) ['flow_shift']"),
    ],
)
def test_image_rules_name_what_is_wrong(fields: dict[str, Any], rule: str) -> None:
    with pytest.raises(GenerationOptionError, match=None) as info:
        IMAGE.resolve(GenerationRequest(prompt="a fox", **fields))
    assert rule in str(info.value)


@pytest.mark.parametrize("frames", [80, 82, 0, 125])
def test_video_frames_follow_the_models_rule(frames: int) -> None:
    with pytest.raises(GenerationOptionError, match=r"takes 4\*k\+1 .*at most 121"):
        VIDEO.resolve(GenerationRequest(prompt="waves", num_frames=frames))


def test_valid_frame_counts_pass() -> None:
    assert [VIDEO.resolve(GenerationRequest(prompt="w", num_frames=n)).num_frames for n in (1, 5, 121)] == [1, 5, 121]


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(GenerationOptionError) as info:
        IMAGE.resolve(GenerationRequest(prompt="a fox", width=17, num_inference_steps=0))
    assert "width 17" in str(info.value) and "num_inference_steps 0" in str(info.value)


def test_image_to_video_needs_an_image() -> None:
    i2v = VIDEO.model_copy(update={"task": "image-to-video"})
    with pytest.raises(GenerationOptionError, match=r"pass image=PATH"):
        i2v.resolve(GenerationRequest(prompt="the cat turns"))


def test_unknown_and_blank_fields_are_refused_with_the_accepted_list() -> None:
    with pytest.raises(GenerationOptionError, match=r"unknown option 'steps' .*num_inference_steps"):
        GenerationRequest.parse({"prompt": "x", "steps": 4})
    with pytest.raises(GenerationOptionError, match=r"prompt is blank"):
        GenerationRequest.parse({"prompt": "   "})


def test_a_video_profile_without_frame_defaults_is_invalid() -> None:
    with pytest.raises(ValueError, match=r"default_frames and default_fps"):
        GenerationProfile(
            task="text-to-video", default_width=64, default_height=64, default_steps=2, default_guidance=1
        )


# -- resolution ------------------------------------------------------------------------------


@dataclass
class _Record:
    distribution: str
    manifest: Any = None
    status: str = "ok"
    reason: str = ""


@dataclass
class _Plugins:
    models: Registry[ModelSpec]
    records: list[_Record] = field(default_factory=list)


def _plugins(*specs: tuple[str, dict[str, Any]], records: list[_Record] | None = None) -> _Plugins:
    offers = []
    for dist, fields in specs:
        registrar = ModelRegistrar(Provider(dist, dist, "1.0"))
        registrar.register(ref="pkg.family:Family", **fields)
        offers += registrar.offers()
    return _Plugins(build_registries(offers)[0][Kind.MODEL], records or [])


FAMILIES = _plugins(
    (
        "omni-plugin-flux",
        {
            "name": "flux1-dev",
            "architectures": ("FluxPipeline",),
            "config_match": {"transformer.guidance_embeds": True},
        },
    ),
    (
        "omni-plugin-flux",
        {
            "name": "flux1-schnell",
            "architectures": ("FluxPipeline",),
            "config_match": {"transformer.guidance_embeds": False},
        },
    ),
    ("omni-plugin-wan", {"name": "wan2.1-t2v", "architectures": ("WanPipeline",)}),
    (
        "omni-plugin-wan",
        {
            "name": "wan2.2-t2v",
            "architectures": ("WanPipeline",),
            "config_match": {"model_index.boundary_ratio": {"exists": True}},
        },
    ),
    ("omni-plugin-old", {"name": "renamed", "architectures": ("NewPipeline",), "aliases": ("OldPipeline",)}),
    ("omni-plugin-hf", {"name": "hf-dit", "architectures": ("HfDitModel",), "model_types": ("hf_dit",)}),
)


def _checkpoint(
    root: Path,
    class_name: str | None,
    index: dict[str, Any] | None = None,
    transformer: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if class_name:
        data = {"_class_name": class_name, "_diffusers_version": "0.42.1", **(index or {})}
        (root / "model_index.json").write_text(json.dumps(data))
    if transformer is not None:
        (root / "transformer").mkdir()
        (root / "transformer" / "config.json").write_text(json.dumps(transformer))
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
    return root


def test_siblings_are_told_apart_by_their_config_predicate(tmp_path: Path) -> None:
    dev = _checkpoint(tmp_path / "dev", "FluxPipeline", transformer={"guidance_embeds": True})
    schnell = _checkpoint(tmp_path / "schnell", "FluxPipeline", transformer={"guidance_embeds": False})
    assert resolve_model(FAMILIES, dev).family == "flux1-dev"
    resolution = resolve_model(FAMILIES, schnell)
    assert resolution.family == "flux1-schnell" and resolution.rule == "model_index"
    rendered = resolution.explanation.render()
    assert "transformer.guidance_embeds is False, not True" in rendered  # why dev lost


def test_the_sibling_without_a_predicate_is_the_fallback(tmp_path: Path) -> None:
    wan21 = _checkpoint(tmp_path / "21", "WanPipeline", index={"boundary_ratio": None})
    wan22 = _checkpoint(tmp_path / "22", "WanPipeline", index={"boundary_ratio": 0.875})
    assert resolve_model(FAMILIES, wan21).family == "wan2.1-t2v"
    assert resolve_model(FAMILIES, wan22).family == "wan2.2-t2v"


def test_registration_order_never_decides(tmp_path: Path) -> None:
    reversed_families = _plugins(
        *reversed(
            [
                (
                    "omni-plugin-flux",
                    {
                        "name": "flux1-dev",
                        "architectures": ("FluxPipeline",),
                        "config_match": {"transformer.guidance_embeds": True},
                    },
                ),
                (
                    "omni-plugin-flux",
                    {
                        "name": "flux1-schnell",
                        "architectures": ("FluxPipeline",),
                        "config_match": {"transformer.guidance_embeds": False},
                    },
                ),
            ]
        )
    )
    ckpt = _checkpoint(tmp_path / "s", "FluxPipeline", transformer={"guidance_embeds": False})
    assert resolve_model(reversed_families, ckpt).family == resolve_model(FAMILIES, ckpt).family == "flux1-schnell"


def test_a_checkpoint_matching_no_predicate_is_an_error_with_the_fix(tmp_path: Path) -> None:
    odd = _checkpoint(tmp_path / "odd", "FluxPipeline", transformer={})
    with pytest.raises(ModelResolutionError, match=r"(?s)matches none of their config predicates.*--model-class-name"):
        resolve_model(FAMILIES, odd)


def test_explicit_name_beats_recipe_beats_model_index(tmp_path: Path) -> None:
    dev = _checkpoint(tmp_path / "dev", "FluxPipeline", transformer={"guidance_embeds": True})
    assert resolve_model(FAMILIES, dev, recipe_pin="flux1-schnell").family == "flux1-schnell"
    chosen = resolve_model(FAMILIES, dev, model_class_name="wan2.1-t2v", recipe_pin="flux1-schnell")
    assert (chosen.family, chosen.rule) == ("wan2.1-t2v", "explicit")


def test_aliases_resolve_renamed_classes(tmp_path: Path) -> None:
    old = _checkpoint(tmp_path / "old", "OldPipeline")
    assert resolve_model(FAMILIES, old).family == "renamed"


def test_config_json_architectures_then_model_type(tmp_path: Path) -> None:
    by_arch = _checkpoint(tmp_path / "a", None, config={"architectures": ["HfDitModel"]})
    by_type = _checkpoint(tmp_path / "t", None, config={"model_type": "hf_dit"})
    assert resolve_model(FAMILIES, by_arch).rule == "architectures"
    assert resolve_model(FAMILIES, by_type).rule == "model_type"


def test_unknown_class_lists_known_names_and_the_plugin_that_provides_it(tmp_path: Path) -> None:
    catalog = parse_manifest({"omni_api": ">=1.0,<2", "catalog": {"omni-plugin-sana": ["SanaPipeline"]}})
    plugins = _plugins(
        *[(d, f) for d, f in [("omni-plugin-flux", {"name": "flux1-dev", "architectures": ("FluxPipeline",)})]],
        records=[_Record("omni-plugin-diffusion", catalog)],
    )
    sana = _checkpoint(tmp_path / "sana", "SanaPipeline")
    with pytest.raises(ModelResolutionError) as info:
        resolve_model(plugins, sana)
    message = str(info.value)
    assert "Model class 'SanaPipeline'" in message and "pip install omni-plugin-sana" in message
    assert "Known: FluxPipeline, flux1-dev" in message
    with pytest.raises(ModelResolutionError, match=r"no installed or catalogued plugin provides it"):
        resolve_model(plugins, sana, model_class_name="MysteryPipeline")


def test_a_directory_without_configs_says_what_is_expected(tmp_path: Path) -> None:
    with pytest.raises(ModelResolutionError, match=r"neither model_index.json"):
        resolve_model(FAMILIES, tmp_path)


def test_config_match_keys_must_name_a_component() -> None:
    with pytest.raises(ValueError, match=r"must be '<component>.<key>'"):
        ModelSpec(name="x", ref="a.b:C", config_match={"guidance_embeds": True})


# -- recipes ---------------------------------------------------------------------------------


def test_recipe_loads_and_rejects_typos(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "model: org/model\nmodel_class_name: flux1-dev\nattention:\n  default: {backend: torch_sdpa}\n"
        "generation: {num_inference_steps: 28, guidance_scale: 3.5}\n"
    )
    recipe = load_recipe(good)
    assert recipe.attention.default.backend == "TORCH_SDPA" and recipe.generation["num_inference_steps"] == 28
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_class_name: flux1-dev\ngeneration: {steps: 28}\nofload: [layerwise]\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(bad)
    assert "ofload" in str(info.value) and "steps" in str(info.value)
    with pytest.raises(RecipeError, match=r"cannot read recipe"):
        load_recipe(tmp_path / "missing.yaml")


def test_every_shipped_recipe_loads() -> None:
    recipes = sorted((Path(__file__).parent.parent / "recipes").glob("*.yaml"))
    assert recipes, "recipes/ holds one YAML per model"
    for path in recipes:
        recipe = load_recipe(path)
        assert recipe.model_class_name, f"{path.name} pins no model_class_name"
        if recipe.pipeline is None:  # a pipeline model's stages choose their own attention
            assert recipe.attention.default.backend, f"{path.name} pins no attention backend"
        else:
            assert recipe.pipeline.stages, f"{path.name} places none of its model's stages"


def test_doctor_finds_claims_no_checkpoint_can_settle() -> None:
    assert ambiguous_families(FAMILIES) == []
    clash = _plugins(
        ("omni-plugin-a", {"name": "a", "architectures": ("XPipeline",)}),
        ("omni-plugin-b", {"name": "b", "architectures": ("XPipeline",)}),
        ("omni-plugin-c", {"name": "c", "architectures": ("YPipeline",), "config_match": {"transformer.k": 1}}),
        ("omni-plugin-d", {"name": "d", "architectures": ("YPipeline",), "config_match": {"transformer.k": 1}}),
    )
    problems = ambiguous_families(clash)
    assert len(problems) == 2
    assert "xpipeline is claimed by a (omni-plugin-a), b (omni-plugin-b)" in problems[0]
    assert "same config_match" in problems[1]


# -- batching through the offline API --------------------------------------------------------


class _PlainEngine:
    """A torch-free engine whose "image" is the resolved values it was asked for."""

    def __init__(self, family_cls: Any, model_dir: Path, options: Any) -> None:
        self.family_cls, self.model_dir, self.family = family_cls, model_dir, options.family
        self.calls: list[tuple[str, list[str]]] = []

    def _result(self, request: GenerationRequest, batch_size: int = 1) -> Any:
        from omni_core.generation.outputs import GeneratedImage, GenerationMetadata, GenerationResult

        resolved = self.family_cls.profile.resolve(request)
        metadata = GenerationMetadata(
            model=str(self.model_dir), family=self.family, provider="", request=resolved, batch_size=batch_size
        )
        pixels = (resolved.prompt, resolved.seed, resolved.num_inference_steps, resolved.width)
        return GenerationResult(images=[GeneratedImage(pixels)], videos=[], metadata=metadata)

    def generate(self, request: GenerationRequest) -> Any:
        self.calls.append(("generate", [request.prompt]))
        return self._result(request)

    def explain(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class _BatchEngine(_PlainEngine):
    """The same, batching requests of one size and step count."""

    def batch_key(self, request: GenerationRequest) -> Any:
        resolved = self.family_cls.profile.resolve(request)
        return (resolved.width, resolved.height, resolved.num_inference_steps)

    def generate_batch(self, requests: list[GenerationRequest]) -> list[Any]:
        self.calls.append(("batch", [r.prompt for r in requests]))
        return [self._result(r, batch_size=len(requests)) for r in requests]


class _PlainFamily:
    profile = GenerationProfile(
        task="text-to-image", default_width=32, default_height=32, default_steps=4, default_guidance=0.0
    )
    engine_class: Any = _PlainEngine

    @classmethod
    def profile_for(cls, model_dir: Path) -> GenerationProfile:
        return cls.profile

    @classmethod
    def plan(cls, model_dir: Path, options: Any) -> dict[str, Any]:
        return {}

    @classmethod
    def open(cls, model_dir: Path, options: Any) -> Any:
        return cls.engine_class(cls, model_dir, options)


class _BatchFamily(_PlainFamily):
    engine_class = _BatchEngine


def _omni(tmp_path: Path, family: type, **options: Any) -> Any:
    from omni_core.api import Omni
    from omni_core.plugins import plugin_set_of

    registrar = ModelRegistrar(Provider("p", "omni-plugin-p", "1.0"))
    registrar.register(name="plain", ref=f"{family.__module__}:{family.__qualname__}", architectures=("PlainPipeline",))
    directory = _checkpoint(tmp_path / "plain", "PlainPipeline")
    return Omni(directory, plugins=plugin_set_of(registrar.offers()), **options)


def test_omni_batches_through_an_engine_that_batches_with_the_recipes_settings(tmp_path: Path) -> None:
    from omni_core.generation.model import BatchingEngine
    from omni_core.generation.recipe import Recipe

    omni = _omni(tmp_path, _BatchFamily, recipe=Recipe(generation={"num_inference_steps": 3}))
    assert isinstance(omni.generation, BatchingEngine)
    assert omni.batch_key("a") == omni.batch_key({"prompt": "b", "seed": 9}) == (32, 32, 3)
    assert omni.batch_key({"prompt": "a", "num_inference_steps": 5}) == (32, 32, 5)
    with pytest.raises(GenerationOptionError, match="width 33 is not allowed"):
        omni.batch_key({"prompt": "a", "width": 33})
    results = omni.generate_batch(["a", {"prompt": "b", "seed": 9}, GenerationRequest(prompt="c", seed=2)])
    assert omni.generation.calls == [("batch", ["a", "b", "c"])]
    assert [r.images[0].pixels[:3] for r in results[1:]] == [("b", 9, 3), ("c", 2, 3)]
    assert [r.metadata.batch_size for r in results] == [3, 3, 3]
    # a batch of one is a plain generate; an empty batch is empty
    assert omni.generate_batch([{"prompt": "d", "seed": 1}])[0].images[0].pixels == ("d", 1, 3, 32)
    assert omni.generate_batch([]) == []
    assert omni.generation.calls[1:] == [("generate", ["d"])]


def test_omni_runs_a_batch_one_by_one_on_an_engine_that_does_not_batch(tmp_path: Path) -> None:
    from omni_core.generation.model import BatchingEngine
    from omni_core.generation.recipe import Recipe

    omni = _omni(tmp_path, _PlainFamily, recipe=Recipe(generation={"width": 48}))
    assert not isinstance(omni.generation, BatchingEngine)
    assert omni.batch_key("a") is None
    results = omni.generate_batch(["a", {"prompt": "b", "seed": 4}])
    assert omni.generation.calls == [("generate", ["a"]), ("generate", ["b"])]
    assert results[1].images[0].pixels == ("b", 4, 4, 48)
    assert [r.metadata.batch_size for r in results] == [1, 1]
