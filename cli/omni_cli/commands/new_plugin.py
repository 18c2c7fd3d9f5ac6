"""``omni new-plugin``: render a working plugin package of one kind from the plugin template."""

from __future__ import annotations

from pathlib import Path

import typer

from omni_cli.output import fail


def new_plugin(
    name: str = typer.Argument(..., help="Plugin name, e.g. 'my-backend' (becomes omni-plugin-my-backend)."),
    kind: str = typer.Option(
        ..., "--kind", help="model, tts, attention, platform, connector, offloader, executor or cache."
    ),
    output: Path = typer.Option(Path("."), "--output", "-o", help="Directory to create the package in."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing directory."),
) -> None:
    """Create a plugin package: pyproject, manifest, a working implementation, tests, README."""
    from omni_plugin_template import TemplateError, render

    try:
        target = render(kind=kind, name=name, output=output, force=force)
    except TemplateError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"created {target}")
    typer.echo(f"next: pip install -e '{target}[test]' && pytest {target}")
