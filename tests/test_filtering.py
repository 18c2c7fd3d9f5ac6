"""End to end: which plugins and extensions load, steered by environment, config and flags.

OMNI_PLUGINS / OMNI_DISABLE_PLUGINS filter whole plugins (platforms exempt from the allow-list),
OMNI_<KIND>S / OMNI_DISABLE_<KIND>S filter names of one kind, safe mode loads built-ins only,
`omni plugins disable/enable` persist in the config file, `omni plugins freeze` lists what is active.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from omni_testenv import check

pytestmark = pytest.mark.slow

ZOO = (
    "omni-fixture-good",
    "omni-fixture-import-fails",
    "omni-fixture-hook-raises",
    "omni-fixture-incompatible",
    "omni-fixture-dup-a",
    "omni-fixture-dup-b",
    "omni-fixture-lying",
)
THIRD_PARTY = (
    "fixture-dup-a",
    "fixture-dup-b",
    "fixture-good",
    "fixture-hook-raises",
    "fixture-import-fails",
    "fixture-incompatible",
    "fixture-lying",
)
GREETING = "hello, Ada, from omni-fixture-good"

REGISTRIES = """
import json
from omni_core.kinds import Kind
from omni_core.plugins import load_plugins
ps = load_plugins()
print(json.dumps({
    "names": {k.value: ps.registry(k).names() for k in Kind},
    "filtered": {k.value: ps.registry(k).filtered for k in Kind},
    "conflicts": [c.name for c in ps.conflicts],
    "status": {r.name: r.status.value for r in ps.records},
    "hardware_only": sorted(r.name for r in ps.records if r.hardware_only),
}))
"""


@pytest.fixture
def install(install_plugins: Callable[..., Any], fixture_src: Path, torch_findable: Path) -> Callable[..., Any]:
    def go(*names: str) -> Any:
        venv = install_plugins(*(fixture_src / name for name in names))
        return dataclasses.replace(venv, extra_paths=[*venv.extra_paths, torch_findable])

    return go


@pytest.fixture(scope="module")
def zoo_site(base_venv: Any, fixture_src: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ZOO, pip-installed once for this module into a site directory nobody changes."""
    site = tmp_path_factory.mktemp("zoo-site")
    base_venv.pip(
        "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", site, *(fixture_src / n for n in ZOO)
    )
    return site


@pytest.fixture
def zoo(base_venv: Any, zoo_site: Path, torch_findable: Path, tmp_path: Path) -> Any:
    """A venv that sees the ZOO, with a config and cache directory of this test's own."""
    venv = base_venv.with_site(zoo_site, tmp_path / "home")
    return dataclasses.replace(venv, extra_paths=[*venv.extra_paths, torch_findable])


def listing(venv: Any, *args: str, **env: str) -> dict[str, Any]:
    return check(venv.omni("plugins", "list", "--json", *args, **env)).json()


def statuses(data: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["status"] for p in data["plugins"]}


def registries(venv: Any, **env: str) -> dict[str, Any]:
    return json.loads(check(venv.run([venv.python, "-c", REGISTRIES], env=venv.env(**env))).stdout)


def winner(venv: Any, **env: str) -> str | None:
    return check(venv.omni("explain", "platform", "--json", **env)).json()["winner"]


def help_commands(venv: Any, *args: str, **env: str) -> set[str]:
    text = check(venv.omni(*args, "--help", **env)).stdout
    block = text.split("Commands:", 1)[1]
    return {m.group(1) for m in re.finditer(r"^  (\S+)", block, re.M)}


# --- OMNI_PLUGINS / OMNI_DISABLE_PLUGINS --------------------------------------------------------


def test_allow_list_loads_only_the_named_plugins_but_keeps_the_platform(zoo):
    venv = zoo
    env = {"OMNI_PLUGINS": "fixture-good"}
    data = listing(venv, **env)
    assert statuses(data) == {"cpu": "ok", "fixture-good": "ok"}
    assert data["hidden_disabled"] == 7 - 1
    cpu = next(p for p in data["plugins"] if p["name"] == "cpu")
    assert cpu["hardware_only"] is True
    assert cpu["notes"] == ["not in OMNI_PLUGINS: contributes its platforms and attention backends only"]
    everything = {p["name"]: p for p in listing(venv, "--all", **env)["plugins"]}
    for name in set(THIRD_PARTY) - {"fixture-good"}:
        assert everything[name]["status"] == "disabled"
        assert everything[name]["reason"] == "not in OMNI_PLUGINS"
        assert everything[name]["fix"] == f"add {name} to OMNI_PLUGINS"

    # the platform of the plugin left out still wins, with its attention backends; its other
    # extensions are gone
    assert winner(venv, **env) == "cpu"
    snapshot = registries(venv, **env)
    assert snapshot["hardware_only"] == ["cpu"]
    assert snapshot["names"]["platform"] == ["cpu"]
    assert set(snapshot["names"]["attention_backend"]) >= {"FIXTURE_ATTN", "TORCH_SDPA"}
    assert snapshot["names"]["model"] == ["echo-model"]
    # the broken plugins were left out, so doctor has nothing to report
    report = check(venv.omni("doctor", "--json", **env), 0).json()
    assert report["problems"] == []
    assert {p["name"]: p["status"] for p in report["plugins"]}["fixture-import-fails"] == "disabled"
    assert check(venv.omni("hello", "--name", "Ada", **env)).stdout.strip() == GREETING
    # names are case-insensitive and the list may carry blanks
    assert statuses(listing(venv, OMNI_PLUGINS=" FIXTURE-GOOD , ")) == {"cpu": "ok", "fixture-good": "ok"}


def test_allow_list_leaves_an_accelerator_platform_in_charge(install):
    venv = install("omni-fixture-good", "omni-fixture-platform")
    env = {"OMNI_PLUGINS": "fixture-good", "FIXTURE_ACCEL": "1"}
    assert winner(venv, **env) == "fixture-accel"
    assert registries(venv, **env)["hardware_only"] == ["cpu", "fixture-platform"]
    # an explicit deny removes a platform
    assert winner(venv, OMNI_DISABLE_PLUGINS="fixture-platform", FIXTURE_ACCEL="1") == "cpu"


def test_deny_list_skips_plugins_without_touching_the_config(zoo):
    venv = zoo
    deny = "fixture-import-fails,fixture-hook-raises,fixture-incompatible,fixture-lying,fixture-dup-a"
    data = listing(venv, "--all", OMNI_DISABLE_PLUGINS=deny)
    assert statuses(data) == {
        "cpu": "ok",
        "fixture-good": "ok",
        "fixture-dup-b": "ok",
        **{name: "disabled" for name in deny.split(",")},
    }
    assert data["conflicts"] == []
    assert "no problems found" in check(venv.omni("doctor", OMNI_DISABLE_PLUGINS=deny)).stdout
    assert not (venv.home / "config" / "config.toml").exists()
    check(venv.omni("doctor"), 1)  # the environment only applies where it is set


def test_denying_the_only_platform_leaves_no_platform(install):
    venv = install("omni-fixture-good")
    result = check(venv.omni("explain", "platform", OMNI_DISABLE_PLUGINS="cpu"), 1)
    assert (
        "=> nothing selected (no platform claims this machine; installed but disabled: cpu "
        "(`omni plugins enable NAME`, or `omni --safe-mode` to run on the built-in plugins))"
    ) in result.stdout
    doctor = check(venv.omni("doctor", OMNI_DISABLE_PLUGINS="cpu"), 1)
    assert "problem 1: no platform claims this machine" in doctor.stdout
    # the rest still works
    assert check(venv.omni("hello", "--name", "Ada", OMNI_DISABLE_PLUGINS="cpu")).stdout.strip() == GREETING


# --- per-kind lists ------------------------------------------------------------------------------


def test_per_kind_model_lists_filter_models_only(install):
    venv = install("omni-fixture-good", "omni-fixture-dup-a", "omni-fixture-dup-b", "omni-fixture-platform")
    assert [c["name"] for c in listing(venv)["conflicts"]] == ["shared-model"]

    allow = registries(venv, OMNI_MODELS="echo-model")
    assert allow["names"]["model"] == ["echo-model"]
    assert allow["filtered"]["model"] == {"shared-model": "not in OMNI_MODELS"}
    assert allow["conflicts"] == []
    # every plugin still loads, and other kinds are untouched
    assert set(allow["status"].values()) == {"ok"}
    assert allow["names"]["platform"] == ["cpu", "fixture-accel"]
    assert {"FIXTURE_ATTN", "TORCH_SDPA"} <= set(allow["names"]["attention_backend"])
    assert allow["names"]["command"] == ["fixture-tools", "hello"]
    assert winner(venv, OMNI_MODELS="echo-model") == "cpu"
    assert winner(venv, OMNI_MODELS="echo-model", FIXTURE_ACCEL="1") == "fixture-accel"

    deny = registries(venv, OMNI_DISABLE_MODELS="SHARED-MODEL")  # case-insensitive
    assert deny["names"]["model"] == ["echo-model"]
    assert deny["filtered"]["model"] == {"shared-model": "removed by OMNI_DISABLE_MODELS"}
    assert deny["conflicts"] == []

    # a filtered name is no conflict in any view
    for env in ({"OMNI_MODELS": "echo-model"}, {"OMNI_DISABLE_MODELS": "shared-model"}):
        assert listing(venv, **env)["conflicts"] == []
        assert listing(venv, "--load", **env)["conflicts"] == []
        assert "no problems found" in check(venv.omni("doctor", **env)).stdout
        check(venv.omni("--strict", "plugins", "list", "--load", **env))
    check(venv.omni("--strict", "plugins", "list", "--load"), 3)


def test_per_kind_lists_for_commands_platforms_and_attention_backends(install):
    venv = install("omni-fixture-good", "omni-fixture-platform")
    commands = help_commands(venv)
    assert {"hello", "fixture-tools"} <= commands

    for env in ({"OMNI_DISABLE_COMMANDS": "hello"}, {"OMNI_COMMANDS": "fixture-tools"}):
        shown = help_commands(venv, **env)
        assert "hello" not in shown and "fixture-tools" in shown
        result = check(venv.omni("hello", **env), 2)
        assert "No such command 'hello'" in result.stderr
        assert check(venv.omni("fixture-tools", "ping", **env)).stdout.strip() == "pong from omni-fixture-good"

    assert winner(venv, OMNI_PLATFORMS="cpu", FIXTURE_ACCEL="1") == "cpu"
    assert winner(venv, OMNI_DISABLE_PLATFORMS="fixture-accel", FIXTURE_ACCEL="1") == "cpu"
    snapshot = registries(venv, OMNI_DISABLE_ATTENTION_BACKENDS="FIXTURE_ATTN")
    assert "FIXTURE_ATTN" not in snapshot["names"]["attention_backend"]
    assert "TORCH_SDPA" in snapshot["names"]["attention_backend"]
    assert snapshot["filtered"]["attention_backend"] == {"fixture_attn": "removed by OMNI_DISABLE_ATTENTION_BACKENDS"}
    assert snapshot["names"]["model"] == ["echo-model"]


# --- safe mode -----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["env", "flag"])
def test_safe_mode_loads_only_the_builtin_cpu_plugin(zoo, how):
    venv = zoo
    env = {"OMNI_SAFE_MODE": "1"} if how == "env" else {}
    flag = ("--safe-mode",) if how == "flag" else ()

    def omni(*args: str, code: int = 0) -> Any:
        return check(venv.omni(*flag, *args, **env), code)

    data = omni("plugins", "list", "--json").json()
    assert data["safe_mode"] is True
    assert statuses(data) == {"cpu": "ok"}
    assert data["hidden_disabled"] == 7
    everything = {p["name"]: p for p in omni("plugins", "list", "--all", "--json").json()["plugins"]}
    for name in THIRD_PARTY:
        assert everything[name]["status"] == "disabled"
        assert everything[name]["reason"] == "safe mode (OMNI_SAFE_MODE=1) loads built-in plugins only"
    assert everything["cpu"]["builtin"] is True

    loaded = omni("plugins", "list", "--load", "--json").json()
    assert statuses(loaded) == {"cpu": "ok"}
    assert loaded["conflicts"] == []
    assert "no problems found" in omni("doctor").stdout
    assert omni("explain", "platform", "--json").json()["winner"] == "cpu"
    omni("--strict", "plugins", "list", "--load")  # the broken plugins are no problem either
    # no third-party code ran: only the CPU plugin has a remembered load
    health = json.loads((venv.home / "cache" / "plugin-health.json").read_text())
    assert list(health) == ["omni-plugin-cpu==0.1.0/cpu"]
    # third-party commands are gone, from --help too
    assert not {"hello", "fixture-tools", "fixture-explode"} & help_commands(venv, *flag, **env)
    assert "No such command 'hello'" in omni("hello", code=2).stderr
    # freeze lists the active plugins only
    assert omni("plugins", "freeze").stdout.splitlines() == ["omni-plugin-cpu==0.1.0"]


def test_safe_mode_flag_applies_to_the_root_only(install):
    venv = install("omni-fixture-good")
    assert check(venv.omni("hello", "--name", "Ada")).stdout.strip() == GREETING
    # after the command name, --safe-mode is the command's own (unknown) option
    result = check(venv.omni("hello", "--safe-mode"), 2)
    assert "No such option: --safe-mode" in result.stdout + result.stderr


# --- persistent disable / enable -------------------------------------------------------------


def test_disable_and_enable_persist_in_the_config_file(install):
    venv = install("omni-fixture-good", "omni-fixture-dup-a")
    config = venv.home / "config" / "config.toml"
    assert not config.exists()

    out = check(venv.omni("plugins", "disable", "fixture-good")).stdout
    assert out.strip() == f"fixture-good is disabled; saved to {config}"
    assert tomllib.loads(config.read_text()) == {"plugins": {"disabled": ["fixture-good"]}}
    data = listing(venv)
    assert statuses(data) == {"cpu": "ok", "fixture-dup-a": "ok"} and data["hidden_disabled"] == 1
    assert "hello" not in help_commands(venv)
    check(venv.omni("hello"), 2)
    assert statuses(listing(venv, "--load")) == {"cpu": "ok", "fixture-dup-a": "ok"}

    again = check(venv.omni("plugins", "disable", "fixture-good")).stdout
    assert again.strip() == f"fixture-good is already disabled; saved to {config}"
    check(venv.omni("plugins", "disable", "fixture-dup-a"))
    assert tomllib.loads(config.read_text())["plugins"]["disabled"] == ["fixture-dup-a", "fixture-good"]
    unknown = check(venv.omni("plugins", "disable", "fixture-nope")).stdout
    assert "(no plugin of that name is installed right now)" in unknown

    out = check(venv.omni("plugins", "enable", "FIXTURE-GOOD")).stdout  # names are case-insensitive
    assert out.strip() == f"FIXTURE-GOOD is enabled; saved to {config}"
    assert tomllib.loads(config.read_text())["plugins"]["disabled"] == ["fixture-dup-a", "fixture-nope"]
    assert check(venv.omni("hello", "--name", "Ada")).stdout.strip() == GREETING
    assert "fixture-good is already enabled" in check(venv.omni("plugins", "enable", "fixture-good")).stdout

    # another config directory knows nothing of it; the env deny-list adds to the file's
    other = {"OMNI_CONFIG_DIR": str(venv.home / "other-config")}
    assert statuses(listing(venv, **other)) == {"cpu": "ok", "fixture-dup-a": "ok", "fixture-good": "ok"}
    assert statuses(listing(venv, OMNI_DISABLE_PLUGINS="fixture-good")) == {"cpu": "ok"}


def test_a_broken_config_file_is_reported_not_a_crash(install):
    venv = install("omni-fixture-good")
    config = venv.home / "config" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("[plugins]\ndisabled = 'fixture-good'\n")
    result = check(venv.omni("plugins", "list"), 1)
    assert f"error: config file {config} is invalid: [plugins] disabled must be a list of plugin names" in result.stderr
    # --help still works (without plugin commands) and says why
    shown = venv.omni("--help")
    check(shown)
    assert "warning: plugin commands unavailable" in shown.stderr


# --- freeze ----------------------------------------------------------------------------------


def test_freeze_prints_active_plugins_only(zoo):
    venv = zoo
    check(venv.omni("plugins", "disable", "fixture-dup-a"))
    check(venv.omni("plugins", "list", "--load"))  # learn which plugins fail to load
    lines = check(venv.omni("plugins", "freeze")).stdout.splitlines()
    assert lines == ["omni-fixture-dup-b==2.0.0", "omni-fixture-good==0.1.0", "omni-plugin-cpu==0.1.0"]
    assert check(venv.omni("plugins", "freeze", OMNI_PLUGINS="fixture-good")).stdout.splitlines() == [
        "omni-fixture-good==0.1.0",
        "omni-plugin-cpu==0.1.0",
    ]
