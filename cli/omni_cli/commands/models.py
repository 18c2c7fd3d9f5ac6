"""``omni models ...``: the families installed plugins provide, tiny checkpoints of them, and what
serves one checkpoint (with its voices).

A tiny checkpoint is a family's standard on-disk layout with a few random weights: enough to
check an install, run the tests and measure omni's overhead, not to produce speech or pictures.
Families are TTS adapters (``config.json`` layout) and image and video model families
(diffusers layout: ``model_index.json``, a folder per component, safetensors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from omni_cli._typer import OmniTyper
from omni_cli.output import emit_json, fail_with, table
from omni_core.tiny import MARKER_FILENAME, read_marker, write_marker

app = OmniTyper(
    help="Model families of the installed plugins, tiny checkpoints of them, and what a checkpoint offers.",
    no_args_is_help=True,
)


def _has_maker(cls: Any) -> bool:
    from omni_core.speech.adapter import TTSAdapter

    maker = getattr(cls, "make_tiny", None)
    if maker is None or getattr(maker, "__func__", None) is TTSAdapter.make_tiny.__func__:
        return False
    can = getattr(cls, "can_make_tiny", None)  # a base class's make_tiny may need a subclass's parts
    return bool(can()) if callable(can) else True


def families(plugins: Any) -> list[dict[str, Any]]:
    """Every TTS adapter and model family, with whether it can make a tiny checkpoint
    (importing each class)."""
    rows = []
    for entry in plugins.models:
        row = {
            "family": entry.name,
            "kind": "model",
            "provider": str(entry.provider),
            "archs": list(entry.spec.architectures),
            "stage_keys": list(entry.spec.tasks),
        }
        try:
            row["make_tiny"] = _has_maker(entry.load())
        except Exception as exc:
            row["make_tiny"], row["error"] = False, f"{type(exc).__name__}: {exc}"
        rows.append(row)
    for entry in plugins.tts_adapters:
        row: dict[str, Any] = {
            "family": entry.name,
            "kind": "tts_adapter",
            "provider": str(entry.provider),
            "archs": list(entry.spec.model_archs),
            "stage_keys": list(entry.spec.stage_keys),
        }
        try:
            row["make_tiny"] = _has_maker(entry.load())
        except Exception as exc:
            row["make_tiny"], row["error"] = False, f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


#: files that mark a directory as a checkpoint, which ``make-tiny --force`` may replace
CHECKPOINT_FILES = (MARKER_FILENAME, "model_index.json", "config.json")


def is_checkpoint(directory: Path) -> bool:
    return any((directory / name).is_file() for name in CHECKPOINT_FILES)


def make_tiny(
    plugins: Any, family: str, directory: Path, seed: int = 0, force: bool = False, force_any: bool = False
) -> Path:
    """Write a tiny checkpoint of ``family`` to ``directory``: built in a scratch directory
    beside it and swapped into place at the end (:func:`omni_core.fsutil.replace_dir`), so an
    interrupted or failed run leaves the old directory (or none) exactly as it was.

    ``force`` replaces an existing checkpoint; ``force_any`` replaces any non-empty directory
    (``force`` alone refuses one that is not a checkpoint: a home or a folder of photos)."""
    from omni_core.errors import OmniError, OutputError, UnknownExtensionError
    from omni_core.fsutil import FileWriteError, replace_dir
    from omni_core.quiet import quiet_libraries

    if family in plugins.tts_adapters:
        entry, layout_file = plugins.tts_adapters.get(family), "config.json"
    elif family in plugins.models:
        entry, layout_file = plugins.models.get(family), "model_index.json"
    else:
        known = ", ".join(r["family"] for r in families(plugins) if r["make_tiny"]) or "none"
        raise UnknownExtensionError(
            f"no installed family is called {family!r}; families that make tiny checkpoints: {known}. "
            "Install the family's plugin; `omni models list --all` shows every installed family."
        )
    cls = entry.load()
    if callable(getattr(cls, "topology_for", None)):  # a multi-stage model: transformers layout
        layout_file = "config.json"
    if not _has_maker(cls):
        raise UnknownExtensionError(
            f"{entry.name!r} ({entry.provider}) has no tiny-checkpoint maker (make_tiny)",
            name=entry.name,
            plugin=entry.provider.plugin,
        )
    directory = directory.expanduser()
    if directory.exists() and not directory.is_dir():
        raise FileWriteError(f"{directory} is a file, not a directory; choose a directory for the checkpoint")
    if directory.is_dir() and any(directory.iterdir()):
        if not (force or force_any):
            raise OutputError(
                f"{directory} exists and is not empty; choose another directory, or pass --force to replace "
                "the checkpoint in it"
            )
        if not force_any and not is_checkpoint(directory):
            raise OutputError(
                f"{directory} is not a checkpoint (it has no {', '.join(CHECKPOINT_FILES)}), so --force will not "
                "replace it; choose another directory, or pass --force-any to delete everything in it and "
                "write the checkpoint there"
            )

    def build(scratch: Path) -> None:
        try:
            with quiet_libraries():  # the libraries' save bars and advisories are not omni's output
                cls.make_tiny(scratch, seed=seed)
        except OmniError:
            raise
        except Exception as exc:  # plugin code: its failure is named, the old directory is untouched
            raise OmniError(
                f"{entry.name}.make_tiny ({entry.provider}) failed: {type(exc).__name__}: {exc}; "
                f"nothing was written to {directory}"
            ) from None
        if not (scratch / layout_file).is_file():
            raise OmniError(f"{entry.name}.make_tiny ({entry.provider}) wrote no {layout_file}")
        write_marker(scratch, family=entry.name, seed=seed, provider=str(entry.provider))

    return replace_dir(directory, build, replace=True)


def ensure_tiny(plugins: Any, family: str, directory: Path, seed: int) -> bool:
    """Make the tiny checkpoint of ``family`` at ``directory`` unless it is there, made by the
    installed provider; True if it was made now. Safe to call from many processes at once:
    one makes it under a lock, the others wait and then use it."""
    from omni_core.fsutil import ensure_dir, file_lock

    provider = str(
        (plugins.tts_adapters.get(family) if family in plugins.tts_adapters else plugins.models.get(family)).provider
    )
    if (read_marker(directory) or {}).get("provider") == provider:
        return False
    ensure_dir(directory.parent, fix="set OMNI_CACHE_DIR to a writable directory (it holds the embedded default)")
    with file_lock(directory.parent / f".{directory.name}.lock"):
        if (read_marker(directory) or {}).get("provider") == provider:
            return False  # another process made it while this one waited for the lock
        typer.echo(f"making the embedded default: a tiny {family} checkpoint in {directory} ...")
        make_tiny(plugins, family, directory, seed=seed, force_any=True)  # omni's own cache directory
    return True


def _size(directory: Path) -> str:
    total = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    return f"{total / 1e6:.1f} MB" if total >= 1e5 else f"{total / 1e3:.1f} kB"


def installed_rows(plugins: Any) -> list[dict[str, Any]]:
    """The installed models adapters know by name, one row per model (its names together), the
    default voice first (:meth:`~omni_core.speech.adapter.TTSAdapter.ready_model`)."""
    from omni_core.speech.detection import installed_models, ready_models

    offers = ready_models(plugins)
    default = offers[0].model.path if offers else None
    by_path: dict[Path, dict[str, Any]] = {}
    for model in installed_models(plugins).values():
        row = by_path.setdefault(
            model.path, {"name": None, "aliases": [], "adapter": model.adapter, "path": str(model.path)}
        )
        row["aliases"].append(model.name)
    for offer in offers:
        if offer.model.path in by_path:
            by_path[offer.model.path]["name"] = offer.model.name
    rows = []
    for path, row in by_path.items():
        names = sorted(row["aliases"], key=len)
        row["name"] = row["name"] or names[0]
        row["aliases"] = [n for n in names if n != row["name"]]
        row["default"] = path == default
        rows.append(row)
    return sorted(rows, key=lambda r: (not r["default"], r["name"].casefold()))


@app.command("list")
def list_models(
    show_all: bool = typer.Option(False, "--all", help="Include families without a tiny-checkpoint maker."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Families that can make tiny checkpoints (`omni models make-tiny`), and the installed models
    --model may name (voices installed as packages), the default voice first."""
    from omni_core.errors import OmniError
    from omni_core.plugins import get_plugins

    plugins = get_plugins()
    rows = [r for r in families(plugins) if show_all or r["make_tiny"]]
    try:
        installed = installed_rows(plugins)
    except OmniError as exc:  # a plugin's detection hook failed: named, with what to do
        raise fail_with(exc) from None
    if as_json:
        emit_json({"families": rows, "installed": installed})
        return
    if installed:
        typer.echo(
            table(
                ("installed model", "also called", "adapter", "path"),
                [
                    (
                        r["name"] + ("  (default voice)" if r["default"] else ""),
                        ", ".join(r["aliases"]) or "-",
                        r["adapter"],
                        r["path"],
                    )
                    for r in installed
                ],
            )
        )
        typer.echo("")
    if not rows:
        typer.echo("no installed family can make a tiny checkpoint (install a family plugin, e.g. omni-plugin-vits)")
        return
    typer.echo(
        table(
            ("family", "kind", "serves", "tiny", "provider"),
            [
                (
                    r["family"],
                    r["kind"],
                    ", ".join(r["archs"] + r["stage_keys"]) or "-",
                    "yes" if r["make_tiny"] else ("error: " + r["error"] if "error" in r else "no"),
                    r["provider"],
                )
                for r in rows
            ],
        )
    )


@app.command("make-tiny")
def make_tiny_cmd(
    family: str = typer.Argument(..., help="Family name (`omni models list`): a TTS adapter or a model family."),
    directory: Path = typer.Argument(..., help="Directory to write the checkpoint to (new or empty)."),
    seed: int = typer.Option(0, "--seed", help="Seed for the random weights."),
    force: bool = typer.Option(False, "--force", help="Replace the checkpoint already in DIRECTORY."),
    force_any: bool = typer.Option(
        False, "--force-any", help="Replace DIRECTORY even if it is not a checkpoint (deletes what is in it)."
    ),
) -> None:
    """Write a tiny random-weight checkpoint of FAMILY in its standard layout."""
    from omni_core.errors import OmniError
    from omni_core.plugins import get_plugins

    try:
        path = make_tiny(get_plugins(), family, directory, seed=seed, force=force, force_any=force_any)
    except OmniError as exc:
        raise fail_with(exc) from None
    typer.echo(f"wrote a tiny {family} checkpoint with random weights (seed {seed}) to {path} ({_size(path)})")
    if (path / "model_index.json").is_file():
        typer.echo(f'try: omni generate "a red fox in snow" --model {path}')
    elif family in get_plugins().models and "chat" in get_plugins().models.get(family).spec.tasks:
        typer.echo(f'try: omni chat --model {path} "Hello there"')
    elif family in get_plugins().models and callable(getattr(get_plugins().models.load(family), "topology_for", None)):
        typer.echo(f"try: omni explain pipeline --model {path}")
    else:
        typer.echo(f'try: omni speak "Hello there" --model {path}')


def describe(model: str) -> dict[str, Any]:
    """What serves ``model`` and what a request may ask of it. A speech model is loaded (an
    adapter knows its voices once it has read its files); a multi-stage model's voices come from
    its topology, an image or video model has none: neither loads anything."""
    from omni_core.api import Omni, identify_model
    from omni_core.tiny import has_random_weights

    identity = identify_model(model)
    info: dict[str, Any] = {
        "model": str(identity.model_dir),
        "family": identity.name,
        "kind": "tts_adapter" if identity.modality == "speech" else "model",
        "provider": identity.provider,
        "task": identity.task,
        "random_weights": identity.model_dir.is_dir() and has_random_weights(identity.model_dir),
        "voices": [],
        "default_voice": None,
    }
    if identity.modality == "speech":
        with Omni(model) as omni:
            caps = omni.capabilities
        info.update(
            voices=list(caps.voices),
            default_voice=caps.default_voice,
            languages=list(caps.languages),
            native_sample_rate=caps.native_sample_rate,
            sample_rates=list(caps.supported_sample_rates),
            streaming=caps.streaming,
            native_speed_control=caps.native_speed_control,
        )
    elif identity.modality == "pipeline":
        stage = identity.plan_pipeline().topology.voice_stage
        if stage is not None:
            info.update(voices=list(stage.voices), default_voice=stage.voices[0], voice_stage=stage.name)
    return info


def _voices(info: dict[str, Any]) -> str:
    if info["voices"]:
        return ", ".join(f"{v} (default)" if v == info["default_voice"] else v for v in info["voices"])
    if info["task"] == "speech":
        return "none to choose (send no voice)"
    return "none (it does not speak)"


@app.command("show")
def show(
    model: str = typer.Argument(..., help="Checkpoint directory, or a name a TTS adapter knows (an installed voice)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """What serves MODEL and what a request may ask of it: voices, languages, sample rate."""
    from omni_core.errors import OmniError

    try:
        info = describe(model)
    except OmniError as exc:
        raise fail_with(exc) from None
    if as_json:
        emit_json(info)
        return
    rows = [
        ("model", info["model"] + ("  (random weights)" if info["random_weights"] else "")),
        (
            "served by",
            f"{info['family']}  ({'TTS adapter' if info['kind'] == 'tts_adapter' else 'family'}, {info['provider']})",
        ),
        ("task", info["task"]),
        ("voices", _voices(info)),
    ]
    if info["task"] == "speech":
        rates = ", ".join(map(str, info["sample_rates"])) or "any from 8000 to 192000"
        rows += [
            ("languages", ", ".join(info["languages"]) or "-"),
            ("sample rate", f"{info['native_sample_rate']} Hz native; on request: {rates} Hz"),
            ("streaming", "yes" if info["streaming"] else "no"),
            ("speed", "the model's own" if info["native_speed_control"] else "time-stretched after synthesis"),
        ]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width}}  {value}")
