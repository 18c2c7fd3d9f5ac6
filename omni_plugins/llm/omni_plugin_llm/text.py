"""Torch-free text handling of the ``generate`` stage: the request's prompt, its parameters,
incremental detokenization and stop strings.

Kept apart from the engine so any engine that runs the stage (this plugin's transformers
engine, a vLLM stage engine) reads a request the same way and answers the same text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omni_core.errors import ChatRequestError

#: the request parameters the stage reads (anything else is refused, not ignored)
PARAMS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos")
#: ``max_tokens`` when neither the request nor the checkpoint's generation_config sets it
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class SamplingParams:
    """One request's decoding parameters, validated. ``temperature`` 0 is greedy decoding
    (``top_p`` and ``top_k`` then do nothing); ``top_k`` 0 and ``top_p`` 1 are off."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def parse(cls, params: dict[str, Any], *, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> SamplingParams:
        """The stage's ``params``; a value of the wrong type or range, or a key the stage does not
        read, is a :class:`~omni_core.errors.ChatRequestError` naming it."""
        unknown = sorted(set(params) - set(PARAMS))
        if unknown:
            raise ChatRequestError(
                f"the generate stage does not take {', '.join(repr(k) for k in unknown)}; it takes {', '.join(PARAMS)}",
                field=unknown[0],
            )

        def number(key: str, kind: type, low: float, high: float | None = None, *, low_open: bool = False) -> Any:
            value = params.get(key)
            if value is None:
                return None
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or (kind is int and value != int(value))
            ):
                raise ChatRequestError(
                    f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}", field=key
                )
            value = kind(value)
            too_low = value <= low if low_open else value < low
            if too_low or (high is not None and value > high):
                bound = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if high is not None else "")
                raise ChatRequestError(f"{key} must be {bound}, got {value!r}", field=key)
            return value

        max_tokens = number("max_tokens", int, 1)
        temperature = number("temperature", float, 0)
        top_p = number("top_p", float, 0, 1, low_open=True)
        top_k = number("top_k", int, -1)  # -1 (vLLM's old "off") and 0 both mean off
        seed = number("seed", int, -(2**63), 2**64 - 1)
        stop = params.get("stop")
        if stop is None:
            stops: tuple[str, ...] = ()
        elif isinstance(stop, str):
            stops = (stop,)
        elif isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
            stops = tuple(stop)
        else:
            raise ChatRequestError(f"stop must be a string or a list of strings, got {stop!r}", field="stop")
        if any(not s for s in stops):
            raise ChatRequestError("stop strings must not be empty", field="stop")
        ignore_eos = params.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise ChatRequestError(f"ignore_eos must be true or false, got {ignore_eos!r}", field="ignore_eos")
        return cls(
            max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
            temperature=temperature or 0.0,
            top_p=top_p if top_p is not None else 1.0,
            top_k=max(top_k or 0, 0),
            seed=seed,
            stop=stops,
            ignore_eos=ignore_eos,
        )


def chat_messages(request: Any) -> list[dict[str, str]]:
    """Chat messages as a chat template reads them: role and text content. Content is a string
    or OpenAI content parts; a part other than text is refused by name (this model reads text
    only), so an image is never silently dropped."""
    messages: list[dict[str, str]] = []
    for n, message in enumerate(request):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ChatRequestError(
                f'messages[{n}] must be an object with a "role" string and a "content", got {message!r}',
                field=f"messages[{n}]",
            )
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            texts = []
            for k, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise ChatRequestError(
                        f"messages[{n}].content[{k}] is a {kind!r} part; this model reads text only: "
                        'send {"type": "text", "text": ...} parts or a string',
                        field=f"messages[{n}].content",
                    )
                texts.append(part["text"])
            text = "".join(texts)
        else:
            raise ChatRequestError(
                f"messages[{n}].content must be a string or a list of content parts, got {type(content).__name__}",
                field=f"messages[{n}].content",
            )
        messages.append({"role": message["role"], "content": text})
    if not messages:
        raise ChatRequestError("messages is empty: send at least one message", field="messages")
    return messages


def prompt_ids(tokenizer: Any, request: Any) -> list[int]:
    """The token ids of the request: a string as it is (the tokenizer's own special tokens
    added, as ``tokenizer(prompt)`` does), or chat messages through the tokenizer's chat template
    with the assistant's turn opened (the template holds any BOS itself)."""
    if isinstance(request, str):
        ids = tokenizer(request)["input_ids"]
    elif isinstance(request, list):
        messages = chat_messages(request)
        if not getattr(tokenizer, "chat_template", None):
            raise ChatRequestError(
                "this model's tokenizer has no chat template (no chat_template in tokenizer_config.json, no "
                "chat_template.jinja), so it cannot read chat messages: send a prompt string instead",
                field="messages",
            )
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        raise ChatRequestError(
            f"the generate stage takes a prompt string or a list of chat messages, got {type(request).__name__}"
        )
    if not ids:
        raise ChatRequestError("the prompt is empty: it has no tokens", field="messages")
    return list(ids)


class IncrementalDetokenizer:
    """Text of a growing list of token ids, one piece per token, such that the pieces join to
    ``tokenizer.decode(ids, skip_special_tokens=True)``. A token that ends inside a multi-byte
    character answers "" and its bytes come with the token that completes it (never half a
    character). Decoding re-reads only the tokens since the last piece (a short window), so a
    long answer costs linear time."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # the window starts here: tokens before it are text already given out
        self._read = 0  # and this many ids are text given out so far

    def _decode(self, ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text

    def push(self, token: int, *, final: bool = False) -> str:
        """The text ``token`` completes; ``final`` gives out whatever is held (even a broken
        character's replacement mark, as ``decode`` of the whole would)."""
        self.ids.append(token)
        before = self._decode(self.ids[self._prefix : self._read])
        now = self._decode(self.ids[self._prefix :])
        if final or (len(now) > len(before) and not now.endswith("\ufffd")):
            self._prefix, self._read = self._read, len(self.ids)
            return now[len(before) :]
        return ""


class StopStrings:
    """Ends the text before the first stop string. Text that may be the start of a stop string
    is held back until it is known not to be (so a stop string split over tokens never shows
    up in the answer); :meth:`feed` gives out the rest."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.held = ""

    def feed(self, text: str, *, final: bool = False) -> tuple[str, bool]:
        """``(text to give out, whether a stop string was reached)``."""
        buffer = self.held + text
        hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return buffer[: min(hits)], True
        keep = 0 if final else self._open_prefix(buffer)
        self.held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def _open_prefix(self, buffer: str) -> int:
        """Length of the longest end of ``buffer`` that begins some stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:n]):
                    longest = n
                    break
        return longest
