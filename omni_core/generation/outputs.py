"""Typed results of an image or video generation, and saving them.

Pixels are numpy ``uint8`` arrays (``H x W x 3`` for an image, ``F x H x W x 3`` for a
video), so results cross process boundaries and reach any encoder without torch. Saving goes
through :mod:`omni_core.generation.media`: PNG for images, MP4 (H.264) or GIF for video, each
carrying the model, seed and steps in its metadata.

Where outputs go is decided by :func:`plan_outputs` before anything loads (``omni generate``
calls it first), and :meth:`GenerationResult.save` follows the same plan:

* ``--out fox.png`` with one output writes ``fox.png``, replacing it if it exists: you named it.
* ``--out fox.png -n 3`` writes ``fox-1.png`` ... ``fox-3.png``; a directory (or no ``--out``)
  gets ``<family>-seed<seed>.png`` (``-1`` ... for several). omni derived these names, so
  it never overwrites a file already there: an :class:`OutputError` names it first.
* The format comes from ``--format``, else the file's suffix, else PNG (image) or MP4 (video),
  and must be one the model's output kind has; a ``--format`` that contradicts the suffix
  is an error, not a PNG hidden in ``x.mp4``.
* Every file is written to a temporary name beside it and renamed at the end
  (:func:`omni_core.fsutil.atomic_output`): a failed or killed run never leaves a truncated
  file where a good one was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_core.errors import OutputError
from omni_core.generation.request import ResolvedGeneration

IMAGE_FORMATS = ("png",)
VIDEO_FORMATS = ("mp4", "gif")


def plan_outputs(out: str | Path | None, fmt: str | None, kind: str, n: int = 1, *, stem: str = "output") -> list[Path]:
    """The files that ``n`` outputs of ``kind`` (``"image"`` or ``"video"``) go to, for an
    ``out`` path (a file, an existing directory, or None for the current directory) and a
    ``fmt`` (None: from the file's suffix, else the kind's default). ``stem`` names the files
    in a directory (e.g. ``"flux1-schnell-seed0"``). Torch-free and touches nothing, so the
    CLI calls it before any weight loads; raises :class:`OutputError` for a format the kind
    does not have, a ``fmt`` that contradicts the suffix, or a derived name already taken.
    """
    if kind not in ("image", "video"):
        raise ValueError(f"kind must be 'image' or 'video', not {kind!r}")
    allowed = VIDEO_FORMATS if kind == "video" else IMAGE_FORMATS
    article = "a video" if kind == "video" else "an image"
    path = Path(out).expanduser() if out is not None else Path.cwd()
    chosen = fmt.lower().lstrip(".") if fmt else None
    if chosen is not None and chosen not in allowed:
        raise OutputError(f"cannot write {article} as {chosen!r}; choose one of: {', '.join(allowed)}")
    if path.is_dir():
        # names omni makes up in a directory take the next free number: a rerun keeps both files
        suffix = f".{chosen or allowed[0]}"
        return _free_names(path, stem, suffix, n)
    named = path.suffix.lstrip(".").lower()
    if named and chosen is None:
        if named not in allowed:
            raise OutputError(
                f"cannot write {article} as {named!r} (from {path.name!r}); name the file "
                f"{' or '.join('.' + a for a in allowed)}, or pass --format ({', '.join(allowed)})"
            )
        chosen = named
    elif named and named != chosen:
        raise OutputError(
            f"--format {chosen} does not match the output file {path.name!r}; name it {path.stem}.{chosen}, "
            "or drop --format"
        )
    chosen = chosen or allowed[0]
    directory, base, suffix = path.parent, path.stem if named else path.name, path.suffix or f".{chosen}"
    if n == 1:
        return [directory / f"{base}{suffix}"]  # the file the user named: replaced if it exists
    # -n with a named file: NAME-1 ... NAME-n, and none of them may be an unrelated file
    targets = [directory / f"{base}-{i}{suffix}" for i in range(1, n + 1)]
    taken = [t for t in targets if t.exists() or t.is_symlink()]
    if taken:
        names = ", ".join(str(t) for t in taken)
        raise OutputError(
            f"{names} already exist{'s' if len(taken) == 1 else ''}; omni does not overwrite files it names itself. "
            "Pass --out with another name (a single output named with --out is replaced), or move them away"
        )
    return targets


def _free_names(directory: Path, stem: str, suffix: str, n: int) -> list[Path]:
    """``n`` names in ``directory`` that no file has: ``STEM.EXT`` for one output if free, then
    ``STEM-1.EXT``, ``STEM-2.EXT``, ... skipping every name that is taken."""
    found: list[Path] = []
    first = directory / f"{stem}{suffix}"
    if n == 1 and not (first.exists() or first.is_symlink()):
        return [first]
    i = 1
    while len(found) < n:
        candidate = directory / f"{stem}-{i}{suffix}"
        if not (candidate.exists() or candidate.is_symlink()):
            found.append(candidate)
        i += 1
    return found


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
    #: the cache backend's account of this output's steps: backend, settings, quality, and the
    #: steps it computed and reused (None: no cache backend, every step computed)
    cache: dict[str, Any] | None = None
    device: str = "cpu"
    dtype: str = "float32"
    random_weights: bool = False
    #: wall time of the pipeline call; a batched call's time is shared by every request in it
    seconds: float = 0.0
    #: how many requests ran in the one pipeline call that made this output (1: alone)
    batch_size: int = 1

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
            "cache": dict(self.cache) if self.cache else None,
            "device": self.device,
            "dtype": self.dtype,
            "random_weights": self.random_weights,
            "seconds": round(self.seconds, 4),
            "batch_size": self.batch_size,
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
        """Write every output, as :func:`plan_outputs` lays them out. ``path`` is a file
        (``fox.png``; several outputs get ``-1``, ``-2``, ... suffixes) or an existing directory
        (files named after the family and seed). ``format`` defaults to the file's suffix,
        else PNG for images and MP4 for video. Each file is written to a temporary name and
        renamed, so a failure leaves no truncated file; raises :class:`OutputError` or
        :class:`~omni_core.fsutil.FileWriteError`."""
        from omni_core.fsutil import FileWriteError, atomic_output, describe_os_error
        from omni_core.generation import media

        outputs: list[GeneratedImage | GeneratedVideo] = list(self.outputs)
        kind = "video" if self.videos else "image"
        stem = f"{self.metadata.family}-seed{self.seed}"
        targets = plan_outputs(path, format, kind, len(outputs), stem=stem)
        # one output at a path the caller named replaces it; names omni derived never overwrite
        named = len(outputs) == 1 and not Path(path).expanduser().is_dir()
        try:
            targets[0].parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FileWriteError(describe_os_error(exc, targets[0])) from None
        meta = self.metadata.to_dict()
        written = []
        for out, target in zip(outputs, targets, strict=True):
            fmt = target.suffix.lstrip(".").lower() or (VIDEO_FORMATS if self.videos else IMAGE_FORMATS)[0]
            with atomic_output(target, overwrite=named) as tmp:
                if isinstance(out, GeneratedVideo):
                    media.write_video(tmp, out.frames, out.fps, fmt, meta)
                else:
                    media.write_png(tmp, out.pixels, meta)
            written.append(target)
        return written
