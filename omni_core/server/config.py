"""What ``omni serve`` serves and every limit it keeps: one validated object, built by the CLI
from its flags (``omni serve --help`` documents each) or by Python callers directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from omni_core.generation.recipe import Recipe


class ModelSource(BaseModel):
    """One model to serve: the name clients call it by, its checkpoint directory, and an
    optional recipe (deploy settings and generation defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    path: Path
    #: a recipe file, or a recipe built in code (the embedded default's smaller size)
    recipe: Path | Recipe | None = None


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[ModelSource, ...] = Field(min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    #: clients must send ``Authorization: Bearer <api_key>``; None serves without a key
    api_key: str | None = None

    # -- limits: beyond any of them a request is refused (4xx), never half-served --------------
    #: requests waiting per model (not counting the batch running); beyond it 429 + Retry-After
    queue_size: int = Field(default=64, ge=1)
    #: a request still unfinished this long after it arrived is cancelled (504)
    request_timeout_s: float = Field(default=600.0, gt=0)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    #: characters of speech input (413 beyond; the model's own limit may be lower: 400)
    max_input_chars: int = Field(default=4096, ge=1)
    #: pixels of one generated image or video frame (width x height)
    max_pixels: int = Field(default=1024 * 1024, ge=1)
    max_images: int = Field(default=4, ge=1)
    max_steps: int = Field(default=100, ge=1)
    max_frames: int = Field(default=257, ge=1)

    # -- batching -----------------------------------------------------------------------------
    #: image requests run as one pipeline call, at most this many (1 turns batching off)
    max_batch: int = Field(default=8, ge=1)
    #: the least time the first request of a batch waits for companions while others arrive
    #: (see :mod:`omni_core.server.worker`; 0 never waits)
    batch_wait_ms: float = Field(default=5.0, ge=0)

    # -- video jobs -----------------------------------------------------------------------------
    #: finished video jobs (and their files) are kept this long, and at most this many
    job_ttl_s: float = Field(default=3600.0, gt=0)
    max_jobs: int = Field(default=100, ge=1)

    #: SIGTERM: stop accepting, let in-flight work finish for up to this long, then exit 0
    drain_timeout_s: float = Field(default=30.0, ge=0)
    #: engine options for every model (attention backend, offload, dtype), as ``Omni(...)`` takes
    engine_options: dict[str, object] = Field(default_factory=dict)
    #: stage settings of every multi-stage model served (stage -> fields, beating its recipe), as
    #: ``Omni(stages=...)`` takes them; the CLI's ``--stage STAGE.FIELD=VALUE``
    stages: dict[str, dict[str, Any]] = Field(default_factory=dict)
    #: show loading progress bars on the terminal (never per-request denoising bars)
    progress: bool = True

    @field_validator("models")
    @classmethod
    def _unique_names(cls, v: tuple[ModelSource, ...]) -> tuple[ModelSource, ...]:
        names = [m.name for m in v]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"model name(s) {doubled} are given twice; name each model once (--model NAME=DIR)")
        return v
