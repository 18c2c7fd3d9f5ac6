"""Token usage in a result's metadata, on the tiny checkpoint: the text tokens Bark's tokenizer
makes of each sentence and the EnCodec frames generated."""

from __future__ import annotations

from typing import Any

HOP = 320  # EnCodec samples per frame at 24 kHz
TWO = "Hello world. This is omni speaking."


def test_usage_counts_text_tokens_and_codec_frames(bark_engine: Any) -> None:
    result = bark_engine.speak({"input": TWO, "seed": 0, "max_new_tokens": 200})  # both sentences spoken
    tokenizer = bark_engine.adapter._processor.tokenizer
    segments = bark_engine.prepare(TWO)[1].prompt["segments"]
    assert len(segments) == 2
    tokens = sum(len(tokenizer(s, add_special_tokens=False)["input_ids"]) for s in segments)
    frames = result.audio.frames // HOP
    assert frames > 0 and frames * HOP == result.audio.frames
    assert result.metadata["usage"] == {
        "input_tokens": tokens,
        "output_tokens": frames,
        "total_tokens": tokens + frames,
        "input_text_tokens": tokens,
        "input_audio_tokens": 0,
    }


def test_usage_counts_what_the_model_made_not_the_delivered_audio(bark_engine: Any) -> None:
    plain = bark_engine.speak({"input": TWO, "seed": 0, "max_new_tokens": 4})
    faster = bark_engine.speak({"input": TWO, "seed": 0, "max_new_tokens": 4, "speed": 2.0})
    assert faster.audio.frames < plain.audio.frames
    assert faster.metadata["usage"] == plain.metadata["usage"]


def test_sentences_the_budget_cut_are_not_counted_as_input(bark_engine: Any) -> None:
    # 2 frames hold one semantic token: only the first sentence is spoken (test_bark_engine.py)
    result = bark_engine.speak({"input": TWO, "seed": 0, "max_new_tokens": 2})
    tokenizer = bark_engine.adapter._processor.tokenizer
    first, second = bark_engine.prepare(TWO)[1].prompt["segments"]
    spoken = len(tokenizer(first, add_special_tokens=False)["input_ids"])
    assert len(tokenizer(second, add_special_tokens=False)["input_ids"]) > 0  # so leaving it out shows
    assert result.metadata["usage"]["input_text_tokens"] == spoken
