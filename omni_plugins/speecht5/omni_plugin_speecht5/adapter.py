"""The SpeechT5 TTS adapter.

SpeechT5 (``SpeechT5ForTextToSpeech``) encodes the text and decodes a mel spectrogram
autoregressively: every decoder step emits ``reduction_factor`` mel frames and a stop
probability. A HiFi-GAN (``SpeechT5HifiGan``, kept in the checkpoint's ``vocoder/``
subfolder) turns the spectrogram into 16 kHz audio. Voices are x-vector speaker embeddings
(see :mod:`omni_plugin_speecht5.voices`).

Sampling, as the runtime merges it (defaults first, the request's overrides on top, field by
field):

``threshold`` (0.5)
    a step whose stop probability reaches it ends the sentence: the model's stop rule.
``minlenratio`` (0.0) / ``maxlenratio`` (20.0)
    per sentence, at least / at most ``ratio * text_tokens`` mel frames: the frame budget.
``max_frames`` (only when the request sets ``max_new_tokens``)
    a budget for the whole utterance in mel frames. One token is one decoder step, which emits
    ``reduction_factor`` frames, so ``max_frames = max_new_tokens * reduction_factor``.
    Sentences spend it in order; once it is spent the remaining sentences are not spoken.
    The stop rule and the per-sentence ratios stay in force alongside it.

Usage (``metadata["usage"]`` of a result): the input text tokens are the token ids the encoder
read, every sentence's with its end-of-sentence token; the output tokens are decoder steps, the
unit ``max_new_tokens`` budgets (each emits ``reduction_factor`` mel frames).

Text is spoken sentence by sentence, each sentence seeded by the engine's per-segment rule
(``self.ctx.segments``; the decoder pre-net applies dropout at inference, so the seed matters). That is what makes
:meth:`SpeechT5Adapter.stream` yield a sentence as soon as it is ready, and the chunks
concatenate to exactly what :meth:`SpeechT5Adapter.generate` returns for the same seed.

torch and transformers are imported in :meth:`SpeechT5Adapter.load`, never at import time, so
detection (which imports every adapter class) stays light.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from omni_core.errors import ModelLoadError
from omni_core.speech import (
    AdapterContext,
    PreparedRequest,
    SpeechRequest,
    SpeechRequestError,
    TTSAdapter,
    TTSCapabilities,
)
from omni_core.speech.adapter import loading, require_model_type, token_usage
from omni_core.speech.text import segment_text
from omni_plugin_speecht5.voices import read_voice_names

if TYPE_CHECKING:
    from omni_core.speech.audio import Audio

VOCODER_SUBFOLDER = "vocoder"
#: the stage defaults: the stop rule and the per-sentence frame budget
DEFAULT_SAMPLING: dict[str, float] = {"threshold": 0.5, "minlenratio": 0.0, "maxlenratio": 20.0}
#: languages the released SpeechT5 TTS checkpoint was trained on
LANGUAGES = ("en",)

_CLONING_MESSAGE = (
    "speecht5 cannot clone a voice from ref_audio: its voices are x-vector speaker embeddings, and "
    "extracting one from audio needs an external speaker-verification model (an x-vector extractor "
    "such as SpeechBrain's spkrec-xvect-voxceleb) that this plugin does not ship. Omit ref_audio and "
    "choose a voice ({voices}), or add the x-vector of your speaker to voices.safetensors with "
    "omni_plugin_speecht5.voices.save_voices"
)


#: the core's ModelLoadError (a checkpoint lacking a part SpeechT5 needs); the old name keeps working
SpeechT5CheckpointError = ModelLoadError


class SpeechT5Adapter(TTSAdapter):
    backend: ClassVar[Literal["ar", "non_ar"]] = "ar"

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        self.model_dir = Path(ctx.model_dir)
        config = dict(ctx.config or {})
        if not config and (self.model_dir / "config.json").is_file():
            config = json.loads((self.model_dir / "config.json").read_text(encoding="utf-8"))
        self.config = config
        self.reduction_factor = int(config.get("reduction_factor", 2))
        self.speaker_embedding_dim = int(config.get("speaker_embedding_dim", 512))
        # the decoder positions one step per position (plus the all-zero start frame)
        self.max_steps_per_segment = int(config.get("max_speech_positions", 4000)) - 1
        # the text encoder positions every token, including the appended </s>
        self.max_segment_tokens = max(1, int(config.get("max_text_positions", 450)) - 1)
        self._caps: TTSCapabilities | None = None
        self.model: Any = None
        self.vocoder: Any = None
        self.processor: Any = None
        self.voices: dict[str, Any] = {}
        self.device: Any = None

    # ----------------------------------------------------------------- description

    @classmethod
    def make_tiny(cls, directory: Path, seed: int = 0) -> Path:
        from omni_plugin_speecht5.tiny import make_tiny

        return make_tiny(directory, seed=seed)

    def _vocoder_dir(self) -> Path:
        path = self.model_dir / VOCODER_SUBFOLDER
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{self.model_dir} has no {VOCODER_SUBFOLDER}/config.json: SpeechT5 needs its HiFi-GAN vocoder "
                f"in the {VOCODER_SUBFOLDER}/ subfolder of the checkpoint (e.g. microsoft/speecht5_hifigan "
                f"downloaded into {path})"
            )
        return path

    def capabilities(self) -> TTSCapabilities:
        if self._caps is None:
            vocoder_config = json.loads((self._vocoder_dir() / "config.json").read_text(encoding="utf-8"))
            voices = tuple(self.voices) if self.voices else read_voice_names(self.model_dir)
            self._caps = TTSCapabilities(
                native_sample_rate=int(vocoder_config.get("sampling_rate", 16000)),
                voices=voices,
                default_voice=voices[0],
                languages=LANGUAGES,
                native_speed_control=False,  # the runtime time-stretches
                streaming=True,
                voice_cloning=False,
                instructions=False,
            )
        return self._caps

    # ----------------------------------------------------------------- loading

    def load(self) -> None:
        from omni_core.quiet import quiet_libraries

        with quiet_libraries():  # transformers' loading bars and notes are not the user's business
            self._load()

    def _load(self) -> None:
        from transformers import SpeechT5ForTextToSpeech, SpeechT5HifiGan, SpeechT5Processor

        from omni_plugin_speecht5.voices import load_voices

        # the parts transformers would otherwise report with less helpful errors
        require_model_type(self.ctx, self.name, "speecht5")
        self._vocoder_dir()
        read_voice_names(self.model_dir)
        self.device = self.ctx.device  # the engine's choice
        with loading(self.model_dir, "the SpeechT5 processor"):
            self.processor = SpeechT5Processor.from_pretrained(self.model_dir)
        with loading(self.model_dir, "the SpeechT5 model"):
            self.model = SpeechT5ForTextToSpeech.from_pretrained(self.model_dir).to(self.device).eval()
        with loading(self.model_dir, f"the SpeechT5 vocoder ({VOCODER_SUBFOLDER}/)"):
            self.vocoder = (
                SpeechT5HifiGan.from_pretrained(self.model_dir, subfolder=VOCODER_SUBFOLDER).to(self.device).eval()
            )
        config = self.model.config
        self.reduction_factor = int(config.reduction_factor)
        self.speaker_embedding_dim = int(config.speaker_embedding_dim)
        self.max_steps_per_segment = int(config.max_speech_positions) - 1
        self.max_segment_tokens = max(1, int(config.max_text_positions) - 1)
        voices = load_voices(self.model_dir, self.speaker_embedding_dim)
        self.voices = {name: tensor.to(self.device) for name, tensor in voices.items()}
        self._caps = None

    def _require_loaded(self) -> None:
        if self.model is None:
            raise RuntimeError("SpeechT5Adapter.load() must run before requests are built or synthesised")

    # ----------------------------------------------------------------- requests

    def normalize(self, request: SpeechRequest) -> SpeechRequest:
        if request.ref_audio is not None:
            # Said here, before the runtime's generic "cannot clone" rule, so the caller learns why.
            raise SpeechRequestError(_CLONING_MESSAGE.format(voices=", ".join(self.capabilities().voices)))
        return super().normalize(request)

    def validate(self, request: SpeechRequest) -> str | None:
        # SpeechT5's character tokenizer maps what it does not know to <unk>: text made only of
        # such characters would be spoken as noise, so it is refused instead
        self._require_loaded()
        tokenizer = self.processor.tokenizer
        ids = tokenizer(request.input, add_special_tokens=False)["input_ids"]
        blank = {tokenizer.unk_token_id, tokenizer.convert_tokens_to_ids("\u2581"), *tokenizer.all_special_ids}
        if not any(i not in blank for i in ids):
            return (
                "input has no character this model's tokenizer knows (each one maps to its unknown token); "
                f"write the text in the model's language ({', '.join(LANGUAGES)})"
            )
        return None

    def default_sampling(self) -> dict[str, Any]:
        return dict(DEFAULT_SAMPLING)

    def sampling_overrides(self, request: SpeechRequest) -> dict[str, Any]:
        # Only the budget: threshold / minlenratio / maxlenratio stay the stage defaults.
        if request.max_new_tokens is None:
            return {}
        return {"max_frames": request.max_new_tokens * self.reduction_factor}

    def _count_tokens(self, text: str) -> int:
        return len(self.processor.tokenizer(text, add_special_tokens=False)["input_ids"])

    def build(self, request: SpeechRequest, sampling: dict[str, Any]) -> PreparedRequest:
        self._require_loaded()
        segments = segment_text(request.input, self.max_segment_tokens, self._count_tokens)
        input_ids = [list(self.processor(text=s)["input_ids"]) for s in segments]
        voice = request.voice or self.capabilities().default_voice
        return PreparedRequest(
            prompt={"text": request.input, "segments": segments, "input_ids": input_ids},
            sampling=sampling,
            tts_params={"voice": voice},
        )

    # ----------------------------------------------------------------- synthesis

    def _segment_steps(self, tokens: int, sampling: dict[str, Any], remaining_frames: int | None) -> tuple[int, int]:
        """(max steps, min steps) for one segment of ``tokens`` text tokens."""
        rf = self.reduction_factor
        # the model always takes at least one step, whatever the ratio says
        max_steps = max(1, int(tokens * float(sampling["maxlenratio"]) / rf))
        if remaining_frames is not None:
            max_steps = min(max_steps, remaining_frames // rf)
        max_steps = min(max_steps, self.max_steps_per_segment)
        min_steps = min(int(tokens * float(sampling["minlenratio"]) / rf), max_steps)
        return max_steps, min_steps

    def _synthesize(self, input_ids: list[int], speaker: Any, sampling: dict[str, Any], steps: tuple[int, int]) -> Any:
        """One segment: the spectrogram (frames, mel bins) and its waveform."""
        import torch

        max_steps, min_steps = steps
        tokens = len(input_ids)
        rf = self.reduction_factor
        # generate_speech takes ratios: steps = int(tokens * ratio / rf); the +0.5 makes the
        # conversion exact despite floating point
        with torch.inference_mode():
            spectrogram = self.model.generate_speech(
                torch.tensor([input_ids], device=self.device),
                speaker,
                threshold=float(sampling["threshold"]),
                minlenratio=(min_steps + 0.5) * rf / tokens if min_steps else 0.0,
                maxlenratio=(max_steps + 0.5) * rf / tokens,
            )
            waveform = self.vocoder(spectrogram)
        return spectrogram, waveform

    def _chunks(self, prepared: PreparedRequest, seed: int) -> Iterator[Audio]:
        import numpy as np

        from omni_core.speech.audio import Audio

        self._require_loaded()
        sampling = prepared.sampling
        rate = self.capabilities().native_sample_rate
        speaker = self.voices[prepared.tts_params["voice"]]
        remaining = sampling.get("max_frames")
        remaining = None if remaining is None else int(remaining)
        for input_ids in self.ctx.segments(seed, prepared.prompt["input_ids"]):
            steps = self._segment_steps(len(input_ids), sampling, remaining)
            if steps[0] < 1:
                break  # the utterance's frame budget is spent
            spectrogram, waveform = self._synthesize(input_ids, speaker, sampling, steps)
            if remaining is not None:
                remaining -= int(spectrogram.shape[0])
            samples = waveform.detach().float().cpu().numpy().reshape(-1).astype(np.float32)
            yield Audio(samples, rate)

    def generate(self, prepared: PreparedRequest, seed: int) -> Audio:
        from omni_core.speech.audio import Audio

        return Audio.concatenate(list(self._chunks(prepared, seed)))

    def stream(self, prepared: PreparedRequest, seed: int) -> Iterator[Audio]:
        yield from self._chunks(prepared, seed)

    def usage(self, prepared: PreparedRequest, audio: Audio) -> dict[str, int]:
        # the vocoder turns every mel frame into exactly hop samples, and every decoder step
        # emits reduction_factor frames, so the steps follow from the audio's length
        self._require_loaded()
        hop = math.prod(int(r) for r in self.vocoder.config.upsample_rates)
        return token_usage(
            input_text_tokens=sum(len(ids) for ids in prepared.prompt["input_ids"]),
            output_tokens=audio.frames // (hop * self.reduction_factor),
        )
