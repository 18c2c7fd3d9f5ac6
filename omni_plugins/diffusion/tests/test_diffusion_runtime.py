"""The shared diffusion runtime on a tiny real checkpoint: loading through from_pretrained,
attention routed through omni's backends, validation before compute, outputs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from omni_core.attention.config import AttentionConfigError
from omni_core.generation.request import GenerationOptionError, GenerationRequest

FOX = "a red fox in snow"


def _transformer_calls(engine: Any) -> list[int]:
    """A counter of transformer forward passes (one per denoising step here: CFG is batched)."""
    count = [0]
    engine.pipeline.transformer.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


def test_the_checkpoint_has_the_standard_diffusers_layout(tiny_pixart: Path) -> None:
    names = {p.name for p in tiny_pixart.iterdir()}
    assert {"model_index.json", "transformer", "vae", "text_encoder", "tokenizer", "scheduler"} <= names
    assert list((tiny_pixart / "transformer").glob("*.safetensors"))


def test_same_seed_same_pixels_other_seed_other_pixels(open_engine: Any) -> None:
    engine = open_engine("TORCH_SDPA")
    first = engine.generate(GenerationRequest(prompt=FOX, seed=0))
    again = engine.generate(GenerationRequest(prompt=FOX, seed=0))
    other = engine.generate(GenerationRequest(prompt=FOX, seed=1))
    assert first.images[0].pixels.shape == (32, 32, 3) and first.images[0].pixels.dtype == np.uint8
    assert np.array_equal(first.images[0].pixels, again.images[0].pixels)
    assert not np.array_equal(first.images[0].pixels, other.images[0].pixels)
    assert first.seed == 0 and first.metadata.family == "tiny-pixart"


def test_requested_size_and_number_of_outputs(open_engine: Any) -> None:
    result = open_engine().generate(GenerationRequest(prompt=FOX, width=48, height=16, num_outputs=2, seed=0))
    assert [(img.width, img.height) for img in result.images] == [(48, 16), (48, 16)]
    assert [img.index for img in result.images] == [0, 1]


@pytest.mark.parametrize("backend", ["REFERENCE_ATTN", "CHUNKED_ATTN"])
def test_the_chosen_backend_runs_the_transformers_attention(open_engine: Any, backend: str, monkeypatch: Any) -> None:
    """Every attention call inside the transformer goes to the chosen backend; torch's own SDPA
    is not called from inside the transformer at all (the library default is bypassed)."""
    from omni_plugin_diffusion import attention

    engine = open_engine(backend)
    inside = [False]
    torch_sdpa_inside = [0]
    original = attention._original

    def spy(*args: Any, **kwargs: Any) -> Any:
        torch_sdpa_inside[0] += inside[0]
        return original(*args, **kwargs)

    monkeypatch.setattr(attention, "_original", spy)
    transformer = engine.pipeline.transformer
    transformer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
    transformer.register_forward_hook(lambda *_: inside.__setitem__(0, False))
    result = engine.generate(GenerationRequest(prompt=FOX, seed=0))
    # 3 blocks x (self + cross) x 2 steps, CFG batched into one call
    assert dict(engine.router.calls) == {("self", backend): 6, ("cross", backend): 6}
    assert torch_sdpa_inside[0] == 0
    assert result.metadata.attention == {"self": backend, "cross": backend}


def test_torch_sdpa_backend_reaches_torch_through_the_router(open_engine: Any, monkeypatch: Any) -> None:
    from omni_plugin_diffusion import attention

    engine = open_engine("TORCH_SDPA")
    calls = [0]
    original = attention._original
    monkeypatch.setattr(
        attention, "_original", lambda *a, **k: (calls.__setitem__(0, calls[0] + 1), original(*a, **k))[1]
    )
    engine.generate(GenerationRequest(prompt=FOX, seed=0))
    assert sum(engine.router.calls.values()) == 12 and calls[0] >= 12


def test_backends_agree_numerically(open_engine: Any) -> None:
    pixels = {
        b: open_engine(b).generate(GenerationRequest(prompt=FOX, seed=0)).images[0].pixels.astype(int)
        for b in ("TORCH_SDPA", "REFERENCE_ATTN", "CHUNKED_ATTN")
    }
    assert np.abs(pixels["REFERENCE_ATTN"] - pixels["TORCH_SDPA"]).max() <= 2
    assert np.abs(pixels["CHUNKED_ATTN"] - pixels["TORCH_SDPA"]).max() <= 2


def test_per_role_choices_route_each_call_site(open_engine: Any) -> None:
    engine = open_engine({"default": {"backend": "TORCH_SDPA"}, "per_role": {"cross": {"backend": "REFERENCE_ATTN"}}})
    result = engine.generate(GenerationRequest(prompt=FOX, seed=0))
    assert dict(engine.router.calls) == {("self", "TORCH_SDPA"): 6, ("cross", "REFERENCE_ATTN"): 6}
    assert result.metadata.attention == {"self": "TORCH_SDPA", "cross": "REFERENCE_ATTN"}
    assert "explicit" in engine.explain()["attention:cross"].rule


def test_automatic_choice_is_explained(open_engine: Any) -> None:
    engine = open_engine()
    explanation = engine.explain()["attention:self"]
    assert explanation.winner == "TORCH_SDPA" and explanation.rule.startswith("defaulting to TORCH_SDPA")


def test_an_explicit_backend_that_cannot_run_fails_before_loading(open_engine: Any) -> None:
    from runtime_family import TinyPixArt

    class MustNotLoad(TinyPixArt):
        @classmethod
        def pipeline_type(cls) -> Any:
            raise AssertionError("the checkpoint was loaded before the attention choice was checked")

    with pytest.raises(AttentionConfigError, match=r"FLASH_ATTN was chosen explicitly .* cannot run here"):
        open_engine("FLASH_ATTN", family=MustNotLoad)


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"width": 40}, "width 40 is not allowed: it must be a multiple of 16"),
        ({"num_inference_steps": 0}, "num_inference_steps 0 is not allowed"),
        ({"num_frames": 9}, "num_frames applies to video models only"),
    ],
)
def test_bad_options_are_rejected_before_any_compute(open_engine: Any, fields: dict[str, Any], rule: str) -> None:
    engine = open_engine()
    forwards = _transformer_calls(engine)
    with pytest.raises(GenerationOptionError) as info:
        engine.generate(GenerationRequest(prompt=FOX, **fields))
    assert rule in str(info.value) and forwards[0] == 0


def test_denoising_shows_a_progress_bar(open_engine: Any, capsys: Any) -> None:
    engine = open_engine(progress=True)
    engine.generate(GenerationRequest(prompt=FOX, seed=0, num_inference_steps=3))
    err = capsys.readouterr().err
    assert "tiny-pixart denoising" in err and "3/3" in err


def test_an_incomplete_checkpoint_names_the_cause(open_engine: Any, tiny_pixart: Path, tmp_path: Path) -> None:
    from omni_plugin_diffusion.engine import ModelLoadError
    from runtime_family import TinyPixArt

    from omni_core.generation.model import EngineOptions

    broken = tmp_path / "broken"
    shutil.copytree(tiny_pixart, broken)
    shutil.rmtree(broken / "vae")
    with pytest.raises(
        ModelLoadError, match=r"could not load .* as PixArtAlphaPipeline .*complete diffusers checkpoint"
    ):
        TinyPixArt.open(broken, EngineOptions(family="tiny-pixart", progress=False))


def test_an_unsupported_dtype_is_refused_with_the_supported_ones(open_engine: Any) -> None:
    from omni_core.errors import OmniError

    with pytest.raises(OmniError, match=r"dtype int8 is not supported on cpu .*choose one with --dtype"):
        open_engine(dtype="int8")


def test_text_encoder_attention_is_not_routed(open_engine: Any) -> None:
    """Only the transformer's attention is routed: after a generation no router is active."""
    from omni_plugin_diffusion import attention

    engine = open_engine("REFERENCE_ATTN")
    engine.generate(GenerationRequest(prompt=FOX, seed=0))
    assert getattr(attention._local, "router", None) is None
    engine.close()
    assert engine.pipeline is None
