"""Saving generated outputs: PNG, MP4 (H.264) and GIF, each with the generation's metadata."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from omni_core.generation import media
from omni_core.generation.outputs import GeneratedImage, GeneratedVideo, GenerationMetadata, GenerationResult
from omni_core.generation.request import GenerationProfile, GenerationRequest

IMAGE = GenerationProfile(
    task="text-to-image", default_width=32, default_height=16, default_steps=2, default_guidance=1
)
VIDEO = GenerationProfile(
    task="text-to-video",
    default_width=32,
    default_height=16,
    default_steps=2,
    default_guidance=1,
    default_frames=9,
    frames_step=4,
    frames_offset=1,
    default_fps=8,
)


def _pixels(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def _image_result(n: int = 1) -> GenerationResult:
    request = IMAGE.resolve(GenerationRequest(prompt="a red fox", seed=7, num_outputs=n))
    images = [GeneratedImage(_pixels(i, 16, 32, 3), index=i) for i in range(n)]
    return GenerationResult(images, [], GenerationMetadata("tiny", "fam", "omni-plugin-fam 0.1", request))


def _video_result() -> GenerationResult:
    request = VIDEO.resolve(GenerationRequest(prompt="waves", seed=3))
    video = GeneratedVideo(_pixels(0, 9, 16, 32, 3), fps=8)
    return GenerationResult([], [video], GenerationMetadata("tiny", "vid", "omni-plugin-vid 0.1", request))


def test_png_keeps_pixels_and_metadata(tmp_path: Path) -> None:
    from PIL import Image

    result = _image_result()
    [path] = result.save(tmp_path / "fox.png")
    assert path == tmp_path / "fox.png"
    assert np.array_equal(np.asarray(Image.open(path)), result.images[0].pixels)
    meta = media.read_png_metadata(path)
    assert (meta["model"], meta["seed"], meta["steps"], meta["prompt"]) == ("tiny", 7, 2, "a red fox")


def test_several_outputs_get_numbered_files_and_a_directory_names_them_by_seed(tmp_path: Path) -> None:
    assert [p.name for p in _image_result(2).save(tmp_path / "fox.png")] == ["fox-1.png", "fox-2.png"]
    assert [p.name for p in _image_result(1).save(tmp_path)] == ["fam-seed7.png"]


def test_mp4_is_h264_with_every_frame_and_the_metadata(tmp_path: Path) -> None:
    [path] = _video_result().save(tmp_path / "waves.mp4")
    probe = media.probe_video(path)
    assert probe["codec"].startswith("h264") and probe["size"] == (32, 16) and probe["frames"] == 9
    assert probe["fps"] == 8
    assert (probe["metadata"]["seed"], probe["metadata"]["steps"], probe["metadata"]["family"]) == (3, 2, "vid")


def test_gif_has_every_frame_and_the_metadata(tmp_path: Path) -> None:
    from PIL import Image

    [path] = _video_result().save(tmp_path / "waves.gif")
    with Image.open(path) as gif:
        assert gif.n_frames == 9 and gif.size == (32, 16)
        assert json.loads(gif.info["comment"])["seed"] == 3


def test_formats_are_checked_against_the_output_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot write an image as 'mp4'"):
        _image_result().save(tmp_path / "x.mp4")
    with pytest.raises(ValueError, match="cannot write a video as 'png'"):
        _video_result().save(tmp_path / "x.png")


def test_odd_sizes_are_refused_by_h264_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(media.MediaEncodingError, match="even frame sizes"):
        media.write_video(tmp_path / "odd.mp4", _pixels(0, 3, 15, 33, 3), 8, "mp4", {})
