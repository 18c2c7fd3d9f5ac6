"""The offline API: open a checkpoint directory and use it, whatever plugin serves it.

    from omni_core import Omni

    with Omni("path/to/tts-checkpoint") as omni:
        result = omni.speak("Hello there", seed=0)        # SpeechResult: audio, encoded bytes, metadata
        for chunk in omni.stream_speech("Hello there"):   # Audio chunks as the adapter makes them
            ...

    with Omni("path/to/diffusers-checkpoint", attention_backend="TORCH_SDPA") as omni:
        result = omni.generate("a red fox in snow", seed=0)  # GenerationResult: images or videos
        result.save("fox.png")                                # PNG / MP4 / GIF with metadata

:class:`Omni` finds what serves the model through the installed plugins: image and video
families through the model registry (``omni_register_models``, resolved by
:mod:`omni_core.generation.resolve`), speech through the text-to-speech adapters
(``omni_register_tts_adapters``, driven by :class:`omni_core.speech.engine.SpeechEngine`).

Importing this module is cheap: a runtime is imported when a model is opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# defined in omni_core.errors (one error hierarchy); imported here so old imports keep working
from omni_core.errors import ModelNotServedError as ModelNotServedError

if TYPE_CHECKING:
    from collections.abc import Hashable
    from types import TracebackType

    from omni_core.generation.model import GenerationEngine
    from omni_core.generation.outputs import GenerationResult
    from omni_core.generation.recipe import Recipe
    from omni_core.generation.request import GenerationRequest
    from omni_core.generation.resolve import ModelResolution
    from omni_core.pipeline.orchestrator import Pipeline, PipelineResult, RequestStream
    from omni_core.pipeline.placement import ResolvedPipeline
    from omni_core.plugins import PluginSet
    from omni_core.selection import Explanation
    from omni_core.speech.engine import SpeechEngine, SpeechResult, SpeechStream
    from omni_core.speech.request import SpeechRequest, TTSCapabilities


#: options :class:`Omni` passes on to the engine of a speech model
_SPEECH_OPTIONS = frozenset({"plugins", "platform", "model_stage"})
#: options :class:`Omni` passes on to a multi-stage model's pipeline
_PIPELINE_OPTIONS = frozenset({"plugins", "model_class_name", "recipe", "stages", "pipeline"})
#: options :class:`Omni` passes on to the engine of an image or video model
_GENERATION_OPTIONS = frozenset(
    {
        "plugins",
        "platform",
        "model_class_name",
        "recipe",
        "attention",
        "attention_backend",
        "offload",
        "offload_options",
        "cache",
        "cache_config",
        "dtype",
        "progress",
    }
)


@dataclass
class ServedModel:
    """What serves a model directory, found from its JSON files alone (nothing is loaded):
    :func:`identify_model`'s answer."""

    model_dir: Path
    #: "speech" (a TTS adapter serves it), "generation" (an image or video family does) or
    #: "pipeline" (a multi-stage model: its family declares a topology)
    modality: str
    #: the TTS adapter's or the family's registered name
    name: str
    provider: str
    #: what the model does: "speech", "text-to-image", "text-to-video" or "image-to-video"
    task: str
    #: how an image or video family was chosen (None for speech)
    resolution: ModelResolution | None = None
    recipe: Recipe | None = None

    def plan_pipeline(
        self,
        *,
        plugins: PluginSet | None = None,
        stages: dict[str, dict[str, Any]] | None = None,
        model_class_name: str | None = None,
    ) -> ResolvedPipeline:
        """A multi-stage model's pipeline, resolved: its topology placed by the recipe's
        ``pipeline:`` section and ``stages`` (per-stage overrides, beating the recipe);
        ``model_class_name`` beats the recipe's, as in :func:`identify_model`. Nothing
        loads and no process starts, so a caller can check a request against the result first
        and hand it to ``Omni(..., pipeline=...)``."""
        from omni_core.pipeline.placement import plan_pipeline

        if self.modality != "pipeline":
            raise ModelNotServedError(f"{self.model_dir} is {self.describe()}, not a multi-stage model")
        recipe = self.recipe
        return plan_pipeline(
            self.model_dir,
            recipe=recipe.pipeline if recipe is not None else None,
            plugins=plugins,
            overrides=stages,
            model_class_name=model_class_name or (recipe.model_class_name if recipe is not None else None),
        )

    def describe(self) -> str:
        """``a text-to-image model (family flux1-schnell)`` / ``a speech model (TTS adapter vits)``."""
        if self.modality == "speech":
            return f"a speech model (TTS adapter {self.name!r})"
        if self.modality == "pipeline":
            return f"a multi-stage {self.task} model (family {self.name!r})"
        return f"{_article(self.task)} {self.task} model (family {self.name!r})"


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def identify_model(
    model: str | Path,
    *,
    plugins: PluginSet | None = None,
    adapter: str | None = None,
    model_class_name: str | None = None,
    recipe: Recipe | str | Path | None = None,
    model_stage: str | None = None,
    expect: str | None = None,
) -> ServedModel:
    """Which installed plugin serves ``model``, from its JSON files only: no weight is read and
    no runtime is imported beyond the adapter classes detection asks. ``Omni`` opens what this
    finds, and ``omni speak`` / ``omni generate`` call it first to refuse a model of the other
    modality before anything loads (``expect="speech"`` refuses an image or video checkpoint
    even when its family's plugin is not installed). Raises :class:`ModelNotServedError` (naming inactive
    plugins that would serve it, and how to enable them),
    :class:`~omni_core.generation.resolve.ModelResolutionError`, or
    :class:`~omni_core.errors.CheckpointFormatError` for a malformed config file."""
    from omni_core.generation.recipe import Recipe, load_recipe
    from omni_core.generation.resolve import Checkpoint, known_names, resolve_model
    from omni_core.plugins import get_plugins
    from omni_core.speech.detection import ModelIdentity, claim_model, explain_tts, installed_models

    model_dir = Path(model).expanduser()
    plugins = plugins if plugins is not None else get_plugins()
    # a model only a TTS adapter recognises: an installed voice's name, a voice file, a layout of its own
    claimed = claim_model(plugins, model_dir, model_stage)
    if claimed is not None:
        entry, _ = explain_tts(plugins, claimed, adapter)
        if entry is not None:
            return ServedModel(model_dir, "speech", entry.name, str(entry.provider), "speech", None, None)
    if not model_dir.is_dir():
        what = "is a file, not a directory" if model_dir.exists() else "does not exist"
        names = sorted(m.name for m in installed_models(plugins).values()) if not model_dir.exists() else []
        named = f", or name an installed model ({', '.join(names)})" if names else ""
        raise ModelNotServedError(
            f"model directory {str(model_dir)!r} {what}; point it at a checkpoint directory{named}"
        )
    if recipe is not None and not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe)
    pin = recipe.model_class_name if recipe is not None else None
    checkpoint = Checkpoint(model_dir)
    class_name = checkpoint.class_name
    if class_name and (adapter is not None or expect == "speech"):
        raise ModelNotServedError(
            f"{model_dir} is an image or video checkpoint (model_index.json names {class_name}), not a speech "
            f'model: TTS adapters serve speech models only. Generate with it instead: omni generate "PROMPT" '
            f"--model {model_dir} (Omni(...).generate() in Python)"
        )

    def generation() -> ServedModel:
        resolution = resolve_model(plugins, model_dir, model_class_name=model_class_name, recipe_pin=pin)
        family = resolution.entry.load()
        provider = str(resolution.entry.provider)
        if callable(getattr(family, "topology_for", None)):  # a multi-stage model
            task = resolution.entry.spec.tasks[0] if resolution.entry.spec.tasks else "pipeline"
            return ServedModel(model_dir, "pipeline", resolution.family, provider, task, resolution, recipe)
        task = family.profile_for(model_dir).task
        return ServedModel(model_dir, "generation", resolution.family, provider, task, resolution, recipe)

    if adapter is None and (model_class_name or pin or class_name):
        return generation()
    reasons: list[str] = []
    identity: ModelIdentity | None = None
    if adapter is not None or (model_dir / "config.json").is_file():
        reasons.append(_NO_INDEX)
        identity = ModelIdentity.from_dir(model_dir, model_stage)
        entry, explanation = explain_tts(plugins, identity, adapter)  # raises on an equal-priority overlap
        if entry is not None:
            return ServedModel(model_dir, "speech", entry.name, str(entry.provider), "speech", None, None)
        reasons.append(explanation.rule)
        # a transformers-layout image or video checkpoint: a family that names its class serves it
        names = [*checkpoint.architectures, *([checkpoint.model_type] if checkpoint.model_type else [])]
        known = {n.casefold() for n in known_names(plugins)}
        served_types = {t for e in plugins.models for t in e.spec.model_types}
        if any(n.casefold() in known or n in served_types for n in names):
            return generation()
    else:
        reasons += [
            _NO_INDEX,
            "TTS adapters identify a model by its config.json, and this directory has none: point --model at the "
            "checkpoint's root directory",
        ]
    raise ModelNotServedError(_not_served(plugins, model_dir, reasons, identity, checkpoint))


_NO_INDEX = (
    "image and video families identify a checkpoint by a model_index.json with _class_name and "
    "_diffusers_version, and this directory has none"
)


def _not_served(plugins: PluginSet, model_dir: Path, reasons: list[str], identity: Any, checkpoint: Any) -> str:
    """No active plugin serves ``model_dir``: why, what is installed, and any inactive plugin
    that would serve it with how to turn it back on ("disabled", never "not installed")."""
    from omni_core.generation.resolve import provider_hint
    from omni_core.speech.detection import inactive_adapter_hints

    hints = inactive_adapter_hints(plugins, identity) if identity is not None else []
    for name in checkpoint.architectures if identity is not None else []:
        hint = provider_hint(plugins, name)
        if hint:
            hints.append(f"{name}: {hint}")
    adapters = ", ".join(f"{e.name} ({e.provider.distribution})" for e in plugins.tts_adapters) or "none"
    models = ", ".join(f"{e.name} ({e.provider.distribution})" for e in plugins.models) or "none"
    lines = [f"no installed plugin serves {str(model_dir)!r}.", *(f"  {r}" for r in reasons)]
    if hints:
        lines[0] = f"no active plugin serves {str(model_dir)!r}."
        lines += [f"  {h}" for h in hints]
        lines.append("Turn the plugin named above back on (`omni plugins list --all` shows every plugin).")
        return "\n".join(lines)
    lines += [
        f"  installed TTS adapters: {adapters}",
        f"  installed model families: {models}",
        "Install the plugin for this model family (`omni plugins list --all` shows what is installed).",
    ]
    return "\n".join(lines)


class Omni:
    """One model, opened through the plugin that serves it.

    ``adapter`` names the TTS adapter explicitly instead of detecting it. Other keyword
    options go to the engine that serves the model; an option that engine does not take is an
    error, not ignored:

    * speech: ``plugins``, ``platform``, ``model_stage``;
    * image and video: ``model_class_name`` (a family or pipeline class, beating the
      checkpoint's own), ``recipe`` (a path or :class:`~omni_core.generation.recipe.Recipe`),
      ``attention`` (an :class:`~omni_core.attention.config.AttentionConfig`, dict or JSON),
      ``attention_backend`` (shorthand for its default), ``offload`` (a strategy name) and
      ``offload_options``, ``cache`` (a cache backend's name, :mod:`omni_core.cache`) and
      ``cache_config`` (its options), ``dtype``, ``progress``, ``plugins``, ``platform``. Each beats the
      recipe's setting, which beats the environment (``OMNI_ATTENTION_BACKEND``), which beats
      the defaults: the same order as the command line (``EngineOptions.build`` decides both);
    * multi-stage: ``plugins``, ``model_class_name``, ``recipe``, ``stages`` (per-stage
      overrides, beating the recipe's ``pipeline:`` section), or ``pipeline``: a pipeline planned
      already (:meth:`ServedModel.plan_pipeline`), which is started as it is.

    A user's mistake or a bad checkpoint raises an :class:`~omni_core.errors.OmniError`
    subclass: :class:`ModelNotServedError`, ``ModelResolutionError``,
    :class:`~omni_core.errors.CheckpointFormatError` (a malformed config, truncated weights),
    :class:`~omni_core.errors.ModelLoadError`, and per request ``GenerationOptionError`` /
    ``SpeechRequestError`` or :class:`~omni_core.errors.ModelRuntimeError`.
    """

    def __init__(self, model: str | Path, *, adapter: str | None = None, **kwargs: Any) -> None:
        from omni_core.plugins import get_plugins

        self.model_dir = Path(model).expanduser()
        plugins: PluginSet = kwargs.get("plugins") or get_plugins()
        kwargs["plugins"] = plugins
        self._speech: SpeechEngine | None = None
        self._generation: GenerationEngine | None = None
        self._pipeline: Pipeline | None = None
        self._recipe_defaults: dict[str, Any] = {}
        self._closed = False
        #: what the model does: "speech", "text-to-image", "text-to-video" or "image-to-video"
        self.kind: str = ""
        self.identity = identify_model(
            self.model_dir,
            plugins=plugins,
            adapter=adapter,
            model_class_name=kwargs.get("model_class_name"),
            recipe=kwargs.get("recipe"),
            model_stage=kwargs.get("model_stage"),
        )
        if self.identity.modality == "speech":
            self._open_speech(adapter, kwargs)
        elif self.identity.modality == "pipeline":
            self._open_pipeline(kwargs)
        else:
            self._open_generation(kwargs)
        self.kind = self.identity.task

    def _open_speech(self, adapter: str | None, kwargs: dict[str, Any]) -> None:
        from omni_core.speech.engine import SpeechEngine

        unknown = set(kwargs) - _SPEECH_OPTIONS
        if unknown:
            raise TypeError(
                f"Omni() got option(s) {sorted(unknown)} that a speech model does not take; "
                f"accepted: adapter, {', '.join(sorted(_SPEECH_OPTIONS))}"
            )
        self._speech = SpeechEngine(self.model_dir, adapter=adapter, **kwargs)

    def _open_generation(self, kwargs: dict[str, Any]) -> None:
        unknown = set(kwargs) - _GENERATION_OPTIONS
        if unknown:
            raise TypeError(
                f"Omni() got option(s) {sorted(unknown)} that an image or video model does not take; "
                f"accepted: {', '.join(sorted(_GENERATION_OPTIONS))}"
            )
        recipe = self.identity.recipe
        self._generation = _open_family(self.identity.resolution, self.model_dir, kwargs["plugins"], recipe, kwargs)
        self._recipe_defaults = dict(recipe.generation) if recipe else {}

    def _open_pipeline(self, kwargs: dict[str, Any]) -> None:
        from omni_core.pipeline.orchestrator import Pipeline

        unknown = set(kwargs) - _PIPELINE_OPTIONS
        if unknown:
            raise TypeError(
                f"Omni() got option(s) {sorted(unknown)} that a multi-stage model does not take; "
                f"accepted: {', '.join(sorted(_PIPELINE_OPTIONS))}"
            )
        resolved: ResolvedPipeline | None = kwargs.get("pipeline")
        if resolved is None:
            resolved = self.identity.plan_pipeline(
                plugins=kwargs["plugins"], stages=kwargs.get("stages"), model_class_name=kwargs.get("model_class_name")
            )
        elif kwargs.get("stages"):
            raise TypeError("Omni() takes stages= or an already planned pipeline=, not both: plan with the stages")
        elif Path(resolved.model_dir).resolve() != self.model_dir.resolve():
            raise ValueError(
                f"Omni({str(self.model_dir)!r}, pipeline=...): the pipeline was planned for {resolved.model_dir}"
            )
        self._pipeline = Pipeline(resolved, plugins=kwargs["plugins"]).start()

    @property
    def pipeline(self) -> Pipeline:
        """The running pipeline, for a multi-stage model."""
        self._check_open()
        if self._pipeline is None:
            raise ModelNotServedError(f"{self.model_dir} is {self.identity.describe()}, not a multi-stage model")
        return self._pipeline

    def run(
        self,
        request_input: Any,
        *,
        params: dict[str, dict[str, Any]] | None = None,
        outputs: tuple[str, ...] | None = None,
    ) -> PipelineResult:
        """Send one request through a multi-stage model and wait for all of it. ``params`` are
        per stage (``{"talker": {"temperature": 0.7}}``); ``outputs`` the modalities wanted
        (None: every one the model answers), which decides where the request stops."""
        return self.pipeline.run(request_input, params=params, outputs=outputs)

    def stream(
        self,
        request_input: Any,
        *,
        params: dict[str, dict[str, Any]] | None = None,
        outputs: tuple[str, ...] | None = None,
    ) -> RequestStream:
        """Like :meth:`run`, but the final stages' items arrive as they are made: iterate for
        :class:`~omni_core.pipeline.orchestrator.StageOutput` chunks (the first audio of an
        answer does not wait for its whole text); closing the iterator early cancels the
        request."""
        return self.pipeline.submit(request_input, params=params, outputs=outputs)

    # -- speech -------------------------------------------------------------------------------

    @property
    def speech(self) -> SpeechEngine:
        """The speech engine, for a model a TTS adapter serves."""
        self._check_open()
        if self._speech is None:
            raise ModelNotServedError(
                f"{self.model_dir} is {self.identity.describe()}, not a speech model; use generate() "
                "(`omni generate` on the command line)"
            )
        return self._speech

    @property
    def adapter(self) -> str:
        """Name of the TTS adapter serving the model."""
        return self.speech.adapter_name

    @property
    def capabilities(self) -> TTSCapabilities:
        return self.speech.capabilities

    def speak(self, text_or_request: str | SpeechRequest | dict[str, Any], **fields: Any) -> SpeechResult:
        """Synthesise a whole utterance. ``fields`` are :class:`SpeechRequest` fields
        (``voice``, ``response_format``, ``speed``, ``sample_rate``, ``seed``, ...)."""
        return self.speech.speak(_request(text_or_request, fields))

    def stream_speech(self, text_or_request: str | SpeechRequest | dict[str, Any], **fields: Any) -> SpeechStream:
        """An iterator of native-rate :class:`~omni_core.speech.audio.Audio` chunks, validated
        before the first one is made. For the same seed the chunks concatenate to what
        :meth:`speak` returns. The iterator carries ``seed`` and the validated ``request``."""
        return self.speech.stream(_request(text_or_request, {**fields, "stream": True}))

    # -- image and video ----------------------------------------------------------------------

    @property
    def generation(self) -> GenerationEngine:
        """The generation engine, for an image or video model."""
        self._check_open()
        if self._generation is None:
            raise ModelNotServedError(
                f"{self.model_dir} is {self.identity.describe()}, not an image or video model; use speak() "
                "(`omni speak` on the command line)"
            )
        return self._generation

    @property
    def family(self) -> str:
        """Name of the model family serving an image or video model."""
        return self.generation.family

    def generate(self, prompt_or_request: str | GenerationRequest | dict[str, Any], **fields: Any) -> GenerationResult:
        """Generate images (or videos, for a video model). ``fields`` are
        :class:`~omni_core.generation.request.GenerationRequest` fields (``width``, ``height``,
        ``num_inference_steps``, ``guidance_scale``, ``seed``, ``num_outputs``, ``num_frames``,
        ``fps``, ``image``, ``negative_prompt``, ``extra``); unset ones take the recipe's
        settings, then the family's defaults. Invalid values raise
        :class:`~omni_core.generation.request.GenerationOptionError` before any compute."""
        return self.generation.generate(self._generation_request(prompt_or_request, fields))

    def batch_key(self, request: str | GenerationRequest | dict[str, Any]) -> Hashable | None:
        """What decides whether ``request`` can share one pipeline call with others: requests
        whose keys are equal can go to :meth:`generate_batch` together. The recipe's settings
        apply as in :meth:`generate`, and the engine validates the request (raising
        ``GenerationOptionError`` before any compute). None: the request never batches (the
        engine cannot batch, or not this request)."""
        from omni_core.generation.model import BatchingEngine, validate_request

        engine = self.generation
        parsed = self._generation_request(request, {})
        if not isinstance(engine, BatchingEngine):
            # no key, but the same rules: a caller checks requests here before queueing them
            if self.identity.resolution is not None:
                validate_request(self.identity.resolution.entry.load(), self.model_dir, parsed)
            return None
        return engine.batch_key(parsed)

    def generate_batch(self, requests: list[str | GenerationRequest | dict[str, Any]]) -> list[GenerationResult]:
        """Generate for several requests, result ``i`` for request ``i``, each with the recipe's
        settings applied as in :meth:`generate`. An engine that batches runs them as one
        pipeline call (their :meth:`batch_key` must be equal and not None, else ``ValueError``);
        any other engine runs them one by one. Either way each request gets the outputs it
        would get alone."""
        from omni_core.generation.model import BatchingEngine

        engine = self.generation
        parsed = [self._generation_request(r, {}) for r in requests]
        if isinstance(engine, BatchingEngine) and len(parsed) > 1:
            return engine.generate_batch(parsed)
        return [engine.generate(r) for r in parsed]

    def _generation_request(
        self, prompt_or_request: str | GenerationRequest | dict[str, Any], fields: dict[str, Any]
    ) -> GenerationRequest:
        """One validated request: the recipe's settings, then the prompt, dict or request, then
        keyword ``fields`` on top (every generation entry point builds its request here)."""
        from omni_core.generation.request import GenerationRequest

        if isinstance(prompt_or_request, GenerationRequest):
            data = prompt_or_request.model_dump(exclude_unset=True)
        elif isinstance(prompt_or_request, dict):
            data = dict(prompt_or_request)
        elif isinstance(prompt_or_request, str):
            data = {"prompt": prompt_or_request}
        else:
            raise TypeError(f"expected a prompt, a GenerationRequest or a dict, not {type(prompt_or_request).__name__}")
        return GenerationRequest.parse({**self._recipe_defaults, **data, **fields})

    # -- common -------------------------------------------------------------------------------

    def explain(self) -> Explanation:
        """How the serving plugin was chosen: every candidate and why it lost. For image and
        video models :meth:`explain_all` also covers attention roles and offload."""
        if self._generation is not None:
            return self._generation.explain()["model"]
        return self.speech.explain()

    def explain_all(self) -> dict[str, Explanation]:
        """Every selection made when opening the model, by subject."""
        if self._generation is not None:
            return self._generation.explain()
        return {"adapter": self.speech.explain()}

    def close(self) -> None:
        """Drop the loaded model (and any hooks its runtime installed); stop a pipeline's stages."""
        if self._generation is not None:
            self._generation.close()
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None
        self._speech = None
        self._generation = None
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise ModelNotServedError(f"this Omni for {self.model_dir} is closed")

    def __enter__(self) -> Omni:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        via = (
            self._speech.adapter_name
            if self._speech
            else self._generation.family
            if self._generation
            else self.identity.name
            if self._pipeline
            else "-"
        )
        state = "closed" if self._closed else f"{self.kind} via {via}"
        return f"Omni({str(self.model_dir)!r}, {state})"


def _request(text_or_request: str | SpeechRequest | dict[str, Any], fields: dict[str, Any]) -> SpeechRequest:
    """One validated request from text, a dict or a request, plus keyword fields on top."""
    from omni_core.speech.request import SpeechRequest

    if isinstance(text_or_request, SpeechRequest):
        if not fields:
            return text_or_request
        data = text_or_request.model_dump(exclude_unset=True)
    elif isinstance(text_or_request, dict):
        data = dict(text_or_request)
    elif isinstance(text_or_request, str):
        data = {"input": text_or_request}
    else:
        raise TypeError(f"expected text, a SpeechRequest or a dict, not {type(text_or_request).__name__}")
    return SpeechRequest.parse({**data, **fields})


def _open_family(
    resolution: Any, model_dir: Path, plugins: PluginSet, recipe: Any, kwargs: dict[str, Any]
) -> GenerationEngine:
    """Build the engine options (explicit options > recipe > environment) and open the family."""
    from omni_core.generation.model import EngineOptions

    given = dict(kwargs)
    if "cache" in given:  # the public name of EngineOptions.cache_backend
        given["cache_backend"] = given.pop("cache")
    options = EngineOptions.build(resolution, plugins, recipe, given)
    engine: GenerationEngine = resolution.entry.load().open(model_dir, options)
    return engine
