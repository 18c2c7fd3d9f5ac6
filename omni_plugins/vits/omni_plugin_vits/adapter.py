"""The VITS / MMS-TTS adapter: transformers ``VitsModel`` + ``VitsTokenizer`` behind omni's
:class:`~omni_core.speech.adapter.TTSAdapter` contract.

What it serves:

* **Voices.** A multi-speaker checkpoint (``num_speakers > 1``) offers ``speaker_0`` ...
  ``speaker_{n-1}`` (default ``speaker_0``); a single-speaker one (every MMS-TTS model) has none.
* **Speed.** Native: the request's ``speed`` scales the model's ``speaking_rate`` (the duration
  predictor's length scale), so the runtime never time-stretches VITS audio.
* **Streaming.** Sentence by sentence. :meth:`VitsAdapter.generate` synthesises each sentence
  of the normalised input in order, each seeded by the engine's per-segment rule
  (``self.ctx.segments``), and concatenates; :meth:`VitsAdapter.stream` yields the same
  per-sentence audio, so the stream concatenates to exactly what ``generate`` returns for the
  same seed.
* **Languages.** None, unless the checkpoint declares one (``language`` in ``config.json`` or
  in ``tokenizer_config.json``, as MMS-TTS tokenizers do, e.g. ``"eng"``).

torch and transformers are imported only when a model is loaded or run, so detection (which
imports every installed adapter class) stays cheap.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from omni_core.errors import ModelLoadError
from omni_core.speech.adapter import AdapterContext, TTSAdapter, loading, require_model_type
from omni_core.speech.audio import Audio
from omni_core.speech.request import PreparedRequest, SpeechRequest, SpeechRequestError, TTSCapabilities
from omni_core.speech.text import split_sentences

if TYPE_CHECKING:
    import torch

_VOICE = re.compile(r"^speaker_(\d+)$")


#: the core's ModelLoadError (a VITS checkpoint that cannot be served as it is); the old name keeps working
VitsLoadError = ModelLoadError


def voice_names(num_speakers: int) -> tuple[str, ...]:
    """``speaker_0`` ... for a multi-speaker checkpoint; no voices for a single speaker."""
    return tuple(f"speaker_{i}" for i in range(num_speakers)) if num_speakers > 1 else ()


def _as_languages(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) and value.strip():
        return (value.strip(),)
    if isinstance(value, (list, tuple)):
        return tuple(str(v).strip() for v in value if str(v).strip())
    return ()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class VitsAdapter(TTSAdapter):
    """VITS and MMS-TTS checkpoints (``architectures: ["VitsModel"]``)."""

    backend: ClassVar[Literal["ar", "non_ar"]] = "non_ar"

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        self.model: Any = None
        self.tokenizer: Any = None
        self.device: Any = None
        # One request at a time on the model: the sampling knobs live on the module.
        self._lock = threading.Lock()
        self._caps: TTSCapabilities | None = None

    # ------------------------------------------------------------------ checkpoints

    @classmethod
    def make_tiny(
        cls,
        directory: Path,
        seed: int = 0,
        *,
        num_speakers: int = 1,
        sampling_rate: int = 16000,
        language: str | None = None,
    ) -> Path:
        """Write a tiny random-weight VITS checkpoint (about 100 KB; ``num_speakers > 1`` for
        a multi-speaker one). See :func:`omni_plugin_vits.tiny.write_tiny_checkpoint`."""
        from omni_plugin_vits.tiny import write_tiny_checkpoint

        return write_tiny_checkpoint(
            directory, seed=seed, num_speakers=num_speakers, sampling_rate=sampling_rate, language=language
        )

    def _checkpoint_config(self) -> Mapping[str, Any]:
        if self.model is not None:
            return dict(self.model.config.to_dict())
        if self.ctx.config:
            return self.ctx.config
        return _read_json(Path(self.ctx.model_dir) / "config.json")

    def _languages(self, config: Mapping[str, Any]) -> tuple[str, ...]:
        declared = _as_languages(config.get("language"))
        if declared:
            return declared
        if self.tokenizer is not None:
            return _as_languages(getattr(self.tokenizer, "language", None))
        return _as_languages(_read_json(Path(self.ctx.model_dir) / "tokenizer_config.json").get("language"))

    # ------------------------------------------------------------------ contract

    def load(self) -> None:
        from omni_core.quiet import quiet_libraries

        with quiet_libraries():  # transformers' loading bars and notes are not the user's business
            self._load()

    def _load(self) -> None:
        from transformers import VitsModel, VitsTokenizer
        from transformers.utils import is_phonemizer_available

        model_dir = str(self.ctx.model_dir)
        require_model_type(self.ctx, self.name, "vits")
        with loading(model_dir, "the VITS tokenizer"):
            tokenizer = VitsTokenizer.from_pretrained(model_dir)
        if tokenizer.phonemize and not is_phonemizer_available():
            raise ModelLoadError(
                f"{model_dir}: this checkpoint's tokenizer phonemizes its input (phonemize=true in "
                "tokenizer_config.json), which needs the phonemizer package and espeak-ng: "
                "pip install phonemizer, and install espeak-ng with your system's package manager"
            )
        with loading(model_dir, "the VITS model"):
            model = VitsModel.from_pretrained(model_dir, use_safetensors=True)
        device = self.ctx.device  # the engine's choice
        model.to(device).eval()
        self.tokenizer, self.model, self.device = tokenizer, model, device
        self._caps = None

    def capabilities(self) -> TTSCapabilities:
        if self._caps is None:
            config = self._checkpoint_config()
            voices = voice_names(int(config.get("num_speakers") or 1))
            self._caps = TTSCapabilities(
                native_sample_rate=int(config.get("sampling_rate") or 16000),
                voices=voices,
                default_voice=voices[0] if voices else None,
                languages=self._languages(config),
                native_speed_control=True,
                streaming=True,
                voice_cloning=False,
                instructions=False,
                # a one-pass model has no token budget: refuse it rather than ignore it
                unsupported_fields=("max_new_tokens",),
            )
        return self._caps

    def _require_loaded(self) -> None:
        if self.model is None or self.tokenizer is None:
            raise ModelLoadError("the VITS adapter is not loaded; call load() first")

    def _pronounceable(self, text: str) -> str:
        """What the tokenizer keeps of ``text`` (its normalisation drops characters outside the
        vocabulary); empty when nothing of it can be spoken."""
        cleaned, _ = self.tokenizer.prepare_for_tokenization(text)
        return str(cleaned).strip()

    def validate(self, request: SpeechRequest) -> str | None:
        self._require_loaded()
        if not self._pronounceable(request.input):
            vocab = "".join(sorted(k for k in self.tokenizer.get_vocab() if len(k) == 1 and not k.isspace()))
            return (
                "input has no characters this model can pronounce once normalised "
                f"(its vocabulary: {vocab[:80]!r}); write the text in the model's alphabet"
            )
        return None

    def default_sampling(self) -> dict[str, Any]:
        config = self._checkpoint_config()
        return {
            "speaking_rate": float(config.get("speaking_rate", 1.0)),
            "noise_scale": float(config.get("noise_scale", 0.667)),
            "noise_scale_duration": float(config.get("noise_scale_duration", 0.8)),
        }

    def sampling_overrides(self, request: SpeechRequest) -> dict[str, Any]:
        # max_new_tokens is refused by capabilities(); speed is the model's own speaking rate
        if request.speed == 1.0:
            return {}
        return {"speaking_rate": self.default_sampling()["speaking_rate"] * request.speed}

    def build(self, request: SpeechRequest, sampling: dict[str, Any]) -> PreparedRequest:
        self._require_loaded()
        sentences: list[str] = []
        input_ids: list[torch.Tensor] = []
        for sentence in split_sentences(request.input):
            if not self._pronounceable(sentence):
                continue  # e.g. a sentence of punctuation only: nothing to say
            ids = self.tokenizer(sentence, return_tensors="pt")["input_ids"]
            sentences.append(sentence)
            input_ids.append(ids)
        if not sentences:
            raise SpeechRequestError("input has no characters this model can pronounce once normalised")
        speaker_id = None
        if request.voice is not None:
            match = _VOICE.match(request.voice)
            if match is None:  # the runtime checked the name against capabilities() already
                raise SpeechRequestError(f"unknown voice {request.voice!r}")
            speaker_id = int(match.group(1))
        return PreparedRequest(
            prompt={"text": request.input, "sentences": sentences, "input_ids": input_ids},
            sampling=dict(sampling),
            tts_params={"speaker_id": speaker_id},
            request=request,
        )

    def generate(self, prepared: PreparedRequest, seed: int) -> Audio:
        return Audio.concatenate(list(self._sentences(prepared, seed)))

    def stream(self, prepared: PreparedRequest, seed: int) -> Iterator[Audio]:
        yield from self._sentences(prepared, seed)

    # ------------------------------------------------------------------ synthesis

    def _sentences(self, prepared: PreparedRequest, seed: int) -> Iterator[Audio]:
        """One chunk per sentence, each seeded by the engine's per-segment rule: generate() and
        stream() both come through here, so their audio is the same bit for bit."""
        speaker_id = prepared.tts_params.get("speaker_id")
        for ids in self.ctx.segments(seed, prepared.prompt["input_ids"]):
            yield self._synthesize(ids, speaker_id, prepared.sampling)

    def _synthesize(self, input_ids: Any, speaker_id: int | None, sampling: Mapping[str, Any]) -> Audio:
        import numpy as np
        import torch

        self._require_loaded()
        model = self.model
        kwargs: dict[str, Any] = {"input_ids": input_ids.to(self.device)}
        if speaker_id is not None:
            kwargs["speaker_id"] = speaker_id
        with self._lock, torch.inference_mode():
            saved = (model.speaking_rate, model.noise_scale, model.noise_scale_duration)
            try:
                model.speaking_rate = float(sampling.get("speaking_rate", saved[0]))
                model.noise_scale = float(sampling.get("noise_scale", saved[1]))
                model.noise_scale_duration = float(sampling.get("noise_scale_duration", saved[2]))
                waveform = model(**kwargs).waveform
            finally:
                model.speaking_rate, model.noise_scale, model.noise_scale_duration = saved
        samples = waveform[0].detach().to("cpu", torch.float32).numpy()
        return Audio(np.ascontiguousarray(samples, dtype=np.float32), self.capabilities().native_sample_rate)
