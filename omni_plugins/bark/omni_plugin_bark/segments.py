"""Splitting input text into the segments Bark generates one at a time.

Bark reads at most ``max_input_semantic_length`` text tokens per generation (256 for the
published checkpoints) and drifts on long inputs, so long text is generated sentence by
sentence with the same voice preset. A sentence longer than the window is cut at word
boundaries, and a single word longer than the window by characters, so no text is silently
truncated. Pure Python: no torch, no tokenizer import (the caller passes a token counter).
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: a sentence ends at ., ! or ? followed by whitespace, or right after a CJK (full-width)
#: full stop, exclamation or question mark
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` in order. A piece with no letter or digit (``"?!"``, ``"..."``)
    joins the sentence before it, or the one after when it comes first."""
    sentences: list[str] = []
    leading = ""
    for piece in _SENTENCE_END.split(text):
        piece = piece.strip()
        if not piece:
            continue
        if not any(ch.isalnum() for ch in piece):
            if sentences:
                sentences[-1] = f"{sentences[-1]} {piece}"
            else:
                leading = f"{leading} {piece}".strip()
            continue
        sentences.append(f"{leading} {piece}".strip())
        leading = ""
    if leading:  # nothing but punctuation
        sentences.append(leading)
    return sentences


def segment_text(text: str, max_tokens: int, count_tokens: Callable[[str], int]) -> list[str]:
    """Sentences of ``text``, each cut further so that ``count_tokens(segment) <= max_tokens``."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    segments: list[str] = []
    for sentence in split_sentences(text):
        if count_tokens(sentence) <= max_tokens:
            segments.append(sentence)
            continue
        current = ""
        for word in sentence.split():
            candidate = f"{current} {word}" if current else word
            if count_tokens(candidate) <= max_tokens:
                current = candidate
                continue
            if current:
                segments.append(current)
            pieces = [word] if count_tokens(word) <= max_tokens else _cut_word(word, max_tokens, count_tokens)
            segments.extend(pieces[:-1])
            current = pieces[-1]
        if current:
            segments.append(current)
    return segments


def _cut_word(word: str, max_tokens: int, count_tokens: Callable[[str], int]) -> list[str]:
    pieces: list[str] = []
    current = ""
    for ch in word:
        if current and count_tokens(current + ch) > max_tokens:
            pieces.append(current)
            current = ch
        else:
            current += ch
    pieces.append(current)
    return pieces
