"""``omni install`` / ``omni uninstall``: pip into this environment, checking plugin API
compatibility before anything is installed. Loads no plugin code."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import typer

from omni_cli.output import EXIT_PROBLEMS, fail


def pip_command() -> list[str]:
    """pip for this interpreter; uv's pip where pip is absent (uv tool environments)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    uv = shutil.which("uv")
    if uv:
        return [uv, "pip"]
    raise fail("neither pip nor uv is available for this Python; install one (python -m ensurepip)")


def _python_flag(cmd: list[str]) -> list[str]:
    return ["--python", sys.executable] if cmd[0] != sys.executable else []


def check_wheel(wheel: Path) -> tuple[str, str | None]:
    """(plugin description, problem or None) for one built wheel."""
    import tomllib

    from omni_core._version import PLUGIN_API_VERSION
    from omni_core.discovery import api_compatible
    from omni_core.errors import ManifestError
    from omni_core.manifest import MANIFEST_FILENAME, parse_manifest

    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith("/" + MANIFEST_FILENAME) and n.count("/") == 1]
        if not names:
            return (wheel.name, None)  # not an omni plugin (a dependency, say): nothing to check
        try:
            manifest = parse_manifest(tomllib.loads(zf.read(names[0]).decode()), f"{wheel.name}:{names[0]}")
        except (ManifestError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            return (wheel.name, f"invalid manifest: {exc}")
    try:
        ok = api_compatible(manifest.omni_api)
    except Exception:
        return (wheel.name, f"omni_api {manifest.omni_api!r} is not a version range")
    if not ok:
        return (wheel.name, f"supports omni plugin API {manifest.omni_api}, this omni provides {PLUGIN_API_VERSION}")
    return (wheel.name, None)


def install(
    packages: list[str] = typer.Argument(..., help="Requirement specifiers, paths or wheel files."),
    force: bool = typer.Option(False, "--force", help="Install even if the plugin API range does not match."),
) -> None:
    """Install plugins into this environment, refusing API-incompatible ones before installing."""
    pip = pip_command()
    with tempfile.TemporaryDirectory(prefix="omni-install-") as tmp:
        if pip[0] == sys.executable:
            build = [*pip, "wheel", "--no-deps", "--quiet", "--wheel-dir", tmp, *packages]
        else:  # uv: build wheels the uv way
            build = [pip[0], "build", "--wheel", "--out-dir", tmp, *packages]
        typer.echo(f"checking {' '.join(packages)} ...")
        if subprocess.run(build, check=False).returncode != 0:
            raise fail("could not fetch or build the packages above; nothing was installed")
        wheels = sorted(Path(tmp).glob("*.whl"))
        refused = [(w, why) for w, why in map(check_wheel, wheels) if why]
        for name, why in refused:
            typer.echo(f"  {name}: {why}", err=True)
        if refused and not force:
            raise fail(
                "nothing was installed; upgrade omni or choose a compatible plugin version (--force skips this check)"
            )
        result = subprocess.run([*pip, "install", *_python_flag(pip), *map(str, wheels)], check=False)
    if result.returncode != 0:
        raise typer.Exit(EXIT_PROBLEMS)
    typer.echo("installed; `omni plugins list` shows what was added")


def uninstall(packages: list[str] = typer.Argument(..., help="Distribution names to remove.")) -> None:
    """Remove distributions from this environment (works while a plugin is broken)."""
    pip = pip_command()
    flags = ["-y"] if pip[0] == sys.executable else []
    result = subprocess.run([*pip, "uninstall", *_python_flag(pip), *flags, *packages], check=False)
    if result.returncode != 0:
        raise typer.Exit(EXIT_PROBLEMS)
