"""A second plugin for a test: installed for real, where only the test sees it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def install_plugin(source: str | Path, site: str | Path) -> Path:
    """pip-install the plugin whose source tree is ``source`` (the directory of its
    ``pyproject.toml``) into the directory ``site``, without its dependencies, and return
    ``site``. Put it on ``sys.path`` (processes spawned later inherit it) or ``PYTHONPATH`` to
    load the plugin: a real install, entry point and manifest included, that nothing else in
    the environment sees.

    pip builds a copy of the tree without ``build``, ``*.egg-info`` and ``__pycache__``, so the
    build never writes into ``source`` nor picks up a stale one. Raises
    :class:`subprocess.CalledProcessError`, with pip's output, when pip fails."""
    source, site = Path(source), Path(site)
    with tempfile.TemporaryDirectory(prefix="omni-plugin-src-") as tmp:
        copy = Path(tmp) / source.name
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
        subprocess.run(
            [*pip, "--target", str(site), str(copy)],
            check=True,
            capture_output=True,
            text=True,
        )
    return site
