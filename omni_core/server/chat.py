"""``POST /v1/chat/completions`` for multi-stage models: from the request to the pipeline's
input and back to the OpenAI API's shapes.

A chat request becomes one pipeline request through the same orchestrator ``Omni.run`` uses
(:meth:`~omni_core.api.Omni.stream`): the conversation is the entry stage's input (a list of
``{"role", "content"}`` dicts, content as text), the sampling fields are the entry stage's
parameters, ``modalities`` are the outputs asked for (a text-only request stops before the
speech stages). What comes back is each final stage's items as the model's ``for_output``
made them: ``str`` pieces of text, 1-D float samples of audio at the stage's sample rate.

This module is the translation only; the route, the waiting and the streaming are in
:mod:`omni_core.server.app`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import uuid
from typing import Any

from omni_core.errors import ChatRequestError, ModelRuntimeError
from omni_core.server.models import Model
from omni_core.speech.audio import Audio

#: how long a finished answer's audio id stays meaningful (the OpenAI shape asks for it)
AUDIO_TTL_S = 3600
#: the sampling fields that go to the entry stage, as the stage reads them
_SAMPLING = ("temperature", "top_p", "seed", "stop")


def conversation(model: Model, body: Any) -> list[dict[str, Any]]:
    """The messages as the entry stage reads them: role and content. Text parts are joined into
    a string; a message with other parts the model reads (its entry stage's ``reads``, such as
    ``input_audio``) keeps its parts as dicts; a part the model does not read is refused by name."""
    messages: list[dict[str, Any]] = []
    for n, message in enumerate(body.messages):
        content: Any = message.content
        if isinstance(content, list):
            for k, part in enumerate(content):
                if part.type not in model.reads or (part.type == "text" and part.text is None):
                    reads = " and ".join(model.reads)
                    raise ChatRequestError(
                        f"messages[{n}].content[{k}] is a {part.type!r} part; model {model.name!r} reads {reads} "
                        f"parts only: send those, or a string",
                        field=f"messages[{n}].content",
                    )
            if all(part.type == "text" for part in content):
                content = "".join(part.text or "" for part in content)
            else:
                content = [part.model_dump(exclude_none=True) for part in content]
        messages.append({"role": message.role, "content": content})
    return messages


def outputs_asked(model: Model, body: Any) -> tuple[str, ...]:
    """The modalities to answer with: the request's, else text (as the OpenAI API defaults),
    else everything the model makes."""
    makes = list(model.outputs)
    asked = body.modalities or (["text"] if "text" in makes else makes)
    unknown = [m for m in asked if m not in makes]
    if unknown:
        raise ChatRequestError(
            f"model {model.name!r} answers with {' and '.join(makes)}; it cannot answer with "
            f"{', '.join(repr(m) for m in unknown)}: drop it from modalities",
            field="modalities",
        )
    voice = body.audio.voice if body.audio is not None else None
    if voice not in (None, "default") and voice not in model.voices:
        raise ChatRequestError(
            (
                f"model {model.name!r} has no voice {voice!r}; its voices are {', '.join(model.voices)}"
                if model.voices
                else f'model {model.name!r} has no selectable voices; send audio.voice "default" or leave it out '
                f"(got {voice!r})"
            ),
            field="audio.voice",
        )
    return tuple(dict.fromkeys(asked))


def stage_params(entry: str, stages: list[str], body: Any, voice_stage: str | None = None) -> dict[str, dict[str, Any]]:
    """Per-stage parameters: the sampling fields for the entry stage, then ``stage_params``."""
    sampling: dict[str, Any] = {}
    limit = body.max_completion_tokens or body.max_tokens
    if limit is not None:
        sampling["max_tokens"] = limit
    for name in _SAMPLING:
        value = getattr(body, name)
        if value is not None:
            sampling[name] = value
    params: dict[str, dict[str, Any]] = {entry: sampling} if sampling else {}
    voice = body.audio.voice if body.audio is not None else None
    if voice not in (None, "default") and voice_stage is not None:
        params.setdefault(voice_stage, {})["voice"] = voice
    for stage, fields in (body.stage_params or {}).items():
        if stage not in stages:
            raise ChatRequestError(
                f"stage_params names stage {stage!r}; this model's stages are {', '.join(stages)}",
                field="stage_params",
            )
        params[stage] = {**params.get(stage, {}), **fields}
    return params


# -- what the stages answered -------------------------------------------------------------------


def text_piece(model: Model, item: Any) -> str:
    if not isinstance(item, str):
        raise ModelRuntimeError(
            f"model {model.name!r} answered a text item of type {type(item).__name__}; its text stage's "
            "for_output must return str pieces (docs/authoring/stages.md)"
        )
    return item


def audio_chunk(model: Model, items: list[Any]) -> Audio:
    """One chunk's items (1-D float samples each) as one piece of audio."""
    import numpy as np

    parts = []
    for item in items:
        samples = np.asarray(item, dtype=np.float32)
        if samples.ndim != 1:
            raise ModelRuntimeError(
                f"model {model.name!r} answered an audio item of shape {tuple(samples.shape)}; its audio stage's "
                "for_output must return 1-D samples (docs/authoring/stages.md)"
            )
        parts.append(samples)
    rate = model.outputs.get("audio") or 0
    joined = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    return Audio(np.clip(joined, -1.0, 1.0), rate)


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def sse(event: dict[str, Any] | str) -> bytes:
    data = event if isinstance(event, str) else json.dumps(event, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def audio_b64(audio: Audio, fmt: str) -> str:
    from omni_core.speech.audio import encode

    return base64.b64encode(encode(audio, "wav" if fmt == "wav" else "pcm")).decode("ascii")


def expires_at() -> int:
    return int(time.time()) + AUDIO_TTL_S


# -- from the pipeline's thread to the event loop -------------------------------------------------

#: the end of a request's outputs, on its queue
END = object()


def pump(stream: Any, loop: asyncio.AbstractEventLoop, events: asyncio.Queue[Any]) -> threading.Thread:
    """Iterate the pipeline's stream on a thread of its own (one per request: a long answer
    never holds a shared worker), handing each chunk, the end or the error to ``events``."""

    def hand(item: Any) -> bool:
        try:
            loop.call_soon_threadsafe(events.put_nowait, item)
        except RuntimeError:  # the loop is gone: nobody is waiting for this answer
            return False
        return True

    def run() -> None:
        try:
            for chunk in stream:
                if not hand(chunk):
                    stream.cancel()
                    return
            hand(END)
        except BaseException as exc:  # the request's failure, handed to whoever waits for it
            hand(exc)

    thread = threading.Thread(target=run, name=f"omni-chat-{stream.request_id}", daemon=True)
    thread.start()
    return thread
