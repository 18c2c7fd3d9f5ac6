"""End to end through omni_core.speech.engine.SpeechEngine on the tiny checkpoint."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pytest
from omni_plugin_bark.adapter import PRESET_KEYS, BarkAdapter
from omni_plugin_bark.tiny import TINY_VOICES

from omni_core.speech.adapter import AdapterContext
from omni_core.speech.audio import Audio
from omni_core.speech.request import SpeechRequestError

ONE = "Hello world, this is omni."
TWO = "Hello world. This is omni speaking."
HOP = 320  # EnCodec samples per frame at 24 kHz


def _frames_for(semantic_tokens: int) -> int:
    """Codec frames Bark's coarse stage makes from ``semantic_tokens`` (75 Hz vs 49.9 Hz)."""
    ratio = 75 / 49.9 * 2  # coarse tokens per semantic token, two codebooks interleaved
    return math.floor(semantic_tokens * ratio / 2)


# --- detection and capabilities ------------------------------------------------------------------


def test_the_engine_detects_bark_by_architecture(bark_engine) -> None:  # type: ignore[no-untyped-def]
    assert bark_engine.adapter_name == "bark"
    assert isinstance(bark_engine.adapter, BarkAdapter)
    assert bark_engine.explanation.winner == "bark"


def test_capabilities_come_from_the_checkpoint(bark_engine) -> None:  # type: ignore[no-untyped-def]
    caps = bark_engine.capabilities
    assert caps.native_sample_rate == 24_000  # the EnCodec codec's rate
    assert caps.voices == TINY_VOICES
    assert caps.default_voice == TINY_VOICES[0]
    assert caps.streaming
    assert not (caps.native_speed_control or caps.voice_cloning or caps.instructions)


def test_matches_arch_before_stage_key() -> None:
    assert BarkAdapter.matches(None, "BarkModel")
    assert BarkAdapter.matches("bark", None)
    assert not BarkAdapter.matches("bark", "VitsModel")  # an architecture match beats a stage key
    assert not BarkAdapter.matches("vits", None)


def test_registration_agrees_with_the_class(omni_isolated: object) -> None:
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    entry = load_plugins(isolated_settings(only="bark")).tts_adapters.get("bark")
    assert set(entry.spec.stage_keys) == BarkAdapter.stage_keys
    assert set(entry.spec.model_archs) == BarkAdapter.model_archs
    assert entry.spec.detect_priority == BarkAdapter.detect_priority
    assert entry.load() is BarkAdapter
    assert BarkAdapter.backend == "ar"


def test_adapter_import_and_capabilities_need_no_torch(tiny_bark: Path) -> None:
    code = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "from omni_core.speech.adapter import AdapterContext\n"
        "from omni_plugin_bark.adapter import BarkAdapter\n"
        f"d = Path({str(tiny_bark)!r})\n"
        "a = BarkAdapter(AdapterContext(d, json.loads((d / 'config.json').read_text())))\n"
        "caps = a.capabilities(); a.default_sampling()\n"
        "print(json.dumps({'heavy': sorted(m for m in ('torch', 'transformers') if m in sys.modules),"
        " 'voices': list(caps.voices)}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"heavy": [], "voices": list(TINY_VOICES)}


# --- output --------------------------------------------------------------------------------------


def test_wav_decodes_at_the_native_rate(bark_engine) -> None:  # type: ignore[no-untyped-def]
    result = bark_engine.speak({"input": ONE, "seed": 0})
    assert result.content_type == "audio/wav"
    assert result.metadata["adapter"] == "bark" and result.metadata["sample_rate"] == 24_000
    with wave.open(io.BytesIO(result.data)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24_000)
        assert wav.getnframes() == result.audio.frames
    assert result.audio.frames > 0 and result.audio.frames % HOP == 0
    assert np.all(np.abs(result.audio.samples) <= 1.0)


def test_flac_and_pcm_decode(bark_engine) -> None:  # type: ignore[no-untyped-def]
    import soundfile

    flac = bark_engine.speak({"input": ONE, "seed": 0, "response_format": "flac"})
    samples, rate = soundfile.read(io.BytesIO(flac.data))
    assert rate == 24_000 and samples.shape == (flac.audio.frames,)
    pcm = bark_engine.speak({"input": ONE, "seed": 0, "response_format": "pcm"})
    assert len(pcm.data) == 2 * pcm.audio.frames


def test_resampling_to_a_requested_rate(bark_engine) -> None:  # type: ignore[no-untyped-def]
    native = bark_engine.speak({"input": ONE, "seed": 0})
    result = bark_engine.speak({"input": ONE, "seed": 0, "sample_rate": 16_000})
    with wave.open(io.BytesIO(result.data)) as wav:
        assert wav.getframerate() == 16_000
    assert result.audio.frames == (4 * native.audio.frames + 3) // 6  # 2/3 of them, soxr rounds halves up


def test_speed_is_applied_by_the_runtime(bark_engine) -> None:  # type: ignore[no-untyped-def]
    normal = bark_engine.speak({"input": ONE, "seed": 0})
    fast = bark_engine.speak({"input": ONE, "seed": 0, "speed": 2.0})
    assert fast.audio.frames == round(normal.audio.frames / 2)


# --- determinism and voices ----------------------------------------------------------------------


def test_same_seed_same_audio_other_seed_other_audio(bark_engine) -> None:  # type: ignore[no-untyped-def]
    a = bark_engine.speak({"input": ONE, "seed": 7}).audio.samples
    b = bark_engine.speak({"input": ONE, "seed": 7}).audio.samples
    c = bark_engine.speak({"input": ONE, "seed": 8}).audio.samples
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_voices_are_selectable_and_the_first_is_the_default(bark_engine) -> None:  # type: ignore[no-untyped-def]
    default = bark_engine.speak({"input": ONE, "seed": 3}).audio.samples
    first = bark_engine.speak({"input": ONE, "seed": 3, "voice": TINY_VOICES[0]}).audio.samples
    second = bark_engine.speak({"input": ONE, "seed": 3, "voice": TINY_VOICES[1]}).audio.samples
    assert np.array_equal(default, first)
    assert not np.array_equal(first, second)
    assert bark_engine.prepare({"input": ONE, "voice": TINY_VOICES[1]})[1].prompt["voice"] == TINY_VOICES[1]


def test_an_unknown_voice_is_refused(bark_engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpeechRequestError, match="unknown voice 'nobody'; available: v2/en_speaker_0, v2/en_speaker_1"):
        bark_engine.speak({"input": ONE, "voice": "nobody"})


def test_presets_outside_the_checkpoint_or_missing_are_not_offered(tmp_path: Path, tiny_bark: Path) -> None:
    listing = json.loads((tiny_bark / "speaker_embeddings_path.json").read_text())
    listing["escape"] = {key: "../../etc/passwd" for key in PRESET_KEYS}
    listing["missing"] = {key: f"speaker_embeddings/none_{key}.npy" for key in PRESET_KEYS}
    model_dir = tmp_path / "ckpt"
    model_dir.mkdir()
    (model_dir / "speaker_embeddings_path.json").write_text(json.dumps(listing))
    (model_dir / "speaker_embeddings").symlink_to(tiny_bark / "speaker_embeddings")
    caps = BarkAdapter(AdapterContext(model_dir, {})).capabilities()
    assert caps.voices == TINY_VOICES
    assert caps.native_sample_rate == 24_000  # Bark's rate when the config names none


# --- sampling ------------------------------------------------------------------------------------


def test_max_new_tokens_merges_onto_the_stage_defaults(bark_engine) -> None:  # type: ignore[no-untyped-def]
    defaults = bark_engine.adapter.default_sampling()
    assert defaults["semantic_max_new_tokens"] == 20  # the checkpoint's semantic budget
    assert {"semantic_temperature", "coarse_temperature", "fine_temperature", "semantic_min_eos_p"} <= set(defaults)
    sampling = bark_engine.prepare({"input": ONE, "max_new_tokens": 6})[1].sampling
    assert sampling == {**defaults, "max_frames": 6}  # the whole utterance's budget, in codec frames
    assert bark_engine.prepare({"input": ONE})[1].sampling == defaults


@pytest.mark.parametrize("budget", [2, 7, 12])
def test_max_new_tokens_bounds_the_whole_utterance_in_the_frames_usage_counts(bark_engine, budget: int) -> None:  # type: ignore[no-untyped-def]
    result = bark_engine.speak({"input": TWO, "seed": 0, "max_new_tokens": budget})
    assert 0 < result.metadata["usage"]["output_tokens"] <= budget
    assert 0 < result.audio.frames <= budget * HOP
    default = bark_engine.speak({"input": ONE, "seed": 0}).audio
    assert default.frames <= _frames_for(20) * HOP  # the checkpoint's per-sentence semantic budget


def test_sentences_spend_the_budget_in_order(bark_engine) -> None:  # type: ignore[no-untyped-def]
    # 2 frames hold one semantic token (1 frame): the second sentence has nothing left
    assert len(list(bark_engine.stream({"input": TWO, "seed": 0, "max_new_tokens": 2}))) == 1
    assert len(list(bark_engine.stream({"input": TWO, "seed": 0, "max_new_tokens": 200}))) == 2


def test_max_new_tokens_below_one_semantic_token_is_refused(bark_engine) -> None:  # type: ignore[no-untyped-def]
    bark_engine.prepare({"input": ONE, "max_new_tokens": 2})
    with pytest.raises(SpeechRequestError, match=r"max_new_tokens 1 is fewer codec frames than one semantic token"):
        bark_engine.speak({"input": ONE, "max_new_tokens": 1})


# --- streaming and long text ---------------------------------------------------------------------


def test_stream_yields_a_chunk_per_sentence_that_concatenates_to_speak(bark_engine) -> None:  # type: ignore[no-untyped-def]
    chunks = list(bark_engine.stream({"input": TWO, "seed": 11}))
    assert len(chunks) == 2
    assert all(chunk.sample_rate == 24_000 and chunk.frames > 0 for chunk in chunks)
    whole = bark_engine.speak({"input": TWO, "seed": 11}).audio
    assert np.array_equal(Audio.concatenate(chunks).samples, whole.samples)
    # the first sentence is seeded with the request seed: alone it sounds the same
    alone = bark_engine.speak({"input": "Hello world.", "seed": 11}).audio
    assert np.array_equal(chunks[0].samples, alone.samples)


def test_long_sentences_are_cut_to_the_text_window(bark_engine) -> None:  # type: ignore[no-untyped-def]
    text = "this sentence is much longer than the forty eight character window of the tiny model"
    segments = bark_engine.prepare({"input": text})[1].prompt["segments"]
    assert len(segments) > 1
    assert all(bark_engine.adapter.count_tokens(s) <= 48 for s in segments)
    assert " ".join(segments) == text
    assert len(list(bark_engine.stream({"input": text, "seed": 0}))) == len(segments)


def test_stream_refuses_what_it_cannot_stream(bark_engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpeechRequestError, match="cannot stream"):
        list(bark_engine.stream({"input": ONE, "speed": 1.5}))
    with pytest.raises(SpeechRequestError, match=r"use SpeechEngine\.stream\(\)"):
        bark_engine.speak({"input": ONE, "stream": True})


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"instructions": "whisper"}, "does not take instructions"),
        ({"ref_audio": "/tmp/reference.wav"}, "cannot clone a voice"),
        ({"ref_audio": "/tmp/reference.wav", "ref_text": "hi"}, "cannot clone a voice"),
        ({"ref_text": "hi"}, "pass ref_audio with it"),
        ({"language": "en"}, "unsupported language 'en'"),
        ({"input": "   "}, "input text cannot be empty"),
        ({"temperature": 0.3}, "unknown field 'temperature'"),
    ],
)
def test_unsupported_fields_are_refused(bark_engine, fields: dict[str, object], message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpeechRequestError, match=message):
        bark_engine.speak({"input": ONE, **fields})


# --- speed of the tiny checkpoint ----------------------------------------------------------------


def test_one_sentence_is_fast_on_cpu(bark_engine) -> None:  # type: ignore[no-untyped-def]
    bark_engine.speak({"input": ONE, "seed": 0})  # warm
    start = time.perf_counter()
    result = bark_engine.speak({"input": ONE, "seed": 0})
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"one sentence took {elapsed:.3f}s on the tiny checkpoint"
    assert result.metadata["rtf"] is not None
