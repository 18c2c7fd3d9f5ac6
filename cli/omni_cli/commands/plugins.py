"""``omni plugins ...``: see, enable, disable, pin and freeze installed plugins.

These are recovery commands: they read declared metadata only and keep working while an
installed plugin is broken (``--load`` imports plugins on purpose, each in isolation).
"""

from __future__ import annotations

import typer

from omni_cli._typer import OmniTyper
from omni_cli.output import EXIT_PROBLEMS, EXIT_STRICT, echo, emit_json, fail, table
from omni_core.text import shell_arg

app = OmniTyper(help="List, inspect, enable, disable and pin installed plugins.", no_args_is_help=True)


def _provides_summary(data: dict) -> str:
    counts: dict[str, list[str]] = {}
    for p in data["provides"]:
        counts.setdefault(p["kind"], []).append(p["name"])
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in counts.items()) or "-"


@app.command("list")
def list_plugins(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    show_all: bool = typer.Option(False, "--all", help="Include disabled plugins and every extension."),
    load: bool = typer.Option(False, "--load", help="Import every plugin now to check it (isolated)."),
) -> None:
    """Show installed plugins, their status and what each provides."""
    from omni_cli.inventory import take_inventory
    from omni_core.discovery import Status

    inventory = take_inventory(load=load)
    shown = [r for r in inventory.records if show_all or r.status is not Status.DISABLED]
    hidden = len(inventory.records) - len(shown)
    problems = inventory.problems()
    if as_json:
        emit_json(
            {
                "plugins": [inventory.record_dict(r) for r in shown],
                "conflicts": [c.to_dict() for c in inventory.conflicts],
                "hidden_disabled": hidden,
                "loaded": inventory.loaded,
                "strict": inventory.settings.strict,
                "safe_mode": inventory.settings.safe_mode,
            }
        )
    else:
        rows = []
        for r in shown:
            data = inventory.record_dict(r)
            rows.append((r.name, r.distribution, r.version, data["status"], _provides_summary(data)))
        echo(
            table(("plugin", "distribution", "version", "status", "provides"), rows) if rows else "no plugins installed"
        )
        if show_all:
            for r in shown:
                data = inventory.record_dict(r)
                for p in data["provides"]:
                    echo(f"  {r.name}: {p['kind']} {p['name']} -> {p['ref']} (priority {p['priority']})")
        for r in shown:
            data = inventory.record_dict(r)
            if Status(data["status"]).is_problem:
                echo(f"\n{r.name}: {data['status']}: {data['reason']}\n  fix: {data['fix'] or '-'}")
        for c in inventory.conflicts:
            echo(f"\nconflict: {c.message()}")
        if hidden:
            echo(f"\n{hidden} disabled plugin(s) hidden; --all shows them")
        if not inventory.loaded:
            echo("\n(read from declared metadata; `omni plugins list --load` or `omni doctor` checks imports)")
    if inventory.settings.strict and problems:
        raise typer.Exit(EXIT_STRICT)


@app.command("show")
def show(
    name: str = typer.Argument(..., help="Plugin name, as in `omni plugins list`."),
    do_import: bool = typer.Option(False, "--import", help="Import each reference now and time it."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Everything about one plugin: where it is from, what it provides, how long its imports take."""
    from omni_cli.inventory import take_inventory

    inventory = take_inventory(load=False)
    matches = [r for r in inventory.records if r.name.casefold() == name.casefold()]
    if not matches:
        known = ", ".join(r.name for r in inventory.records) or "none"
        raise fail(f"no plugin named {name!r} is installed (installed: {known})")
    # a built-in's name cannot be taken: show the built-in, and name any other that tried
    matches.sort(key=lambda r: not r.builtin)
    record, others = matches[0], matches[1:]
    data = inventory.record_dict(record)
    data["same_name"] = [inventory.record_dict(r) for r in others]
    timings = dict((data.get("last_load") or {}).get("imports") or {})
    if do_import:
        from omni_core.errors import LazyImportError
        from omni_core.lazy import LazyRef

        import_errors = {}
        for p in data["provides"]:
            ref = LazyRef(p["ref"], owner=record.name)
            try:
                ref.resolve()
                timings[p["ref"]] = ref.load_seconds
            except LazyImportError as exc:
                import_errors[p["ref"]] = str(exc)
        data["import_errors"] = import_errors
    data["import_seconds"] = timings
    if as_json:
        emit_json(data)
        return
    echo(f"{record.name}  ({record.distribution} {record.version})")
    echo(f"  {data['description']}" if data["description"] else "")
    echo(f"  status:       {data['status']}" + (f" - {data['reason']}" if data["reason"] else ""))
    if data["fix"]:
        echo(f"  fix:          {data['fix']}")
    echo(f"  hook module:  {record.module}")
    echo(f"  omni_api:     {data['omni_api']}   built-in: {'yes' if record.builtin else 'no'}")
    if data["requires_hardware"]:
        echo(f"  hardware:     {', '.join(data['requires_hardware'])}")
    for w in data["warnings"]:
        echo(f"  warning:      {w}")
    for n in data["notes"]:
        echo(f"  note:         {n}")
    if data["traceback"]:
        echo("  traceback:    " + data["traceback"].replace("\n", "\n                "))
    for other in data["same_name"]:
        echo(
            f"  same name:    {other['name']} ({other['distribution']} {other['version']}): {other['status']}"
            + (f" - {other['reason']}" if other["reason"] else "")
        )
    rows = []
    for p in data["provides"]:
        seconds = timings.get(p["ref"])
        shown = f"{seconds * 1000:.1f} ms" if isinstance(seconds, float) else "not imported yet"
        rows.append((p["kind"], p["name"], p["ref"], p["priority"], shown))
    if record.module in timings and isinstance(timings[record.module], float):
        rows.append(("hooks", record.name, record.module, "", f"{timings[record.module] * 1000:.1f} ms"))
    if rows:
        echo("")
        echo(table(("kind", "name", "ref", "priority", "import time"), rows))
    for ref, err in (data.get("import_errors") or {}).items():
        echo(f"\nimport of {ref} failed: {err}")
    if data.get("import_errors"):
        raise typer.Exit(EXIT_PROBLEMS)


def _set_disabled(name: str, disabled: bool) -> None:
    from omni_core.config import UserConfig, current_settings
    from omni_core.discovery import discover

    settings = current_settings()
    config = UserConfig.load(settings.config_path)
    records = discover(settings)
    installed = {r.name.casefold() for r in records}
    builtin = next((r for r in records if r.builtin and r.name.casefold() == name.casefold()), None)
    current = [d for d in config.disabled if d.casefold() != name.casefold()]
    if disabled:
        current.append(name)
    was = any(d.casefold() == name.casefold() for d in config.disabled)
    config.disabled = current
    config.save()
    state = "disabled" if disabled else "enabled"
    note = "" if name.casefold() in installed else " (no plugin of that name is installed right now)"
    unchanged = " already" if was == disabled else ""
    echo(f"{name} is{unchanged} {state}{note}; saved to {config.path}")
    if disabled and builtin is not None:
        echo(
            f"note: {builtin.name!r} is the built-in plugin ({builtin.distribution}); without it omni has no "
            f"embedded default. `omni --safe-mode` still loads it, and `omni plugins enable {shell_arg(name)}` "
            "undoes this"
        )


@app.command("disable")
def disable(name: str = typer.Argument(..., help="Plugin name to stop loading.")) -> None:
    """Stop loading a plugin (persists in the user config; works while it is broken)."""
    _set_disabled(name, True)


@app.command("enable")
def enable(name: str = typer.Argument(..., help="Plugin name to load again.")) -> None:
    """Load a previously disabled plugin again."""
    _set_disabled(name, False)


@app.command("pin")
def pin(
    kind: str = typer.Argument(..., help="Extension kind, e.g. attention_backend."),
    name: str = typer.Argument(..., help="The contested name, e.g. FLASH_ATTN."),
    distribution: str = typer.Argument(..., help="The distribution that should provide it."),
) -> None:
    """Decide which plugin provides a name that several plugins offer."""
    from omni_core.config import Settings, UserConfig
    from omni_core.kinds import Kind

    try:
        parsed = Kind.parse(kind)
    except ValueError as exc:
        raise fail(str(exc)) from None
    config = UserConfig.load(Settings.from_env().config_path)
    table_ = config.pins.setdefault(parsed.value, {})
    for k in [k for k in table_ if k.casefold() == name.casefold()]:
        del table_[k]  # names are case-insensitive: re-pinning replaces, never adds a rival key
    table_[name] = distribution
    config.save()
    echo(f"{parsed.label} {name} pinned to {distribution}; saved to {config.path}")


@app.command("unpin")
def unpin(
    kind: str = typer.Argument(..., help="Extension kind."),
    name: str = typer.Argument(..., help="The pinned name."),
) -> None:
    """Remove a pin set with `omni plugins pin`."""
    from omni_core.config import Settings, UserConfig
    from omni_core.kinds import Kind

    try:
        parsed = Kind.parse(kind)
    except ValueError as exc:
        raise fail(str(exc)) from None
    config = UserConfig.load(Settings.from_env().config_path)
    table_ = config.pins.get(parsed.value, {})
    removed = [k for k in table_ if k.casefold() == name.casefold()]
    for k in removed:
        del table_[k]
    config.save()
    echo(f"{parsed.label} {name}: " + ("pin removed" if removed else "was not pinned"))


@app.command("freeze")
def freeze() -> None:
    """Print `distribution==version` for every active plugin (a requirements file)."""
    from omni_cli.inventory import take_inventory
    from omni_core.discovery import Status

    inventory = take_inventory(load=False)
    lines = sorted(
        {f"{r.distribution}=={r.version}" for r in inventory.records if inventory.effective_status(r)[0] is Status.OK}
    )
    for line in lines:
        echo(line)
