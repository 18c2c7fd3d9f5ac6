"""Splitting input text into the segments SpeechT5 speaks one at a time (no torch here).

A segment is a sentence; a sentence whose token count exceeds what the text encoder can
position (``max_text_positions``) is cut further at word boundaries, and a single word longer
than that at character boundaries. Every segment is synthesised on its own, which is what
lets streaming yield sentence by sentence.
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: a sentence ends at ., ! or ? (optionally followed by closing quotes or brackets) and a space
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


def split_sentences(text: str) -> list[str]:
    """``"Hi. How are you? Fine."`` -> ``["Hi.", "How are you?", "Fine."]``."""
    parts = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        end = match.start() + len(match.group(0).rstrip())
        parts.append(text[start:end])
        start = match.end()
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def segment(text: str, count_tokens: Callable[[str], int], max_tokens: int) -> list[str]:
    """Sentences of ``text``, each cut so ``count_tokens(piece) <= max_tokens``."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    pieces: list[str] = []
    for sentence in split_sentences(text):
        if count_tokens(sentence) <= max_tokens:
            pieces.append(sentence)
            continue
        current = ""
        for word in sentence.split():
            candidate = f"{current} {word}" if current else word
            if count_tokens(candidate) <= max_tokens:
                current = candidate
                continue
            if current:
                pieces.append(current)
            current = ""
            while count_tokens(word) > max_tokens:  # one word longer than the encoder allows
                cut = len(word) - 1
                while cut > 1 and count_tokens(word[:cut]) > max_tokens:
                    cut = max(1, cut * max_tokens // max(count_tokens(word[:cut]), 1))
                pieces.append(word[:cut])
                word = word[cut:]
            current = word
        if current:
            pieces.append(current)
    return pieces
