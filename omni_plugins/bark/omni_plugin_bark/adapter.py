"""``BarkAdapter``: Bark checkpoints (transformers ``BarkModel``) behind omni's TTS contract.

Bark is a cascade of three GPTs and a codec: text -> *semantic* tokens (AR) -> *coarse*
acoustic tokens, the first two EnCodec codebooks (AR, in sliding windows) -> *fine* tokens,
the remaining codebooks (non-causal) -> EnCodec waveform. A voice is a *voice preset*
(history prompt: semantic, coarse and fine prompts) shipped with the checkpoint and listed in
``speaker_embeddings_path.json``.

* **Sampling:** :meth:`BarkAdapter.default_sampling` holds the per-stage defaults as
  ``BarkModel.generate`` keyword arguments (``semantic_temperature``,
  ``coarse_temperature``, ``fine_temperature``, ``semantic_max_new_tokens`` (per sentence),
  ...). A request's ``max_new_tokens`` is the most EnCodec frames (the output tokens
  ``usage`` counts) of the whole utterance: it becomes ``max_frames``, which the sentences
  spend in order. Each sentence's semantic budget is cut to what the frames left allow (a
  semantic token becomes ``coarse_rate_hz / semantic_rate_hz``, 75 / 49.9, frames), and the
  sentences after the budget is spent are not spoken. The runtime merges it onto the
  defaults, so the temperatures and the rest survive.
* **Long text** is generated sentence by sentence (:func:`omni_core.speech.text.segment_text`), each
  sentence seeded by the engine's per-segment rule (``self.ctx.segments``), so :meth:`BarkAdapter.stream` yields
  one chunk per sentence and the chunks concatenate to exactly what
  :meth:`BarkAdapter.generate` returns.
* **Usage** (``metadata["usage"]`` of a result): the input text tokens are what Bark's
  tokenizer makes of each sentence (padding not counted); the output tokens are EnCodec frames
  (each one token of every codebook), the audio's length over the codec's hop.
* **Not supported:** native speed control (the runtime time-stretches), cloning from raw
  audio, instructions, the ``language`` field (the voice preset carries the language).

This module imports no torch or transformers at import time (detection imports it to call
:meth:`matches`); they are imported by :meth:`BarkAdapter.load`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from omni_core.speech.adapter import AdapterContext, TTSAdapter, loading, require_model_type, token_usage
from omni_core.speech.request import PreparedRequest, SpeechRequest, TTSCapabilities

if TYPE_CHECKING:
    from omni_core.speech.audio import Audio

#: the keys every voice preset holds (BarkProcessor's convention)
PRESET_KEYS = ("semantic_prompt", "coarse_prompt", "fine_prompt")
SPEAKER_EMBEDDINGS_FILE = "speaker_embeddings_path.json"

#: Bark's published defaults, used where the checkpoint's generation config says nothing
BARK_SAMPLE_RATE = 24_000
BARK_MAX_INPUT_SEMANTIC_LENGTH = 256
BARK_SEMANTIC_MAX_NEW_TOKENS = 768
BARK_SEMANTIC_BLOCK_SIZE = 1024
BARK_SEMANTIC_RATE_HZ = 49.9
BARK_COARSE_RATE_HZ = 75


class BarkAdapter(TTSAdapter):
    """Serves ``BarkModel`` checkpoints (``suno/bark``, ``suno/bark-small`` and their layout)."""

    backend: ClassVar[Literal["ar", "non_ar"]] = "ar"

    #: the original Bark sampling temperatures (text 0.7, waveform 0.7, fine 0.5)
    TEMPERATURES: ClassVar[dict[str, float]] = {"semantic": 0.7, "coarse": 0.7, "fine": 0.5}
    #: end a sentence as soon as end-of-semantic is this likely (original Bark: 0.2)
    MIN_EOS_P: ClassVar[float] = 0.2

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        self._caps: TTSCapabilities | None = None
        self._preset_files: dict[str, dict[str, Path]] | None = None
        self._generation: dict[str, Any] | None = None
        self._model: Any = None
        self._processor: Any = None
        self._device: Any = None
        self._presets: dict[str, dict[str, Any]] = {}

    @classmethod
    def make_tiny(cls, directory: Path, seed: int = 0) -> Path:
        from omni_plugin_bark.tiny import make_tiny

        return make_tiny(directory, seed)

    # --- what the checkpoint declares (read from its files; no torch) ---------------------------

    def _generation_config(self) -> dict[str, Any]:
        if self._generation is None:
            path = Path(self.ctx.model_dir) / "generation_config.json"
            try:
                self._generation = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
            except ValueError:
                self._generation = {}
        return self._generation

    def _semantic_generation(self) -> dict[str, Any]:
        return dict(self._generation_config().get("semantic_config") or {})

    def _sample_rate(self) -> int:
        codec = self.ctx.config.get("codec_config") or {}
        rate = codec.get("sampling_rate") or self._generation_config().get("sample_rate") or BARK_SAMPLE_RATE
        return int(rate)

    def _max_text_tokens(self) -> int:
        value = self._semantic_generation().get("max_input_semantic_length")
        return int(value or BARK_MAX_INPUT_SEMANTIC_LENGTH)

    def _semantic_tokens_within(self, frames: int) -> int:
        """The most semantic tokens whose coarse (and so EnCodec) frames fit in ``frames``:
        transformers makes ``floor(semantic * coarse_rate / semantic_rate)`` of them."""
        semantic = float(self._semantic_generation().get("semantic_rate_hz") or BARK_SEMANTIC_RATE_HZ)
        coarse = self._generation_config().get("coarse_acoustics_config") or {}
        return math.floor(frames * semantic / float(coarse.get("coarse_rate_hz") or BARK_COARSE_RATE_HZ))

    def _max_semantic_tokens(self) -> int:
        """The longest semantic budget the semantic model's position table allows."""
        semantic = self.ctx.config.get("semantic_config") or {}
        block = int(semantic.get("block_size") or BARK_SEMANTIC_BLOCK_SIZE)
        return max(1, block - self._max_text_tokens() - 1)

    def _voice_files(self) -> dict[str, dict[str, Path]]:
        """Voice presets listed in ``speaker_embeddings_path.json`` whose three prompt files exist
        inside the checkpoint directory, in the file's order."""
        if self._preset_files is None:
            root = Path(self.ctx.model_dir)
            listing: dict[str, Any] = {}
            path = root / SPEAKER_EMBEDDINGS_FILE
            if path.is_file():
                try:
                    listing = json.loads(path.read_text(encoding="utf-8"))
                except ValueError:
                    listing = {}
            base = os.path.abspath(root)
            files: dict[str, dict[str, Path]] = {}
            for voice, entry in listing.items():
                if voice == "repo_or_path" or not isinstance(entry, dict):
                    continue
                paths = {}
                for key in PRESET_KEYS:
                    relative = entry.get(key)
                    if not isinstance(relative, str):
                        break
                    target = os.path.abspath(os.path.join(base, relative))
                    if os.path.commonpath([base, target]) != base or not os.path.isfile(target):
                        break  # outside the checkpoint, or missing: not offered
                    paths[key] = Path(target)
                else:
                    files[voice] = paths
            self._preset_files = files
        return self._preset_files

    def capabilities(self) -> TTSCapabilities:
        if self._caps is None:
            voices = tuple(self._voice_files())
            self._caps = TTSCapabilities(
                native_sample_rate=self._sample_rate(),
                voices=voices,
                default_voice=voices[0] if voices else None,
                native_speed_control=False,
                streaming=True,
                voice_cloning=False,
                instructions=False,
            )
        return self._caps

    # --- loading ----------------------------------------------------------------------------------

    def load(self) -> None:
        from omni_core.quiet import quiet_libraries

        with quiet_libraries():  # transformers' loading bars and notes are not the user's business
            self._load()

    def _load(self) -> None:
        import numpy as np
        from transformers import BarkModel, BarkProcessor

        require_model_type(self.ctx, self.name, "bark")
        self._device = self.ctx.device  # the engine's choice
        model_dir = str(self.ctx.model_dir)
        with loading(model_dir, "the Bark model"):
            self._model = BarkModel.from_pretrained(model_dir, local_files_only=True).to(self._device).eval()
        # speaker embeddings are read here from the files capabilities() checked, not by the
        # processor (which would resolve them against the hub-style repo_or_path per request)
        with loading(model_dir, "the Bark processor"):
            self._processor = BarkProcessor.from_pretrained(model_dir, speaker_embeddings_dict_path=None)
        with loading(model_dir, f"the Bark voice presets ({SPEAKER_EMBEDDINGS_FILE})"):
            self._presets = {
                voice: {key: np.load(path, allow_pickle=False) for key, path in files.items()}
                for voice, files in self._voice_files().items()
            }

    def _loaded(self) -> Any:
        if self._model is None:
            raise RuntimeError("BarkAdapter.load() must run before requests are built or generated")
        return self._model

    def count_tokens(self, text: str) -> int:
        """Text tokens Bark's semantic model reads for ``text``."""
        self._loaded()
        return len(self._processor.tokenizer(text, add_special_tokens=False)["input_ids"])

    # --- requests ---------------------------------------------------------------------------------

    def validate(self, request: SpeechRequest) -> str | None:
        # text the tokenizer reads as nothing, or as unknown tokens only, would be "spoken" as
        # whatever the model babbles: refused instead
        self._loaded()
        tokenizer = self._processor.tokenizer
        ids = tokenizer(request.input, add_special_tokens=False)["input_ids"]
        if not any(i not in {tokenizer.unk_token_id, *tokenizer.all_special_ids} for i in ids):
            return (
                "input has nothing this model's tokenizer can read (it is empty once tokenised, or every "
                "character maps to the unknown token); write the text in a language the model speaks"
            )
        if request.max_new_tokens is not None and self._semantic_tokens_within(request.max_new_tokens) < 1:
            return (
                f"max_new_tokens {request.max_new_tokens} is fewer codec frames than one semantic token of this "
                "Bark checkpoint makes; raise it or omit it"
            )
        return None

    def default_sampling(self) -> dict[str, Any]:
        budget = self._semantic_generation().get("max_new_tokens") or BARK_SEMANTIC_MAX_NEW_TOKENS
        return {
            "semantic_temperature": self.TEMPERATURES["semantic"],
            "coarse_temperature": self.TEMPERATURES["coarse"],
            "fine_temperature": self.TEMPERATURES["fine"],
            "semantic_do_sample": True,
            "coarse_do_sample": True,
            # per sentence; about 50 semantic tokens per second of audio
            "semantic_max_new_tokens": min(int(budget), self._max_semantic_tokens()),
            # at least one token, so a sentence never decodes from an empty code sequence
            "semantic_min_new_tokens": 1,
            "semantic_min_eos_p": self.MIN_EOS_P,
        }

    def sampling_overrides(self, request: SpeechRequest) -> dict[str, Any]:
        # the whole utterance's frame budget; each sentence's semantic budget follows from what is left
        if request.max_new_tokens is None:
            return {}
        return {"max_frames": request.max_new_tokens}

    def build(self, request: SpeechRequest, sampling: dict[str, Any]) -> PreparedRequest:
        from omni_core.speech.text import segment_text

        self._loaded()
        segments = segment_text(request.input, self._max_text_tokens(), self.count_tokens)
        return PreparedRequest(
            prompt={"segments": segments, "voice": request.voice},
            sampling=dict(sampling),
            tts_params={"voice": [request.voice], "segments": [len(segments)]},
        )

    # --- synthesis --------------------------------------------------------------------------------

    def _segment_audio(self, text: str, voice: str | None, sampling: dict[str, Any]) -> Audio:
        import numpy as np
        import torch

        from omni_core.speech.audio import Audio

        model = self._loaded()
        inputs = self._processor(
            text,
            voice_preset=self._presets[voice] if voice is not None else None,
            max_length=self._max_text_tokens(),
            return_tensors="pt",
        )
        history = inputs.pop("history_prompt", None)
        kwargs: dict[str, Any] = {
            "input_ids": inputs["input_ids"].to(self._device),
            "attention_mask": inputs["attention_mask"].to(self._device),
        }
        if history is not None:
            kwargs["history_prompt"] = {key: value.to(self._device) for key, value in history.items()}
        with torch.inference_mode():
            waveform = model.generate(**kwargs, **sampling)
        samples = waveform[0].detach().to(torch.float32).cpu().numpy()
        return Audio(np.clip(samples, -1.0, 1.0).astype(np.float32), self._sample_rate())

    def _hop(self) -> int:
        """Samples per EnCodec frame: the codec decodes every frame to exactly this many."""
        return math.prod(int(r) for r in self._loaded().codec_model.config.upsampling_ratios)

    def _synthesize(self, prepared: PreparedRequest, seed: int) -> Iterator[Audio]:
        voice = prepared.prompt.get("voice")
        sampling = dict(prepared.sampling)
        left: int | None = sampling.pop("max_frames", None)
        # how many sentences were spoken, for usage(): those cut by the budget read no input
        prepared.tts_params["spoken_segments"] = 0
        for text in self.ctx.segments(seed, prepared.prompt["segments"]):
            if left is not None:
                semantic = min(int(sampling["semantic_max_new_tokens"]), self._semantic_tokens_within(left))
                if semantic < 1:
                    return  # the budget is spent: the remaining sentences are not spoken
                sampling["semantic_max_new_tokens"] = semantic
                sampling["semantic_min_new_tokens"] = min(int(sampling.get("semantic_min_new_tokens", 1)), semantic)
            audio = self._segment_audio(text, voice, sampling)
            if left is not None:
                left -= audio.frames // self._hop()
            prepared.tts_params["spoken_segments"] += 1
            yield audio

    def generate(self, prepared: PreparedRequest, seed: int) -> Audio:
        from omni_core.speech.audio import Audio

        return Audio.concatenate(list(self._synthesize(prepared, seed)))

    def stream(self, prepared: PreparedRequest, seed: int) -> Iterator[Audio]:
        yield from self._synthesize(prepared, seed)

    def usage(self, prepared: PreparedRequest, audio: Audio) -> dict[str, int]:
        # the codec decodes every frame to exactly hop samples, so the frames follow from the length;
        # the unit max_new_tokens budgets. Sentences the budget cut were never read by the model.
        segments = prepared.prompt["segments"]
        spoken = segments[: prepared.tts_params.get("spoken_segments", len(segments))]
        return token_usage(
            input_text_tokens=sum(self.count_tokens(text) for text in spoken),
            output_tokens=audio.frames // self._hop(),
        )
