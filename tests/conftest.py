"""Shared fixtures: real virtual environments with omni installed from this checkout.

Plugins under test are installed for real (``pip install``), never registered in-process, so
discovery, metadata and entry points are exercised exactly as a user's install would be.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from omni_testenv import FIXTURE_PLUGINS, Venv, clean_build_dirs, create_venv
from serving import (
    CHAT_MODEL,
    CHAT_RECIPE,
    FAULTS_FIXTURE,
    PIPELINE_FIXTURE,
    ServerProcess,
    make_tiny,
    server_env,
    stage_processes,
    start_server,
)

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


# -- omni serve: the checkpoints and servers its tests share (started on first use) ---------------


@pytest.fixture(scope="session")
def serve_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for every server of the session: the embedded defaults are made once."""
    return tmp_path_factory.mktemp("serve-cache")


@pytest.fixture(scope="session")
def fault_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("serve-fixture-src") / FAULTS_FIXTURE.name
    shutil.copytree(FAULTS_FIXTURE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = tmp_path_factory.mktemp("serve-fixture-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", site, src],
        check=True,
        capture_output=True,
    )
    return site


@pytest.fixture(scope="session")
def fault_models(tmp_path_factory: pytest.TempPathFactory, fault_site: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve-fault-models")
    return {
        "image": make_tiny("fixture-serve-image", root / "image", root, (fault_site,)),
        "voice": make_tiny("fixture-serve-voice", root / "voice", root, (fault_site,)),
    }


@pytest.fixture(scope="session")
def video_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("serve-video")
    return make_tiny("wan2.1-t2v", root / "wan", root)


@pytest.fixture(scope="session")
def default_server(tmp_path_factory: pytest.TempPathFactory, serve_cache: Path) -> Iterator[ServerProcess]:
    """`omni serve` with no --model where no real voice is installed (the piper plugin disabled):
    the embedded tiny-image and the fallback voice, tiny-voice. Cheap models, for the server's
    mechanics; test_serve.py serves the installed real default voice in a server of its own."""
    home = tmp_path_factory.mktemp("serve-home")
    proc = start_server([], home=home, env=server_env(home, serve_cache, OMNI_DISABLE_PLUGINS="piper"))
    yield proc
    proc.kill()


@pytest.fixture(scope="session")
def fault_server(
    tmp_path_factory: pytest.TempPathFactory, fault_site: Path, fault_models: dict[str, Path], video_model: Path
) -> Iterator[ServerProcess]:
    """The fault fixture's image model (faulty) and voice (faulty-voice), and a tiny video model,
    with a short deadline, a short queue and no batching; ``chunk_log`` lists the chunks spoken."""
    home = tmp_path_factory.mktemp("serve-faults-home")
    chunk_log = home / "chunks.log"
    env = server_env(home, sites=(fault_site,), OMNI_FIXTURE_SERVE_LOG=str(chunk_log))
    args = [
        "--model", f"faulty={fault_models['image']}",
        "--model", f"faulty-voice={fault_models['voice']}",
        "--model", f"tiny-video={video_model}",
        "--request-timeout", "4",
        "--queue-size", "3",
        "--max-batch", "1",
    ]  # fmt: skip
    proc = start_server(args, home=home, env=env)
    proc.chunk_log = chunk_log  # type: ignore[attr-defined]
    yield proc
    proc.kill()


@pytest.fixture(scope="session")
def chat_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The test pipeline plugin, pip-installed into a site of its own; on ``sys.path`` too, for
    the reference (the same stage classes, called in the test's process)."""
    from omni_core.testing.install import install_plugin

    path = install_plugin(PIPELINE_FIXTURE, tmp_path_factory.mktemp("chat-site"))
    sys.path.insert(0, str(path))
    yield path
    sys.path.remove(str(path))


@pytest.fixture(scope="session")
def chat_model(chat_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("chat-make")
    return make_tiny("fixture-pipeline", home / "tiny", home, (chat_site,))


@pytest.fixture(scope="session")
def chat_server(chat_site: Path, chat_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``omni serve`` of the test pipeline as ``chatty`` (serving.CHAT_RECIPE). Stopping it must
    exit 0 and leave none of its stage processes behind."""
    home = tmp_path_factory.mktemp("chat-home")
    recipe = home / "chat.yaml"
    recipe.write_text(CHAT_RECIPE)
    running = start_server(["--model", f"{CHAT_MODEL}={chat_model}", "--recipe", recipe], home=home, sites=(chat_site,))
    stages = stage_processes(running.proc.pid)
    assert len(stages) == 3, stages  # each stage in a process of its own, as the recipe says
    yield running
    assert running.stop() == 0, running.stderr[-3000:]
    assert "stopped" in running.stdout
    assert not [pid for pid in stages if Path(f"/proc/{pid}").exists()], "a stage process outlived the server"
