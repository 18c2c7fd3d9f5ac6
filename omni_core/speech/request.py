"""Typed speech requests, capabilities and the prepared request an adapter builds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# defined in omni_core.errors (one error hierarchy); imported here so old imports keep working
from omni_core.errors import SpeechRequestError as SpeechRequestError
from omni_core.inputs import check_seed

AudioFormat = Literal["wav", "pcm", "flac", "mp3"]
AUDIO_FORMATS: tuple[str, ...] = ("wav", "pcm", "flac", "mp3")

#: longest input the runtime accepts unless an adapter declares less
MAX_INPUT_CHARS = 4096


class SpeechRequest(BaseModel):
    """What a caller asks for. Unknown fields are rejected, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str
    voice: str | None = None
    response_format: AudioFormat = "wav"
    #: playback speed; 1.0 leaves the audio untouched
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    #: output sample rate in Hz; None keeps the model's native rate
    sample_rate: int | None = Field(default=None, ge=8000, le=192000)
    language: str | None = None
    instructions: str | None = None
    #: reference audio for voice cloning: a path to an audio file
    ref_audio: str | None = None
    ref_text: str | None = None
    #: the range is :data:`omni_core.inputs.SEED_LIMIT`'s, shared with image and video generation
    seed: int | None = None
    stream: bool = False
    max_new_tokens: int | None = Field(default=None, ge=1)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> SpeechRequest:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpeechRequestError.from_validation(exc, what="speech request", model=cls) from None

    @field_validator("seed")
    @classmethod
    def _seed_in_range(cls, v: Any) -> Any:
        return check_seed(v)

    @field_validator("voice", "language", "instructions", "ref_audio", "ref_text")
    @classmethod
    def _blank_is_none(cls, v: str | None) -> str | None:
        return v if v is None or v.strip() else None


class TTSCapabilities(BaseModel):
    """What an adapter's model can do; the runtime rejects requests outside it."""

    model_config = ConfigDict(frozen=True)

    native_sample_rate: int
    #: rates the output may be resampled to; empty means any rate the request allows
    supported_sample_rates: tuple[int, ...] = ()
    voices: tuple[str, ...] = ()
    default_voice: str | None = None
    languages: tuple[str, ...] = ()
    #: the model changes speed itself; otherwise the runtime time-stretches the audio
    native_speed_control: bool = False
    streaming: bool = False
    voice_cloning: bool = False
    instructions: bool = False
    max_input_chars: int = MAX_INPUT_CHARS
    #: fields of SpeechRequest this model cannot honour, beyond the ones implied above
    unsupported_fields: tuple[str, ...] = ()


@dataclass
class PreparedRequest:
    """What an adapter's :meth:`~omni_core.speech.adapter.TTSAdapter.build` returns."""

    #: model inputs: text, or token ids plus extra information
    prompt: dict[str, Any]
    #: sampling parameters for the model: the stage defaults merged with the request's overrides
    sampling: dict[str, Any] = field(default_factory=dict)
    #: free-form, adapter-owned
    tts_params: dict[str, Any] = field(default_factory=dict)
    request: SpeechRequest | None = None
