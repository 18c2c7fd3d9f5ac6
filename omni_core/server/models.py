"""The models a server serves: identified before the port is bound (a wrong directory fails
``omni serve`` at once), loaded in the background after it (``/health`` says 503 until then),
each with its own :class:`~omni_core.server.worker.ModelWorker`.

What a model can do decides which routes take it (:data:`ENDPOINTS`, by task); a new kind of
model (chat, multi-stage) is a new task here and a new route, never a branch on its name.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from omni_core.errors import ModelNotReadyError, ModelNotServedError, OmniError, RecipeError, UnknownExtensionError
from omni_core.server.config import ModelSource, ServerConfig
from omni_core.server.worker import ModelWorker

if TYPE_CHECKING:
    from omni_core.api import Omni, ServedModel
    from omni_core.generation.request import GenerationProfile
    from omni_core.speech.request import TTSCapabilities

log = logging.getLogger("omni.serve")

#: the routes that serve each task
ENDPOINTS: dict[str, tuple[str, ...]] = {
    "text-to-image": ("/v1/images/generations",),
    "text-to-video": ("/v1/videos",),
    "image-to-video": ("/v1/videos",),
    "speech": ("/v1/audio/speech",),
    "chat": ("/v1/chat/completions",),
}
#: what a route calls the models it takes, for "model X is not a ... model"
ROUTE_NOUNS = {
    "/v1/images/generations": "image",
    "/v1/videos": "video",
    "/v1/audio/speech": "speech",
    "/v1/chat/completions": "chat",
}


#: request field -> the profile attribute holding the model's default for it
_PROFILE_DEFAULTS = {
    "width": "default_width",
    "height": "default_height",
    "num_inference_steps": "default_steps",
    "num_frames": "default_frames",
    "fps": "default_fps",
}


@dataclass
class Model:
    """One served model: what it is (known before loading) and, once loaded, its engine."""

    source: ModelSource
    identity: ServedModel
    status: Literal["loading", "ready", "failed"] = "loading"
    error: str | None = None
    omni: Omni | None = None
    worker: ModelWorker | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    load_seconds: float = 0.0
    profile: GenerationProfile | None = None
    capabilities: TTSCapabilities | None = None
    #: a multi-stage model's output modalities -> samples per second (None but for audio)
    outputs: dict[str, int | None] = field(default_factory=dict)
    #: a multi-stage model's voices (the default first) and the stage that takes them
    stage_voices: tuple[str, ...] = ()
    voice_stage: str | None = None
    #: the chat content part types its entry stage reads
    reads: tuple[str, ...] = ("text",)

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def task(self) -> str:
        return self.identity.task

    @property
    def endpoints(self) -> tuple[str, ...]:
        return ENDPOINTS.get(self.task, ())

    @property
    def provider(self) -> str:
        return self.identity.provider.split(" ")[0] or "omni"

    @property
    def multi_stage(self) -> bool:
        return self.identity.modality == "pipeline"

    @property
    def voices(self) -> list[str]:
        if self.multi_stage:
            return list(self.stage_voices)
        return list(self.capabilities.voices) if self.capabilities is not None else []

    def effective(self, fields: dict[str, Any], name: str) -> Any:
        """The value a generation will use for ``name``: the request's, else the recipe's, else
        the model's default (None where the model has none, as a video setting of an image model)."""
        if name in fields:
            return fields[name]
        recipe = self.identity.recipe
        if recipe is not None and name in recipe.generation:
            return recipe.generation[name]
        attribute = _PROFILE_DEFAULTS.get(name)
        return getattr(self.profile, attribute) if self.profile is not None and attribute else None

    def state(self) -> str:
        if self.worker is not None and self.worker.fault is not None:
            return "failed"
        if self.status == "ready" and self.multi_stage and self.omni is not None:
            down = [f"stage {n!r} is {s}" for n, s in self.omni.pipeline.state.items() if s.startswith("down")]
            if down:  # past its restarts: the pipeline cannot serve until the server restarts
                self.error = "; ".join(down)
                return "failed"
        return self.status


class ModelTable:
    """Every served model by name, and the one loading thread."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.models: dict[str, Model] = {}

    def identify(self) -> None:
        """Which plugin serves each model directory, from its JSON files (no weights): a model
        nothing serves fails here, before the port is bound."""
        from omni_core.api import identify_model

        multi_stage = 0
        for source in self.config.models:
            outputs: dict[str, int | None] = {}
            voiced: Any = None
            entry: Any = None
            try:
                identity = identify_model(source.path, recipe=source.recipe)
                if identity.modality == "pipeline":
                    multi_stage += 1
                    outputs, voiced, entry = self._check_pipeline(source, identity)
            except OmniError as exc:
                raise type(exc)(f"model {source.name!r} ({source.path}): {exc.message}") from None
            if source.recipe is not None and identity.modality == "speech":
                raise RecipeError(
                    f"model {source.name!r} ({source.path}) is {identity.describe()}; recipes set image, video and "
                    "multi-stage models only: drop its --recipe"
                )
            if identity.task not in ENDPOINTS:
                raise ModelNotServedError(
                    f"model {source.name!r} ({source.path}) is {identity.describe()}; no route of this server "
                    f"serves {identity.task!r} models yet"
                )
            self.models[source.name] = Model(source, identity, outputs=outputs)
            if voiced is not None:
                self.models[source.name].stage_voices, self.models[source.name].voice_stage = voiced.voices, voiced.name
            if entry is not None:
                self.models[source.name].reads = entry.reads
        if self.config.stages and not multi_stage:
            raise RecipeError(
                f"--stage sets stages of a multi-stage model, and none is served here (stages given: "
                f"{sorted(self.config.stages)}); drop --stage"
            )

    def _check_pipeline(self, source: ModelSource, identity: ServedModel) -> tuple[dict[str, int | None], Any, Any]:
        """The recipe's placement and ``--stage`` against the model's topology, before the port is
        bound (no weights, no process): a mistake there fails ``omni serve`` at once. Returns
        what the model answers (output modality -> sample rate, None but for audio) and the stage
        that takes a voice (None: no voices), and the stage that takes the request."""
        from omni_core.pipeline.placement import plan_pipeline

        recipe = identity.recipe
        resolved = plan_pipeline(
            source.path,
            recipe=recipe.pipeline if recipe is not None else None,
            overrides=self.config.stages or None,
            model_class_name=recipe.model_class_name if recipe is not None else None,
        )
        outputs = {s.final: s.sample_rate for s in resolved.topology.stages if s.final is not None}
        return outputs, resolved.topology.voice_stage, resolved.topology.entry

    def load_all(self, make_worker: Any) -> None:
        """Load each model in turn (on the caller's thread); raise at the first that fails,
        leaving it marked failed."""
        for model in self.models.values():
            self.load(model, make_worker)

    def load(self, model: Model, make_worker: Any) -> None:
        from omni_core.api import Omni

        started = time.perf_counter()
        options: dict[str, Any] = {}
        if model.identity.modality == "generation":
            options = {"progress": False, **self.config.engine_options}
            if model.source.recipe is not None:
                options["recipe"] = model.source.recipe
        elif model.multi_stage:
            options = {"stages": self.config.stages or None}
            if model.source.recipe is not None:
                options["recipe"] = model.source.recipe
        try:
            omni = Omni(model.source.path, **options)
        except OmniError as exc:
            model.status, model.error = "failed", exc.message
            raise
        except Exception as exc:  # a plugin's own failure: named, cause chained
            model.status, model.error = "failed", f"{type(exc).__name__}: {exc}"
            raise ModelNotReadyError(f"model {model.name!r} failed to load: {model.error}", name=model.name) from exc
        model.omni = omni
        if model.identity.modality == "speech":
            model.capabilities = omni.capabilities
        elif not model.multi_stage:
            entry = model.identity.resolution.entry if model.identity.resolution is not None else None
            if entry is not None:
                model.profile = entry.load().profile_for(model.source.path)
        if not model.multi_stage:  # a pipeline queues and bounds its requests itself (max_requests)
            model.worker = make_worker(model)
            model.worker.start()
        model.load_seconds = time.perf_counter() - started
        model.status = "ready"

    # -- lookups --------------------------------------------------------------------------------

    def for_route(self, name: str | None, route: str) -> Model:
        """The model a request names (or the only one that serves ``route``), ready to run.
        404 for a name nobody serves or a model of the wrong kind, 503 while it loads."""
        noun = ROUTE_NOUNS[route]
        candidates = [m for m in self.models.values() if route in m.endpoints]
        if name is None:
            if len(candidates) != 1:
                names = ", ".join(m.name for m in candidates) or "none"
                raise UnknownExtensionError(
                    f'name the {noun} model with "model"; this server\'s {noun} models: {names}', field="model"
                )
            model = candidates[0]
        else:
            found = self.models.get(name)
            if found is None:
                names = ", ".join(m.name for m in candidates) or "none"
                raise UnknownExtensionError(
                    f"model {name!r} is not served here; {noun} models: {names} (GET /v1/models lists every model)",
                    field="model",
                    name=name,
                )
            if route not in found.endpoints:
                article = "an" if noun[0] in "aeiou" else "a"
                raise UnknownExtensionError(
                    f"model {name!r} is a {found.task} model, not {article} {noun} model; use {found.endpoints[0]}",
                    field="model",
                    name=name,
                )
            model = found
        state = model.state()
        if state == "loading":
            raise ModelNotReadyError(f"model {model.name!r} is still loading; retry shortly", name=model.name)
        if state == "failed":
            raise ModelNotReadyError(
                f"model {model.name!r} is out of service: {model.error or (model.worker and model.worker.fault)}",
                name=model.name,
            )
        return model

    def health(self) -> tuple[str, dict[str, str]]:
        states = {name: m.state() for name, m in self.models.items()}
        if any(s == "failed" for s in states.values()):
            return "failed", states
        if any(s == "loading" for s in states.values()):
            return "loading", states
        return "ready", states

    def close(self, timeout: float) -> None:
        """Drain every worker (up to ``timeout`` in all), then release the models."""
        deadline = time.monotonic() + timeout
        for model in self.models.values():
            if model.worker is not None:
                model.worker.stop(max(0.0, deadline - time.monotonic()))
        for model in self.models.values():
            if model.omni is not None:
                model.omni.close()
