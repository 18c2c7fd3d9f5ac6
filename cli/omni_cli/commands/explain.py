"""``omni explain ...``: how a selection was made, with every candidate and the reason."""

from __future__ import annotations

import typer

from omni_cli._typer import OmniTyper
from omni_cli.output import EXIT_PROBLEMS, EXIT_STRICT, emit_json

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
        typer.echo(explanation.render())
    if choice is None:
        raise typer.Exit(EXIT_PROBLEMS)
    if plugins.settings.strict and explanation.failures:
        typer.echo("error: a platform probe failed (OMNI_STRICT_PLUGINS=1)", err=True)
        raise typer.Exit(EXIT_STRICT)


@app.command("attention")
def explain_attention_cmd(
    roles: list[str] = typer.Option(
        ["self", "cross"], "--role", help="Role to explain, as ROLE or ROLE:CATEGORY; repeatable."
    ),
    config: str = typer.Option("", "--config", help="Attention config as JSON, or a backend name."),
    backend: str = typer.Option(
        "", "--attention-backend", envvar="OMNI_ATTENTION_BACKEND", help="Global backend (shorthand for default)."
    ),
    platform: str = typer.Option("", "--platform", help="Explain for this platform (as OMNI_PLATFORM would)."),
    head_size: int = typer.Option(128, "--head-size", help="Head size of the call."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="Dtype of the call."),
    mask: bool = typer.Option(False, "--mask", help="The call passes an attention mask."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Which attention backend each role gets on this platform, and why."""
    import os

    from omni_core.attention.config import AttentionConfig
    from omni_core.attention.selector import CallProfile, describe_backends, explain_attention
    from omni_core.platforms import select_platform
    from omni_core.plugins import load_plugins

    if platform:
        os.environ["OMNI_PLATFORM"] = platform
    plugins = load_plugins()
    chosen_platform = select_platform(plugins).instantiate()
    attention = AttentionConfig.parse(config or None, backend=backend or None)
    call = CallProfile(head_size=head_size, dtype=dtype, mask=mask)
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
        typer.echo(f"platform {chosen_platform.name}; call: head_size={head_size} dtype={dtype} mask={mask}\n")
        typer.echo("\n\n".join(e.render() for e in results))
    if failed:
        raise typer.Exit(EXIT_PROBLEMS)
