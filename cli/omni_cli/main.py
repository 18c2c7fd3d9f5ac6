"""The ``omni`` entry point: built-in commands plus the commands plugins declare.

Plugin commands are added from declared metadata (the manifests), so ``omni --help`` imports
no plugin code; a plugin is loaded only when one of its commands runs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

from omni_cli._typer import OmniTyper
from omni_cli.commands import doctor, explain, generate, install, models, new_plugin, plugins, speak
from omni_cli.output import EXIT_PROBLEMS, EXIT_STRICT

app = OmniTyper(
    name="omni",
    help="Serve omni-modality models (text, speech, image, video) through pip-installable plugins.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version_callback(value: bool) -> None:
    if value:
        from omni_core import PLUGIN_API_VERSION, __version__

        typer.echo(f"omni {__version__} (plugin API {PLUGIN_API_VERSION})")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Show the version and exit."
    ),
    safe_mode: bool = typer.Option(False, "--safe-mode", help="Load built-in plugins only (OMNI_SAFE_MODE=1)."),
    strict: bool = typer.Option(
        False, "--strict", help="Treat any plugin problem as an error (OMNI_STRICT_PLUGINS=1)."
    ),
) -> None:
    if safe_mode:
        os.environ["OMNI_SAFE_MODE"] = "1"
    if strict:
        os.environ["OMNI_STRICT_PLUGINS"] = "1"


app.add_typer(plugins.app, name="plugins")
app.add_typer(explain.app, name="explain")
app.command("doctor")(doctor.doctor)
app.command("install")(install.install)
app.command("uninstall")(install.uninstall)
app.command("new-plugin")(new_plugin.new_plugin)
app.command("speak")(speak.speak)
app.command("generate")(generate.generate)
app.add_typer(models.app, name="models")

BUILTIN_COMMANDS = frozenset(
    {"plugins", "explain", "doctor", "install", "uninstall", "new-plugin", "speak", "generate", "models"}
)


def _plugin_command(name: str, help_text: str) -> Any:
    def run(ctx: typer.Context) -> None:
        from omni_core.errors import UnknownExtensionError
        from omni_core.plugins import get_plugins

        plugins = get_plugins()
        if name not in plugins.commands:
            raise UnknownExtensionError(_why_command_missing(plugins, name))
        target = plugins.commands.load(name)
        if isinstance(target, typer.Typer):
            command = typer.main.get_command(target)
        elif callable(target):
            wrapper = OmniTyper(add_completion=False)
            wrapper.command(name)(target)
            command = typer.main.get_command(wrapper)
        else:
            raise TypeError(f"command {name!r} refers to {type(target).__name__}, not a Typer app or function")
        command.main(args=ctx.args, prog_name=f"omni {name}")

    run.__doc__ = help_text
    return run


def _why_command_missing(plugins: Any, name: str) -> str:
    """Name the plugin that declares ``name`` and why it contributed nothing."""
    from omni_core.kinds import Kind

    for record in plugins.records:
        declared = record.manifest.of_kind(Kind.COMMAND) if record.manifest else []
        if any(d.name.casefold() == name.casefold() for d in declared) and record.status.value != "ok":
            return (
                f"command {name!r} comes from plugin {record.name!r} ({record.distribution} {record.version}), "
                f"which is {record.status}: {record.reason}. Fix: {record.fix or 'see omni doctor'}"
            )
    return plugins.commands.why_missing(name)


def add_plugin_commands(target: typer.Typer) -> None:
    """Add every declared command of the enabled plugins, without importing them."""
    from omni_cli.inventory import installed_plugins
    from omni_core.config import Settings
    from omni_core.discovery import Status, discover, extension_filtered
    from omni_core.kinds import Kind

    try:
        settings = Settings.from_env()
        records = discover(settings, installed_plugins(settings))
    except Exception as exc:  # a bad config file must not take --help down
        typer.echo(f"warning: plugin commands unavailable: {exc}", err=True)
        return
    seen: set[str] = set()
    for record in records:
        if record.status is not Status.OK or record.hardware_only or record.manifest is None:
            continue
        for declared in record.manifest.of_kind(Kind.COMMAND):
            key = declared.name.casefold()
            if key in BUILTIN_COMMANDS or key in seen or extension_filtered(Kind.COMMAND, declared.name, settings):
                continue
            seen.add(key)
            help_text = str(declared.fields.get("help", "")) + f"  [plugin: {record.name}]"
            target.command(
                declared.name,
                help=help_text,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
            )(_plugin_command(declared.name, help_text))


def _early_root_flags(argv: list[str]) -> None:
    """Apply ``--safe-mode`` before plugin commands are added (click parses it only later),
    so safe mode hides third-party commands from ``--help`` just as OMNI_SAFE_MODE=1 does."""
    for arg in argv:
        if not arg.startswith("-"):
            return  # the command: options after it are its own
        if arg == "--safe-mode":
            os.environ["OMNI_SAFE_MODE"] = "1"


def main() -> None:
    from omni_cli.inventory import scan_once
    from omni_core.errors import OmniError, PluginLoadError

    _early_root_flags(sys.argv[1:])
    with scan_once():  # plugin commands and the command itself share one scan
        add_plugin_commands(app)
        try:
            app()
        except PluginLoadError as exc:
            typer.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_STRICT)
        except OmniError as exc:
            typer.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_PROBLEMS)


if __name__ == "__main__":
    main()
