"""Cutting input text into the pieces an adapter synthesises one at a time.

Adapters stream sentence by sentence, and models that read a bounded number of tokens cut
long sentences further. Every family needs the same rules, so they live here: pure Python,
no tokenizer import (the caller passes a token counter).
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: a sentence ends at ., !, ? or an ellipsis, with any closing quotes or brackets, before
#: whitespace; or right after a full-width (CJK) full stop, exclamation or question mark
_SENTENCE_END = re.compile(r"[.!?\u2026][\"')\]\u201d\u2019]*\s+|[\u3002\uff01\uff1f]")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` in order, each keeping its punctuation: ``"Hi. How are you?"`` ->
    ``["Hi.", "How are you?"]``; ``3.5`` never splits. A piece with no letter or digit
    (``"?!"``, ``"..."``) joins the sentence before it, or the one after when it comes first."""
    pieces, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        end = match.start() + len(match.group(0).rstrip())
        pieces.append(text[start:end])
        start = match.end()
    pieces.append(text[start:])

    sentences: list[str] = []
    leading = ""
    for piece in (p.strip() for p in pieces):
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
    """Sentences of ``text``, each cut further so that ``count_tokens(segment) <= max_tokens``:
    at word boundaries, and a single word longer than the budget at characters. Nothing is
    dropped or reordered."""
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
