"""Sentence segmentation and per-sentence seeds (no model needed)."""

import pytest

from omni_core.speech.seeding import segment_seed
from omni_core.speech.text import segment_text, split_sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello world.", ["Hello world."]),
        ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
        ('He said "stop." Then left.', ['He said "stop."', "Then left."]),
        ("Version 2.5 is out.", ["Version 2.5 is out."]),
        ("Wait...  what?", ["Wait...", "what?"]),
        ("   ", []),
    ],
)
def test_speecht5_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_speecht5_segment_cuts_long_sentences_at_words_then_characters() -> None:
    count = len  # one token per character, like a char-level vocabulary
    text = "Short one. " + " ".join(["word"] * 30) + ". " + "x" * 25 + " end."
    pieces = segment_text(text, 12, count)
    assert pieces[0] == "Short one."
    assert all(count(p) <= 12 for p in pieces)
    # the 30 words are packed into pieces of at most 12 characters, in order
    words = [p for p in pieces[1:] if p.startswith("word")]
    assert " ".join(words) == " ".join(["word"] * 30) + "."
    # a word longer than the budget is cut at characters; the rest carries on
    assert pieces[-3:] == ["x" * 12, "x" * 12, "x end."]


def test_speecht5_segment_rejects_a_zero_budget() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        segment_text("Hi.", 0, len)


def test_segment_seeds_differ_per_sentence_and_are_stable() -> None:
    # the one rule every segmenting adapter follows (omni_core.speech.seeding)
    seeds = [segment_seed(7, i) for i in range(5)]
    assert len(set(seeds)) == 5
    assert seeds[0] == 7
    assert seeds == [segment_seed(7, i) for i in range(5)]
    assert all(0 <= s < 2**63 for s in [*seeds, segment_seed(2**63 - 1, 9)])
