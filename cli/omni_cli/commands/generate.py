"""``omni generate PROMPT``: an image (or a video, for a video model) from a checkpoint.

Without ``--model`` it runs the embedded default: a tiny checkpoint of
:data:`DEFAULT_IMAGE_FAMILY` that omni makes on first use under the cache directory. Its
weights are random: it checks the install (loading, attention, the denoising loop, encoding)
and draws noise, not a fox.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from omni_cli.output import fail, fail_with

#: the family of the embedded default model, and the seed of its random weights
DEFAULT_IMAGE_FAMILY = "flux1-schnell"
DEFAULT_IMAGE_SEED = 0
#: the embedded default draws at this size unless --width/--height say otherwise
DEFAULT_IMAGE_SIZE = 256


def default_model_dir() -> Path:
    from omni_core.config import cache_dir

    return cache_dir() / "tiny" / DEFAULT_IMAGE_FAMILY


def embedded_default(plugins: Any) -> Path:
    """The embedded default checkpoint, made now if missing or made by another plugin version
    (once, under a lock, when several processes start at once)."""
    from omni_cli.commands.models import ensure_tiny
    from omni_core.errors import UnknownExtensionError

    if DEFAULT_IMAGE_FAMILY not in plugins.models:
        raise UnknownExtensionError(
            f"the embedded default model needs the {DEFAULT_IMAGE_FAMILY!r} model family, which is "
            f"{plugins.models.why_missing(DEFAULT_IMAGE_FAMILY)}. Install it with `pip install omni-plugin-flux` "
            "(from a checkout: `pip install -e omni_plugins/flux`), or pass --model DIR",
            kind="model",
            name=DEFAULT_IMAGE_FAMILY,
        )
    directory = default_model_dir()
    ensure_tiny(plugins, DEFAULT_IMAGE_FAMILY, directory, seed=DEFAULT_IMAGE_SEED)
    return directory


def generate(
    prompt: str = typer.Argument(..., help="What to draw."),
    model: Path | None = typer.Option(
        None, "--model", help="Checkpoint directory. Default: the embedded tiny model (random weights)."
    ),
    model_class_name: str | None = typer.Option(
        None, "--model-class-name", help="Family or pipeline class to use instead of the checkpoint's own."
    ),
    recipe: Path | None = typer.Option(
        None, "--recipe", help="Recipe YAML (recipes/<family>.yaml); options win over it."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output file or directory. Default: <family>-seed<seed>.<format> here."
    ),
    fmt: str | None = typer.Option(None, "--format", help="png for images; mp4 (H.264) or gif for video."),
    negative_prompt: str | None = typer.Option(None, "--negative-prompt", help="What to steer away from."),
    width: int | None = typer.Option(None, "--width", help="Width in pixels. Default: the model's."),
    height: int | None = typer.Option(None, "--height", help="Height in pixels. Default: the model's."),
    steps: int | None = typer.Option(None, "--steps", help="Denoising steps. Default: the model's."),
    guidance: float | None = typer.Option(None, "--guidance", help="Guidance scale. Default: the model's."),
    seed: int | None = typer.Option(None, "--seed", help="Seed; the same seed gives the same pixels."),
    num_outputs: int = typer.Option(1, "--num-outputs", "-n", help="How many images or videos."),
    frames: int | None = typer.Option(None, "--frames", help="Video: number of frames. Default: the model's."),
    fps: int | None = typer.Option(None, "--fps", help="Video: frames per second. Default: the model's."),
    image: Path | None = typer.Option(None, "--image", help="Image-to-video: the image to animate."),
    extra: list[str] = typer.Option(
        [], "--extra", help="A model-specific option as KEY=VALUE (VALUE is JSON, else text); repeatable."
    ),
    attention_backend: str | None = typer.Option(
        None, "--attention-backend", help="Attention backend for every role (beats a recipe, OMNI_ATTENTION_BACKEND)."
    ),
    attention_config: str | None = typer.Option(
        None, "--attention-config", help='Per-role attention as JSON, e.g. {"per_role": {"cross": {"backend": "X"}}}.'
    ),
    offload: list[str] = typer.Option([], "--offload", help="Offload strategy (`omni plugins list` shows them)."),
    cache_backend: str | None = typer.Option(
        None, "--cache-backend", help="Step cache backend, e.g. teacache (`omni plugins list` shows them)."
    ),
    cache_config: str | None = typer.Option(
        None, "--cache-config", help='The cache backend\'s options as JSON, e.g. {"rel_l1_thresh": 0.4}.'
    ),
    cache_quality: str | None = typer.Option(
        None, "--cache-quality", help="lossless (every step computed) or high (a conservative profile)."
    ),
    dtype: str | None = typer.Option(None, "--dtype", help="Compute dtype, e.g. bfloat16. Default: the family's."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
) -> None:
    """Generate an image (or a video) from PROMPT with the model family that serves the checkpoint."""
    from omni_core.api import Omni, identify_model
    from omni_core.errors import ModelNotServedError, OmniError
    from omni_core.fsutil import check_writable_dir
    from omni_core.generation.model import validate_request
    from omni_core.generation.outputs import plan_outputs
    from omni_core.generation.recipe import load_recipe
    from omni_core.generation.request import GenerationRequest
    from omni_core.plugins import get_plugins
    from omni_core.tiny import read_marker

    if image is not None and not image.is_file():
        raise fail(f"input image {str(image)!r} is not a file")
    fields: dict[str, Any] = {
        "negative_prompt": negative_prompt,
        "width": width,
        "height": height,
        "num_inference_steps": steps,
        "guidance_scale": guidance,
        "seed": seed,
        "num_frames": frames,
        "fps": fps,
        "image": str(image) if image is not None else None,
        "cache_quality": cache_quality,
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    if extra:
        fields["extra"] = _parse_extra(extra)
    if num_outputs != 1:
        fields["num_outputs"] = num_outputs
    try:
        loaded_recipe = load_recipe(recipe) if recipe is not None else None
        request = GenerationRequest.parse(
            {**(loaded_recipe.generation if loaded_recipe else {}), "prompt": prompt, **fields}
        )
        plugins = get_plugins()
        default = model is None
        model_dir = embedded_default(plugins) if default else model
        assert model_dir is not None
        if default:
            size = {"width": DEFAULT_IMAGE_SIZE, "height": DEFAULT_IMAGE_SIZE}
            request = GenerationRequest.parse({**size, **request.model_dump(exclude_unset=True)})
        # Everything that needs no weights is checked before any weight loads: what serves the
        # model (JSON only), the request against the family's rules (its profile and its own
        # checks of --extra values), and where the outputs go.
        served = identify_model(model_dir, plugins=plugins, model_class_name=model_class_name, recipe=loaded_recipe)
        if served.modality != "generation" or served.resolution is None:
            raise ModelNotServedError(
                f"{model_dir} is {served.describe()}; `omni generate` makes images and videos. "
                f'Speak with it instead: omni speak "TEXT" --model {model_dir}',
                name=served.name,
            )
        resolved = validate_request(served.resolution.entry.load(), model_dir, request)
        # the seed is drawn now (when not given) so the output names are known before loading
        request = GenerationRequest.parse({**request.model_dump(exclude_unset=True), "seed": resolved.seed})
        kind = "video" if resolved.is_video else "image"
        stem = f"{served.name}-seed{resolved.seed}"
        targets = plan_outputs(out, fmt, kind, resolved.num_outputs, stem=stem)
        check_writable_dir(targets[0].parent, targets[0])
        options: dict[str, Any] = {"plugins": plugins, "progress": progress, "dtype": dtype}
        if model_class_name:
            options["model_class_name"] = model_class_name
        if loaded_recipe is not None:
            options["recipe"] = loaded_recipe
        if attention_backend or attention_config:
            options["attention"] = attention_config
            options["attention_backend"] = attention_backend
        if offload:
            options["offload"] = tuple(offload)
        if cache_backend is not None:
            options["cache"] = cache_backend
        if cache_config is not None:
            options["cache_config"] = parse_json_option("--cache-config", cache_config)
        if default:
            typer.echo(
                f"note: no --model given, so this is the embedded default: a tiny {DEFAULT_IMAGE_FAMILY} model "
                "with RANDOM WEIGHTS, for checking the install (it draws noise, not the prompt). "
                "Pass --model DIR to generate with a real checkpoint."
            )
        elif (read_marker(model_dir) or {}).get("random_weights"):
            typer.echo(
                "note: this checkpoint was made by `omni models make-tiny`: RANDOM WEIGHTS (noise, not pictures)."
            )
        start = time.perf_counter()
        with Omni(model_dir, **options) as omni:
            loaded = time.perf_counter()
            result = omni.generate(request)
            written = result.save(out if out is not None else Path.cwd(), fmt)
    except (OmniError, ValueError) as exc:
        raise fail_with(exc) from None
    meta = result.metadata
    req = meta.request
    shape = f"{req.width}x{req.height}" + (f", {req.num_frames} frames at {req.fps} fps" if req.is_video else "")
    rows = [
        ("family", f"{meta.family}  ({meta.provider})"),
        ("model", meta.model + ("  (random weights)" if meta.random_weights else "")),
        ("seed", str(req.seed)),
        ("steps", f"{req.num_inference_steps}, guidance {req.guidance_scale}"),
        ("size", shape),
        ("attention", ", ".join(f"{role}: {backend}" for role, backend in sorted(meta.attention.items()))),
        ("offload", meta.offload or "none"),
        *((("cache", cache_row(meta.cache)),) if meta.cache else ()),
        ("time", f"load {loaded - start:.2f} s, generate {meta.seconds:.2f} s on {meta.device} ({meta.dtype})"),
        *(("wrote", str(p)) for p in written),
    ]
    width_ = max(len(k) for k, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width_}}  {value}")


def cache_row(cache: dict[str, Any]) -> str:
    """``teacache (rel_l1_thresh=0.4, ...): 12 of 20 steps computed, 8 reused``"""
    steps = len(cache["computed"]) + len(cache["reused"])
    quality = f", quality {cache['quality']}" if cache.get("quality") else ""
    return (
        f"{cache['backend']} ({cache['settings']}{quality}): {len(cache['computed'])} of {steps} steps computed, "
        f"{len(cache['reused'])} reused"
    )


def parse_json_option(flag: str, text: str) -> dict[str, Any]:
    """A JSON object given on the command line, or a usage error naming the flag."""
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise fail(f"{flag} takes a JSON object, e.g. '{{\"rel_l1_thresh\": 0.4}}': {exc}", 2) from None
    if not isinstance(value, dict):
        raise fail(f"{flag} takes a JSON object, e.g. '{{\"rel_l1_thresh\": 0.4}}', not {text!r}", 2)
    return value


def _parse_extra(items: list[str]) -> dict[str, Any]:
    import json

    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise fail(f"--extra takes KEY=VALUE, got {item!r}")
        try:
            parsed[key.strip()] = json.loads(value)
        except ValueError:
            parsed[key.strip()] = value
    return parsed
