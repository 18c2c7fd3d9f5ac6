"""The tiny checkpoint is a standard Bark checkpoint: transformers loads it the usual way."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omni_plugin_bark.tiny import TINY_VOICES, make_tiny


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_layout_is_what_from_pretrained_reads(tiny_bark: Path) -> None:
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "processor_config.json",
        "tokenizer_config.json",
        "tokenizer.json",
        "speaker_embeddings_path.json",
    ):
        assert (tiny_bark / name).is_file(), name
    config = json.loads((tiny_bark / "config.json").read_text())
    assert config["architectures"] == ["BarkModel"]
    assert config["model_type"] == "bark"
    assert config["codec_config"]["sampling_rate"] == 24_000
    assert sum(f.stat().st_size for f in tiny_bark.rglob("*") if f.is_file()) < 2_000_000


def test_transformers_loads_model_processor_and_presets(tiny_bark: Path) -> None:
    import torch
    from transformers import BarkModel, BarkProcessor

    model = BarkModel.from_pretrained(tiny_bark)
    processor = BarkProcessor.from_pretrained(tiny_bark)  # reads speaker_embeddings_path.json
    assert processor.available_voice_presets == list(TINY_VOICES)
    inputs = processor("hello world.", voice_preset=TINY_VOICES[1], max_length=48)
    preset = inputs["history_prompt"]
    assert preset["semantic_prompt"].ndim == 1
    assert preset["coarse_prompt"].shape[0] == 2
    assert preset["fine_prompt"].shape[0] == model.generation_config.fine_acoustics_config["n_fine_codebooks"]
    torch.manual_seed(0)
    audio = model.generate(**inputs, semantic_max_new_tokens=4, do_sample=True)
    assert audio.shape[0] == 1 and audio.shape[1] > 0
    assert audio.shape[1] % 320 == 0  # whole EnCodec frames (hop 320 at 24 kHz)


def test_same_seed_same_checkpoint_and_the_global_rng_is_untouched(tmp_path: Path, tiny_bark: Path) -> None:
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    again = make_tiny(tmp_path / "again", seed=0)
    assert torch.equal(torch.rand(3), expected)
    assert _digest(again / "model.safetensors") == _digest(tiny_bark / "model.safetensors")
    other = make_tiny(tmp_path / "other", seed=1)
    assert _digest(other / "model.safetensors") != _digest(tiny_bark / "model.safetensors")
