"""Real virtual environments with omni installed from this checkout, for the tests.

Plugins under test are installed for real (``pip install``), never registered in-process, so
discovery, metadata and entry points are exercised exactly as a user's install would be.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
import venv
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE_PLUGINS = Path(__file__).parent / "fixtures" / "plugins"
#: the repo's own distributions, in dependency order
CORE_PACKAGES = (REPO, REPO / "plugin_template", REPO / "cli")
CPU_PLUGIN = REPO / "omni_plugins" / "cpu"
RUNTIME_DEPS = (
    "pluggy>=1.5",
    "pydantic>=2.6",
    "packaging>=23",
    "tomli-w>=1.0",
    "pyyaml>=6",
    "typer>=0.12",
    "pytest>=8",
    # the speech extra (omni-core[speech]) that TTS plugins, the tts template among them, install:
    # read from pyproject.toml, so a dependency added there is in every test venv too
    *tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"][
        "speech"
    ],
)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> object:
        return json.loads(self.stdout)


@dataclass
class Venv:
    """A virtual environment on disk with helpers to run its Python and the ``omni`` CLI."""

    root: Path
    home: Path
    extra_paths: list[Path] = field(default_factory=list)

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_") and k != "PYTHONPATH"}
        env.update(
            OMNI_CONFIG_DIR=str(self.home / "config"),
            OMNI_CACHE_DIR=str(self.home / "cache"),
            PATH=f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            VIRTUAL_ENV=str(self.root),
        )
        if self.extra_paths:
            env["PYTHONPATH"] = os.pathsep.join(str(p) for p in self.extra_paths)
        env.update(overrides)
        return env

    def run(
        self,
        args: Iterable[str | Path],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 600,
    ) -> Result:
        proc = subprocess.run(
            [str(a) for a in args],
            capture_output=True,
            text=True,
            env=env or self.env(),
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def omni(self, *args: str, **env: str) -> Result:
        return self.run([self.root / "bin" / "omni", *args], env=self.env(**env))

    def pip(self, *args: str | Path) -> Result:
        result = self.run([self.python, "-m", "pip", "--disable-pip-version-check", *args])
        if result.returncode != 0:
            raise RuntimeError(f"pip {' '.join(map(str, args))} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def with_site(self, site: Path, home: Path) -> Venv:
        """The same interpreter, plus packages installed into ``site``, with its own config home."""
        return Venv(self.root, home, [*self.extra_paths, site])


def clean_build_dirs(paths: Iterable[Path]) -> None:
    """setuptools builds local projects in place; a stale ``build/lib`` from an earlier run
    would be copied into the new install, so remove it first."""
    for path in paths:
        shutil.rmtree(Path(path) / "build", ignore_errors=True)


def create_venv(root: Path, packages: Iterable[Path] = (), with_cpu_plugin: bool = True) -> Venv:
    """A fresh venv with omni-core, the template, the CLI (and, by default, the CPU plugin
    without torch) installed from this checkout, non-editable, as a user would get them."""
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    env = Venv(root, root.parent / (root.name + "-home"))
    env.pip("install", "--quiet", "setuptools>=68", "wheel", *RUNTIME_DEPS)
    local = [*CORE_PACKAGES, *((CPU_PLUGIN,) if with_cpu_plugin else ()), *packages]
    clean_build_dirs(local)
    env.pip("install", "--quiet", "--no-deps", "--no-build-isolation", *local)
    return env


def check(result: Result, code: int = 0) -> Result:
    assert result.returncode == code, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result
