"""The thinker's input: a request (a string, or OpenAI-style chat messages) as a conversation the
chat template renders, with the audio clips it carries.

Parts of a message's content:

* ``{"type": "text", "text": ...}``;
* ``{"type": "input_audio", "input_audio": {"data": BASE64, "format": "wav"}}``: decoded,
  mixed to mono and resampled to the feature extractor's rate; the part becomes the audio
  placeholder (``<|audio_bos|><|AUDIO|><|audio_eos|>``) the thinker's processor expands;
* anything visual (``image_url``, ``image``, ``video``, ...) is refused: transformers'
  Qwen2.5-Omni processor needs torchvision for them, which omni does not install.

:class:`Prompter` turns a conversation into the thinker's inputs as ``Qwen2_5OmniProcessor``
does for text and audio. Importing this module imports neither torch nor numpy.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_core.errors import ChatRequestError

#: the system prompt Qwen2.5-Omni was trained to speak with: its model card says audio output
#: "may not work as expected" under any other
SPEECH_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving auditory "
    "and visual inputs, as well as generating text and speech."
)
#: what an audio part becomes in the rendered prompt (one ``<|AUDIO|>`` per clip, expanded later)
AUDIO_PLACEHOLDER = "<|audio_bos|><|AUDIO|><|audio_eos|>"
_VISUAL = ("image_url", "image", "input_image", "video", "video_url", "input_video")
_ROLES = ("system", "user", "assistant")


@dataclass
class Conversation:
    """Messages with text-only content (audio parts replaced by their placeholder), and the
    decoded clips in the order their placeholders appear."""

    messages: list[dict[str, str]]
    clips: list[Any] = field(default_factory=list)  # 1-D float32 numpy arrays at ``rate``
    rate: int = 16000


def read_conversation(request: Any, *, system_prompt: str | None, rate: int = 16000) -> Conversation:
    """The request as a conversation. A string is one user turn. ``system_prompt`` is put first
    when the messages have no system message (None or "": nothing is added)."""
    if isinstance(request, str):
        raw: list[Any] = [{"role": "user", "content": request}]
    elif isinstance(request, (list, tuple)) and request:
        raw = list(request)
    else:
        raise ChatRequestError(
            "the thinker reads a prompt string or a non-empty list of chat messages "
            f'[{{"role": ..., "content": ...}}], got {type(request).__name__}',
            field="messages",
        )
    conversation = Conversation(messages=[], rate=rate)
    for n, message in enumerate(raw):
        if not isinstance(message, dict) or "content" not in message:
            raise ChatRequestError(
                f'messages[{n}] is not a {{"role": ..., "content": ...}} message', field=f"messages[{n}]"
            )
        role = message.get("role", "user")
        if role not in _ROLES:
            raise ChatRequestError(
                f"messages[{n}].role is {role!r}; use one of {', '.join(_ROLES)}", field=f"messages[{n}].role"
            )
        conversation.messages.append({"role": role, "content": _content(message["content"], n, conversation)})
    if system_prompt and conversation.messages[0]["role"] != "system":
        conversation.messages.insert(0, {"role": "system", "content": system_prompt})
    return conversation


def _content(content: Any, n: int, conversation: Conversation) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatRequestError(
            f"messages[{n}].content is a {type(content).__name__}; send a string or a list of parts",
            field=f"messages[{n}].content",
        )
    pieces: list[str] = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        where = f"messages[{n}].content[{k}]"
        if kind == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif kind == "input_audio":
            conversation.clips.append(decode_audio(part.get("input_audio"), conversation.rate, where))
            pieces.append(AUDIO_PLACEHOLDER)
        elif kind in _VISUAL:
            raise ChatRequestError(
                f"{where} is an {kind!r} part: images and video are not supported by this install "
                "(transformers' Qwen2.5-Omni processor needs torchvision for them, which omni does not install); "
                'send text parts or "input_audio" parts',
                field=where,
            )
        else:
            raise ChatRequestError(
                f"{where} is a {kind!r} part; the thinker reads "
                '{"type": "text", "text": ...} and {"type": "input_audio", "input_audio": {"data": ..., '
                '"format": "wav"}} parts',
                field=where,
            )
    return "".join(pieces)


def decode_audio(audio: Any, rate: int, where: str = "input_audio") -> Any:
    """An ``input_audio`` object (base64 WAV) as 1-D float32 samples at ``rate``."""
    import numpy as np

    from omni_core.speech.audio import Audio, resample

    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
        raise ChatRequestError(f'{where}: input_audio must be {{"data": BASE64, "format": "wav"}}', field=where)
    fmt = str(audio.get("format", "wav")).lower()
    if fmt != "wav":
        raise ChatRequestError(f"{where}: input_audio format {fmt!r} is not supported; send wav", field=where)
    try:
        data = base64.b64decode(audio["data"], validate=True)
    except (binascii.Error, ValueError):
        raise ChatRequestError(f"{where}: input_audio data is not base64", field=where) from None
    samples, source_rate = _read_wav(data, where)
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    if samples.size == 0:
        raise ChatRequestError(f"{where}: the audio holds no samples", field=where)
    clip = resample(Audio(samples.astype(np.float32), source_rate), rate).samples
    return np.ascontiguousarray(clip, dtype=np.float32)


def _read_wav(data: bytes, where: str) -> tuple[Any, int]:
    """Samples in [-1, 1] (frames or frames x channels) and their rate. soundfile reads every WAV
    flavour; without it, the standard library reads integer PCM."""
    import numpy as np

    try:
        import soundfile  # type: ignore[import-untyped]
    except ImportError:
        soundfile = None
    if soundfile is not None:
        try:
            samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=False)
        except Exception as exc:
            message = f"{where}: input_audio data is not a readable WAV file ({exc})"
            raise ChatRequestError(message, field=where) from None
        return samples, int(rate)
    import wave

    try:
        with wave.open(io.BytesIO(data)) as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ChatRequestError(f"{where}: input_audio data is not a PCM WAV file ({exc})", field=where) from None
    if width == 1:
        samples = (np.frombuffer(frames, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width in (2, 4):
        kind = np.int16 if width == 2 else np.int32
        samples = np.frombuffer(frames, dtype=kind).astype(np.float32) / float(np.iinfo(kind).max + 1)
    else:
        message = f"{where}: {8 * width}-bit WAV needs the soundfile package; send 16-bit PCM"
        raise ChatRequestError(message, field=where)
    return samples.reshape(-1, channels) if channels > 1 else samples, rate


class Prompter:
    """A request as the thinker's inputs: the chat template's text with each audio placeholder
    expanded to its clip's number of audio tokens, tokenized, and the clips as log-mel features
    (``input_ids``, and ``input_features`` and ``feature_attention_mask`` with audio): what
    ``Qwen2_5OmniProcessor`` makes. The processor itself is not used: it cannot be built without
    its video processor, which needs torchvision."""

    def __init__(
        self, model_dir: Path, tokenizer: Any, *, audio_token_id: int, num_mel_bins: int, system_prompt: str | None
    ) -> None:
        self.model_dir = Path(model_dir)
        self.tokenizer = tokenizer
        if not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = processor_chat_template(self.model_dir)
        self.audio_token = str(tokenizer.convert_ids_to_tokens(audio_token_id))
        self.num_mel_bins = num_mel_bins
        self.system_prompt = system_prompt or None
        self._features: Any = None

    def feature_extractor(self) -> Any:
        """The checkpoint's Whisper feature extractor (``preprocessor_config.json``), made on the
        first audio input."""
        if self._features is None:
            from transformers import WhisperFeatureExtractor

            if (self.model_dir / "preprocessor_config.json").is_file():
                self._features = WhisperFeatureExtractor.from_pretrained(self.model_dir)
            else:
                self._features = WhisperFeatureExtractor(feature_size=self.num_mel_bins)
        return self._features

    def __call__(self, request: Any, *, speech: bool = True) -> dict[str, Any]:
        """The thinker's inputs for ``request``; ``speech``: the answer is to be spoken, so the
        system prompt (Qwen's speech prompt, which its talker needs) goes first when the
        conversation has none. Without speech the conversation is rendered as sent."""
        rate = int(self.feature_extractor().sampling_rate) if _has_audio(request) else 16000
        system_prompt = self.system_prompt if speech else None
        conversation = read_conversation(request, system_prompt=system_prompt, rate=rate)
        text = self.tokenizer.apply_chat_template(conversation.messages, add_generation_prompt=True, tokenize=False)
        inputs: dict[str, Any] = {}
        if conversation.clips:
            features = self.feature_extractor()(
                conversation.clips,
                sampling_rate=rate,
                return_attention_mask=True,
                padding="max_length",
                return_tensors="pt",
            )
            mask = features["attention_mask"]
            # the audio encoder's output lengths (the processor's _get_feat_extract_output_lengths)
            counts = ((((mask.sum(-1) - 1) // 2 + 1) - 2) // 2 + 1).tolist()
            pieces = text.split(self.audio_token)
            if len(pieces) != len(counts) + 1:
                raise ChatRequestError(
                    f"the prompt holds {len(pieces) - 1} audio placeholder(s) for {len(counts)} clip(s): "
                    f"text must not contain {self.audio_token}",
                    field="messages",
                )
            text = pieces[0] + "".join(
                self.audio_token * int(n) + piece for n, piece in zip(counts, pieces[1:], strict=True)
            )
            inputs["input_features"] = features["input_features"]
            inputs["feature_attention_mask"] = mask
        inputs["input_ids"] = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        return inputs


def processor_chat_template(model_dir: Path) -> str | None:
    """The chat template a checkpoint keeps beside its processor (``chat_template.jinja``, or
    ``chat_template.json``'s ``chat_template``) rather than in its tokenizer's config."""
    import json

    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    path = model_dir / "chat_template.json"
    if path.is_file():
        template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
        return template if isinstance(template, str) else None
    return None


def _has_audio(request: Any) -> bool:
    if not isinstance(request, (list, tuple)):
        return False
    return any(
        isinstance(part, dict) and part.get("type") == "input_audio"
        for message in request
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
    )
