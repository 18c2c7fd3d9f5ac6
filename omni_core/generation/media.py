"""Encoding generated pixels to files, with the generation's metadata inside.

* PNG: Pillow, metadata as ``tEXt`` chunks (``omni`` holds the whole record as JSON).
* MP4: H.264 (``libx264``, ``yuv420p``) through the ffmpeg binary that ``imageio-ffmpeg``
  ships, so no system ffmpeg is needed; metadata in the container's ``comment`` tag.
* GIF: Pillow, every frame, looping, metadata in the comment extension.

Needs the ``media`` extra (``pip install 'omni-core[media]'``); imported only when saving.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# defined in omni_core.errors (one error hierarchy); imported here so old imports keep working
from omni_core.errors import MediaEncodingError as MediaEncodingError


def _pil() -> Any:
    try:
        from PIL import Image, PngImagePlugin
    except ImportError:
        raise MediaEncodingError("writing images needs Pillow: pip install 'omni-core[media]'") from None
    return Image, PngImagePlugin


def write_png(path: Path | Any, pixels: Any, metadata: dict[str, Any]) -> None:
    """A PNG with ``metadata`` in its text chunks, to a path or a binary file object."""
    image_mod, png = _pil()
    info = png.PngInfo()
    info.add_text("omni", json.dumps(metadata, sort_keys=True))
    for key in ("model", "seed", "steps", "prompt"):
        info.add_text(key, str(metadata.get(key)))
    image_mod.fromarray(pixels).save(path, format="PNG", pnginfo=info)


def png_bytes(pixels: Any, metadata: dict[str, Any]) -> bytes:
    """The PNG :func:`write_png` writes, in memory (what a server sends)."""
    import io

    buffer = io.BytesIO()
    write_png(buffer, pixels, metadata)
    return buffer.getvalue()


def read_png_metadata(path: Path) -> dict[str, Any]:
    """The record :func:`write_png` stored (empty if the file has none)."""
    image_mod, _ = _pil()
    with image_mod.open(path) as img:
        raw = img.text.get("omni") if hasattr(img, "text") else None
    return json.loads(raw) if raw else {}


def write_video(path: Path, frames: Any, fps: int, fmt: str, metadata: dict[str, Any]) -> None:
    if fmt == "gif":
        _write_gif(path, frames, fps, metadata)
    elif fmt == "mp4":
        _write_mp4(path, frames, fps, metadata)
    else:
        raise MediaEncodingError(f"unknown video format {fmt!r}; use mp4 or gif")


def _write_gif(path: Path, frames: Any, fps: int, metadata: dict[str, Any]) -> None:
    image_mod, _ = _pil()
    images = [image_mod.fromarray(f) for f in frames]
    images[0].save(
        path,
        format="GIF",
        save_all=True,
        append_images=images[1:],
        duration=max(1, round(1000 / fps)),
        loop=0,
        comment=json.dumps(metadata, sort_keys=True).encode(),
    )


def _write_mp4(path: Path, frames: Any, fps: int, metadata: dict[str, Any]) -> None:
    try:
        import imageio_ffmpeg  # type: ignore[import-untyped]
    except ImportError:
        raise MediaEncodingError("writing MP4 needs imageio-ffmpeg: pip install 'omni-core[media]'") from None
    _, height, width, _ = frames.shape
    if width % 2 or height % 2:
        raise MediaEncodingError(f"H.264 (yuv420p) needs even frame sizes, got {width}x{height}; choose an even size")
    writer = imageio_ffmpeg.write_frames(
        str(path),
        (width, height),
        fps=fps,
        codec="libx264",
        pix_fmt_out="yuv420p",
        macro_block_size=1,
        quality=None,
        # mp4 keeps free-form tags only with use_metadata_tags
        output_params=[
            "-crf",
            "18",
            "-movflags",
            "use_metadata_tags",
            "-metadata",
            "comment=" + json.dumps(metadata, sort_keys=True),
        ],
        ffmpeg_log_level="error",
    )
    try:
        writer.send(None)  # start the encoder
        for frame in frames:
            writer.send(frame.tobytes())
    except Exception as exc:
        raise MediaEncodingError(f"ffmpeg failed writing {path}: {exc}") from None
    finally:
        writer.close()


def probe_video(path: Path) -> dict[str, Any]:
    """Codec, size, frame count and comment of a video written here (reads it back with the
    same bundled ffmpeg): used by tests and ``omni generate`` to confirm what was written."""
    import subprocess

    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    count = sum(1 for _ in reader)
    tags = subprocess.run(  # ffmetadata prints tags whole (the banner truncates long ones)
        [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(path), "-f", "ffmetadata", "-"],
        capture_output=True,
        text=True,
    ).stdout
    comment = next((line.split("=", 1)[1] for line in tags.splitlines() if line.startswith("comment=")), "")
    comment = re.sub(r"\\(.)", r"\1", comment)  # ffmetadata escapes = ; # \ with a backslash
    try:
        metadata = json.loads(comment) if comment else {}
    except ValueError:
        metadata = {}
    return {
        "codec": meta.get("codec"),
        "size": tuple(meta.get("size", ())),
        "fps": meta.get("fps"),
        "frames": count,
        "metadata": metadata,
    }
