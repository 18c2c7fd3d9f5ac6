"""End to end: ``omni install`` checks the plugin API range before installing anything, and
``omni install`` / ``omni uninstall`` change a real environment (a venv of its own here)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from omni_testenv import check, create_venv

from omni_core import PLUGIN_API_VERSION

pytestmark = pytest.mark.slow

#: Build the local fixture wheels with the venv's own setuptools instead of fetching one into an
#: isolated build environment. (pip reads this "no-" switch inverted: 0 turns isolation off.)
PIP_ENV = {"PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


@pytest.fixture(scope="module")
def src(fixture_src: Path) -> Path:
    """The fixture packages, copied out of the repo (see conftest.fixture_src)."""
    return fixture_src


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, torch_findable: Path) -> Any:
    """A venv of its own: these tests install into and uninstall from it."""
    env = create_venv(tmp_path_factory.mktemp("install") / "venv")
    return dataclasses.replace(env, extra_paths=[torch_findable])


def omni(venv: Any, *args: str, code: int = 0, **env: str) -> Any:
    return check(venv.omni(*args, **PIP_ENV, **env), code)


def installed(venv: Any, distribution: str) -> bool:
    """Whether pip sees the distribution in the venv itself."""
    return (
        venv.run([venv.python, "-m", "pip", "show", "--quiet", distribution], env=venv.env(**PIP_ENV)).returncode == 0
    )


def plugin_names(venv: Any) -> dict[str, str]:
    data = omni(venv, "plugins", "list", "--all", "--json").json()
    return {p["name"]: p["status"] for p in data["plugins"]}


def test_install_refuses_an_incompatible_plugin_before_installing(venv, src):
    result = omni(venv, "install", str(src / "omni-fixture-incompatible"), code=1)
    assert (
        f"omni-fixture-incompatible 0.1.0: supports omni plugin API >=2.0,<3, this core provides {PLUGIN_API_VERSION}"
        in (result.stderr)
    )
    assert "error: nothing was installed; upgrade omni or choose a compatible plugin version" in result.stderr
    assert not installed(venv, "omni-fixture-incompatible")
    assert "fixture-incompatible" not in plugin_names(venv)
    # a refused batch installs none of its members, not even the compatible ones
    omni(venv, "install", str(src / "omni-fixture-good"), str(src / "omni-fixture-incompatible"), code=1)
    assert not installed(venv, "omni-fixture-good")


def test_install_force_overrides_the_check_and_the_core_still_skips_the_plugin(venv, src):
    omni(venv, "install", "--force", str(src / "omni-fixture-incompatible"))
    try:
        assert installed(venv, "omni-fixture-incompatible")
        assert plugin_names(venv)["fixture-incompatible"] == "incompatible"
        assert "no problems found" not in omni(venv, "doctor", code=1).stdout
    finally:
        omni(venv, "uninstall", "omni-fixture-incompatible")
    assert not installed(venv, "omni-fixture-incompatible")


def test_install_list_and_uninstall_a_plugin(venv, src):
    assert "fixture-good" not in plugin_names(venv)
    result = omni(venv, "install", str(src / "omni-fixture-good"))
    assert result.stdout.splitlines()[-1] == "installed; `omni plugins list` shows what was added"
    try:
        assert installed(venv, "omni-fixture-good")
        # into the venv itself, not a side directory
        assert list((venv.root / "lib").glob("python3*/site-packages/omni_fixture_good/omni_plugin.toml"))
        data = omni(venv, "plugins", "list", "--json").json()
        good = next(p for p in data["plugins"] if p["name"] == "fixture-good")
        assert (good["distribution"], good["version"], good["status"]) == ("omni-fixture-good", "0.1.0", "ok")
        assert omni(venv, "hello", "--name", "Ada").stdout.strip() == "hello, Ada, from omni-fixture-good"
        assert "omni-fixture-good==0.1.0" in omni(venv, "plugins", "freeze").stdout.splitlines()
    finally:
        omni(venv, "uninstall", "omni-fixture-good")
    assert not installed(venv, "omni-fixture-good")
    assert "fixture-good" not in plugin_names(venv)
    assert "hello" not in omni(venv, "--help").stdout
    omni(venv, "hello", code=2)


def test_uninstall_works_while_a_broken_plugin_is_installed(venv, src):
    # compatible, so it installs; its hook module fails only when loaded (never by install)
    omni(venv, "install", str(src / "omni-fixture-import-fails"))
    try:
        assert plugin_names(venv)["fixture-import-fails"] == "ok"  # not known yet: nothing loaded it
        loaded = omni(venv, "plugins", "list", "--load", "--json").json()
        assert {p["name"]: p["status"] for p in loaded["plugins"]}["fixture-import-fails"] == "import-failed"
        omni(venv, "--strict", "plugins", "list", code=3)  # remembered from the load
        omni(venv, "doctor", code=1)
    finally:
        # strict mode must not stand in the way of removing the culprit
        omni(venv, "--strict", "uninstall", "omni-fixture-import-fails")
    assert not installed(venv, "omni-fixture-import-fails")
    assert "fixture-import-fails" not in plugin_names(venv)
    assert "no problems found" in omni(venv, "doctor").stdout
    omni(venv, "--strict", "plugins", "list", "--load")


def test_install_of_something_unbuildable_installs_nothing(venv, tmp_path):
    empty = tmp_path / "not-a-package"
    empty.mkdir()
    result = omni(venv, "install", str(empty), code=1)
    assert "error: could not fetch or build the packages above; nothing was installed" in result.stderr
