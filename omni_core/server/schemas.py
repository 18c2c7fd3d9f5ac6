"""The bodies the server reads and writes, in the OpenAI API's shapes.

The generation and speech fields are not restated: each body takes them from the offline
API's own request model (:class:`~omni_core.generation.request.GenerationRequest`,
:class:`~omni_core.speech.request.SpeechRequest`), so a field, its type and its description
exist once, and a request is checked by the same rules whichever way it arrives. What the
HTTP shapes add is named here: ``model``, ``n``, ``size`` "WxH", ``response_format``,
``stream_format``, video ``seconds``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from omni_core.generation.request import GenerationRequest
from omni_core.speech.request import SpeechRequest

SIZE_PATTERN = r"^[0-9]{1,5}x[0-9]{1,5}$"
_SIZE = re.compile(SIZE_PATTERN)


def parse_size(size: str) -> tuple[int, int]:
    """``"640x480"`` -> (640, 480); the pattern was checked by the schema."""
    width, height = _SIZE.match(size).group(0).split("x")  # type: ignore[union-attr]
    return int(width), int(height)


def _borrowed(source: type[BaseModel], names: tuple[str, ...]) -> dict[str, Any]:
    """Fields of ``source``, as they are there (type, default, description), for create_model."""
    return {name: (source.model_fields[name].annotation, source.model_fields[name]) for name in names}


def _field(name: str, annotation: Any, info: Any) -> dict[str, Any]:
    return {name: (annotation, info)}


# NaN and Infinity are no JSON, yet Python's parser takes them: a number must be finite
_FORBID = ConfigDict(extra="forbid", allow_inf_nan=False)
# a JSON body arrives typed: as its schema says, true is no seed and "2" is no n (a form's
# values are all text, so the video body is made strict only when it came as JSON)
_JSON_BODY = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
_GENERATION_FIELDS = (
    "prompt",
    "negative_prompt",
    "num_inference_steps",
    "guidance_scale",
    "seed",
    "extra",
    "cache_quality",
)

ImageGenerationBody: type[BaseModel] = create_model(
    "ImageGenerationBody",
    __config__=_JSON_BODY,
    __doc__="`POST /v1/images/generations`. Unset fields take the recipe's, then the model's defaults.",
    model=(
        str | None,
        Field(
            default=None,
            description="A served model's name (`GET /v1/models`). May be left out when one model makes images.",
        ),
    ),
    n=(int, Field(default=1, ge=1, le=64, description="How many images.")),
    size=(str | None, Field(default=None, pattern=SIZE_PATTERN, description='"WIDTHxHEIGHT" in pixels.')),
    **_field(
        "response_format",
        Literal["b64_json", "url"],
        Field(default="b64_json", description="b64_json: PNG bytes in base64 (this server keeps no image files)."),
    ),
    user=(str | None, Field(default=None, max_length=256, description="The caller's id (accepted, not stored).")),
    **_borrowed(GenerationRequest, _GENERATION_FIELDS),
)

VideoGenerationBody: type[BaseModel] = create_model(
    "VideoGenerationBody",
    __config__=_FORBID,
    __doc__="`POST /v1/videos`, as JSON or as a multipart form (what the official client sends). "
    "An explicit num_frames beats seconds; otherwise frames = seconds x fps, rounded up to one the "
    "model takes.",
    model=(str | None, Field(default=None, description="A served video model's name.")),
    size=(str | None, Field(default=None, pattern=SIZE_PATTERN, description='"WIDTHxHEIGHT" in pixels.')),
    seconds=(float | None, Field(default=None, gt=0, le=600, description="Clip length in seconds.")),
    **_borrowed(GenerationRequest, ("num_frames", "fps", *_GENERATION_FIELDS)),
)

SpeechBody: type[BaseModel] = create_model(
    "SpeechBody",
    __config__=_JSON_BODY,
    __doc__='`POST /v1/audio/speech`. `voice` "default" is the model\'s own voice.',
    model=(str | None, Field(default=None, description="A served speech model's name.")),
    **_field(
        "stream_format",
        Literal["audio", "sse"],
        Field(
            default="audio",
            description='"audio": audio bytes (chunked as they are made when stream is true); '
            '"sse": server-sent events with base64 PCM chunks.',
        ),
    ),
    **_borrowed(
        SpeechRequest,
        (
            "input",
            "voice",
            "response_format",
            "speed",
            "sample_rate",
            "language",
            "instructions",
            "seed",
            "stream",
            "max_new_tokens",
        ),
    ),
)


# -- chat -------------------------------------------------------------------------------------


class ChatContentPart(BaseModel):
    """One part of a message's content: ``text``, or a part type the model reads (``input_audio``
    with ``{"data": base64, "format": "wav"}``, ...: `GET /v1/models` lists each model's)."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = _JSON_BODY

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ChatContentPart]
    name: str | None = None


class ChatAudioOptions(BaseModel):
    model_config = _JSON_BODY

    format: Literal["wav", "pcm16"] = Field(
        default="wav", description="The answer's audio: a WAV file, or raw 16-bit PCM. Streams always send pcm16."
    )
    voice: str | None = Field(
        default=None, description='One of the model\'s voices (`GET /v1/models`); "default" or left out: its default.'
    )


class ChatCompletionBody(BaseModel):
    """`POST /v1/chat/completions`, for the models whose task is chat (multi-stage models that
    answer text and speech). Sampling fields go to the model's first stage."""

    model_config = _JSON_BODY

    model: str | None = Field(
        default=None, description="A served model's name (`GET /v1/models`). May be left out when one model chats."
    )
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation, oldest first.")
    modalities: list[str] | None = Field(
        default=None,
        min_length=1,
        description='What to answer with: ["text"] (the default), ["text", "audio"], or what the model makes '
        "(`GET /v1/models` lists each model's outputs). A text-only request stops before the speech stages.",
    )
    audio: ChatAudioOptions | None = None
    stream: bool = Field(default=False, description="Server-sent events: text pieces, then audio chunks, as made.")
    max_tokens: int | None = Field(default=None, ge=1, description="Most tokens of the text answer.")
    max_completion_tokens: int | None = Field(
        default=None, ge=1, description="The same as max_tokens (its newer name)."
    )
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = Field(
        default=None, description="Text that ends the answer where it appears (not included): one string or a list."
    )
    stage_params: dict[str, dict[str, Any]] | None = Field(
        default=None,
        description="omni's own: parameters per stage by name, on top of the sampling fields (see the model's page).",
    )


class ChatAudio(BaseModel):
    id: str
    #: base64 of the whole answer's audio, in the requested format
    data: str
    expires_at: int
    transcript: str
    #: samples per second (omni's own field; the format's header says it too for wav)
    sample_rate: int


class ChatAnswer(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    audio: ChatAudio | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatAnswer
    finish_reason: Literal["stop", "length"] = Field(
        default="stop",
        description="stop: the answer ended by itself (its end, a stop string); length: a stage's token budget "
        "(max_tokens) ran out, so the answer is cut short.",
    )


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error, whatever the status: what went wrong and how to fix it, never a stack trace."""

    error: ErrorDetail


class ImageData(BaseModel):
    b64_json: str
    seed: int
    revised_prompt: str | None = None


class ImagesResponse(BaseModel):
    created: int
    model: str
    data: list[ImageData]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    #: what the model does: text-to-image, text-to-video, image-to-video or speech
    task: str
    #: the routes that serve it
    endpoints: list[str]
    #: selectable voices (speech); empty: only "default"
    voices: list[str] = Field(default_factory=list)
    #: what a chat model answers with (its output modalities)
    modalities: list[str] = Field(default_factory=list)
    #: the message content part types a chat model reads (``text``, ``input_audio``, ...)
    content_parts: list[str] = Field(default_factory=list)
    status: Literal["loading", "ready", "failed"] = "ready"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


VideoStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled"]


class VideoError(BaseModel):
    code: str
    message: str


class VideoJob(BaseModel):
    id: str
    object: Literal["video"] = "video"
    model: str
    status: VideoStatus
    progress: int = Field(ge=0, le=100)
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    size: str
    seconds: str
    prompt: str
    error: VideoError | None = None


class VideoJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VideoJob]


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool = True


class Health(BaseModel):
    status: Literal["ready", "loading", "draining", "failed"]
    models: dict[str, str]
    detail: str | None = None
