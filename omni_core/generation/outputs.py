"""Typed results of an image or video generation, and saving them.

Pixels are numpy ``uint8`` arrays (``H x W x 3`` for an image, ``F x H x W x 3`` for a
video), so results cross process boundaries and reach any encoder without torch. Saving goes
through :mod:`omni_core.generation.media`: PNG for images, MP4 (H.264) or GIF for video, each
carrying the model, seed and steps in its metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_core.generation.request import ResolvedGeneration

IMAGE_FORMATS = ("png",)
VIDEO_FORMATS = ("mp4", "gif")


@dataclass(frozen=True)
class GenerationMetadata:
    """What made an output: recorded in every file written."""

    model: str
    family: str
    provider: str
    request: ResolvedGeneration
    #: attention backend per role that actually ran, e.g. {"self": "TORCH_SDPA"}
    attention: dict[str, str] = field(default_factory=dict)
    offload: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    random_weights: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "family": self.family,
            "provider": self.provider,
            "seed": self.request.seed,
            "steps": self.request.num_inference_steps,
            "guidance_scale": self.request.guidance_scale,
            "width": self.request.width,
            "height": self.request.height,
            "num_frames": self.request.num_frames,
            "fps": self.request.fps,
            "prompt": self.request.prompt,
            "negative_prompt": self.request.negative_prompt,
            "attention": dict(self.attention),
            "offload": self.offload,
            "device": self.device,
            "dtype": self.dtype,
            "random_weights": self.random_weights,
            "seconds": round(self.seconds, 4),
        }


@dataclass(frozen=True)
class GeneratedImage:
    pixels: Any  # numpy uint8, H x W x 3
    index: int = 0

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    def to_pil(self) -> Any:
        from PIL import Image

        return Image.fromarray(self.pixels)


@dataclass(frozen=True)
class GeneratedVideo:
    frames: Any  # numpy uint8, F x H x W x 3
    fps: int
    index: int = 0

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    @property
    def width(self) -> int:
        return int(self.frames.shape[2])

    @property
    def height(self) -> int:
        return int(self.frames.shape[1])


@dataclass(frozen=True)
class GenerationResult:
    """Everything one generation produced: ``images`` or ``videos`` (per the model's task)."""

    images: list[GeneratedImage]
    videos: list[GeneratedVideo]
    metadata: GenerationMetadata

    @property
    def outputs(self) -> list[GeneratedImage] | list[GeneratedVideo]:
        return self.videos if self.videos else self.images

    @property
    def seed(self) -> int:
        return self.metadata.request.seed

    def save(self, path: str | Path, format: str | None = None) -> list[Path]:
        """Write every output. ``path`` is a file (``fox.png``; several outputs get ``-1``,
        ``-2``, ... suffixes) or an existing directory (files named after the seed).
        ``format`` defaults to the file's suffix, else PNG for images and MP4 for video."""
        from omni_core.generation import media

        path = Path(path).expanduser()
        video = bool(self.videos)
        allowed = VIDEO_FORMATS if video else IMAGE_FORMATS
        if path.is_dir():
            fmt = (format or allowed[0]).lower()
            stem, directory = f"{self.metadata.family}-seed{self.seed}", path
        else:
            fmt = (format or path.suffix.lstrip(".") or allowed[0]).lower()
            stem, directory = path.stem if path.suffix else path.name, path.parent
        if fmt not in allowed:
            kind = "a video" if video else "an image"
            raise ValueError(f"cannot write {kind} as {fmt!r}; choose one of: {', '.join(allowed)}")
        directory.mkdir(parents=True, exist_ok=True)
        meta = self.metadata.to_dict()
        written = []
        outputs = self.outputs
        for out in outputs:
            name = f"{stem}.{fmt}" if len(outputs) == 1 else f"{stem}-{out.index + 1}.{fmt}"
            target = directory / name
            if isinstance(out, GeneratedVideo):
                media.write_video(target, out.frames, out.fps, fmt, meta)
            else:
                media.write_png(target, out.pixels, meta)
            written.append(target)
        return written
