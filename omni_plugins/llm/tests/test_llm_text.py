"""Incremental detokenization and stop strings, on the tiny tokenizer (byte-level BPE)."""

from __future__ import annotations

from typing import Any

import pytest
from omni_plugin_llm.text import IncrementalDetokenizer, StopStrings

TEXTS = ("Hello, how are you?", "héllo wörld 漢字 🙂 ok", "🙂🙂", "tab\tand\nnewline")


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_join_to_decode_and_never_split_a_character(reference: tuple[Any, Any], text: str) -> None:
    _, tokenizer = reference
    ids = tokenizer(text)["input_ids"]
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.push(t, final=i == len(ids) - 1) for i, t in enumerate(ids)]
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert all("\ufffd" not in p for p in pieces)
    if any(ord(c) > 0x7FF for c in text):
        assert "" in pieces  # a character's first bytes waited for the rest


def test_special_tokens_have_no_text(reference: tuple[Any, Any]) -> None:
    _, tokenizer = reference
    detokenizer = IncrementalDetokenizer(tokenizer)
    ids = tokenizer("<|im_start|>hi<|im_end|>")["input_ids"]
    assert "".join(detokenizer.push(t) for t in ids) == "hi"


def test_stop_strings_hold_back_only_what_may_start_one() -> None:
    stops = StopStrings(["STOP", "xy"])
    assert stops.feed("abc") == ("abc", False)
    assert stops.feed("dS") == ("d", False)  # "S" may start "STOP"
    assert stops.feed("Tx") == ("ST", False)  # "STx" cannot start "STOP"; "x" may start "xy"
    assert stops.feed("q") == ("xq", False)
    assert stops.feed("1ST") == ("1", False)
    assert stops.feed("OP and more") == ("", True)
    assert StopStrings(["xy"]).feed("axyb") == ("a", True)
    assert StopStrings(["op", "long stop"]).feed("a long stop") == ("a ", True)  # the earliest wins
    assert StopStrings(["STOP"]).feed("ST", final=True) == ("ST", False)


def test_no_stop_strings_pass_text_through() -> None:
    assert StopStrings([]).feed("anything") == ("anything", False)
