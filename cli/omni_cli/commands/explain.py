"""``omni explain ...``: how a selection was made, with every candidate and the reason."""

from __future__ import annotations

from pathlib import Path

import typer

from omni_cli._typer import OmniTyper
from omni_cli.output import EXIT_PROBLEMS, EXIT_STRICT, echo, emit_json, fail_with

app = OmniTyper(help="Explain how omni chose something: candidates, rejections, winner.", no_args_is_help=True)


@app.command("platform")
def explain_platform_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Which platform omni uses here, and why each other one was not chosen."""
    from omni_core.platforms import explain_platform
    from omni_core.plugins import load_plugins

    plugins = load_plugins()
    choice, explanation = explain_platform(plugins)
    if as_json:
        emit_json(explanation.to_dict())
    else:
        echo(explanation.render())
    if choice is None:
        raise typer.Exit(EXIT_PROBLEMS)
    if plugins.settings.strict and explanation.failures:
        echo("error: a platform probe failed (OMNI_STRICT_PLUGINS=1)", err=True)
        raise typer.Exit(EXIT_STRICT)


@app.command("attention")
def explain_attention_cmd(
    roles: list[str] = typer.Option(
        ["self", "cross"], "--role", help="Role to explain, as ROLE or ROLE:CATEGORY; repeatable."
    ),
    config: str = typer.Option("", "--config", help="Attention config as JSON, or a backend name."),
    backend: str = typer.Option(
        "", "--attention-backend", help="Global backend (shorthand for default); beats OMNI_ATTENTION_BACKEND."
    ),
    platform: str = typer.Option("", "--platform", help="Explain for this platform (as OMNI_PLATFORM would)."),
    head_size: int = typer.Option(0, "--head-size", help="Head size of the call (0: any)."),
    dtype: str = typer.Option("", "--dtype", help="Dtype of the call, e.g. bfloat16 (empty: any)."),
    mask: bool = typer.Option(False, "--mask", help="The call passes an attention mask."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Which attention backend each role gets on this platform, and why."""
    import dataclasses

    from omni_core.attention.config import layered_attention
    from omni_core.attention.selector import CallProfile, describe_backends, explain_attention
    from omni_core.config import EngineSettings, current_settings
    from omni_core.platforms import PlatformChoice, select_platform
    from omni_core.plugins import load_plugins
    from omni_core.selection import Explanation

    settings = current_settings()
    if platform:  # the flag beats OMNI_PLATFORM and the config file; plugins see it in omni_configure
        settings = dataclasses.replace(settings, platform=platform)
    plugins = load_plugins(settings)
    if platform:
        # explaining for another machine: the platform is used without its hardware, so its
        # probe is not asked (a forced OMNI_PLATFORM would refuse absent hardware)
        chosen_platform = PlatformChoice(plugins.platforms.get(platform), Explanation("platform")).instantiate()
    else:
        chosen_platform = select_platform(plugins).instantiate()
    # the same layering as a run, less the recipe: flags > OMNI_ATTENTION_BACKEND > the platform's chain
    attention = layered_attention(
        config or None, backend=backend or None, environment=EngineSettings.from_env().attention_backend
    )
    call = CallProfile(head_size=head_size or None, dtype=dtype or None, mask=mask)
    results = []
    failed = False
    for role_text in roles:
        role, _, category = role_text.partition(":")
        choice, explanation = explain_attention(plugins, chosen_platform, attention, role, category or None, call)
        failed |= choice is None
        results.append(explanation)
    if as_json:
        emit_json(
            {
                "platform": chosen_platform.name,
                "roles": [e.to_dict() for e in results],
                "backends": describe_backends(plugins, chosen_platform),
            }
        )
    else:
        shown = f"head_size={head_size or 'any'} dtype={dtype or 'any'} mask={mask}"
        echo(f"platform {chosen_platform.name}; call: {shown}\n")
        echo("\n\n".join(e.render() for e in results))
    if failed:
        raise typer.Exit(EXIT_PROBLEMS)


@app.command("tts")
def explain_tts_cmd(
    model: Path = typer.Option(..., "--model", help="Checkpoint directory, voice file, or installed voice name."),
    adapter: str = typer.Option("", "--adapter", help="Explain an explicit choice of this TTS adapter."),
    model_stage: str = typer.Option("", "--model-stage", help="The deploy model_stage, if the deployment names one."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Which TTS adapter serves a model: every candidate, why each lost, and the winner."""
    from omni_core.errors import OmniError
    from omni_core.plugins import load_plugins
    from omni_core.speech.detection import explain_tts, locate_model, overlapping_adapters

    plugins = load_plugins()
    try:
        identity = locate_model(plugins, model, model_stage or None)
        choice, explanation = explain_tts(plugins, identity, adapter or None)
    except OmniError as exc:
        raise fail_with(exc) from None
    overlaps = overlapping_adapters(plugins)
    if as_json:
        emit_json(
            {
                "model": str(identity.model_dir),
                "architectures": list(identity.architectures),
                "model_type": identity.model_type,
                "model_stage": identity.model_stage,
                **explanation.to_dict(),
                "overlaps": overlaps,
            }
        )
    else:
        echo(explanation.render())
        for problem in overlaps:
            echo(f"warning: {problem}", err=True)
    if choice is None:
        raise typer.Exit(EXIT_PROBLEMS)


@app.command("model")
def explain_model_cmd(
    model: Path = typer.Option(..., "--model", help="Checkpoint directory (diffusers layout, or config.json)."),
    model_class_name: str = typer.Option("", "--model-class-name", help="Explain an explicit family or class."),
    recipe: Path | None = typer.Option(None, "--recipe", help="Recipe YAML whose pins apply."),
    attention_backend: str = typer.Option(
        "", "--attention-backend", help="Attention backend for every role (beats a recipe, OMNI_ATTENTION_BACKEND)."
    ),
    attention_config: str = typer.Option("", "--attention-config", help="Per-role attention config as JSON."),
    offload: list[str] = typer.Option([], "--offload", help="Offload strategy to check."),
    cache_backend: str = typer.Option("", "--cache-backend", help="Cache backend to check."),
    cache_config: str = typer.Option("", "--cache-config", help="The cache backend's options as JSON."),
    dtype: str = typer.Option("", "--dtype", help="Compute dtype to check."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Which family serves an image or video checkpoint, which attention backend each of its
    roles gets, which offload strategy and cache backend run, and why: without loading a weight."""
    from omni_core.errors import OmniError
    from omni_core.generation.model import EngineOptions
    from omni_core.generation.recipe import load_recipe
    from omni_core.generation.resolve import resolve_model
    from omni_core.plugins import load_plugins

    plugins = load_plugins()
    try:
        loaded_recipe = load_recipe(recipe) if recipe is not None else None
        resolution = resolve_model(
            plugins,
            model,
            model_class_name=model_class_name or None,
            recipe_pin=loaded_recipe.model_class_name if loaded_recipe else None,
        )
        given: dict[str, object] = {"dtype": dtype or None}
        if attention_backend or attention_config:
            given.update(attention=attention_config or None, attention_backend=attention_backend or None)
        if offload:
            given["offload"] = tuple(offload)
        if cache_backend:
            given["cache_backend"] = cache_backend
        if cache_config:
            from omni_cli.commands.generate import parse_json_option

            given["cache_config"] = parse_json_option("--cache-config", cache_config)
        family = resolution.entry.load()
        if not callable(getattr(family, "plan", None)):
            from omni_core.errors import ModelNotServedError

            raise ModelNotServedError(
                f"{model} is served by {resolution.family!r}, "
                "a multi-stage model (no attention or offload plan of its own): "
                f"`omni explain pipeline --model {model}` shows its stages, their engines and placement",
                name=resolution.family,
            )
        explanations = family.plan(model, EngineOptions.build(resolution, plugins, loaded_recipe, given))
    except (OmniError, ValueError) as exc:
        raise fail_with(exc) from None
    profile = family.profile_for(model)
    if as_json:
        emit_json(
            {
                "family": resolution.family,
                "provider": str(resolution.entry.provider),
                "profile": profile.model_dump(),
                "selections": {k: e.to_dict() for k, e in explanations.items()},
            }
        )
        return
    for explanation in explanations.values():
        echo(explanation.render())
        echo("")
    frames = f", frames {profile.frames_rule()} (default {profile.default_frames} at {profile.default_fps} fps)"
    echo(
        f"{resolution.family} ({profile.task}): default {profile.default_width}x{profile.default_height}, "
        f"sizes multiples of {profile.size_multiple}, {profile.default_steps} steps, guidance "
        f"{profile.default_guidance if profile.uses_guidance else 'not used'}" + (frames if profile.is_video else "")
    )


#: ``--stage``'s help, the same wherever a command places a pipeline's stages
STAGE_HELP = (
    "A stage's setting, beating the recipe: STAGE.FIELD=VALUE, VALUE read as YAML "
    "(hidden.placement=inprocess, tokens.engine_options.seed=3). Repeatable."
)


@app.command("pipeline")
def explain_pipeline_cmd(
    model: Path = typer.Option(..., "--model", help="Checkpoint directory of a pipeline model."),
    recipe: Path | None = typer.Option(None, "--recipe", help="Recipe YAML whose pipeline: section places the stages."),
    stage: list[str] = typer.Option([], "--stage", metavar="STAGE.FIELD=VALUE", help=STAGE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The resolved stage graph of a pipeline model: each stage's engine and placement, each
    edge's connector and why, without loading a weight or starting a process."""
    from omni_core.errors import OmniError
    from omni_core.pipeline.placement import describe, parse_stage_overrides, plan_pipeline
    from omni_core.plugins import load_plugins

    try:
        overrides = parse_stage_overrides(stage) or None
        resolved = plan_pipeline(model, recipe=recipe, plugins=load_plugins(), overrides=overrides)
    except (OmniError, ValueError) as exc:
        raise fail_with(exc) from None
    if as_json:
        emit_json(resolved.model_dump(exclude={"run_id"}))
        return
    echo(describe(resolved))
