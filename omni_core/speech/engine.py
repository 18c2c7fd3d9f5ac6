"""The speech runtime: one loaded model, every request through the adapter's hooks."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_core.cancel import check_cancelled
from omni_core.errors import ModelLoadError, ModelRuntimeError, OmniError
from omni_core.inputs import check_checkpoint_files
from omni_core.quiet import quiet_libraries
from omni_core.speech.adapter import AdapterContext, TTSAdapter
from omni_core.speech.audio import CONTENT_TYPES, Audio, check_format, encode, resample, time_stretch
from omni_core.speech.detection import TTSDetectionError, explain_tts, locate_model
from omni_core.speech.request import PreparedRequest, SpeechRequest, SpeechRequestError, TTSCapabilities

if TYPE_CHECKING:
    from omni_core.platforms import Platform
    from omni_core.plugins import PluginSet
    from omni_core.selection import Explanation


@dataclass
class SpeechResult:
    audio: Audio
    data: bytes
    response_format: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES[self.response_format]


class SpeechStream(Iterator[Audio]):
    """The chunks of one streamed utterance (an iterator of :class:`Audio` at the native rate),
    with the validated request and the seed it was made with."""

    def __init__(self, chunks: Iterator[Audio], request: SpeechRequest, seed: int, adapter: str) -> None:
        self._chunks = chunks
        self.request = request
        self.seed = seed
        self.adapter = adapter

    def __iter__(self) -> SpeechStream:
        return self

    def __next__(self) -> Audio:
        return next(self._chunks)


def merge_sampling(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides land field by field on the defaults (nested dicts merge too): a request that
    sets a budget keeps the model's stop tokens."""
    merged = dict(defaults)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_sampling(merged[key], value)
        else:
            merged[key] = value
    return merged


#: the sample rates an MPEG audio stream (MPEG-1, 2 and 2.5 layer III) can carry
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


def check_request(request: SpeechRequest, caps: TTSCapabilities) -> None:
    """The rules every adapter gets; a violation names the rule and the fix."""

    def reject(message: str) -> None:
        raise SpeechRequestError(message)

    if not request.input.strip():
        reject("input text cannot be empty")
    if len(request.input) > caps.max_input_chars:
        reject(f"input is {len(request.input)} characters; this model accepts at most {caps.max_input_chars}")
    if request.voice is not None:
        if not caps.voices:
            reject(f"this model has no selectable voices; omit voice (got {request.voice!r})")
        elif request.voice not in caps.voices:
            reject(f"unknown voice {request.voice!r}; available: {', '.join(caps.voices)}")
    if request.language is not None and request.language not in caps.languages:
        known = ", ".join(caps.languages) or "none: omit language"
        reject(f"unsupported language {request.language!r}; supported: {known}")
    if request.instructions is not None and not caps.instructions:
        reject("this model does not take instructions; omit instructions")
    if request.ref_audio is not None and not caps.voice_cloning:
        reject("this model cannot clone a voice from reference audio; omit ref_audio")
    if request.ref_text is not None and request.ref_audio is None:
        reject("ref_text describes ref_audio; pass ref_audio with it")
    if (
        request.sample_rate is not None
        and caps.supported_sample_rates
        and (request.sample_rate not in caps.supported_sample_rates)
    ):
        rates = ", ".join(map(str, caps.supported_sample_rates))
        reject(f"sample_rate {request.sample_rate} is not supported; choose one of {rates}")
    if request.stream:
        if not caps.streaming:
            reject("this model cannot stream; omit stream")
        if request.sample_rate not in (None, caps.native_sample_rate):
            reject(
                f"streaming returns the native {caps.native_sample_rate} Hz; omit sample_rate to stream, "
                "or drop stream to resample"
            )
        if request.speed != 1.0 and not caps.native_speed_control:
            reject("this model changes speed only after synthesis, which cannot stream; drop stream or speed")
    # an encoder this install lacks is refused before anything is synthesised
    check_format(request.response_format)
    if request.response_format == "mp3":
        rate = request.sample_rate or caps.native_sample_rate
        if rate not in MP3_RATES:
            rates = ", ".join(
                str(r) for r in MP3_RATES if not caps.supported_sample_rates or r in caps.supported_sample_rates
            )
            reject(f"mp3 cannot carry {rate} Hz audio; set sample_rate to one of {rates}, or choose wav, pcm or flac")
    defaults = SpeechRequest.model_fields
    for name in caps.unsupported_fields:
        if getattr(request, name) != defaults[name].default:
            reject(f"this model does not support {name!r}; omit it")


class SpeechEngine:
    """A TTS model loaded through the adapter that serves it."""

    def __init__(
        self,
        model: str | Path,
        *,
        adapter: str | None = None,
        plugins: PluginSet | None = None,
        platform: Platform | None = None,
        model_stage: str | None = None,
    ) -> None:
        from omni_core.platforms import current_platform
        from omni_core.plugins import get_plugins

        self.plugins = plugins if plugins is not None else get_plugins()
        self.platform = platform if platform is not None else current_platform()
        self.identity = locate_model(self.plugins, model, model_stage)
        entry, self.explanation = explain_tts(self.plugins, self.identity, adapter)
        if entry is None:
            raise TTSDetectionError(self.explanation.rule + "\n" + self.explanation.render())
        cls = entry.load()
        if not (isinstance(cls, type) and issubclass(cls, TTSAdapter)):
            raise TTSDetectionError(f"{entry.spec.ref} is not a TTSAdapter subclass ({entry.provider})")
        self.adapter_name = entry.name
        self.provider = str(entry.provider)
        #: set when an adapter was forced (``--adapter``) onto a model it does not claim
        self.forced = adapter is not None and not cls.matches(self.identity.model_stage, self.identity.arch)
        # malformed configs and truncated or corrupt weights are named, with the file, before loading
        check_checkpoint_files(self.identity.model_dir)
        ctx = AdapterContext(self.identity.model_dir, self.identity.config, self.platform, model_stage)
        start = time.perf_counter()
        # an adapter quiets the libraries it imports as it loads them (quiet_libraries()); the
        # engine quiets only those already imported, so a torch-free voice never imports torch
        with self._failures("loading", ModelLoadError), quiet_libraries(imported_only=True):
            self.adapter: TTSAdapter = cls(ctx)
            self.adapter.load()
        self.load_seconds = time.perf_counter() - start

    @contextlib.contextmanager
    def _failures(self, doing: str, error: type[OmniError]) -> Iterator[None]:
        """Turn an adapter's own failure into ``error`` naming the adapter, the model and the
        fix; the original exception stays chained (``OMNI_DEBUG=1`` shows its traceback). The
        errors omni raises on purpose pass through as they are."""
        try:
            yield
        except OmniError:
            raise
        except Exception as exc:
            model_dir = self.identity.model_dir
            lines = str(exc).strip().splitlines() or [""]
            cause = f"{type(exc).__name__}: {' '.join(line.strip() for line in lines[:3])[:600]}".rstrip(". ")
            if self.forced:
                fix = (
                    f"the adapter was chosen with --adapter but does not claim this model "
                    f"(architectures {list(self.identity.architectures) or 'none'}); drop --adapter to let omni "
                    "detect the right one (`omni explain tts --model DIR` shows the candidates)"
                )
            elif doing == "loading":
                fix = "check that the checkpoint is complete and re-download any part that is missing or damaged"
            else:
                fix = f"rerun with OMNI_DEBUG=1 and report the traceback to {self.provider}"
            raise error(f"TTS adapter {self.adapter_name!r} failed {doing} {model_dir}: {cause}. Fix: {fix}") from exc

    @property
    def capabilities(self) -> TTSCapabilities:
        return self.adapter.capabilities()

    def prepare(self, request: SpeechRequest | dict[str, Any] | str) -> tuple[SpeechRequest, PreparedRequest, int]:
        """Normalise, validate and build a request: nothing is synthesised yet."""
        if isinstance(request, str):
            request = SpeechRequest.parse({"input": request})
        elif isinstance(request, dict):
            request = SpeechRequest.parse(request)
        with self._failures("preparing the request for", ModelRuntimeError):
            request = self.adapter.normalize(request)
            check_request(request, self.capabilities)
            problem = self.adapter.validate(request)
            if problem:
                raise SpeechRequestError(problem)
            sampling = merge_sampling(self.adapter.default_sampling(), self.adapter.sampling_overrides(request))
            prepared = self.adapter.build(request, sampling)
        prepared.request = request
        seed = request.seed if request.seed is not None else random.SystemRandom().randrange(2**31)
        return request, prepared, seed

    def _seeded(self, seed: int) -> None:
        self.platform.seed_everything(seed)

    def _finish(self, audio: Audio, request: SpeechRequest) -> Audio:
        if request.speed != 1.0 and not self.capabilities.native_speed_control:
            audio = time_stretch(audio, request.speed)
        if request.sample_rate is not None:
            audio = resample(audio, request.sample_rate)
        return audio

    def speak(self, request: SpeechRequest | dict[str, Any] | str) -> SpeechResult:
        """Synthesise the whole utterance and encode it."""
        request, prepared, seed = self.prepare(request)
        if request.stream:
            raise SpeechRequestError(
                "stream=true asks for chunks: use SpeechEngine.stream() (Omni.stream_speech() in the offline API)"
            )
        check_cancelled()  # a request cancelled while it waited is not synthesised
        start = time.perf_counter()
        with self._failures("synthesising with", ModelRuntimeError), quiet_libraries(imported_only=True):
            self._seeded(seed)
            raw = self.adapter.generate(prepared, seed)
            check_cancelled()  # nor resampled and encoded for a client that is gone
            audio = self._finish(raw, request)
            usage = self.adapter.usage(prepared, raw)
        elapsed = time.perf_counter() - start
        metadata: dict[str, Any] = {
            "adapter": self.adapter_name,
            "model": str(self.identity.model_dir),
            "seed": seed,
            "sample_rate": audio.sample_rate,
            "duration_s": audio.duration,
            "rtf": elapsed / audio.duration if audio.duration else None,
        }
        if usage is not None:
            metadata["usage"] = dict(usage)
        return SpeechResult(
            audio=audio,
            data=encode(audio, request.response_format),
            response_format=request.response_format,
            metadata=metadata,
        )

    def stream(self, request: SpeechRequest | dict[str, Any] | str) -> SpeechStream:
        """Native-rate audio chunks as the adapter produces them. The request is validated
        here, before anything is synthesised, so bad input raises at the call, not at the
        first ``next()``."""
        if isinstance(request, SpeechRequest):
            request = request.model_copy(update={"stream": True})
        elif isinstance(request, dict):
            request = {**request, "stream": True}
        else:
            request = {"input": request, "stream": True}
        request, prepared, seed = self.prepare(request)
        return SpeechStream(self._chunks(prepared, seed), request, seed, self.adapter_name)

    def _chunks(self, prepared: PreparedRequest, seed: int) -> Iterator[Audio]:
        # seeded when iteration starts, so streams created side by side do not share a seed
        with self._failures("synthesising with", ModelRuntimeError), quiet_libraries(imported_only=True):
            check_cancelled()
            self._seeded(seed)
            chunks = self.adapter.stream(prepared, seed)
            try:
                for chunk in chunks:
                    yield chunk
                    # before the adapter makes the next chunk: a cancelled stream makes no more
                    check_cancelled()
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()  # the adapter's generator runs its own cleanup now, not at garbage collection

    def explain(self) -> Explanation:
        return self.explanation
