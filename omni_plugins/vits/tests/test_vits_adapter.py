"""The adapter and its tiny checkpoint, below the runtime."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from omni_plugin_vits.adapter import VitsAdapter, voice_names
from omni_plugin_vits.tiny import tiny_vocab

from omni_core.speech.adapter import AdapterContext
from omni_core.speech.request import SpeechRequest, SpeechRequestError
from omni_core.speech.text import split_sentences


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def _adapter(model_dir: Path, platform) -> VitsAdapter:  # type: ignore[no-untyped-def]
    config = json.loads((model_dir / "config.json").read_text())
    adapter = VitsAdapter(AdapterContext(model_dir, config, platform))
    adapter.load()
    return adapter


# -------------------------------------------------------------------- sentences and voices


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("Hello world.", ["Hello world."]),
        ("Hello world. How are you? Fine!", ["Hello world.", "How are you?", "Fine!"]),
        ("Wait\u2026 then go.", ["Wait\u2026", "then go."]),
        ("Pi is 3.14 today.", ["Pi is 3.14 today."]),
        ("no terminator at all", ["no terminator at all"]),
        ("  ", []),
    ],
)
def test_split_sentences(text: str, sentences: list[str]) -> None:
    assert split_sentences(text) == sentences


def test_voice_names() -> None:
    assert voice_names(1) == ()
    assert voice_names(3) == ("speaker_0", "speaker_1", "speaker_2")


def test_matches_by_architecture_and_stage_key() -> None:
    assert VitsAdapter.matches(None, "VitsModel")
    assert VitsAdapter.matches("vits", None)
    assert not VitsAdapter.matches("vits", "BarkModel")  # an architecture beats a stage key
    assert not VitsAdapter.matches("bark", None)
    assert VitsAdapter.backend == "non_ar"


def test_registration_agrees_with_the_class(vits_plugins) -> None:  # type: ignore[no-untyped-def]
    entry = vits_plugins.tts_adapters.get("vits")
    assert entry.load() is VitsAdapter
    assert entry.spec.name == VitsAdapter.name
    assert set(entry.spec.stage_keys) == VitsAdapter.stage_keys
    assert set(entry.spec.model_archs) == VitsAdapter.model_archs
    assert entry.spec.detect_priority == VitsAdapter.detect_priority


# -------------------------------------------------------------------- the tiny checkpoint


def test_make_tiny_writes_the_standard_layout(tiny_vits: Path) -> None:
    assert sorted(p.name for p in tiny_vits.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer_config.json",
        "vocab.json",
    ]
    config = json.loads((tiny_vits / "config.json").read_text())
    assert config["architectures"] == ["VitsModel"]
    assert config["model_type"] == "vits"
    assert config["hidden_size"] == 16
    assert config["hidden_size"] // config["num_attention_heads"] >= 8
    assert config["num_speakers"] == 1
    tokenizer_config = json.loads((tiny_vits / "tokenizer_config.json").read_text())
    assert tokenizer_config["phonemize"] is False
    assert tokenizer_config["is_uroman"] is False
    assert json.loads((tiny_vits / "vocab.json").read_text()) == tiny_vocab()
    assert sum(p.stat().st_size for p in tiny_vits.iterdir()) < 200_000


def test_make_tiny_loads_through_transformers(tiny_vits_multi: Path) -> None:
    from transformers import VitsModel, VitsTokenizer

    model = VitsModel.from_pretrained(tiny_vits_multi)
    tokenizer = VitsTokenizer.from_pretrained(tiny_vits_multi)
    assert model.config.num_speakers == 4
    assert model.config.speaker_embedding_size > 0
    assert tokenizer.phonemize is False
    ids = tokenizer("Hello, world!", return_tensors="pt")["input_ids"]
    # a blank (id 0) between and around the characters kept by normalisation ("hello world")
    assert ids.shape == (1, 2 * len("hello world") + 1)
    assert ids[0, ::2].eq(0).all()


def test_make_tiny_is_deterministic_for_a_seed(tmp_path: Path, tiny_vits: Path) -> None:
    again = VitsAdapter.make_tiny(tmp_path / "again", seed=0)
    other = VitsAdapter.make_tiny(tmp_path / "other", seed=1)
    assert _digest(again) == _digest(tiny_vits)
    assert _digest(other)["model.safetensors"] != _digest(tiny_vits)["model.safetensors"]


def test_make_tiny_rejects_zero_speakers(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_speakers must be at least 1"):
        VitsAdapter.make_tiny(tmp_path / "none", num_speakers=0)


# -------------------------------------------------------------------- capabilities and requests


def test_capabilities_single_speaker(tiny_vits: Path, vits_platform) -> None:  # type: ignore[no-untyped-def]
    unloaded = VitsAdapter(AdapterContext(tiny_vits, {}, vits_platform))
    caps = unloaded.capabilities()  # from config.json alone, before load()
    assert caps.native_sample_rate == 16000
    assert caps.voices == ()
    assert caps.default_voice is None
    assert caps.languages == ()
    assert caps.native_speed_control and caps.streaming
    assert not caps.voice_cloning and not caps.instructions
    assert "max_new_tokens" in caps.unsupported_fields
    assert _adapter(tiny_vits, vits_platform).capabilities() == caps


def test_capabilities_multi_speaker(tiny_vits_multi: Path, vits_platform) -> None:  # type: ignore[no-untyped-def]
    caps = _adapter(tiny_vits_multi, vits_platform).capabilities()
    assert caps.voices == ("speaker_0", "speaker_1", "speaker_2", "speaker_3")
    assert caps.default_voice == "speaker_0"


def test_language_and_rate_come_from_the_checkpoint(tmp_path: Path, vits_platform) -> None:  # type: ignore[no-untyped-def]
    model_dir = VitsAdapter.make_tiny(tmp_path / "eng", language="eng", sampling_rate=22050)
    caps = VitsAdapter(AdapterContext(model_dir, {}, vits_platform)).capabilities()
    assert caps.languages == ("eng",)
    assert caps.native_sample_rate == 22050
    adapter = _adapter(model_dir, vits_platform)
    assert adapter.capabilities().languages == ("eng",)
    audio = adapter.generate(adapter.build(adapter.normalize(SpeechRequest(input="hi")), {}), seed=0)
    assert audio.sample_rate == 22050


def test_normalize_fills_the_default_voice(tiny_vits_multi: Path, vits_platform) -> None:  # type: ignore[no-untyped-def]
    adapter = _adapter(tiny_vits_multi, vits_platform)
    request = adapter.normalize(SpeechRequest(input="  hello \n  world  "))
    assert request.input == "hello world"
    assert request.voice == "speaker_0"


def test_sampling_merges_speed_into_the_speaking_rate(tiny_vits: Path, vits_platform) -> None:  # type: ignore[no-untyped-def]
    adapter = _adapter(tiny_vits, vits_platform)
    defaults = adapter.default_sampling()
    assert defaults["speaking_rate"] == 1.0
    assert defaults["noise_scale"] == pytest.approx(0.667)
    assert adapter.sampling_overrides(SpeechRequest(input="hi")) == {}
    assert adapter.sampling_overrides(SpeechRequest(input="hi", speed=2.0)) == {"speaking_rate": 2.0}


def test_build_folds_punctuation_only_pieces_into_a_sentence(tiny_vits_multi: Path, vits_platform) -> None:  # type: ignore[no-untyped-def]
    adapter = _adapter(tiny_vits_multi, vits_platform)
    request = adapter.normalize(SpeechRequest(input="Hello there. ?!? Bye now.", voice="speaker_2"))
    prepared = adapter.build(request, adapter.default_sampling())
    # the shared splitter joins a piece with nothing to say onto the sentence before it
    assert prepared.prompt["sentences"] == ["Hello there. ?!?", "Bye now."]
    assert len(prepared.prompt["input_ids"]) == 2
    assert prepared.tts_params == {"speaker_id": 2}
    assert prepared.request is request


def test_validate_rejects_text_without_pronounceable_characters(tiny_vits: Path, vits_platform) -> None:  # type: ignore[no-untyped-def]
    adapter = _adapter(tiny_vits, vits_platform)
    assert adapter.validate(SpeechRequest(input="hello")) is None
    problem = adapter.validate(SpeechRequest(input="?!. \u00bf\u00a1"))
    assert problem is not None and "no characters this model can pronounce" in problem
    with pytest.raises(SpeechRequestError, match="no characters this model can pronounce"):
        adapter.build(SpeechRequest(input="?!"), {})


def test_generation_restores_model_knobs_and_seeds_each_sentence(tiny_vits: Path, vits_platform) -> None:  # type: ignore[no-untyped-def]
    import numpy as np
    import torch

    adapter = _adapter(tiny_vits, vits_platform)
    request = adapter.normalize(SpeechRequest(input="Hello. World.", speed=2.0))
    prepared = adapter.build(request, {**adapter.default_sampling(), **adapter.sampling_overrides(request)})
    # each sentence is seeded through the context (the engine's rule), so whatever state the
    # process's generator is in beforehand, the same seed gives the same audio
    torch.manual_seed(1234)
    first = adapter.generate(prepared, seed=7)
    torch.manual_seed(99)
    again = adapter.generate(prepared, seed=7)
    np.testing.assert_array_equal(first.samples, again.samples)
    assert adapter.model.speaking_rate == 1.0
    assert adapter.model.noise_scale == pytest.approx(0.667)


def test_generate_before_load_says_so(tiny_vits: Path, vits_platform) -> None:  # type: ignore[no-untyped-def]
    adapter = VitsAdapter(AdapterContext(tiny_vits, {}, vits_platform))
    with pytest.raises(Exception, match="not loaded"):
        adapter.build(SpeechRequest(input="hi"), {})


def test_a_phonemizing_checkpoint_without_phonemizer_fails_at_load(
    tmp_path: Path, vits_platform, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    import transformers.utils

    from omni_core.errors import ModelLoadError

    model_dir = VitsAdapter.make_tiny(tmp_path / "phonemes")
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    (model_dir / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "phonemize": True}))
    monkeypatch.setattr(transformers.utils, "is_phonemizer_available", lambda: False)
    with pytest.raises(ModelLoadError, match="pip install phonemizer"):
        VitsAdapter(AdapterContext(model_dir, {}, vits_platform)).load()
