"""A second plugin for a test: installed for real, where only the test sees it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

#: what pip leaves in a source tree, and what a build of it never reads
_NOT_SOURCE = ("build", "*.egg-info", "__pycache__")


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
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
        subprocess.run(
            [*pip, "--target", str(site), str(copy)],
            check=True,
            capture_output=True,
            text=True,
        )
    return site


def plugin_site(source: str | Path, cache: str | Path) -> Path:
    """The plugin whose source tree is ``source``, installed with :func:`install_plugin` into
    ``cache/site-<hash of its files>`` (once per version of those files: a second call, or a
    second session with the same ``cache``, reuses it) and put first on ``sys.path``, where
    processes spawned later find it too. Returns the site directory.

    For a test session (``plugin_site(FIXTURE, tmp_path_factory.mktemp("site"))``), and for a
    script that keeps its installs between runs. The install goes to a temporary name and is
    renamed into place, so an interrupted one is never taken for a complete one."""
    source, cache = Path(source), Path(cache)
    digest = hashlib.sha256()
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if path.is_file() and not any(Path(part).match(pattern) for part in rel.parts for pattern in _NOT_SOURCE):
            digest.update(str(rel).encode() + b"\0" + path.read_bytes())
    site = cache / f"site-{digest.hexdigest()[:12]}"
    if not site.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        partial = cache / f".{site.name}-{uuid.uuid4().hex[:8]}"
        try:
            install_plugin(source, partial)
            os.rename(partial, site)
        except OSError:
            if not site.is_dir():  # not another process that finished the same install first
                raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    return site
