"""``omni install`` / ``omni uninstall``: pip into this environment, checking plugin API
compatibility before anything is installed. Loads no plugin code."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import tomllib
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


def check_staged(staging: Path) -> list[tuple[str, str]]:
    """(distribution, problem) for every omni plugin unpacked in ``staging`` that this core
    cannot load. Packages without a manifest (ordinary dependencies) are not checked."""
    from importlib import metadata

    from omni_core.discovery import check_api_range
    from omni_core.errors import ManifestError
    from omni_core.manifest import MANIFEST_FILENAME, parse_manifest

    refused = []
    for dist in metadata.distributions(path=[str(staging)]):
        manifests = [f for f in dist.files or () if f.name == MANIFEST_FILENAME and len(f.parts) == 2]
        if not manifests:
            continue
        label = f"{dist.metadata['Name']} {dist.version}"
        path = Path(str(dist.locate_file(manifests[0])))
        try:
            manifest = parse_manifest(tomllib.loads(path.read_text(encoding="utf-8")), f"{label}: {manifests[0]}")
        except (ManifestError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            refused.append((label, f"invalid manifest: {exc}"))
            continue
        check = check_api_range(manifest.omni_api, str(dist.metadata["Name"]))
        if not check.ok:
            refused.append((label, check.reason))
    return refused


def install(
    packages: list[str] = typer.Argument(..., help="Requirement specifiers, paths or wheel files."),
    force: bool = typer.Option(False, "--force", help="Install even if the plugin API range does not match."),
) -> None:
    """Install plugins into this environment, refusing API-incompatible ones before installing."""
    pip = pip_command()
    if not force:
        # Stage the requested packages (not their dependencies) in a throw-away directory and
        # read their manifests: the environment is untouched until every one of them passes.
        with tempfile.TemporaryDirectory(prefix="omni-install-") as staging:
            typer.echo(f"checking {' '.join(packages)} ...")
            stage = [*pip, "install", "--quiet", "--no-deps", "--target", staging, *packages]
            if subprocess.run(stage, check=False).returncode != 0:
                raise fail("could not fetch or build the packages above; nothing was installed")
            refused = check_staged(Path(staging))
        for package, why in refused:
            typer.echo(f"  {package}: {why}", err=True)
        if refused:
            raise fail(
                "nothing was installed; upgrade omni or choose a compatible plugin version (--force skips this check)"
            )
    result = subprocess.run([*pip, "install", *_python_flag(pip), *packages], check=False)
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
