"""The three kinds of plugin a first-time author writes can be written from docs/ alone.

Each page below shows a whole plugin: every file is a fenced block whose info string names its
path in the distribution (```` ```python title="omni_plugin_tone/adapter.py" ````; the empty
``__init__.py`` of a package may be left out, as the package layout in
docs/authoring/index.md says it imports nothing). This test writes those blocks, and nothing
else, into a directory, pip-installs it for real (into a private ``--target`` site the repo
``.venv``'s omni sees, so torch is there for the ones that need it), then:

* ``omni plugins list`` shows the plugin ``ok`` providing what its manifest declares, and the
  conformance kit (``check_plugin``) finds nothing wrong;
* every command block of the page marked ``<!-- not run: run by tests/test_docs_authoring.py -->``
  runs and prints what the page shows (the rule of ``tests/docblocks.py``), in a directory that
  holds the package's files, as the plugin's own checkout would. So the TTS adapter speaks on
  its own tiny checkpoint, the image family makes a tiny checkpoint and generates (and refuses
  a bad option), the attention backend is chosen, agrees with the reference attention and runs
  a model, the command runs, the connector moves payloads (across a spawned process too,
  in the conformance kit) and refuses what its contract says it must, and the executor runs
  the conformance kit's pipeline in processes of its own, with the options a recipe gives it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from docblocks import BIN, REPO, Block, Session, env_for, page_blocks, run_block

pytestmark = pytest.mark.slow

#: page -> (distribution, plugin name, what `omni plugins list` shows it provides)
PAGES = {
    "docs/authoring/tts-adapters.md": ("omni-plugin-tone", "tone", "tts_adapter: tone"),
    "docs/authoring/models.md": ("omni-plugin-acme-dit", "acme-dit", "model: acme-dit"),
    "docs/authoring/attention-backends.md": (
        "omni-plugin-my-backend",
        "my-backend",
        "attention_backend: MY_BACKEND_ATTN",
    ),
    "docs/authoring/commands.md": ("omni-plugin-hello", "hello", "command: hello"),
    "docs/authoring/connectors.md": ("omni-plugin-spool", "spool", "connector: spool"),
    "docs/authoring/executors.md": ("omni-plugin-popen", "popen", "executor: popen"),
    "docs/authoring/stage-engines.md": ("omni-plugin-greedy", "greedy", "stage_engine: greedy"),
}
_TITLED = re.compile(r'^```\w+ title="([^"/][^"]*)"\n(.*?)^```', re.M | re.S)


def package_files(page: Path) -> dict[str, str]:
    """The files a page shows, by their path in the distribution."""
    files: dict[str, str] = {}
    for match in _TITLED.finditer(page.read_text(encoding="utf-8")):
        path = match.group(1)
        assert path not in files, f"{page.name} shows {path} twice"
        files[path] = match.group(2)
    return files


def write_package(page: Path, dest: Path) -> None:
    for rel, text in package_files(page).items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    for package in {p.parent for p in dest.rglob("*.py")} - {dest}:
        if package.name != "tests":
            (package / "__init__.py").touch(exist_ok=True)


def run_by_this_test(page: Path) -> list[Block]:
    return [b for b in page_blocks(page)[0] if (b.not_run or "").startswith("run by tests/test_docs_authoring.py")]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return Session(tmp_path_factory.mktemp("authoring-session"))


@pytest.fixture(scope="module", params=sorted(PAGES), ids=lambda p: Path(p).stem)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(page, the package written from it, the site it is installed into)."""
    page = REPO / request.param
    root = tmp_path_factory.mktemp(page.stem)
    src, site = root / "src", root / "site"
    write_package(page, src)
    result = subprocess.run(
        [str(BIN / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", site, src],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"the package {page.name} shows does not install:\n{result.stderr}"
    return page, src, site


def test_the_page_shows_a_whole_package(built: tuple[Path, Path, Path]):
    page, _, _ = built
    files = package_files(page)
    assert "pyproject.toml" in files and any(p.endswith("omni_plugin.toml") for p in files), sorted(files)
    assert run_by_this_test(page), f"{page.name} shows no command that runs its plugin"


def test_the_plugin_loads_ok_and_conforms(built: tuple[Path, Path, Path], tmp_path: Path):
    page, _, site = built
    distribution, name, provides = PAGES[str(page.relative_to(REPO))]
    (tmp_path / "home").mkdir()
    env = env_for(tmp_path, site)
    listing = subprocess.run(
        [str(BIN / "omni"), "plugins", "list", "--load", "--json"], env=env, capture_output=True, text=True
    )
    assert listing.returncode == 0, listing.stdout + listing.stderr
    rows = {p["name"]: p for p in json.loads(listing.stdout)["plugins"]}
    assert name in rows, sorted(rows)
    assert rows[name]["status"] == "ok" and rows[name]["distribution"] == distribution, rows[name]
    table = subprocess.run([str(BIN / "omni"), "plugins", "list"], env=env, capture_output=True, text=True).stdout
    assert any(line.split()[:1] == [name] and provides in line for line in table.splitlines()), table
    kit = subprocess.run(
        [
            str(BIN / "python"),
            "-c",
            f"import json; from omni_core.testing import check_plugin; print(json.dumps(check_plugin({name!r})))",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert kit.returncode == 0, kit.stderr
    problems = {check: found for check, found in json.loads(kit.stdout.splitlines()[-1]).items() if found}
    assert problems == {}, f"the conformance kit finds problems in the plugin {page.name} shows: {problems}"


def test_the_commands_the_page_shows(built: tuple[Path, Path, Path], session: Session, tmp_path: Path):
    page, src, site = built
    problems = []
    for index, block in enumerate(run_by_this_test(page)):
        tmp = tmp_path / f"b{index}"
        tmp.mkdir()

        def checkout(directory: Path) -> None:
            for item in src.iterdir():  # the plugin's own checkout: its tests, its pyproject
                if item.name not in ("build",) and not item.name.endswith(".egg-info"):
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, directory / item.name)

        problems += run_block(block, tmp, session, site=site, prepare=checkout)
    assert not problems, f"{page.name} differs from what its plugin does:\n\n" + "\n\n".join(problems)
