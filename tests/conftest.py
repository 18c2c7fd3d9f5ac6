"""Shared fixtures: real virtual environments with omni installed from this checkout.

Plugins under test are installed for real (``pip install``), never registered in-process, so
discovery, metadata and entry points are exercised exactly as a user's install would be.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from omni_testenv import FIXTURE_PLUGINS, Venv, clean_build_dirs, create_venv

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """One venv per test session: omni + CPU plugin (no torch). Scenarios add plugins beside it
    with :func:`install_plugins`, so they never see each other's packages."""
    return create_venv(tmp_path_factory.mktemp("venvs") / "base")


@pytest.fixture
def install_plugins(base_venv: Venv, tmp_path: Path) -> Callable[..., Venv]:
    """Install plugin packages (fixture names or paths) into a private site directory for
    this test and return a :class:`Venv` that sees them."""

    def install(*plugins: str | Path) -> Venv:
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        paths = [p if isinstance(p, Path) else FIXTURE_PLUGINS / p for p in plugins]
        if paths:
            clean_build_dirs(paths)
            base_venv.pip("install", "--quiet", "--no-deps", "--no-build-isolation", "--target", site, *paths)
        return base_venv.with_site(site, tmp_path / "home")

    return install


@pytest.fixture
def repo_python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def fixture_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the fixture packages, so pip's in-tree builds never write into the repo."""
    dest = tmp_path_factory.mktemp("fixture-src")
    for pkg in FIXTURE_PLUGINS.iterdir():
        if (pkg / "pyproject.toml").is_file():
            shutil.copytree(pkg, dest / pkg.name, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    return dest


@pytest.fixture(scope="session")
def torch_findable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that makes this interpreter's torch findable, by symlinks; nothing imports it.

    The shared venv installs the CPU plugin without its torch dependency. ``omni doctor`` rightly
    reports that no attention backend can run there, so a clean doctor needs torch to be
    installed, as in any real install; omni itself only looks it up (``find_spec``).
    """
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        pytest.skip("torch is not installed in the interpreter running the tests")
    package = Path(spec.origin).parent
    shim = tmp_path_factory.mktemp("torch-findable")
    (shim / "torch").symlink_to(package, target_is_directory=True)
    for dist_info in package.parent.glob("torch-*.dist-info"):
        (shim / dist_info.name).symlink_to(dist_info, target_is_directory=True)
    return shim
