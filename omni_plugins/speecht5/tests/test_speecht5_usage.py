"""Token usage in a result's metadata, on the tiny checkpoint: the text tokens the encoder read
and the decoder steps it made (the unit max_new_tokens budgets)."""

from __future__ import annotations

from typing import Any

HOP = 16  # samples per mel frame of the tiny vocoder
REDUCTION = 2  # mel frames per decoder step
THREE = "One two. Three four five! Six?"


def _text_tokens(engine: Any, text: str) -> int:
    """Token ids the encoder reads: every sentence's, end-of-sentence token included."""
    segments = engine.prepare(text)[1].prompt["segments"]
    assert len(segments) == 3
    return sum(len(engine.adapter.processor(text=s)["input_ids"]) for s in segments)


def test_usage_counts_text_tokens_and_decoder_steps(speecht5_engine: Any) -> None:
    tokens = _text_tokens(speecht5_engine, THREE)
    budgeted = speecht5_engine.speak({"input": THREE, "seed": 5, "max_new_tokens": 4})
    assert budgeted.metadata["usage"] == {
        "input_tokens": tokens,
        "output_tokens": 4,
        "total_tokens": tokens + 4,
        "input_text_tokens": tokens,
        "input_audio_tokens": 0,
    }
    free = speecht5_engine.speak({"input": THREE, "seed": 5})
    steps = free.metadata["usage"]["output_tokens"]
    assert steps > 4 and steps * REDUCTION * HOP == free.audio.frames


def test_usage_counts_what_the_model_made_not_the_delivered_audio(speecht5_engine: Any) -> None:
    """Speed and sample rate change the audio after synthesis, not what the model generated."""
    plain = speecht5_engine.speak({"input": THREE, "seed": 5})
    changed = speecht5_engine.speak({"input": THREE, "seed": 5, "speed": 2.0, "sample_rate": 8000})
    assert changed.audio.frames < plain.audio.frames
    assert changed.metadata["usage"] == plain.metadata["usage"]
