"""The speech runtime with an in-test adapter: every request rule, sampling merge, speed and
resampling on the way out, streaming, detection order and the offline API (:class:`Omni`).

The adapters here are pure numpy (a tone per word plus seeded noise) registered into
hand-built registries, so nothing needs torch. Real installed adapter plugins are driven in
``test_speech_plugins.py`` and ``test_speech_cli.py``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from omni_core.api import ModelNotServedError, Omni
from omni_core.plugins import PluginSet, plugin_set_of
from omni_core.registry import Provider, TTSAdapterRegistrar
from omni_core.selection import Outcome
from omni_core.speech import PreparedRequest, SpeechRequest, SpeechRequestError, TTSAdapter, TTSCapabilities
from omni_core.speech.audio import Audio
from omni_core.speech.detection import ModelIdentity, TTSDetectionError, explain_tts, overlapping_adapters
from omni_core.speech.engine import SpeechEngine, merge_sampling

#: the tone adapters compute with numpy, which the torch-less ``core`` tox env lacks: there the
#: tests that synthesise skip, and every rule that rejects before synthesis still runs
needs_numpy = pytest.mark.skipif(importlib.util.find_spec("numpy") is None, reason="numpy is not installed")
needs_soundfile = pytest.mark.skipif(importlib.util.find_spec("soundfile") is None, reason="no soundfile")

RATE = 16000
WORD_SECONDS = 0.05


class StubPlatform:
    """What the engine needs of a platform: seeding (numpy only, no torch)."""

    name = "stub"
    seeded: ClassVar[list[int]] = []

    def seed_everything(self, seed: int) -> None:
        StubPlatform.seeded.append(seed)


class ToneAdapter(TTSAdapter):
    """A tone per word plus seeded noise: AR-shaped, streams word by word. Capabilities come
    from ``caps`` in the checkpoint's config.json, so one class serves every rule's test."""

    name = "tone"
    model_archs = frozenset({"ToneTTS"})
    backend = "ar"
    #: calls to generate/stream and chunks made, to prove a rejected request synthesised nothing
    calls: ClassVar[list[str]] = []

    def load(self) -> None:
        self.caps = TTSCapabilities(
            **{
                "native_sample_rate": RATE,
                "voices": ("low", "high"),
                "default_voice": "low",
                "languages": ("en", "de"),
                "streaming": True,
                **self.ctx.config.get("caps", {}),
            }
        )

    def capabilities(self) -> TTSCapabilities:
        return self.caps

    def validate(self, request: SpeechRequest) -> str | None:
        if "forbidden" in request.input:
            return "the tone model refuses the word 'forbidden'"
        return None

    def default_sampling(self) -> dict[str, Any]:
        return {"max_new_tokens": 64, "stop": ["<eos>"], "sampler": {"temperature": 0.7, "top_k": 50}}

    def sampling_overrides(self, request: SpeechRequest) -> dict[str, Any]:
        overrides = super().sampling_overrides(request)
        if request.language == "de":
            overrides["sampler"] = {"temperature": 0.3}
        return overrides

    def build(self, request: SpeechRequest, sampling: dict[str, Any]) -> PreparedRequest:
        voice = request.voice or "low"
        return PreparedRequest(
            prompt={"words": request.input.split()},
            sampling=sampling,
            tts_params={"frequency": 220.0 if voice == "low" else 440.0},
        )

    def stream(self, prepared: PreparedRequest, seed: int):
        import numpy as np

        ToneAdapter.calls.append("stream")
        rng = np.random.default_rng(seed)
        n = int(WORD_SECONDS * RATE)
        t = np.arange(n) / RATE
        for word in prepared.prompt["words"][: prepared.sampling["max_new_tokens"]]:
            frequency = prepared.tts_params["frequency"] * (1 + 0.05 * (len(word) % 4))
            ToneAdapter.calls.append("chunk")
            samples = 0.5 * np.sin(2 * math.pi * frequency * t) + 0.01 * rng.standard_normal(n)
            yield Audio(samples.astype(np.float32), RATE)

    def generate(self, prepared: PreparedRequest, seed: int) -> Audio:
        import numpy as np

        ToneAdapter.calls.append("generate")
        rng = np.random.default_rng(seed)
        n = int(WORD_SECONDS * RATE)
        t = np.arange(n) / RATE
        parts = []
        for word in prepared.prompt["words"][: prepared.sampling["max_new_tokens"]]:
            frequency = prepared.tts_params["frequency"] * (1 + 0.05 * (len(word) % 4))
            parts.append(0.5 * np.sin(2 * math.pi * frequency * t) + 0.01 * rng.standard_normal(n))
        return Audio(np.concatenate(parts).astype(np.float32), RATE)


class OneShotAdapter(ToneAdapter):
    """Non-autoregressive: no streaming, no voices; also claims ToneTTS, at priority 50."""

    name = "oneshot"
    detect_priority = 50
    backend = "non_ar"

    def load(self) -> None:
        self.caps = TTSCapabilities(native_sample_rate=RATE, **self.ctx.config.get("caps", {}))


class SameRankAdapter(ToneAdapter):
    name = "same-rank"


class StageAdapter(ToneAdapter):
    name = "stage"
    model_archs = frozenset()
    stage_keys = frozenset({"tone_stage"})


def plugin_set(*adapters: type[TTSAdapter]) -> PluginSet:
    offers = []
    for i, cls in enumerate(adapters):
        registrar = TTSAdapterRegistrar(Provider(f"p{i}", f"omni-plugin-{cls.name}", "1.0"))
        registrar.register(
            cls.name,
            f"{cls.__module__}:{cls.__qualname__}",
            model_archs=tuple(cls.model_archs),
            stage_keys=tuple(cls.stage_keys),
            detect_priority=cls.detect_priority,
        )
        offers += registrar.offers()
    return plugin_set_of(offers)


def checkpoint(path: Path, arch: str | None = "ToneTTS", **caps: Any) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"model_type": "tone", "caps": caps}
    if arch:
        config["architectures"] = [arch]
    (path / "config.json").write_text(json.dumps(config))
    return path


def engine(tmp_path: Path, adapter: type[TTSAdapter] = ToneAdapter, **caps: Any) -> SpeechEngine:
    model = checkpoint(tmp_path / "model", **caps)
    return SpeechEngine(model, plugins=plugin_set(adapter), platform=StubPlatform())


@pytest.fixture(autouse=True)
def _reset_calls():
    ToneAdapter.calls.clear()
    StubPlatform.seeded.clear()


# ---------------------------------------------------------------------------- request rules

#: (request fields, capability overrides, the rule the error must name)
BAD_REQUESTS = [
    pytest.param({"input": ""}, {}, "input text cannot be empty", id="empty"),
    pytest.param({"input": "  \n\t "}, {}, "input text cannot be empty", id="blank"),
    pytest.param(
        {"input": "word " * 30},
        {"max_input_chars": 100},
        "input is 149 characters; this model accepts at most 100",
        id="over-long",
    ),
    pytest.param({"input": "x" * 5000}, {}, "this model accepts at most 4096", id="over-the-core-limit"),
    pytest.param(
        {"input": "hi", "voice": "alto"}, {}, "unknown voice 'alto'; available: low, high", id="unknown-voice"
    ),
    pytest.param(
        {"input": "hi", "voice": "low"},
        {"voices": (), "default_voice": None},
        "this model has no selectable voices",
        id="voice-on-single-speaker",
    ),
    pytest.param({"input": "hi", "language": "fr"}, {}, "unsupported language 'fr'; supported: en, de", id="language"),
    pytest.param({"input": "hi", "language": "en"}, {"languages": ()}, "none: omit language", id="no-languages"),
    pytest.param({"input": "hi", "instructions": "whisper"}, {}, "does not take instructions", id="instructions"),
    pytest.param({"input": "hi", "ref_audio": "/tmp/ref.wav"}, {}, "cannot clone a voice", id="ref-audio"),
    pytest.param(
        {"input": "hi", "ref_text": "hello"}, {"voice_cloning": True}, "pass ref_audio with it", id="ref-text-alone"
    ),
    pytest.param(
        {"input": "hi", "sample_rate": 22050},
        {"supported_sample_rates": (16000, 24000)},
        "sample_rate 22050 is not supported; choose one of 16000, 24000",
        id="rate-not-offered",
    ),
    pytest.param({"input": "hi", "sample_rate": 1000}, {}, "sample_rate: Input should be greater than", id="rate-low"),
    pytest.param({"input": "hi", "sample_rate": 10**6}, {}, "sample_rate: Input should be less than", id="rate-high"),
    pytest.param({"input": "hi", "response_format": "ogg"}, {}, "response_format: Input should be", id="format"),
    pytest.param({"input": "hi", "speed": 10}, {}, "speed: Input should be less than or equal to 4", id="speed"),
    pytest.param({"input": "hi", "speed": 0}, {}, "speed: Input should be greater than or equal to 0.25", id="speed-0"),
    pytest.param({"input": "hi", "colour": "red"}, {}, "unknown field 'colour'", id="unknown-field"),
    pytest.param({"input": "hi", "max_new_tokens": 0}, {}, "max_new_tokens: Input should be greater", id="budget"),
    pytest.param(
        {"input": "hi", "max_new_tokens": 5},
        {"unsupported_fields": ("max_new_tokens",)},
        "this model does not support 'max_new_tokens'; omit it",
        id="unsupported-field",
    ),
    pytest.param(
        {"input": "hi", "stream": True},
        {},
        "use SpeechEngine.stream() (Omni.stream_speech() in the offline API)",
        id="stream-on-speak",
    ),
    pytest.param({"input": "a forbidden word"}, {}, "the tone model refuses the word 'forbidden'", id="adapter-rule"),
]


@pytest.mark.parametrize(("fields", "caps", "rule"), BAD_REQUESTS)
def test_every_bad_request_is_rejected_naming_the_rule_before_synthesis(tmp_path, fields, caps, rule):
    speech = engine(tmp_path, **caps)
    with pytest.raises(SpeechRequestError) as info:
        speech.speak(fields)
    assert rule in str(info.value)
    assert ToneAdapter.calls == [], "a rejected request must not reach the model"


#: streaming-only rules: (request fields, capability overrides, rule)
BAD_STREAMS = [
    pytest.param({"input": "hi"}, {"streaming": False}, "this model cannot stream; omit stream", id="cannot-stream"),
    pytest.param(
        {"input": "hi", "sample_rate": 24000}, {}, "streaming returns the native 16000 Hz", id="stream-resample"
    ),
    pytest.param({"input": "hi", "speed": 1.5}, {}, "changes speed only after synthesis", id="stream-stretch"),
    pytest.param({"input": ""}, {}, "input text cannot be empty", id="stream-empty"),
    pytest.param({"input": "hi", "voice": "alto"}, {}, "unknown voice 'alto'", id="stream-voice"),
]


@pytest.mark.parametrize(("fields", "caps", "rule"), BAD_STREAMS)
def test_bad_stream_requests_are_rejected_at_the_call_not_at_the_first_chunk(tmp_path, fields, caps, rule):
    speech = engine(tmp_path, **caps)
    with pytest.raises(SpeechRequestError) as info:
        speech.stream(fields)  # no next(): validation is eager
    assert rule in str(info.value)
    assert ToneAdapter.calls == []


@needs_numpy
def test_native_speed_control_may_stream_with_speed(tmp_path):
    chunks = list(engine(tmp_path, native_speed_control=True).stream({"input": "a b", "speed": 1.5}))
    assert len(chunks) == 2


@needs_soundfile
def test_unsupported_encoder_is_rejected_before_synthesis(tmp_path, monkeypatch):
    import soundfile

    formats = {k: v for k, v in soundfile.available_formats().items() if k != "MP3"}
    monkeypatch.setattr(soundfile, "available_formats", lambda: formats)
    with pytest.raises(SpeechRequestError, match="response_format 'mp3' is not supported by this libsndfile"):
        engine(tmp_path).speak({"input": "hi", "response_format": "mp3"})
    assert ToneAdapter.calls == []


@needs_numpy
def test_missing_soundfile_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "soundfile", None)
    with pytest.raises(SpeechRequestError, match="needs the soundfile package: pip install soundfile"):
        engine(tmp_path).speak({"input": "hi", "response_format": "flac"})
    # wav and pcm need no library
    assert engine(tmp_path).speak({"input": "hi", "response_format": "pcm"}).data


@needs_numpy
def test_blank_optional_fields_count_as_absent(tmp_path):
    result = engine(tmp_path).speak({"input": "hi there", "voice": " ", "language": "", "seed": 1})
    assert result.audio.frames == 2 * int(WORD_SECONDS * RATE)


def test_normalize_fills_the_default_voice_and_collapses_whitespace(tmp_path):
    request, prepared, _ = engine(tmp_path).prepare({"input": "  hello \n  world  "})
    assert request.input == "hello world" and request.voice == "low"
    assert prepared.request is request


# ---------------------------------------------------------------------------- sampling


def test_merge_sampling_is_field_by_field_and_keeps_what_the_request_does_not_mention():
    defaults = {"max_new_tokens": 2048, "stop": ["<eos>"], "sampler": {"temperature": 0.7, "top_k": 50}}
    merged = merge_sampling(defaults, {"max_new_tokens": 10, "sampler": {"temperature": 0.2}})
    assert merged == {"max_new_tokens": 10, "stop": ["<eos>"], "sampler": {"temperature": 0.2, "top_k": 50}}
    assert defaults["max_new_tokens"] == 2048 and defaults["sampler"]["temperature"] == 0.7, "defaults unchanged"
    assert merge_sampling(defaults, {}) == defaults
    # a dict replacing a scalar, or a scalar replacing a dict, is a plain replacement
    assert merge_sampling({"a": 1, "b": {"x": 1}}, {"a": {"y": 2}, "b": 3}) == {"a": {"y": 2}, "b": 3}


def test_request_overrides_reach_build_merged_onto_the_model_defaults(tmp_path):
    _, prepared, _ = engine(tmp_path).prepare({"input": "hi", "max_new_tokens": 1, "language": "de"})
    assert prepared.sampling == {"max_new_tokens": 1, "stop": ["<eos>"], "sampler": {"temperature": 0.3, "top_k": 50}}
    _, plain, _ = engine(tmp_path).prepare({"input": "hi"})
    assert plain.sampling == ToneAdapter.default_sampling(None)  # type: ignore[arg-type]


@needs_numpy
def test_the_budget_really_limits_generation(tmp_path):
    result = engine(tmp_path).speak({"input": "one two three four", "max_new_tokens": 2, "seed": 0})
    assert result.audio.frames == 2 * int(WORD_SECONDS * RATE)


# ---------------------------------------------------------------------------- output audio


def _peak_hz(audio: Audio) -> float:
    import numpy as np

    spectrum = np.abs(np.fft.rfft(audio.samples * np.hanning(audio.frames)))
    return float(np.fft.rfftfreq(audio.frames, 1 / audio.sample_rate)[np.argmax(spectrum)])


@needs_numpy
def test_output_is_resampled_to_the_requested_rate_with_a_correct_header(tmp_path):
    import io
    import wave

    words = "tone " * 20
    native = engine(tmp_path).speak({"input": words, "seed": 3})
    result = engine(tmp_path).speak({"input": words, "seed": 3, "sample_rate": 24000})
    assert result.metadata["sample_rate"] == result.audio.sample_rate == 24000
    assert result.audio.frames == math.floor(native.audio.frames * 24000 / RATE)
    with wave.open(io.BytesIO(result.data)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24000, 1, 2)
        assert wav.getnframes() == result.audio.frames
    assert abs(_peak_hz(result.audio) - _peak_hz(native.audio)) < 5
    assert result.content_type == "audio/wav"


@needs_numpy
def test_speed_is_applied_after_synthesis_when_the_model_cannot_and_pitch_is_kept(tmp_path):
    words = "tone " * 40
    native = engine(tmp_path).speak({"input": words, "seed": 3})
    fast = engine(tmp_path).speak({"input": words, "seed": 3, "speed": 2.0})
    assert abs(fast.audio.duration - native.audio.duration / 2) < 0.01
    assert abs(_peak_hz(fast.audio) - _peak_hz(native.audio)) < 5
    assert fast.metadata["duration_s"] == pytest.approx(fast.audio.duration)


@needs_numpy
def test_native_speed_control_leaves_speed_to_the_model(tmp_path):
    words = "tone " * 10
    speech = engine(tmp_path, native_speed_control=True)
    assert speech.speak({"input": words, "speed": 2.0}).audio.frames == 10 * int(WORD_SECONDS * RATE)


@needs_numpy
def test_metadata_names_adapter_seed_rate_and_duration(tmp_path):
    meta = engine(tmp_path).speak({"input": "a b c", "seed": 42}).metadata
    assert meta["adapter"] == "tone" and meta["seed"] == 42 and meta["sample_rate"] == RATE
    assert meta["duration_s"] == pytest.approx(3 * WORD_SECONDS)
    assert StubPlatform.seeded == [42]


@needs_numpy
def test_a_random_seed_is_chosen_and_reported_when_none_is_given(tmp_path):
    import numpy as np

    speech = engine(tmp_path)
    first = speech.speak("a b c")
    again = speech.speak({"input": "a b c", "seed": first.metadata["seed"]})
    assert np.array_equal(first.audio.samples, again.audio.samples)


# ---------------------------------------------------------------------------- streaming


@needs_numpy
def test_stream_yields_several_chunks_that_concatenate_to_the_same_seed_speak(tmp_path):
    import numpy as np

    speech = engine(tmp_path)
    text = "the quick brown fox jumps"
    whole = speech.speak({"input": text, "seed": 7}).audio
    stream = speech.stream({"input": text, "seed": 7})
    assert stream.seed == 7 and stream.request.stream and stream.adapter == "tone"
    chunks = list(stream)
    assert len(chunks) == 5
    assert np.array_equal(Audio.concatenate(chunks).samples, whole.samples)
    other = Audio.concatenate(list(speech.stream({"input": text, "seed": 8})))
    assert not np.array_equal(other.samples, whole.samples), "the seed must matter"


@needs_numpy
def test_the_first_chunk_arrives_before_the_utterance_is_done(tmp_path):
    stream = engine(tmp_path).stream({"input": "one two three four", "seed": 0})
    assert ToneAdapter.calls == [], "nothing is synthesised before iteration starts"
    next(stream)
    assert ToneAdapter.calls == ["stream", "chunk"], "one word made, three still to come"
    assert len(list(stream)) == 3


@needs_numpy
def test_streams_are_seeded_when_iteration_starts(tmp_path):
    speech = engine(tmp_path)
    a, b = speech.stream({"input": "x y", "seed": 1}), speech.stream({"input": "x y", "seed": 2})
    assert StubPlatform.seeded == []
    list(b), list(a)
    assert StubPlatform.seeded == [2, 1]


# ---------------------------------------------------------------------------- cancellation


class ClosingToneAdapter(ToneAdapter):
    """The tone adapter, recording when its stream's generator is closed."""

    name = "closing-tone"

    def stream(self, prepared: PreparedRequest, seed: int):
        try:
            yield from super().stream(prepared, seed)
        finally:
            ToneAdapter.calls.append("closed")


@needs_numpy
def test_a_cancelled_stream_stops_before_the_next_chunk(tmp_path):
    from omni_core.cancel import CancelToken, cancellable
    from omni_core.errors import RequestCancelled

    token = CancelToken()
    with cancellable(token):
        stream = engine(tmp_path, ClosingToneAdapter).stream({"input": "one two three four", "seed": 0})
        next(stream)
        token.cancel("the client disconnected")
        with pytest.raises(RequestCancelled, match="the client disconnected"):
            next(stream)
    assert ToneAdapter.calls == ["stream", "chunk", "closed"], "no chunk made after the cancel, the adapter closed"


@needs_numpy
def test_a_stream_cancelled_before_it_starts_makes_nothing(tmp_path):
    from omni_core.cancel import CancelToken, cancellable
    from omni_core.errors import RequestCancelled

    token = CancelToken()
    token.cancel("deadline passed")
    with cancellable(token):
        stream = engine(tmp_path).stream({"input": "one two", "seed": 0})  # validation still runs
        with pytest.raises(RequestCancelled, match="deadline passed"):
            next(stream)
    assert ToneAdapter.calls == [] and StubPlatform.seeded == []


@needs_numpy
def test_speak_under_a_cancelled_token_synthesises_nothing(tmp_path):
    from omni_core.cancel import CancelToken, cancellable
    from omni_core.errors import RequestCancelled

    speech = engine(tmp_path)
    token = CancelToken()
    token.cancel("gone")
    with cancellable(token), pytest.raises(RequestCancelled, match="gone"):
        speech.speak({"input": "one two", "seed": 0})
    assert ToneAdapter.calls == []
    # outside a cancellable scope nothing is checked: the same engine speaks on
    assert speech.speak({"input": "one two", "seed": 0}).audio.frames > 0


# ---------------------------------------------------------------------------- usage


class CountingToneAdapter(ToneAdapter):
    """The tone adapter with token usage: a text token per word, an output token per tone."""

    name = "counting-tone"

    def usage(self, prepared: PreparedRequest, audio: Audio) -> dict[str, int] | None:
        from omni_core.speech.adapter import token_usage

        return token_usage(
            input_text_tokens=len(prepared.prompt["words"]),
            output_tokens=audio.frames // int(WORD_SECONDS * RATE),
        )


@needs_numpy
def test_usage_is_in_the_metadata_when_the_adapter_reports_it(tmp_path):
    result = engine(tmp_path, CountingToneAdapter).speak({"input": "a b c d", "seed": 0, "max_new_tokens": 3})
    assert result.metadata["usage"] == {
        "input_tokens": 4,
        "output_tokens": 3,
        "total_tokens": 7,
        "input_text_tokens": 4,
        "input_audio_tokens": 0,
    }
    # counted on what the model made, before the runtime changes speed or rate
    faster = engine(tmp_path / "again", CountingToneAdapter).speak(
        {"input": "a b c d", "seed": 0, "max_new_tokens": 3, "speed": 2.0, "sample_rate": 8000}
    )
    assert faster.metadata["usage"] == result.metadata["usage"]


@needs_numpy
def test_no_usage_when_the_adapter_has_no_token_count(tmp_path):
    assert "usage" not in engine(tmp_path).speak({"input": "a b", "seed": 0}).metadata


# ---------------------------------------------------------------------------- detection


def test_detection_takes_the_lowest_priority_match_and_says_why_the_others_lost(tmp_path):
    plugins = plugin_set(ToneAdapter, OneShotAdapter, StageAdapter)
    entry, explanation = explain_tts(plugins, ModelIdentity.from_dir(checkpoint(tmp_path / "m")))
    assert entry is not None and entry.name == "oneshot"
    seen = {c.name: (c.outcome, c.reason) for c in explanation.candidates}
    assert seen["oneshot"] == (Outcome.SELECTED, "matches (priority 50)")
    assert seen["tone"] == (Outcome.NOT_CONSIDERED, "matches too, but at priority 100")
    assert seen["stage"] == (Outcome.REJECTED, "does not match (priority 100)")
    assert explanation.rule == "first match in (detect_priority, name) order"


def test_equal_priority_matches_are_an_error_naming_both_plugins(tmp_path):
    plugins = plugin_set(ToneAdapter, SameRankAdapter)
    with pytest.raises(TTSDetectionError) as info:
        explain_tts(plugins, ModelIdentity.from_dir(checkpoint(tmp_path / "m")))
    message = str(info.value)
    assert "omni-plugin-tone 1.0" in message and "omni-plugin-same-rank 1.0" in message
    assert "detect_priority 100" in message and "--adapter NAME" in message
    with pytest.raises(TTSDetectionError):
        SpeechEngine(tmp_path / "m", plugins=plugins, platform=StubPlatform())
    problems = overlapping_adapters(plugins)
    assert len(problems) == 1 and "['ToneTTS']" in problems[0] and "omni-plugin-same-rank" in problems[0]


def test_an_explicit_adapter_settles_an_overlap(tmp_path):
    plugins = plugin_set(ToneAdapter, SameRankAdapter)
    speech = SpeechEngine(checkpoint(tmp_path / "m"), adapter="same-rank", plugins=plugins, platform=StubPlatform())
    assert speech.adapter_name == "same-rank" and speech.explain().rule == "explicit choice"


class SharedStageAdapter(ToneAdapter):
    name = "shared-stage"
    stage_keys = frozenset({"shared_stage"})


def test_architecture_beats_stage_key(tmp_path):
    # an adapter that names architectures is decided by the architecture when there is one
    assert SharedStageAdapter.matches("shared_stage", "OtherTTS") is False
    assert SharedStageAdapter.matches("other_stage", "ToneTTS") is True
    # the stage key decides only when the checkpoint names no architecture
    assert SharedStageAdapter.matches("shared_stage", None) is True
    plugins = plugin_set(SharedStageAdapter, StageAdapter)
    identity = ModelIdentity.from_dir(checkpoint(tmp_path / "m", arch="OtherTTS"), model_stage="tone_stage")
    entry, _ = explain_tts(plugins, identity)
    assert entry is not None and entry.name == "stage"


def test_no_match_lists_the_installed_adapters(tmp_path):
    entry, explanation = explain_tts(plugin_set(ToneAdapter), ModelIdentity.from_dir(checkpoint(tmp_path / "m", "X")))
    assert entry is None and explanation.rule == "no TTS adapter serves this model (adapters: tone)"


# ---------------------------------------------------------------------------- offline API


@needs_numpy
def test_omni_speaks_and_streams_the_same_audio_for_the_same_seed(tmp_path):
    import numpy as np

    model = checkpoint(tmp_path / "m")
    with Omni(model, plugins=plugin_set(ToneAdapter), platform=StubPlatform()) as omni:
        assert omni.adapter == "tone" and omni.kind == "speech"
        whole = omni.speak("one two three", seed=11)
        chunks = omni.stream_speech("one two three", seed=11)
        assert chunks.seed == 11
        parts = list(chunks)
        assert len(parts) == 3
        assert np.array_equal(Audio.concatenate(parts).samples, whole.audio.samples)
        assert omni.explain().winner == "tone"
        assert omni.capabilities.streaming


@needs_numpy
def test_omni_accepts_text_dicts_and_requests_with_fields_on_top(tmp_path):
    omni = Omni(checkpoint(tmp_path / "m"), plugins=plugin_set(ToneAdapter), platform=StubPlatform())
    by_text = omni.speak("a b", seed=1, response_format="pcm")
    by_dict = omni.speak({"input": "a b", "seed": 1}, response_format="pcm")
    by_request = omni.speak(SpeechRequest(input="a b", seed=2), seed=1, response_format="pcm")
    assert by_text.data == by_dict.data == by_request.data
    assert by_text.response_format == "pcm"
    with pytest.raises(SpeechRequestError, match="unknown field 'colour'"):
        omni.speak("a b", colour="red")
    with pytest.raises(SpeechRequestError, match="unknown voice"):
        omni.stream_speech("a b", voice="alto")  # raises at the call


def test_omni_with_an_overlap_is_an_error_naming_both(tmp_path):
    with pytest.raises(TTSDetectionError, match="omni-plugin-same-rank"):
        Omni(checkpoint(tmp_path / "m"), plugins=plugin_set(ToneAdapter, SameRankAdapter), platform=StubPlatform())
    omni = Omni(
        tmp_path / "m", adapter="tone", plugins=plugin_set(ToneAdapter, SameRankAdapter), platform=StubPlatform()
    )
    assert omni.adapter == "tone"


def test_omni_refuses_what_no_plugin_serves_and_lists_what_is_installed(tmp_path):
    plugins = plugin_set(ToneAdapter, OneShotAdapter)
    with pytest.raises(ModelNotServedError) as info:
        Omni(checkpoint(tmp_path / "m", arch="ImagePipeline"), plugins=plugins, platform=StubPlatform())
    message = str(info.value)
    assert "no installed plugin serves" in message
    assert "installed TTS adapters: oneshot (omni-plugin-oneshot), tone (omni-plugin-tone)" in message
    assert "installed model families: none" in message and "model_index.json" in message
    diffusers = tmp_path / "pipe"
    diffusers.mkdir()
    (diffusers / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
    with pytest.raises(ModelNotServedError, match="has none"):
        Omni(diffusers, plugins=plugins, platform=StubPlatform())
    with pytest.raises(ModelNotServedError, match="does not exist"):
        Omni(tmp_path / "missing", plugins=plugins)


def test_omni_rejects_options_it_would_otherwise_ignore(tmp_path):
    with pytest.raises(TypeError, match=r"\['dtype'\]"):
        Omni(checkpoint(tmp_path / "m"), plugins=plugin_set(ToneAdapter), platform=StubPlatform(), dtype="fp16")


def test_a_closed_omni_says_so(tmp_path):
    omni = Omni(checkpoint(tmp_path / "m"), plugins=plugin_set(ToneAdapter), platform=StubPlatform())
    with omni:
        pass
    with pytest.raises(ModelNotServedError, match="closed"):
        omni.speak("hi")
    assert "closed" in repr(omni)


def test_omni_is_exported_lazily_and_import_omni_core_stays_light(tmp_path):
    script = (
        "import sys, omni_core\n"
        "heavy = [m for m in ('pydantic', 'numpy', 'torch', 'omni_core.api', 'omni_core.speech') if m in sys.modules]\n"
        "from omni_core import Omni\n"
        "assert Omni.__module__ == 'omni_core.api'\n"
        "print(','.join(heavy))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
        ('He said "stop." Then left.', ['He said "stop."', "Then left."]),
        ("Pi is 3.14 today.", ["Pi is 3.14 today."]),
        ("Wait\u2026 then go.", ["Wait\u2026", "then go."]),
        ("\u4f60\u597d\u3002\u518d\u89c1\uff01", ["\u4f60\u597d\u3002", "\u518d\u89c1\uff01"]),
        ("Wait ... ! Go.", ["Wait ... !", "Go."]),
        ("?! ok", ["?! ok"]),
        ("   ", []),
    ],
)
def test_sentences_every_adapter_streams_by(text, sentences):
    from omni_core.speech.text import split_sentences

    assert split_sentences(text) == sentences


def test_long_sentences_are_cut_to_the_token_budget_without_loss():
    from omni_core.speech.text import segment_text

    text = "Short one. " + " ".join(["word"] * 30) + ". " + "x" * 25 + " end."
    pieces = segment_text(text, 12, len)
    assert pieces[0] == "Short one." and all(len(p) <= 12 for p in pieces)
    assert pieces[-3:] == ["x" * 12, "x" * 12, "x end."]
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")  # nothing dropped or reordered
    with pytest.raises(ValueError, match="at least 1"):
        segment_text("Hi.", 0, len)
