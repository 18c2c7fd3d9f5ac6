"""What an image or video generation asks for, and the rules a model family sets on it.

:class:`GenerationRequest` is what a user gives (every field optional but the prompt; unknown
fields are refused). :class:`GenerationProfile` is what a family declares: its task, defaults
and limits. :meth:`GenerationProfile.resolve` checks one against the other *before any
compute* and returns a :class:`ResolvedGeneration` with every value filled in, or raises
:class:`GenerationOptionError` naming the rule that was broken and what would be accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# defined in omni_core.errors (one error hierarchy); imported here so old imports keep working
from omni_core.errors import GenerationOptionError as GenerationOptionError
from omni_core.inputs import check_seed

Task = Literal["text-to-image", "text-to-video", "image-to-video"]
VIDEO_TASKS: frozenset[str] = frozenset({"text-to-video", "image-to-video"})


class GenerationRequest(BaseModel):
    """One generation. Fields left unset take the family's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    prompt: str = Field(min_length=1, description="What to generate.")
    negative_prompt: str | None = Field(default=None, description="What to steer away from (models that take one).")
    width: int | None = Field(default=None, description="Width in pixels; unset: the model's default.")
    height: int | None = Field(default=None, description="Height in pixels; unset: the model's default.")
    num_inference_steps: int | None = Field(default=None, description="Denoising steps; unset: the model's default.")
    guidance_scale: float | None = Field(
        default=None, description="Guidance scale; unset: the model's default (guidance-distilled models take none)."
    )
    #: the range is :data:`omni_core.inputs.SEED_LIMIT`'s, shared with speech
    seed: int | None = Field(
        default=None, description="0 to 4294967295; the same seed gives the same pixels. Unset: drawn and reported."
    )
    num_outputs: int = Field(default=1, description="How many images or videos.")
    num_frames: int | None = Field(default=None, description="Video only: frames; unset: the model's default.")
    fps: int | None = Field(default=None, description="Video only: frames per second; unset: the model's default.")
    #: image-to-video: a path to an image file, a PIL image or an HxWx3 uint8 array
    image: Any = Field(default=None, description="Image-to-video: the image to animate.")
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the model's own (`omni models list` and GET /v1/models name its family); "
        "an option it does not declare is refused.",
    )
    cache_quality: Literal["lossless", "high"] | None = Field(
        default=None,
        description="With a cache backend: lossless computes every step (the output equals an uncached run's), "
        "high a conservative profile; unset: the profile the model was opened with.",
    )

    @field_validator("prompt")
    @classmethod
    def _prompt_has_text(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the prompt is blank; describe what to generate")
        return v

    @field_validator("seed")
    @classmethod
    def _seed_in_range(cls, v: Any) -> Any:
        return check_seed(v)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> GenerationRequest:
        """Validate a plain dict, turning pydantic's errors into one readable message."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise GenerationOptionError.from_validation(
                exc, what="generation request", model=cls, noun="option"
            ) from None


class GenerationProfile(BaseModel):
    """A family's task, defaults and limits. Production defaults live here, in the model
    family, so every entry point (CLI, Python, a server) applies the same ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: Task
    default_width: int = Field(ge=1)
    default_height: int = Field(ge=1)
    #: width and height must be multiples of this (the VAE scale times the patch size)
    size_multiple: int = Field(default=16, ge=1)
    min_size: int = Field(default=16, ge=1)
    max_size: int = Field(default=4096, ge=1)
    default_steps: int = Field(ge=1)
    max_steps: int = Field(default=1000, ge=1)
    default_guidance: float = Field(ge=0)
    #: False for guidance-distilled models that ignore a guidance scale: setting one is refused
    uses_guidance: bool = True
    supports_negative_prompt: bool = True
    max_outputs: int = Field(default=8, ge=1)
    #: video: valid frame counts are ``frames_step * k + frames_offset`` up to ``max_frames``
    default_frames: int | None = None
    frames_step: int = Field(default=1, ge=1)
    frames_offset: int = Field(default=0, ge=0)
    max_frames: int | None = None
    default_fps: int | None = None
    #: model-specific options: name -> one-line description
    extra_options: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _coherent(self) -> GenerationProfile:
        if self.is_video and (self.default_frames is None or self.default_fps is None):
            raise ValueError("a video profile needs default_frames and default_fps")
        return self

    @property
    def is_video(self) -> bool:
        return self.task in VIDEO_TASKS

    @property
    def needs_image(self) -> bool:
        return self.task == "image-to-video"

    def frames_rule(self) -> str:
        if self.frames_step == 1:
            rule = f"at least {max(1, self.frames_offset)}"
        else:
            rule = f"{self.frames_step}*k+{self.frames_offset} (e.g. {self.frames_step + self.frames_offset}, "
            rule += f"{2 * self.frames_step + self.frames_offset}, {4 * self.frames_step + self.frames_offset})"
        return rule + (f", at most {self.max_frames}" if self.max_frames else "")

    def resolve(self, request: GenerationRequest) -> ResolvedGeneration:
        """Apply defaults and check every limit; raises :class:`GenerationOptionError`."""
        problems: list[str] = []
        width = self.default_width if request.width is None else request.width
        height = self.default_height if request.height is None else request.height
        for axis, value in (("width", width), ("height", height)):
            if not self.min_size <= value <= self.max_size or value % self.size_multiple:
                problems.append(
                    f"{axis} {value} is not allowed: it must be a multiple of {self.size_multiple} "
                    f"between {self.min_size} and {self.max_size}"
                )
        steps = self.default_steps if request.num_inference_steps is None else request.num_inference_steps
        if not 1 <= steps <= self.max_steps:
            problems.append(f"num_inference_steps {steps} is not allowed: it must be between 1 and {self.max_steps}")
        guidance = self.default_guidance
        if request.guidance_scale is not None:
            if not self.uses_guidance:
                problems.append("guidance_scale is not used by this model (it runs without guidance); leave it unset")
            elif request.guidance_scale < 0:
                problems.append(f"guidance_scale {request.guidance_scale} is negative; use 0 or more")
            guidance = request.guidance_scale
        if request.negative_prompt is not None and not self.supports_negative_prompt:
            problems.append("negative_prompt is not supported by this model; leave it unset")
        if not 1 <= request.num_outputs <= self.max_outputs:
            problems.append(
                f"num_outputs {request.num_outputs} is not allowed: it must be between 1 and {self.max_outputs}"
            )
        frames = fps = None
        if self.is_video:
            frames = self.default_frames if request.num_frames is None else request.num_frames
            fps = self.default_fps if request.fps is None else request.fps
            assert frames is not None and fps is not None  # guaranteed by _coherent
            bad = frames < max(1, self.frames_offset) or (frames - self.frames_offset) % self.frames_step
            if bad or (self.max_frames is not None and frames > self.max_frames):
                problems.append(f"num_frames {frames} is not allowed: this model takes {self.frames_rule()}")
            if not 1 <= fps <= 240:
                problems.append(f"fps {fps} is not allowed: it must be between 1 and 240")
        else:
            for name in ("num_frames", "fps"):
                if getattr(request, name) is not None:
                    problems.append(f"{name} applies to video models only; this model makes images ({self.task})")
        if self.needs_image and request.image is None:
            problems.append("this model animates an input image: pass image=PATH (--image on the command line)")
        if not self.needs_image and request.image is not None:
            problems.append(f"an input image is not used by this model ({self.task}); leave it unset")
        unknown = sorted(set(request.extra) - set(self.extra_options))
        if unknown:
            accepted = ", ".join(sorted(self.extra_options)) or "none"
            problems.append(f"unknown model option(s) {unknown}; this model accepts: {accepted}")
        if problems:
            raise GenerationOptionError("; ".join(problems))
        return ResolvedGeneration(
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            width=width,
            height=height,
            num_inference_steps=steps,
            guidance_scale=guidance,
            seed=_draw_seed() if request.seed is None else request.seed,
            num_outputs=request.num_outputs,
            num_frames=frames,
            fps=fps,
            image=request.image,
            extra=dict(request.extra),
            task=self.task,
            cache_quality=request.cache_quality,
        )


class ResolvedGeneration(BaseModel):
    """A request with the family's defaults applied and every limit checked."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    prompt: str
    negative_prompt: str | None
    width: int
    height: int
    num_inference_steps: int
    guidance_scale: float
    seed: int
    num_outputs: int
    num_frames: int | None
    fps: int | None
    image: Any
    extra: dict[str, Any]
    task: Task
    cache_quality: Literal["lossless", "high"] | None = None

    @property
    def is_video(self) -> bool:
        return self.task in VIDEO_TASKS

    def summary(self) -> dict[str, Any]:
        """The values worth recording next to an output (no image data)."""
        data = self.model_dump(exclude={"image"})
        if isinstance(self.image, (str, Path)):
            data["image"] = str(self.image)
        return data


def _draw_seed() -> int:
    import secrets

    return secrets.randbelow(2**31)
