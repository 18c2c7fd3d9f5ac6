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

    input: str = Field(description="The text to speak.")
    voice: str | None = Field(default=None, description="One of the model's voices; unset: its default voice.")
    response_format: AudioFormat = Field(
        default="wav", description="wav (16-bit PCM), pcm (raw 16-bit little-endian), flac or mp3."
    )
    speed: float = Field(default=1.0, ge=0.25, le=4.0, description="Playback speed; 1.0 leaves the audio untouched.")
    sample_rate: int | None = Field(
        default=None, ge=8000, le=192000, description="Output sample rate in Hz; unset keeps the model's native rate."
    )
    language: str | None = Field(default=None, description="A language the model lists; unset: its default.")
    instructions: str | None = Field(default=None, description="How to speak, for models that take instructions.")
    ref_audio: str | None = Field(default=None, description="Reference audio to clone a voice from: a file path.")
    ref_text: str | None = Field(default=None, description="What ref_audio says.")
    seed: int | None = Field(
        default=None, description="0 to 4294967295; the same seed gives the same audio. Unset: drawn and reported."
    )
    stream: bool = Field(default=False, description="Send the audio in chunks as it is made.")
    max_new_tokens: int | None = Field(
        default=None,
        ge=1,
        description="The most output tokens the model generates for the whole input, in the unit its usage "
        "counts (e.g. decoder steps, codec frames); models that make audio in one pass refuse it. Unset: the "
        "model's own budget.",
    )

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
