"""``omni doctor``: what omni sees on this machine, every problem, and the fix for each."""

from __future__ import annotations

import dataclasses
import platform as _platform
import sys
from importlib import metadata
from typing import Any

import typer

from omni_cli.output import EXIT_PROBLEMS, EXIT_STRICT, echo, emit_json, table
from omni_core.text import shell_arg

#: a plugin whose hook module takes longer than this to import is reported as slow
SLOW_HOOK_IMPORT_S = 0.5
#: a lazily imported implementation slower than this is reported as slow
SLOW_REF_IMPORT_S = 5.0


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def doctor(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Check the environment, platform and every plugin; exit 1 if anything needs fixing."""
    from omni_core import PLUGIN_API_VERSION, __version__
    from omni_core.breadcrumb import remembered_crashes
    from omni_core.config import current_settings
    from omni_core.discovery import Status, discover
    from omni_core.guard import contained, describe
    from omni_core.platforms import explain_platform
    from omni_core.plugins import HEAVY_IMPORT_FIX, load_plugins
    from omni_core.state import HealthStore

    settings = current_settings()
    problems: list[dict[str, str]] = []
    # Said before loading: a plugin that ended the last run (os._exit) may end this one too.
    # Only for plugins still installed and enabled: disabling one is how the user settles it.
    active = {(r.name, r.distribution, r.version) for r in discover(settings) if r.status is not Status.DISABLED}
    for crash in remembered_crashes(settings.cache_dir):
        if (crash["plugin"], crash["distribution"], crash["version"]) not in active:
            continue
        echo(f"warning: {crash['reason']}; {crash['fix']}", err=True)
        problems.append({"problem": crash["reason"], "fix": crash["fix"]})
    # Doctor reports problems rather than stopping at the first, strict mode or not.
    plugin_set = load_plugins(dataclasses.replace(settings, strict=False))

    report: dict[str, Any] = {
        "python": {"version": _platform.python_version(), "executable": sys.executable},
        "omni": {"core": __version__, "cli": _version("omni-cli"), "plugin_api": PLUGIN_API_VERSION},
        "torch": _version("torch"),
        "serve": _serve(),
        "settings": {
            "strict": settings.strict,
            "safe_mode": settings.safe_mode,
            "forced_platform": settings.platform,
            "config": str(settings.config_path),
        },
    }

    choice, explanation = explain_platform(plugin_set)
    report["platform"] = explanation.to_dict()
    for c in explanation.failures:
        problems.append(
            {
                "problem": f"platform probe {c.name!r} failed: {c.reason}",
                "fix": f"fix or disable the plugin providing it ({c.provider})",
            }
        )
    if choice is None:
        problems.append({"problem": explanation.rule, "fix": "install a platform plugin, or set OMNI_PLATFORM"})
    else:
        try:
            with contained():  # the platform's and the backends' code is plugin code
                platform = choice.instantiate()
                report["hardware"] = platform.facts()
                report["attention"] = _attention(plugin_set, platform, problems)
        except Exception as exc:
            problems.append(
                {
                    "problem": f"platform {choice.name!r} failed to describe the hardware: {describe(exc)}",
                    "fix": "check the vendor build of torch and the driver (`omni explain platform`), "
                    f"or reinstall {choice.entry.provider.distribution}",
                }
            )

    plugins = []
    for r in plugin_set.records:
        plugins.append(
            {
                "name": r.name,
                "distribution": r.distribution,
                "version": r.version,
                "status": r.status.value,
                "reason": r.reason,
                "fix": r.fix,
                "import_seconds": r.import_seconds,
                "heavy_imports": list(r.heavy_imports),
                "warnings": list(r.warnings),
                "notes": list(r.notes),
                "traceback": r.traceback,
            }
        )
        if r.status.is_problem:
            problems.append({"problem": r.problem(), "fix": r.fix})
        if r.heavy_imports:
            problems.append(
                {
                    "problem": f"plugin {r.name!r} ({r.distribution} {r.version}) imports "
                    f"{', '.join(r.heavy_imports)} when it registers, so every omni command pays for it",
                    "fix": f"in the plugin: {HEAVY_IMPORT_FIX}",
                }
            )
        elif r.import_seconds is not None and r.import_seconds > SLOW_HOOK_IMPORT_S:
            problems.append(
                {
                    "problem": f"plugin {r.name!r} takes {r.import_seconds:.2f} s to import its hook module",
                    "fix": "move heavy imports out of the hook module: register 'module:attr' references instead",
                }
            )
        for w in r.warnings:
            if w.startswith("unknown hook"):
                problems.append(
                    {"problem": f"plugin {r.name!r}: {w}", "fix": "rename it to a hook in omni_core.hookspecs"}
                )
    report["plugins"] = plugins
    for c in plugin_set.conflicts:
        problems.append(
            {"problem": c.message(), "fix": f"omni plugins pin {c.kind.value} {shell_arg(c.name)} DISTRIBUTION"}
        )
    from omni_core.speech.detection import overlapping_adapters

    for overlap in overlapping_adapters(plugin_set):
        problems.append(
            {
                "problem": overlap,
                "fix": "uninstall one of the two plugins, or have one declare another detect_priority "
                "(`omni explain tts --model DIR` shows which adapter a model gets)",
            }
        )
    from omni_core.generation.resolve import ambiguous_families

    for ambiguity in ambiguous_families(plugin_set):
        problems.append(
            {
                "problem": ambiguity,
                "fix": "uninstall one of the plugins, pin a family with --model-class-name, or have the plugin "
                "authors add a config_match (`omni explain model --model DIR` shows which family a checkpoint gets)",
            }
        )
    report["models"] = [
        {
            "name": e.name,
            "provider": str(e.provider),
            "architectures": list(e.spec.architectures),
            "tasks": list(e.spec.tasks),
        }
        for e in plugin_set.models
    ]
    report["stage_engines"] = [_stage_engine_row(e) for e in plugin_set.stage_engines]
    store = HealthStore(settings.cache_dir)
    for r in plugin_set.records:
        for ref, seconds in ((store.lookup(r.distribution, r.version, r.name) or {}).get("imports") or {}).items():
            if isinstance(seconds, float) and seconds > SLOW_REF_IMPORT_S and ref != r.module:
                problems.append(
                    {
                        "problem": f"{ref} (plugin {r.name!r}) took {seconds:.1f} s to import",
                        "fix": "expected for large libraries; otherwise defer imports inside it",
                    }
                )
    notes = list(plugin_set.notes)
    if choice is not None:
        here = {choice.name, report.get("hardware", {}).get("device_type", choice.name)}
        for r in plugin_set.records:
            needs = list(r.manifest.requires_hardware) if r.manifest else []
            if r.status is Status.OK and needs and not here & set(needs):
                notes.append(f"plugin {r.name!r} is for {', '.join(needs)} hardware; this machine runs {choice.name}")
    report["notes"] = notes
    report["problems"] = problems

    if as_json:
        emit_json(report)
    else:
        _print(report)
    if problems:
        raise typer.Exit(EXIT_STRICT if settings.strict else EXIT_PROBLEMS)


def _serve() -> dict[str, Any]:
    """Whether ``omni serve`` can run here. Serving is optional, so a missing package is
    reported with its fix, not counted as a problem."""
    from omni_core.server.runner import SERVE_FIX, missing_packages

    missing = missing_packages()  # find_spec only: nothing is imported
    return {"missing": missing, "fix": SERVE_FIX if missing else None}


def _attention(plugin_set: Any, platform: Any, problems: list[dict[str, str]]) -> dict[str, Any]:
    """The automatic attention choice for the common roles, and every backend's availability."""
    from omni_core.attention.config import AttentionConfig, AttentionConfigError
    from omni_core.attention.selector import describe_backends, explain_attention
    from omni_core.selection import Outcome

    roles = {}
    for role in ("self", "cross"):
        try:
            choice, explanation = explain_attention(plugin_set, platform, AttentionConfig(), role)
        except AttentionConfigError as exc:
            problems.append({"problem": str(exc), "fix": "see `omni explain attention`"})
            continue
        roles[role] = explanation.to_dict()
        if choice is None:
            # name why each candidate cannot run (a missing package, say): the fix depends on it
            why = "; ".join(f"{c.name}: {c.reason}" for c in explanation.candidates if c.outcome is Outcome.REJECTED)
            problems.append(
                {
                    "problem": f"no attention backend can run role {role!r}" + (f" ({why})" if why else ""),
                    "fix": "install what those backends need, or a plugin with a backend for this platform "
                    "(`omni explain attention` says why)",
                }
            )
    return {"roles": roles, "backends": describe_backends(plugin_set, platform)}


def _print(report: dict[str, Any]) -> None:
    echo(f"python      {report['python']['version']}  ({report['python']['executable']})")
    o = report["omni"]
    echo(f"omni        core {o['core']}, cli {o['cli']}, plugin API {o['plugin_api']}")
    echo(f"torch       {report['torch'] or 'not installed'}")
    serving = report["serve"]
    if serving["missing"]:
        echo(f"serve       missing {', '.join(serving['missing'])}; for omni serve: {serving['fix']}")
    else:
        echo("serve       installed (omni serve can run)")
    s = report["settings"]
    flags = [n for n in ("strict", "safe_mode") if s[n]]
    echo(f"config      {s['config']}" + (f"  [{', '.join(flags)}]" if flags else ""))
    echo("")
    from omni_core.selection import Explanation, Outcome

    exp = Explanation(
        report["platform"]["subject"], winner=report["platform"]["winner"], rule=report["platform"]["rule"]
    )
    for c in report["platform"]["candidates"]:
        exp.add(c["name"], Outcome(c["outcome"]), c["reason"], c["provider"])
    echo(exp.render())
    for key, value in (report.get("hardware") or {}).items():
        echo(f"    {key}: {value}")
    attention = report.get("attention") or {}
    if attention:
        echo("")
        chosen = ", ".join(f"{role} -> {data['winner']}" for role, data in attention["roles"].items())
        echo(f"attention (automatic): {chosen}   (`omni explain attention` says why)")
        rows = [
            (b["name"], "yes" if b.get("available") else "no", b.get("reason", ""), b["provider"])
            for b in attention["backends"]
        ]
        echo(table(("backend", "available", "why", "provider"), rows))
    if report.get("models"):
        echo("")
        names = ", ".join(m["name"] for m in report["models"])
        echo(f"model families: {names}   (`omni explain model --model DIR` says which serves a checkpoint)")
    for engine in report.get("stage_engines") or []:
        state = "can run" if engine["available"] else "cannot run"
        echo(
            f"stage engine {engine['name']} ({engine['provider']}): {state} {engine['architectures'][0]} "
            f"{engine['stage_kinds'][0]} stages here: {engine['reason']}"
        )
    echo("")
    rows = [
        (
            p["name"],
            p["distribution"],
            p["version"],
            p["status"],
            "" if p["import_seconds"] is None else f"{p['import_seconds'] * 1000:.0f} ms",
        )
        for p in report["plugins"]
    ]
    echo(
        table(("plugin", "distribution", "version", "status", "hook import"), rows) if rows else "no plugins installed"
    )
    for note in report["notes"]:
        echo(f"note: {note}")
    echo("")
    if not report["problems"]:
        echo("no problems found")
    for i, p in enumerate(report["problems"], 1):
        echo(f"problem {i}: {p['problem']}\n  fix: {p['fix'] or '-'}")


def _stage_engine_row(entry: Any) -> dict[str, Any]:
    """A stage engine and whether it can run here, asked of its probe for the first architecture
    it claims (a missing library or a version skew of it shows there). Not a problem when it
    cannot: stages then run on their models' own engines, as `omni explain pipeline` says."""
    from omni_core.pipeline.engines import probe_engine

    available, reason = probe_engine(entry, entry.spec.architectures[0])
    return {
        "name": entry.name,
        "provider": f"{entry.provider.distribution} {entry.provider.version}",
        "stage_kinds": list(entry.spec.stage_kinds),
        "architectures": list(entry.spec.architectures),
        "available": available,
        "reason": reason,
    }
