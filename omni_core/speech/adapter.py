"""The TTS adapter contract. Subclass :class:`TTSAdapter` in a plugin, register it with
``omni_register_tts_adapters``, and every request to a matching model goes through it."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from omni_core.errors import ModelLoadError, OmniError
from omni_core.identity import DeclaredIdentity  # name etc. come from the registration
from omni_core.kinds import Kind
from omni_core.speech.request import PreparedRequest, SpeechRequest, TTSCapabilities

if TYPE_CHECKING:
    from omni_core.platforms import Platform
    from omni_core.speech.audio import Audio

T = TypeVar("T")


@dataclass
class AdapterContext:
    """What the runtime hands an adapter when constructing it (once per model).

    The engine decides where the model runs and how it is seeded; the adapter follows: it
    loads onto :attr:`device` and, when it synthesises in segments, takes them through
    :meth:`segments`, never choosing a device or seeding a generator itself."""

    model_dir: Path
    #: the checkpoint's ``config.json`` as a dict (empty when there is none)
    config: Mapping[str, Any] = field(default_factory=dict)
    #: the platform the engine runs the model on (None only for a context built by hand)
    platform: Platform | None = None
    #: the deploy ``model_stage`` this model runs as, if the deployment names one
    model_stage: str | None = None

    @property
    def device(self) -> Any:
        """The device to load onto and compute on: the platform's device 0 (None, meaning torch's
        default, for a context without a platform). Resolved on use, so a torch-free adapter
        never imports torch."""
        return self.platform.device(0) if self.platform is not None else None

    def segments(self, seed: int, segments: Iterable[T]) -> Iterator[T]:
        """Each of ``segments``, the platform seeded for it by the one per-segment rule
        (:func:`omni_core.speech.seeding.segment_seed`): iterate an utterance's sentences
        through this, in ``generate`` and ``stream`` alike, and both give the same audio."""
        from omni_core.speech.seeding import seeded_segments

        return seeded_segments(self.platform, seed, segments)


@dataclass(frozen=True)
class ModelClaim:
    """An adapter's claim on a model that has no ``config.json`` (:meth:`TTSAdapter.identify`):
    a file, or a directory in a layout of the adapter's own."""

    #: the directory the adapter loads from (:attr:`AdapterContext.model_dir`)
    model_dir: Path
    #: stands in for ``config.json`` (:attr:`AdapterContext.config`); its ``architectures``
    #: names one of the adapter's ``model_archs``, so detection matches it as it matches any model
    config: Mapping[str, Any]
    #: why the adapter claims it, for ``omni explain tts``
    reason: str


@dataclass(frozen=True)
class ReadyModel:
    """A real model (trained weights, on disk) an adapter offers as omni's default voice: what
    ``omni speak`` and ``omni serve`` use when given no ``--model``
    (:meth:`TTSAdapter.ready_model`)."""

    #: its short name: what ``omni serve`` serves it as, one :meth:`TTSAdapter.installed_models` knows
    name: str
    #: a path the adapter's detection claims (:meth:`TTSAdapter.identify`, or a checkpoint directory)
    path: Path
    #: one line saying what it is, for the note that says which voice spoke
    summary: str
    #: lower is preferred when several adapters offer one (ties: the adapter's name)
    preference: int = 100


class TTSAdapter(DeclaredIdentity, abc.ABC, identity_of=Kind.TTS_ADAPTER):
    """One TTS family: which models it serves, how requests are shaped, how audio is made.

    Lifecycle: constructed once per model with an :class:`AdapterContext`, then :meth:`load`;
    per request the runtime calls :meth:`normalize`, :meth:`validate`,
    :meth:`sampling_overrides` (merged onto :meth:`default_sampling`), :meth:`build`, then
    :meth:`generate` or :meth:`stream`.
    """

    #: registry key and log label
    name: ClassVar[str]
    #: deploy ``model_stage`` values it serves
    stage_keys: ClassVar[frozenset[str]] = frozenset()
    #: model architectures it serves (``config.json`` ``architectures``); authoritative over stage keys
    model_archs: ClassVar[frozenset[str]] = frozenset()
    #: lower is tried first during detection
    detect_priority: ClassVar[int] = 100
    #: autoregressive (token by token) or not (one pass, diffusion or flow); both go through these hooks
    backend: ClassVar[Literal["ar", "non_ar"]] = "non_ar"

    def __init__(self, ctx: AdapterContext) -> None:
        self.ctx = ctx

    @classmethod
    def matches(cls, model_stage: str | None, model_arch: str | None) -> bool:
        """Whether this adapter serves the model. An architecture match beats a stage key;
        override for rules beyond set membership."""
        if model_arch and cls.model_archs:
            return model_arch in cls.model_archs
        if model_stage and cls.stage_keys:
            return model_stage in cls.stage_keys
        return False

    @classmethod
    def make_tiny(cls, directory: Path, seed: int = 0) -> Path:
        """Write a tiny random-weight checkpoint of this family to ``directory`` in its standard
        on-disk layout (for tests and the embedded default). Optional."""
        raise NotImplementedError(f"{cls.name} has no tiny-checkpoint maker")

    # The three classmethods below are optional (plugin API 1.4; adapters without them keep
    # working): they let an adapter serve models that have no ``config.json``, address
    # installed models by name, and offer one as the default voice. Detection calls them on
    # the registered adapters in (detect_priority, name) order; keep them cheap and free of
    # heavy imports, as every installed adapter's are asked.

    @classmethod
    def identify(cls, path: Path) -> ModelClaim | None:
        """Claim ``path`` (a file, or a directory without ``config.json``) as a model of this
        adapter, from its own files (e.g. a voice's JSON config), or None. Raise
        :class:`~omni_core.errors.TTSDetectionError` when it is this adapter's layout but
        cannot be served as it is (say which file to pick, what is missing)."""
        return None

    @classmethod
    def installed_models(cls) -> Mapping[str, Path]:
        """Installed models this adapter knows by a short name (``--model NAME``), each mapped
        to a path :meth:`identify` claims, e.g. voices installed as Python packages. Names
        compare case-insensitively; an existing path of the same name wins over a name."""
        return {}

    @classmethod
    def ready_model(cls) -> ReadyModel | None:
        """A real installed model this adapter offers as omni's default voice, or None (the
        default). Without ``--model``, ``omni speak`` and ``omni serve`` speak with the offered
        model of lowest :attr:`~ReadyModel.preference`; when no adapter offers one, they fall
        back to a tiny random-weight checkpoint and say so. Cheap, like :meth:`installed_models`:
        it is asked of every active adapter whenever no model is named."""
        return None

    @abc.abstractmethod
    def capabilities(self) -> TTSCapabilities:
        """What the loaded model can do (voices, languages, rates, streaming, cloning, ...)."""

    @abc.abstractmethod
    def load(self) -> None:
        """Load the model from ``self.ctx.model_dir`` onto ``self.ctx.device`` (the engine's choice)."""

    def normalize(self, request: SpeechRequest) -> SpeechRequest:
        """Fill defaults and tidy the request (e.g. the default voice). Runs before validation."""
        caps = self.capabilities()
        updates: dict[str, Any] = {"input": " ".join(request.input.split())}
        if request.voice is None and caps.default_voice is not None:
            updates["voice"] = caps.default_voice
        return request.model_copy(update=updates)

    def validate(self, request: SpeechRequest) -> str | None:
        """Adapter-specific rules after the runtime's own checks; a string is the client error."""
        return None

    def default_sampling(self) -> dict[str, Any]:
        """The stage defaults for sampling (stop tokens, budgets, temperatures, ...)."""
        return {}

    def sampling_overrides(self, request: SpeechRequest) -> dict[str, Any]:
        """Fields this request changes. The runtime merges them onto :meth:`default_sampling`
        field by field, so a stop token or budget the request does not mention survives.

        ``max_new_tokens`` has one meaning for every adapter: the most output tokens the model
        generates for the whole request (every sentence together), counted as :meth:`usage`
        counts ``output_tokens``; ``usage()["output_tokens"]`` never exceeds it. Map it onto
        whatever your model's budget is (the default passes it on as ``"max_new_tokens"``);
        sentences spend it in order, and those after it is spent are not spoken. A model
        without such a budget (one pass for the whole waveform) lists ``max_new_tokens`` in
        :attr:`~omni_core.speech.request.TTSCapabilities.unsupported_fields`."""
        overrides: dict[str, Any] = {}
        if request.max_new_tokens is not None:
            overrides["max_new_tokens"] = request.max_new_tokens
        return overrides

    @abc.abstractmethod
    def build(self, request: SpeechRequest, sampling: dict[str, Any]) -> PreparedRequest:
        """Turn a validated request into model inputs."""

    @abc.abstractmethod
    def generate(self, prepared: PreparedRequest, seed: int) -> Audio:
        """Synthesise the whole utterance at the native sample rate, deterministically for ``seed``.
        The engine has seeded the platform with ``seed`` already; an adapter that works in
        segments reseeds per segment through ``self.ctx.segments(seed, ...)``."""

    def stream(self, prepared: PreparedRequest, seed: int) -> Iterator[Audio]:
        """Yield audio incrementally. Adapters declaring ``streaming`` override this so the
        first chunk comes before the utterance is done, and so the chunks concatenate to
        exactly what :meth:`generate` returns for the same seed. The runtime checks for
        cancellation between chunks (:func:`omni_core.cancel.check_cancelled`); an adapter
        whose one chunk takes long may call it inside its own loop too."""
        yield self.generate(prepared, seed)

    def usage(self, prepared: PreparedRequest, audio: Audio) -> dict[str, int] | None:
        """What one :meth:`generate` call consumed and produced, in tokens, for the result's
        ``metadata["usage"]`` (a server reports it). ``audio`` is what :meth:`generate`
        returned, at the native rate, before any speed change or resampling. Keys:

        * ``input_text_tokens``: tokens of the input text, as the model's tokenizer counts them;
        * ``input_audio_tokens``: tokens of reference audio (0 when none is read);
        * ``input_tokens``: their sum;
        * ``output_tokens``: what the model generated, in the unit its adapter documents
          (decoder steps, codec frames): the unit ``max_new_tokens`` budgets, never more than it;
        * ``total_tokens``: input plus output.

        None (the default): the model has no meaningful token count, e.g. one that makes the
        whole waveform in one pass. :func:`token_usage` builds the dict."""
        return None


def token_usage(*, input_text_tokens: int, output_tokens: int, input_audio_tokens: int = 0) -> dict[str, int]:
    """The :meth:`TTSAdapter.usage` dict, with the sums filled in."""
    input_tokens = input_text_tokens + input_audio_tokens
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "input_text_tokens": input_text_tokens,
        "input_audio_tokens": input_audio_tokens,
    }


def require_model_type(ctx: AdapterContext, adapter: str, *model_types: str) -> None:
    """Refuse, before loading, a checkpoint whose ``config.json`` names another ``model_type``
    (an adapter forced onto a model it does not serve): loaders would otherwise build a model
    of random weights from it, or fail somewhere deep. Raises :class:`ModelLoadError`."""
    found = ctx.config.get("model_type")
    if isinstance(found, str) and found not in model_types:
        raise ModelLoadError(
            f"{ctx.model_dir} is not a {adapter} checkpoint: its config.json says model_type {found!r} (the "
            f"{adapter} adapter loads {', '.join(repr(t) for t in model_types)}); drop --adapter {adapter} to let "
            "omni detect the adapter that serves it (`omni explain tts --model DIR`)"
        )


@contextlib.contextmanager
def loading(model_dir: Path | str, what: str) -> Iterator[None]:
    """Turn a loader's failure (``from_pretrained`` on a damaged or incomplete checkpoint) into
    a :class:`ModelLoadError` naming ``what`` was loaded from where, and the fix; the original
    stays chained. Errors omni raises on purpose pass through unchanged."""
    try:
        yield
    except OmniError:
        raise
    except Exception as exc:
        lines = str(exc).strip().splitlines() or [""]
        cause = " ".join(line.strip() for line in lines[:3])[:600].rstrip(". ")
        raise ModelLoadError(
            f"could not load {what} from {model_dir}: {type(exc).__name__}: {cause}. Check that the checkpoint is "
            "complete and re-download any part that is missing or damaged"
        ) from exc
