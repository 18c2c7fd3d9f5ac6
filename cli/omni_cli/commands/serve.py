"""``omni serve``: the models omni runs, behind an OpenAI-compatible HTTP API.

Without ``--model`` it serves the embedded defaults: the tiny image model (``tiny-image``),
made on first use as ``omni generate`` makes it, and the default voice ``omni speak`` uses
(the installed real voice under its own name, e.g. ``joe``; else the random fallback,
``tiny-voice``). The server itself is :mod:`omni_core.server`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from omni_cli.output import echo, fail

#: the name the embedded image model is served under (the voice: :func:`speak.choose_default`)
DEFAULT_IMAGE_NAME = "tiny-image"


def serve(
    model: list[str] = typer.Option(
        [],
        "--model",
        "-m",
        metavar="[NAME=]DIR",
        help="A checkpoint directory to serve, as DIR or NAME=DIR (NAME: what clients call it; "
        "default: the directory's name). Repeatable. Default: the embedded tiny image model and the default voice.",
    ),
    recipe: list[str] = typer.Option(
        [],
        "--recipe",
        metavar="[NAME=]FILE",
        help="Recipe YAML for a model, as FILE or NAME=FILE (recipes/<family>.yaml). With one "
        "--model, FILE applies to it; a recipe whose 'model' is a local directory serves that directory.",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", "-p", help="Port to listen on (0: any free port; the URL is printed)."),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        help="Require 'Authorization: Bearer KEY' on /v1/ routes (off by default; "
        "OMNI_API_KEY sets it too, out of the process list).",
    ),
    queue_size: int = typer.Option(64, "--queue-size", help="Requests that may wait per model; beyond: 429."),
    max_batch: int = typer.Option(8, "--max-batch", help="Image requests run as one pipeline call, at most (1: off)."),
    batch_wait_ms: float = typer.Option(
        5.0,
        "--batch-wait-ms",
        help="Least time a batch waits for companions while requests arrive together (up to a quarter of the last "
        "run, at most 50 ms; a lone client never waits; 0: never wait).",
    ),
    request_timeout: float = typer.Option(
        600.0, "--request-timeout", help="Seconds before a request is cancelled (504)."
    ),
    max_body_mb: float = typer.Option(16.0, "--max-body-mb", help="Largest request body in MiB (413 beyond)."),
    max_input_chars: int = typer.Option(4096, "--max-input-chars", help="Longest speech input (413 beyond)."),
    max_pixels: int = typer.Option(1024 * 1024, "--max-pixels", help="Most pixels per image or video frame (W*H)."),
    max_images: int = typer.Option(4, "--max-images", help="Most images per request (n)."),
    max_steps: int = typer.Option(100, "--max-steps", help="Most denoising steps per request."),
    max_frames: int = typer.Option(257, "--max-frames", help="Most video frames per request."),
    job_ttl: float = typer.Option(3600.0, "--job-ttl", help="Seconds a finished video job and its file are kept."),
    max_jobs: int = typer.Option(100, "--max-jobs", help="Most finished video jobs kept (the oldest go first)."),
    drain_timeout: float = typer.Option(
        30.0, "--drain-timeout", help="On SIGTERM: seconds to finish in-flight work before exiting."
    ),
    attention_backend: str | None = typer.Option(
        None, "--attention-backend", help="Attention backend of every image and video model."
    ),
    offload: list[str] = typer.Option(
        [], "--offload", metavar="STRATEGY", help="Offload strategy of every image and video model."
    ),
    dtype: str | None = typer.Option(None, "--dtype", help="Compute dtype of every image and video model."),
    cache_backend: str | None = typer.Option(
        None, "--cache-backend", help="Step cache backend of every image and video model (e.g. teacache)."
    ),
    cache_config: str | None = typer.Option(None, "--cache-config", help="The cache backend's options as JSON."),
    stage: list[str] = typer.Option(
        [],
        "--stage",
        metavar="STAGE.FIELD=VALUE",
        help="A stage's setting for every multi-stage model served, beating its recipe: STAGE.FIELD=VALUE, VALUE "
        "read as YAML (hidden.placement=inprocess). Repeatable; omni explain pipeline --stage shows the result.",
    ),
) -> None:
    """Serve models behind an OpenAI-compatible API (images, speech, video, chat), with a playground at /."""
    from omni_core.config import server_api_key
    from omni_core.errors import OmniError
    from omni_core.pipeline.placement import parse_stage_overrides
    from omni_core.server import ModelSource, ServerConfig
    from omni_core.server.runner import check_extras
    from omni_core.server.runner import serve as run_server

    check_extras()  # before making the embedded defaults: the fix comes first
    try:
        stages = parse_stage_overrides(stage)
    except OmniError as exc:
        raise fail(exc.message + " (see omni serve --help)", 2) from None
    sources = _sources(model, recipe)
    engine: dict[str, Any] = {}
    if attention_backend:
        engine["attention_backend"] = attention_backend
    if offload:
        engine["offload"] = tuple(offload)
    if dtype:
        engine["dtype"] = dtype
    if cache_backend:
        engine["cache"] = cache_backend
    if cache_config:
        from omni_cli.commands.generate import parse_json_option

        engine["cache_config"] = parse_json_option("--cache-config", cache_config)
    try:
        config = ServerConfig(
            models=tuple(ModelSource(**s) for s in sources),
            host=host,
            port=port,
            api_key=api_key or server_api_key(),
            queue_size=queue_size,
            max_batch=max_batch,
            batch_wait_ms=batch_wait_ms,
            request_timeout_s=request_timeout,
            max_body_bytes=int(max_body_mb * 1024 * 1024),
            max_input_chars=max_input_chars,
            max_pixels=max_pixels,
            max_images=max_images,
            max_steps=max_steps,
            max_frames=max_frames,
            job_ttl_s=job_ttl,
            max_jobs=max_jobs,
            drain_timeout_s=drain_timeout,
            engine_options=engine,
            stages=stages,
        )
    except ValueError as exc:  # pydantic's ValidationError: worded as every omni error is
        from pydantic import ValidationError

        from omni_core.errors import format_validation_error

        if not isinstance(exc, ValidationError):
            raise
        raise fail(format_validation_error(exc, what="omni serve options") + " (see omni serve --help)", 2) from None

    def say(line: str) -> None:
        echo(line)

    code = run_server(config, echo=say)
    raise typer.Exit(code)


def _sources(models: list[str], recipes: list[str]) -> list[dict[str, Any]]:
    """--model and --recipe values as ModelSource fields; the embedded defaults without --model."""
    named_recipes: dict[str | None, Path] = {}
    for value in recipes:
        name, path = _split(value)
        named_recipes[name] = Path(path).expanduser()
    sources: list[dict[str, Any]] = []
    for value in models:
        name, path = _split(value)
        directory = Path(path).expanduser()
        sources.append({"name": name or directory.name or "model", "path": directory})
    if not sources:
        for name, recipe_path in list(named_recipes.items()):
            served = _recipe_model(recipe_path)
            if served is not None:
                sources.append({"name": name or recipe_path.stem, "path": served, "recipe": recipe_path})
                named_recipes.pop(name)
    if not sources:
        sources = _embedded_defaults()
    for name, recipe_path in named_recipes.items():
        if name is None:
            if len(sources) != 1:
                raise fail(f"--recipe {recipe_path} applies to which model? name it: --recipe NAME={recipe_path}", 2)
            sources[0]["recipe"] = recipe_path
            continue
        match = [s for s in sources if s["name"] == name]
        if not match:
            names = ", ".join(s["name"] for s in sources)
            raise fail(f"--recipe {name}={recipe_path}: no model is named {name!r} (models: {names})", 2)
        match[0]["recipe"] = recipe_path
    return sources


def _split(value: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> (NAME, PATH); a bare path (even one holding '=' after a '/') -> (None, PATH)."""
    name, sep, rest = value.partition("=")
    if sep and name and "/" not in name and rest:
        return name, rest
    return None, value


def _recipe_model(recipe_path: Path) -> Path | None:
    """The local directory a recipe's ``model`` names, if it is one."""
    from omni_core.generation.recipe import load_recipe

    recipe = load_recipe(recipe_path)
    candidate = Path(recipe.model).expanduser() if recipe.model else None
    if candidate is not None and not candidate.is_absolute():
        candidate = (recipe_path.parent / candidate).resolve()
    if candidate is not None and candidate.is_dir():
        return candidate
    raise fail(
        f"recipe {recipe_path} names model {recipe.model!r}, which is not a local directory; serve a checkpoint "
        f"directory with it: omni serve --model DIR --recipe {recipe_path}",
        2,
    )


def _embedded_defaults() -> list[dict[str, Any]]:
    from omni_cli.commands import generate, speak
    from omni_core.generation.recipe import Recipe
    from omni_core.plugins import get_plugins

    plugins = get_plugins()
    # the embedded image model draws at the size `omni generate` uses for it unless asked otherwise
    size = {"width": generate.DEFAULT_IMAGE_SIZE, "height": generate.DEFAULT_IMAGE_SIZE}
    voice = speak.choose_default(plugins)
    echo(f"omni serve: {voice.name} is {voice.note}")
    return [
        {"name": DEFAULT_IMAGE_NAME, "path": generate.embedded_default(plugins), "recipe": Recipe(generation=size)},
        {"name": voice.name, "path": voice.path},
    ]
