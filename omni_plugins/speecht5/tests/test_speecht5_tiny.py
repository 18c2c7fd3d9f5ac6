"""The tiny checkpoint: standard layout, production loaders, and generation that ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omni_plugin_speecht5.tiny import TINY_VOICES
from omni_plugin_speecht5.voices import read_voice_names, save_voices

from omni_core.errors import CheckpointFormatError, ModelLoadError


def test_speecht5_tiny_layout(speecht5_tiny: Path) -> None:
    names = {str(p.relative_to(speecht5_tiny)) for p in speecht5_tiny.rglob("*") if p.is_file()}
    assert {
        "config.json",
        "model.safetensors",
        "spm_char.model",
        "tokenizer_config.json",
        "vocoder/config.json",
        "vocoder/model.safetensors",
        "voices.safetensors",
    } <= names
    assert not any("_train_spm" in n for n in names)  # the scratch vocab file is gone
    config = json.loads((speecht5_tiny / "config.json").read_text())
    vocoder = json.loads((speecht5_tiny / "vocoder" / "config.json").read_text())
    assert config["architectures"] == ["SpeechT5ForTextToSpeech"]
    assert config["model_type"] == "speecht5"
    assert config["reduction_factor"] == 2
    assert config["hidden_size"] % config["encoder_attention_heads"] == 0
    assert config["hidden_size"] // config["decoder_attention_heads"] >= 8
    assert vocoder["model_type"] == "speecht5_hifigan"
    assert vocoder["model_in_dim"] == config["num_mel_bins"]
    assert vocoder["sampling_rate"] == 16000
    assert read_voice_names(speecht5_tiny) == TINY_VOICES  # default first, order kept
    total = sum(p.stat().st_size for p in speecht5_tiny.rglob("*") if p.is_file())
    assert total < 1_000_000, f"tiny checkpoint is {total} bytes"


def test_speecht5_tiny_loads_through_from_pretrained(speecht5_tiny: Path) -> None:
    from omni_plugin_speecht5.voices import load_voices
    from transformers import (
        AutoConfig,
        SpeechT5ForTextToSpeech,
        SpeechT5HifiGan,
        SpeechT5Processor,
        SpeechT5Tokenizer,
    )

    processor = SpeechT5Processor.from_pretrained(speecht5_tiny)
    assert isinstance(processor.tokenizer, SpeechT5Tokenizer)
    ids = processor(text="Hello, World 42!")["input_ids"]
    assert ids[-1] == processor.tokenizer.eos_token_id
    assert processor.tokenizer.unk_token_id not in ids  # letters, digits and punctuation are in the vocabulary
    assert processor.tokenizer.decode(ids, skip_special_tokens=True) == "Hello, World 42!"
    model = SpeechT5ForTextToSpeech.from_pretrained(speecht5_tiny)
    assert model.config.vocab_size >= len(processor.tokenizer)
    vocoder = SpeechT5HifiGan.from_pretrained(speecht5_tiny, subfolder="vocoder")
    assert vocoder.config.model_in_dim == model.config.num_mel_bins
    assert AutoConfig.from_pretrained(speecht5_tiny).model_type == "speecht5"
    voices = load_voices(speecht5_tiny, model.config.speaker_embedding_dim)
    assert list(voices) == list(TINY_VOICES)
    assert all(tuple(v.shape) == (1, 512) for v in voices.values())


def _weights(path: Path) -> dict[str, Any]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def test_speecht5_make_tiny_is_deterministic_per_seed(speecht5_tiny: Path, tmp_path: Path) -> None:
    import numpy as np
    from omni_plugin_speecht5.tiny import make_tiny

    again = make_tiny(tmp_path / "again", seed=0)
    other = make_tiny(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "vocoder/model.safetensors", "voices.safetensors"):
        a, b, c = _weights(speecht5_tiny / name), _weights(again / name), _weights(other / name)
        assert a.keys() == b.keys() == c.keys()
        assert all(np.array_equal(a[k], b[k]) for k in a), name
        assert not all(np.array_equal(a[k], c[k]) for k in a), name
    assert (speecht5_tiny / "spm_char.model").read_bytes() == (again / "spm_char.model").read_bytes()


def test_speecht5_random_weights_stop_at_the_frame_budget(speecht5_engine: Any) -> None:
    """Random stop logits stop at once or never; the tiny one never does, so the budget
    (maxlenratio per sentence) decides the length, exactly, and it stays short."""
    _, prepared, _ = speecht5_engine.prepare({"input": "Hello world.", "seed": 0})
    (ids,) = prepared.prompt["input_ids"]
    steps = int(len(ids) * 20.0 / 2)
    result = speecht5_engine.speak({"input": "Hello world.", "seed": 0})
    hop = 16  # the tiny vocoder upsamples each mel frame 4 * 4 times
    assert result.audio.frames == steps * 2 * hop
    assert result.audio.duration < 1.0
    assert float(abs(result.audio.samples).max()) > 0.05  # audible, not a silent vocoder


def test_speecht5_voices_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="x-vector"):
        read_voice_names(tmp_path)
    with pytest.raises(ValueError, match="at least one"):
        save_voices(tmp_path, {})
    import numpy as np

    save_voices(tmp_path, {"zed": np.zeros(4), "amy": np.ones(4)})
    assert read_voice_names(tmp_path) == ("zed", "amy")  # insertion order, not sorted
    from omni_plugin_speecht5.voices import load_voices

    with pytest.raises(CheckpointFormatError, match="speaker_embedding_dim is 512"):
        load_voices(tmp_path, 512)


@pytest.mark.parametrize(("part", "message"), [("vocoder", "HiFi-GAN vocoder"), ("voices.safetensors", "x-vector")])
def test_speecht5_missing_checkpoint_parts_named(speecht5_tiny: Path, tmp_path: Path, part: str, message: str) -> None:
    import shutil

    from omni_plugin_speecht5.adapter import SpeechT5Adapter

    from omni_core.errors import OmniError
    from omni_core.speech import AdapterContext

    broken = tmp_path / "broken"
    shutil.copytree(speecht5_tiny, broken)
    target = broken / part
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    adapter = SpeechT5Adapter(AdapterContext(broken, json.loads((broken / "config.json").read_text())))
    with pytest.raises(OmniError, match=message):
        adapter.load()
