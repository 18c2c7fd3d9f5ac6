"""What a multi-stage model *is*: its stages and the edges between them. Declared by the model
plugin, never by the user (the user's side is the placement, :mod:`omni_core.pipeline.placement`).

A model family whose class has ``topology_for(model_dir)`` is a pipeline model::

    PipelineTopology(
        name="omni-test",
        stages=[
            StageDef(name="tokens", kind="ar", engine="my_plugin.stages:TokenStage", emits="tokens",
                     final="text"),
            StageDef(name="hidden", kind="generation", engine="my_plugin.stages:HiddenStage",
                     inputs=["tokens"], emits="hidden"),
            StageDef(name="wave", kind="generation", engine="my_plugin.stages:WaveStage",
                     inputs=["hidden"], emits="audio", final="audio"),
        ],
    )

Rules, checked when the topology is built: stage names are unique; exactly one stage takes the
request (no ``inputs``); every other stage names exactly one upstream stage declared before it
(so the graph is a tree in execution order: fan-out is allowed, fan-in is not yet); at least one
stage is final for some output modality, and no modality has two final stages.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from omni_core.lazy import check_ref
from omni_core.pipeline.connector import Edge

#: the stage's execution model: autoregressive (token by token), generation (one pass per
#: chunk, no sampling loop), diffusion (a denoising loop)
StageKind = Literal["ar", "generation", "diffusion"]
#: where a stage's final output goes: the orchestrator's own end of the graph
OUTPUT = "output"
_NAME = r"^[a-z][a-z0-9_]{0,31}$"


class StageDef(BaseModel):
    """One stage, as the model plugin declares it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME)
    kind: StageKind
    #: ``module:Class`` of the stage's :class:`~omni_core.pipeline.stage.StageEngine`, imported
    #: in the process that runs the stage
    engine: str
    #: what the model's own engine (``engine``) is called where omni shows or takes a choice
    #: of engine (``omni explain pipeline``, a recipe's ``engine:``), e.g. ``transformers``
    engine_name: str = Field(default="model", pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    #: the checkpoint architecture of the weights this stage runs (``Qwen2ForCausalLM``, ...):
    #: what a registered stage engine (vLLM, ...) is matched on. None: only the model's own
    #: engine runs the stage
    architecture: str | None = None
    #: the upstream stage whose output this stage consumes; empty: the stage takes the request
    inputs: tuple[str, ...] = ()
    #: what one item of this stage's output is (``tokens``, ``hidden``, ``audio``, ...): shown by
    #: ``omni explain pipeline`` and carried on each edge
    emits: str = Field(min_length=1)
    #: the output modality this stage's items answer (``text``, ``audio``, ``image``); None: an
    #: intermediate stage
    final: str | None = None
    #: samples per second of the audio a stage final for ``audio`` answers (required there:
    #: the server writes WAV and streams PCM at this rate)
    sample_rate: int | None = Field(default=None, gt=0)
    #: the chat content part types the stage reads, when it takes the request (``text``,
    #: ``input_audio``, ``image_url``): the server passes those on and refuses others by name
    reads: tuple[str, ...] = ("text",)
    #: the voices this stage speaks in, the default first: a request's voice (the chat route's
    #: ``audio.voice``) goes to this stage as ``params["voice"]``. At most one stage has voices
    voices: tuple[str, ...] = ()
    #: engine options the model fixes (a recipe's ``engine_options`` for the stage go on top)
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> StageDef:
        check_ref(self.engine)
        if "__" in self.name:  # an edge's key joins two names with "__"
            raise ValueError(f"stage name {self.name!r} holds '__', which edge keys use to join stage names")
        if self.final == "audio" and self.sample_rate is None:
            raise ValueError(
                f"stage {self.name!r} is final for audio but declares no sample_rate: set it to the rate of "
                "the samples its items hold"
            )
        if len(self.inputs) > 1:
            raise ValueError(
                f"stage {self.name!r} names {len(self.inputs)} inputs {list(self.inputs)}; a stage consumes "
                "one upstream stage (fan-in is not supported yet)"
            )
        return self


class PipelineTopology(BaseModel):
    """The frozen graph of a pipeline model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    stages: tuple[StageDef, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> PipelineTopology:
        seen: set[str] = set()
        entries = [s.name for s in self.stages if not s.inputs]
        for stage in self.stages:
            if stage.name in seen:
                raise ValueError(f"stage name {stage.name!r} is declared twice")
            if stage.name == OUTPUT:
                raise ValueError(f"{OUTPUT!r} is the orchestrator's end of the graph, not a stage name")
            for source in stage.inputs:
                if source not in seen:
                    later = any(s.name == source for s in self.stages)
                    raise ValueError(
                        f"stage {stage.name!r} takes input from {source!r}, "
                        + (
                            "which is declared after it: declare stages in execution order"
                            if later
                            else "no such stage"
                        )
                    )
            seen.add(stage.name)
        if len(entries) != 1:
            raise ValueError(f"exactly one stage takes the request (has no inputs); found {len(entries)}: {entries}")
        finals: dict[str, str] = {}
        for stage in self.stages:
            if stage.final is None:
                continue
            if stage.final in finals:
                raise ValueError(
                    f"stages {finals[stage.final]!r} and {stage.name!r} are both final for {stage.final!r}"
                )
            finals[stage.final] = stage.name
        if not finals:
            raise ValueError("no stage is final for any output: set `final` on the stage whose items are the answer")
        voiced = [s.name for s in self.stages if s.voices]
        if len(voiced) > 1:
            raise ValueError(f"stages {voiced} all declare voices; one stage takes a request's voice")
        return self

    # -- questions about the graph -------------------------------------------------------------

    def stage(self, name: str) -> StageDef:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    @property
    def entry(self) -> StageDef:
        return next(s for s in self.stages if not s.inputs)

    @property
    def voice_stage(self) -> StageDef | None:
        """The stage that takes a request's voice, if the model has voices."""
        return next((s for s in self.stages if s.voices), None)

    @property
    def modalities(self) -> dict[str, str]:
        """Output modality -> the stage whose items answer it."""
        return {s.final: s.name for s in self.stages if s.final is not None}

    def downstream(self, name: str) -> list[str]:
        return [s.name for s in self.stages if name in s.inputs]

    def edges(self) -> list[Edge]:
        """Every stage-to-stage edge, then each final stage's edge to the output, in stage order."""
        inner = [Edge(src, s.name) for s in self.stages for src in s.inputs]
        return inner + [Edge(s.name, OUTPUT) for s in self.stages if s.final is not None]

    def plan(self, modalities: tuple[str, ...] | None = None) -> dict[str, tuple[str, ...]]:
        """Which stages a request asking for ``modalities`` runs (None: every modality), each with
        where its items go: downstream stages it must feed and ``"output"`` when it is final.
        A text-only request stops after the stage that is final for text."""
        finals = self.modalities
        wanted = tuple(finals) if modalities is None else modalities
        unknown = [m for m in wanted if m not in finals]
        if unknown or not wanted:
            raise ValueError(f"this pipeline answers {sorted(finals)}; cannot produce {unknown or 'nothing'}")
        needed: set[str] = set()
        for modality in wanted:  # every stage on the path from the entry to each final stage
            name: str | None = finals[modality]
            while name is not None:
                needed.add(name)
                stage = self.stage(name)
                name = stage.inputs[0] if stage.inputs else None
        plan: dict[str, tuple[str, ...]] = {}
        for stage in self.stages:
            if stage.name not in needed:
                continue
            targets = [d for d in self.downstream(stage.name) if d in needed]
            if stage.final in wanted:
                targets.append(OUTPUT)
            plan[stage.name] = tuple(targets)
        return plan
