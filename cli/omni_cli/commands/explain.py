"""``omni explain ...``: how a selection was made, with every candidate and the reason."""

from __future__ import annotations

import typer

from omni_cli.output import EXIT_PROBLEMS, emit_json

app = typer.Typer(help="Explain how omni chose something: candidates, rejections, winner.", no_args_is_help=True)


@app.command("platform")
def explain_platform_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Which platform omni uses here, and why each other one was not chosen."""
    from omni_core.platforms import explain_platform
    from omni_core.plugins import load_plugins

    choice, explanation = explain_platform(load_plugins())
    if as_json:
        emit_json(explanation.to_dict())
    else:
        typer.echo(explanation.render())
    if choice is None:
        raise typer.Exit(EXIT_PROBLEMS)
