"""The ``omni`` entry point: built-in commands plus the commands plugins declare.

Plugin commands are added from declared metadata (the manifests), so ``omni --help`` imports
no plugin code; a plugin is loaded only when one of its commands runs.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from omni_cli._typer import OmniTyper
from omni_cli.commands import chat, doctor, explain, generate, install, models, new_plugin, plugins, serve, speak
from omni_cli.inventory import scan_once
from omni_cli.output import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEMS,
    echo,
    exit_code_for,
)
from omni_core.text import printable, shell_arg

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
    # Four plain bool flags rather than two `bool | None` ones: Typer coerces an optional value
    # through pydantic, which costs every command ~80 ms of start-up (see _typer.py).
    safe_mode: bool = typer.Option(False, "--safe-mode", help="Load built-in plugins only; beats OMNI_SAFE_MODE."),
    no_safe_mode: bool = typer.Option(False, "--no-safe-mode", help="Load every plugin, whatever OMNI_SAFE_MODE says."),
    strict: bool = typer.Option(
        False, "--strict", help="Treat any plugin problem as an error; beats OMNI_STRICT_PLUGINS."
    ),
    no_strict: bool = typer.Option(
        False, "--no-strict", help="Skip broken plugins, whatever OMNI_STRICT_PLUGINS says."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", help="Also show the model libraries' own warnings, logs and progress bars."
    ),
) -> None:
    from omni_core.config import Overrides, use_overrides
    from omni_core.quiet import quiet_warnings, set_verbose

    # handed to the core as an object, never written to os.environ (child processes would inherit it)
    use_overrides(Overrides(strict=_switch(strict, no_strict), safe_mode=_switch(safe_mode, no_safe_mode)))
    set_verbose(verbose)
    quiet_warnings()


def _switch(on: bool, off: bool) -> bool | None:
    """A flag pair's value: True, False, or None (neither given: the environment decides)."""
    return False if off else True if on else None


app.add_typer(plugins.app, name="plugins")
app.add_typer(explain.app, name="explain")
app.command("doctor")(doctor.doctor)
app.command("install")(install.install)
app.command("uninstall")(install.uninstall)
app.command("new-plugin")(new_plugin.new_plugin)
app.command("speak")(speak.speak)
app.command("chat")(chat.chat)
app.command("generate")(generate.generate)
app.command("serve")(serve.serve)
app.add_typer(models.app, name="models")

BUILTIN_COMMANDS = frozenset(
    {
        "plugins",
        "explain",
        "doctor",
        "install",
        "uninstall",
        "new-plugin",
        "speak",
        "chat",
        "generate",
        "serve",
        "models",
    }
)


def _plugin_command(name: str, help_text: str) -> Any:
    def run(ctx: typer.Context) -> None:
        from omni_core.errors import UnknownExtensionError
        from omni_core.plugins import get_plugins

        plugins = get_plugins()
        if name not in plugins.commands:
            raise UnknownExtensionError(_why_command_missing(plugins, name))
        entry = plugins.commands.get(name)
        target = entry.load()  # LazyImportError (an OmniError) names the plugin
        if isinstance(target, typer.Typer):
            command = typer.main.get_command(target)
        elif callable(target):
            wrapper = OmniTyper(add_completion=False)
            wrapper.command(name)(target)
            command = typer.main.get_command(wrapper)
        else:
            from omni_core.errors import PluginCommandError

            raise PluginCommandError(
                f"command {name!r} from {entry.provider} refers to {type(target).__name__}, not a Typer app "
                f"or function; fix the plugin or `omni plugins disable {shell_arg(entry.provider.plugin)}`",
                kind="command",
                name=name,
                plugin=entry.provider.plugin,
            )
        code = _run_plugin_command(command, name, list(ctx.args), entry.provider)
        if code:
            raise typer.Exit(code)

    run.__doc__ = help_text
    return run


def _run_plugin_command(command: Any, name: str, args: list[str], provider: Any) -> int:
    """Run a plugin's command as a sub-program and return omni's exit code for it.

    The plugin decides its own exit code only within omni's set (0, 1, 2, 3): ``sys.exit(7)``
    or a ``KeyboardInterrupt`` the user did not cause is reported and becomes 1, and an
    exception names the plugin instead of reading as omni's own bug."""
    from omni_core.errors import OmniError
    from omni_core.guard import describe, sigint_count, user_interrupted

    whose = f"plugin command {name!r} ({provider})"
    disable = f"`omni plugins disable {shell_arg(provider.plugin)}`"
    before = sigint_count()
    try:
        with command.make_context(f"omni {name}", args) as sub:
            command.invoke(sub)
        return EXIT_OK
    except typer.Exit as exc:
        code: object = exc.exit_code
    except SystemExit as exc:
        code = exc.code
    except typer.Abort as exc:
        if isinstance(exc.__context__, KeyboardInterrupt) and user_interrupted(before):
            raise KeyboardInterrupt from exc
        echo(f"error: {whose} aborted", err=True)
        return EXIT_PROBLEMS
    except typer.TyperException as exc:  # click's usage errors and the like: the plugin's own messages
        _show(exc)
        return exc.exit_code if exc.exit_code in EXIT_CODES else EXIT_PROBLEMS
    except KeyboardInterrupt:
        if user_interrupted(before):
            raise
        echo(f"error: {whose} raised KeyboardInterrupt, though no Ctrl-C was pressed; fix it or {disable}", err=True)
        return EXIT_PROBLEMS
    except OmniError:
        raise  # omni's own errors (a lookup, a config problem) read the same from a plugin command
    except Exception as exc:
        echo(
            f"error: {whose} failed: {describe(exc)}; fix the plugin or {disable} (OMNI_DEBUG=1 shows the traceback)",
            err=True,
        )
        _debug_traceback()
        return EXIT_PROBLEMS
    return _omni_exit_code(code, f"{whose} exited with code {{code}}", allow_interrupted=False)


def _omni_exit_code(code: object, said: str, *, allow_interrupted: bool) -> int:
    """One of omni's exit codes for what ``sys.exit(code)`` was called with: None is 0, omni's own
    codes pass, a message prints and fails, any other number is reported (``said`` names who
    exited, ``{code}`` in it stands for the number) and becomes 1."""
    if code is None:
        return EXIT_OK
    if isinstance(code, bool) or not isinstance(code, int):
        echo(f"error: {code}", err=True)  # sys.exit("message") prints the message and fails
        return EXIT_PROBLEMS
    if code in EXIT_CODES - {EXIT_INTERRUPTED}:
        return code
    from omni_core.guard import user_interrupted

    if code == EXIT_INTERRUPTED and allow_interrupted and user_interrupted(0):
        return code
    # replace, not format: ``said`` holds a plugin's name, which may hold braces
    echo(f"error: {said.replace('{code}', str(code))}; omni reports it as {EXIT_PROBLEMS}", err=True)
    return EXIT_PROBLEMS


def _why_command_missing(plugins: Any, name: str) -> str:
    """Name the plugin that declares ``name`` and why it contributed nothing."""
    from omni_core.discovery import Status
    from omni_core.kinds import Kind
    from omni_core.manifest import answers_to

    for record in plugins.records:
        declared = record.manifest.of_kind(Kind.COMMAND) if record.manifest else []
        if any(answers_to(d, name) for d in declared) and record.status is not Status.OK:
            return (
                f"command {name!r} comes from {record.provider}, "
                f"which is {record.status}: {record.reason}. Fix: {record.fix or 'see omni doctor'}"
            )
    return plugins.commands.why_missing(name)


def add_plugin_commands(target: typer.Typer) -> None:
    """Add every declared command of the enabled plugins, without importing them."""
    from omni_cli.inventory import installed_plugins
    from omni_core.config import current_settings
    from omni_core.discovery import Status, discover, extension_filtered
    from omni_core.kinds import Kind

    try:
        settings = current_settings()
        records = discover(settings, installed_plugins(settings))
    except Exception as exc:  # a bad config file must not take --help down
        # a command reports a bad config itself, as its error; only the root help would hide it
        if _root_help_requested(sys.argv[1:]):
            echo(f"warning: plugin commands unavailable: {exc}", err=True)
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
            # the help comes from the plugin's manifest: shown with its control characters escaped
            help_text = printable(f"{declared.fields.get('help', '')}  [plugin: {record.name}]", one_line=True)
            target.command(
                declared.name,
                help=help_text,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
            )(_plugin_command(declared.name, help_text))


def _root_help_requested(argv: list[str]) -> bool:
    """Whether this run shows ``omni --help`` (no command given), where plugin commands appear."""
    commands = [a for a in argv if not a.startswith("-")]
    return not commands


def _early_root_flags(argv: list[str]) -> None:
    """Apply ``--safe-mode`` / ``--no-safe-mode`` before plugin commands are added (click parses
    them only later), so safe mode hides third-party commands from ``--help`` just as
    OMNI_SAFE_MODE=1 does. The root callback hands over the same flags again once parsed."""
    from omni_core.config import Overrides, use_overrides

    safe_mode: bool | None = None
    for arg in argv:
        if not arg.startswith("-"):
            break  # the command: options after it are its own
        if arg in ("--safe-mode", "--no-safe-mode"):
            safe_mode = arg == "--safe-mode"  # the last one given wins, as click decides
    use_overrides(Overrides(safe_mode=safe_mode))


def _debug_traceback() -> None:
    from omni_core.config import debugging

    if debugging():
        import traceback

        traceback.print_exc()


def _show(exc: Exception) -> None:
    show = getattr(exc, "show", None)
    if callable(show):
        show()
    else:
        echo(f"error: {exc}", err=True)


def _invoke(argv: list[str]) -> int:
    """Run the command line and map every outcome onto omni's exit codes (0, 1, 2, 3, 130).

    Click's own top level would turn a Ctrl-C into "Aborted!" with exit 1 and let any other
    exception out as a traceback, so omni runs the command itself and decides."""
    from omni_core.errors import OmniError
    from omni_core.guard import user_interrupted

    try:
        with scan_once():  # plugin commands and the command itself share one scan
            add_plugin_commands(app)
            command = typer.main.get_command(app)
            with command.make_context("omni", argv) as ctx:
                command.invoke(ctx)
        return EXIT_OK
    except typer.Exit as exc:
        code: object = exc.exit_code
    except SystemExit as exc:  # only plugin code calls sys.exit(); omni's commands raise typer.Exit
        code = exc.code
    except (KeyboardInterrupt, typer.Abort) as exc:
        interrupt = isinstance(exc, KeyboardInterrupt) or isinstance(exc.__context__, KeyboardInterrupt)
        if interrupt and user_interrupted(0):
            echo("interrupted", err=True)
            return EXIT_INTERRUPTED
        if interrupt:
            echo(
                "error: plugin code raised KeyboardInterrupt, though no Ctrl-C was pressed; "
                "`omni doctor` and `omni plugins list --load` show which plugins are loaded",
                err=True,
            )
            _debug_traceback()
            return EXIT_PROBLEMS
        echo("aborted", err=True)
        return EXIT_PROBLEMS
    except EOFError:
        echo("aborted: end of input", err=True)
        return EXIT_PROBLEMS
    except OmniError as exc:  # every class declares its exit code (omni_core.errors)
        echo(f"error: {exc}", err=True)
        _debug_traceback()
        return exit_code_for(exc)
    except typer.TyperException as exc:  # usage errors (2) and click's other errors (1)
        _show(exc)
        return exc.exit_code if exc.exit_code in EXIT_CODES else EXIT_PROBLEMS
    except BrokenPipeError:
        # the reader went away (`omni plugins list | head`): nothing more to say, nowhere to say it
        sys.stdout = None  # no flush error at exit
        return EXIT_PROBLEMS
    except Exception as exc:
        echo(
            f"internal error: {type(exc).__name__}: {exc}; rerun with OMNI_DEBUG=1 for the traceback, and report it",
            err=True,
        )
        _debug_traceback()
        return EXIT_PROBLEMS
    return _omni_exit_code(code, "plugin code ended the command with exit code {code}", allow_interrupted=True)


def main() -> None:
    from omni_core.guard import watch_sigint

    watch_sigint()  # from here on a SIGINT is counted: the user's Ctrl-C is told from a plugin's
    _early_root_flags(sys.argv[1:])
    code = _invoke(sys.argv[1:])
    try:
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):  # a closed pipe or stream: nothing to flush into
        sys.stdout = None
    sys.exit(code)


if __name__ == "__main__":
    main()
