"""Sentence splitting and window cutting (pure Python; a word counter stands in for the tokenizer)."""

from __future__ import annotations

import pytest

from omni_core.speech.text import segment_text, split_sentences


def chars(text: str) -> int:
    """One token per non-space character, like the tiny checkpoint's character vocabulary."""
    return sum(not c.isspace() for c in text)


def test_sentences_split_at_terminal_punctuation() -> None:
    assert split_sentences("Hello there. How are you? Fine!") == ["Hello there.", "How are you?", "Fine!"]
    assert split_sentences("It costs 3.5 dollars. Ok") == ["It costs 3.5 dollars.", "Ok"]
    full_stop, exclamation = "\u3002", "\uff01"  # CJK sentences end without a space
    assert split_sentences(f"你好{full_stop}再见{exclamation}") == [f"你好{full_stop}", f"再见{exclamation}"]


def test_punctuation_only_pieces_join_the_sentence_before() -> None:
    assert split_sentences("Wait ... ! Go.") == ["Wait ... !", "Go."]
    assert split_sentences("?! ok") == ["?! ok"]
    assert split_sentences("... ?!") == ["... ?!"]


def test_short_sentences_are_kept_whole() -> None:
    assert segment_text("Hi there. Bye.", 48, chars) == ["Hi there.", "Bye."]


def test_long_sentences_are_cut_at_words_within_the_window() -> None:
    text = "one two three four five six seven eight nine ten eleven twelve."
    segments = segment_text(text, 12, chars)
    assert len(segments) > 1
    assert all(chars(s) <= 12 for s in segments)
    assert " ".join(segments) == text  # nothing dropped, nothing reordered


def test_a_word_longer_than_the_window_is_cut_by_characters() -> None:
    segments = segment_text("ab supercalifragilistic cd", 5, chars)
    assert all(chars(s) <= 5 for s in segments)
    assert "".join(segments).replace(" ", "") == "absupercalifragilisticcd"


def test_the_window_must_hold_a_token() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        segment_text("hi", 0, chars)
