"""End to end: broken plugins are isolated, reported with a fix, and never take omni down.

Every fixture under ``tests/fixtures/plugins`` is pip-installed for real next to the CPU plugin
and driven through the real ``omni`` executable of a venv without torch.
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

from omni_core import PLUGIN_API_VERSION

pytestmark = pytest.mark.slow


#: every kind of breakage next to one good plugin
ZOO = (
    "omni-fixture-good",
    "omni-fixture-import-fails",
    "omni-fixture-hook-raises",
    "omni-fixture-incompatible",
    "omni-fixture-dup-a",
    "omni-fixture-dup-b",
    "omni-fixture-lying",
)
ZOO_STATUS = {
    "cpu": "ok",
    "fixture-good": "ok",
    "fixture-dup-a": "ok",
    "fixture-dup-b": "ok",
    "fixture-import-fails": "import-failed",
    "fixture-hook-raises": "hook-failed",
    "fixture-incompatible": "incompatible",
    "fixture-lying": "metadata-mismatch",
}
BROKEN = ("fixture-import-fails", "fixture-hook-raises", "fixture-incompatible", "fixture-lying")

IMPORT_REASON = (
    "importing 'omni_fixture_import_fails.hooks' raised ModuleNotFoundError: "
    "No module named 'omni_fixture_missing_dependency'"
)
HOOK_REASON = "omni_register_models raised RuntimeError: fixture hook exploded on purpose"
INCOMPATIBLE_REASON = f"supports omni plugin API >=2.0,<3, this core provides {PLUGIN_API_VERSION}"
MISMATCH_REASON = (
    "what the hooks registered differs from omni_plugin.toml: "
    "model 'declared-model' is declared but not registered; "
    "model 'undeclared-model' is registered but not declared; "
    "model 'moved-model': ref: declared 'omni_fixture_lying.model:Model', "
    "registered 'omni_fixture_lying.model:Other'"
)
CONFLICT_MESSAGE = (
    "model 'shared-model' is provided by omni-fixture-dup-a 1.0.0 (plugin 'fixture-dup-a') and "
    "omni-fixture-dup-b 2.0.0 (plugin 'fixture-dup-b') at the same priority (0). Pick one with "
    "`omni plugins pin model shared-model omni-fixture-dup-a`, or uninstall one of them."
)
GREETING = "hello, Ada, from omni-fixture-good"

#: Prints the resolved registries of a real load, for what the CLI does not show (models).
REGISTRIES = """
import json
from omni_core.kinds import Kind
from omni_core.plugins import load_plugins
ps = load_plugins()
print(json.dumps({
    "names": {k.value: ps.registry(k).names() for k in Kind},
    "providers": {k.value: {e.name: e.provider.distribution for e in ps.registry(k)} for k in Kind},
    "filtered": {k.value: ps.registry(k).filtered for k in Kind},
    "conflicts": [c.name for c in ps.conflicts],
    "notes": ps.notes,
}))
"""


@pytest.fixture
def install(install_plugins: Callable[..., Any], fixture_src: Path, torch_findable: Path) -> Callable[..., Any]:
    """Install fixture packages by distribution name; returns the Venv that sees them."""

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


def by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in data["plugins"]}


def statuses(data: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["status"] for p in data["plugins"]}


def registries(venv: Any, **env: str) -> dict[str, Any]:
    return json.loads(check(venv.run([venv.python, "-c", REGISTRIES], env=venv.env(**env))).stdout)


def other_home(venv: Any, name: str) -> Any:
    """The same installed plugins with a fresh config and cache directory."""
    return dataclasses.replace(venv, home=venv.home.parent / name)


def health_file(venv: Any) -> Path:
    return venv.home / "cache" / "plugin-health.json"


# --- outcomes of a load ---------------------------------------------------------------------


def test_load_reports_each_broken_plugin_with_reason_and_fix(zoo):
    venv = zoo
    data = listing(venv, "--load")
    assert data["loaded"] is True
    assert statuses(data) == ZOO_STATUS
    plugins = by_name(data)
    assert plugins["fixture-import-fails"]["reason"] == IMPORT_REASON
    assert plugins["fixture-import-fails"]["fix"] == (
        "install its missing dependencies, upgrade it, or `omni plugins disable fixture-import-fails`"
    )
    assert plugins["fixture-hook-raises"]["reason"] == HOOK_REASON
    assert "`omni plugins disable fixture-hook-raises`" in plugins["fixture-hook-raises"]["fix"]
    assert plugins["fixture-incompatible"]["reason"] == INCOMPATIBLE_REASON
    assert plugins["fixture-incompatible"]["fix"] == (
        "upgrade the plugin (pip install -U omni-fixture-incompatible) or install a matching omni-core"
    )
    assert plugins["fixture-incompatible"]["omni_api"] == ">=2.0,<3"
    assert plugins["fixture-lying"]["reason"] == MISMATCH_REASON
    for name, plugin in plugins.items():
        if name != "cpu":
            assert plugin["distribution"] == "omni-" + name
            assert plugin["version"] == {"fixture-dup-a": "1.0.0", "fixture-dup-b": "2.0.0"}.get(name, "0.1.0")
    # an incompatible plugin is never imported (its hook module raises at import)
    assert plugins["fixture-incompatible"]["loaded"] is False
    assert plugins["fixture-import-fails"]["loaded"] is False
    assert plugins["fixture-good"]["loaded"] is True
    # the hook failure keeps its traceback for whoever investigates, apart from the warnings
    hook_raises = plugins["fixture-hook-raises"]
    assert "fixture hook exploded on purpose" in hook_raises["traceback"] and hook_raises["warnings"] == []
    assert all(p["traceback"] == "" for n, p in plugins.items() if n != "fixture-hook-raises")
    # `omni plugins show` prints it from what the last load remembered, importing nothing
    shown = check(venv.omni("plugins", "show", "fixture-hook-raises")).stdout
    assert "  traceback:    Traceback (most recent call last):" in shown
    assert "RuntimeError: fixture hook exploded on purpose" in shown


def test_conflict_names_both_distributions_and_versions(zoo):
    venv = zoo
    for data in (listing(venv), listing(venv, "--load")):  # declared metadata, then a real load
        assert data["conflicts"] == [
            {
                "kind": "model",
                "name": "shared-model",
                "providers": [
                    {
                        "plugin": "fixture-dup-a",
                        "distribution": "omni-fixture-dup-a",
                        "version": "1.0.0",
                        "priority": 0,
                    },
                    {
                        "plugin": "fixture-dup-b",
                        "distribution": "omni-fixture-dup-b",
                        "version": "2.0.0",
                        "priority": 0,
                    },
                ],
                "message": CONFLICT_MESSAGE,
            }
        ]
        plugins = by_name(data)
        assert [c["name"] for c in plugins["fixture-dup-a"]["conflicts"]] == ["shared-model"]
        assert [c["name"] for c in plugins["fixture-dup-b"]["conflicts"]] == ["shared-model"]
        assert plugins["fixture-good"]["conflicts"] == []
    text = check(venv.omni("plugins", "list"))
    assert f"conflict: {CONFLICT_MESSAGE}" in text.stdout
    # the contested name is unusable; everything else resolves
    snapshot = registries(venv)
    assert snapshot["conflicts"] == ["shared-model"]
    assert snapshot["names"]["model"] == ["echo-model"]


def test_good_and_cpu_plugins_keep_working_next_to_broken_ones(zoo):
    venv = zoo
    assert check(venv.omni("hello", "--name", "Ada")).stdout.strip() == GREETING
    assert check(venv.omni("hello")).stdout.strip() == "hello, world, from omni-fixture-good"
    assert check(venv.omni("fixture-tools", "ping")).stdout.strip() == "pong from omni-fixture-good"
    assert check(venv.omni("fixture-tools", "version")).stdout.strip() == "omni-fixture-good 0.1.0"
    explained = check(venv.omni("explain", "platform", "--json")).json()
    assert explained["winner"] == "cpu"
    assert explained["rule"] == "only claimant"
    snapshot = registries(venv)
    assert snapshot["names"]["platform"] == ["cpu"]
    assert {"FIXTURE_ATTN", "TORCH_SDPA"} <= set(snapshot["names"]["attention_backend"])
    assert snapshot["names"]["command"] == ["fixture-tools", "hello"]
    assert snapshot["providers"]["model"] == {"echo-model": "omni-fixture-good"}
    # nothing of the failed plugins was registered, not even what the hook did before raising
    assert "exploding-model" not in snapshot["names"]["model"]
    assert "undeclared-model" not in snapshot["names"]["model"]


def test_plugin_commands_appear_in_help_without_loading_plugins(zoo):
    venv = zoo
    help_text = check(venv.omni("--help")).stdout
    assert re.search(r"^\s+hello\s+Print a greeting from the good fixture plugin\.", help_text, re.M)
    assert re.search(r"^\s+fixture-tools\s+A Typer command group", help_text, re.M)
    for builtin in ("plugins", "doctor", "explain", "install", "uninstall"):
        assert re.search(rf"^\s+{builtin}\s", help_text, re.M)
    assert not health_file(venv).exists()  # --help read manifests only
    # help of a plugin command is the plugin's own
    assert "--name" in check(venv.omni("hello", "--help")).stdout


def test_command_of_a_failed_plugin_fails_clearly_and_runs_nothing(zoo):
    venv = zoo
    # declared in the manifest, so listed; its plugin's hooks raise, so it never registers
    assert "fixture-explode" in check(venv.omni("--help")).stdout
    result = check(venv.omni("fixture-explode"), 1)
    assert "this must never run" not in result.stdout
    assert (
        "error: command 'fixture-explode' comes from omni-fixture-hook-raises 0.1.0 (plugin 'fixture-hook-raises'), "
        "which is hook-failed: omni_register_models raised RuntimeError" in result.stderr
    )


# --- what `plugins list` knows without loading ----------------------------------------------


@pytest.mark.parametrize("loader", [("doctor",), ("plugins", "list", "--load")], ids=["doctor", "list-load"])
def test_list_shows_incompatible_at_once_and_remembers_load_failures(zoo, loader):
    venv = zoo
    before = listing(venv)
    assert before["loaded"] is False
    # knowable from metadata alone: the API range; import and hook failures are not known yet
    assert statuses(before) == {
        **ZOO_STATUS,
        "fixture-import-fails": "ok",
        "fixture-hook-raises": "ok",
        "fixture-lying": "ok",
    }
    assert by_name(before)["fixture-incompatible"]["reason"] == INCOMPATIBLE_REASON
    assert all(p["last_load"] is None for p in before["plugins"])
    assert not health_file(venv).exists()

    venv.omni(*loader)  # doctor exits 1 here; list --load exits 0
    after = listing(venv)
    assert after["loaded"] is False
    assert statuses(after) == ZOO_STATUS
    plugins = by_name(after)
    for name, reason in (
        ("fixture-import-fails", IMPORT_REASON),
        ("fixture-hook-raises", HOOK_REASON),
        ("fixture-lying", MISMATCH_REASON),
    ):
        assert re.fullmatch(
            re.escape(reason) + r" \(last load \d{4}-\d\d-\d\dT[\d:]+[+-]\d{4}\)", plugins[name]["reason"]
        )
        assert plugins[name]["last_load"]["status"] == ZOO_STATUS[name]
        assert plugins[name]["fix"]
    assert plugins["fixture-good"]["last_load"]["status"] == "ok"
    text = check(venv.omni("plugins", "list")).stdout
    assert "fixture-import-fails: import-failed: " + IMPORT_REASON in text
    # the memory is per home: another config/cache directory has not seen the load
    assert statuses(listing(other_home(venv, "fresh")))["fixture-import-fails"] == "ok"


# --- doctor ------------------------------------------------------------------------------------


def test_doctor_exits_1_and_prints_every_problem_with_a_fix(zoo):
    venv = zoo
    result = check(venv.omni("doctor"), 1)
    problems = re.findall(r"^problem (\d+): (.*)\n  fix: (.*)$", result.stdout, re.M)
    assert [int(n) for n, _, _ in problems] == [1, 2, 3, 4, 5]
    found = {text: fix for _, text, fix in problems}
    assert found == {
        f"plugin 'fixture-hook-raises' from omni-fixture-hook-raises 0.1.0: hook-failed: {HOOK_REASON}": (
            "fix the plugin or `omni plugins disable fixture-hook-raises`; "
            "`omni plugins show fixture-hook-raises` shows the traceback"
        ),
        f"plugin 'fixture-import-fails' from omni-fixture-import-fails 0.1.0: import-failed: {IMPORT_REASON}": (
            "install its missing dependencies, upgrade it, or `omni plugins disable fixture-import-fails`"
        ),
        f"plugin 'fixture-incompatible' from omni-fixture-incompatible 0.1.0: incompatible: {INCOMPATIBLE_REASON}": (
            "upgrade the plugin (pip install -U omni-fixture-incompatible) or install a matching omni-core"
        ),
        f"plugin 'fixture-lying' from omni-fixture-lying 0.1.0: metadata-mismatch: {MISMATCH_REASON}": (
            "make omni_plugin.toml and the hooks agree (the conformance kit shows the diff)"
        ),
        CONFLICT_MESSAGE: "omni plugins pin model shared-model DISTRIBUTION",
    }
    assert "=> cpu (only claimant)" in result.stdout  # the platform is still chosen and described
    report = check(venv.omni("doctor", "--json"), 1).json()
    assert len(report["problems"]) == 5 and all(p["fix"] for p in report["problems"])
    assert {p["name"]: p["status"] for p in report["plugins"]} == ZOO_STATUS
    assert report["platform"]["winner"] == "cpu"
    assert report["hardware"]["device_type"] == "cpu"


def test_disabling_the_broken_plugins_makes_doctor_clean(zoo):
    venv = zoo
    check(venv.omni("doctor"), 1)
    for name in (*BROKEN, "fixture-dup-a"):
        out = check(venv.omni("plugins", "disable", name)).stdout
        assert out.strip() == f"{name} is disabled; saved to {venv.home / 'config' / 'config.toml'}"
    result = check(venv.omni("doctor"))
    assert "no problems found" in result.stdout
    config = tomllib.loads((venv.home / "config" / "config.toml").read_text())
    assert config == {"plugins": {"disabled": sorted((*BROKEN, "fixture-dup-a"))}}

    data = listing(venv)
    assert statuses(data) == {"cpu": "ok", "fixture-dup-b": "ok", "fixture-good": "ok"}
    assert data["hidden_disabled"] == 5 and data["conflicts"] == []
    everything = by_name(listing(venv, "--all"))
    for name in (*BROKEN, "fixture-dup-a"):
        assert everything[name]["status"] == "disabled"
        assert everything[name]["reason"] == "disabled by OMNI_DISABLE_PLUGINS or `omni plugins disable`"
        assert everything[name]["fix"] == f"`omni plugins enable {name}`"
    # disabling an incompatible plugin silences it but keeps what was wrong visible
    assert everything["fixture-incompatible"]["notes"] == [f"also incompatible: {INCOMPATIBLE_REASON}"]
    assert everything["fixture-incompatible"]["warnings"] == []
    # and the strict gate passes too
    check(venv.omni("--strict", "plugins", "list", "--load", "--json"))
    check(venv.omni("--strict", "doctor"))

    check(venv.omni("plugins", "enable", "fixture-import-fails"))
    result = check(venv.omni("doctor"), 1)
    problems = re.findall(r"^problem \d+: (.*)$", result.stdout, re.M)
    assert problems == [
        f"plugin 'fixture-import-fails' from omni-fixture-import-fails 0.1.0: import-failed: {IMPORT_REASON}"
    ]


# --- strict mode -------------------------------------------------------------------------------


STRICT_CASES = {
    "import-failed": (("fixture-import-fails",), f"import-failed: {IMPORT_REASON}"),
    "hook-failed": (("fixture-hook-raises",), f"hook-failed: {HOOK_REASON}"),
    "incompatible": (("fixture-incompatible",), f"incompatible: {INCOMPATIBLE_REASON}"),
    "metadata-mismatch": (("fixture-lying",), f"metadata-mismatch: {MISMATCH_REASON}"),
    "conflict": (("fixture-dup-a", "fixture-dup-b"), CONFLICT_MESSAGE),
}


def test_strict_mode_turns_each_problem_into_exit_3(zoo):
    venv = zoo
    for case, (plugins, problem) in STRICT_CASES.items():
        # OMNI_PLUGINS narrows the zoo to the good plugin plus this one problem
        allow = ",".join(("fixture-good", *plugins))
        home = other_home(venv, f"home-{case}")
        # without strict mode the problem is skipped and the good plugin works
        assert check(home.omni("hello", "--name", "Ada", OMNI_PLUGINS=allow)).stdout.strip() == GREETING
        strict_runs = [
            home.omni("plugins", "list", "--load", "--json", OMNI_PLUGINS=allow, OMNI_STRICT_PLUGINS="1"),
            home.omni("--strict", "plugins", "list", "--load", "--json", OMNI_PLUGINS=allow),
            home.omni("--strict", "hello", "--name", "Ada", OMNI_PLUGINS=allow),
            home.omni("explain", "platform", OMNI_PLUGINS=allow, OMNI_STRICT_PLUGINS="1"),
        ]
        for result in strict_runs:
            check(result, 3)
            assert result.stderr.startswith("error: 1 plugin problem(s) with OMNI_STRICT_PLUGINS=1:\n"), case
            assert problem in result.stderr, case
            assert GREETING not in result.stdout
        # doctor reports everything first, then exits 3 in strict mode
        doctor = check(home.omni("--strict", "doctor", OMNI_PLUGINS=allow), 3)
        assert problem in doctor.stdout, case
        # after a load, plain `plugins list` remembers the problem and fails the strict gate too
        check(home.omni("--strict", "plugins", "list", "--json", OMNI_PLUGINS=allow), 3)


def test_strict_mode_names_every_problem_at_once(zoo):
    venv = zoo
    result = check(venv.omni("plugins", "list", "--load", OMNI_STRICT_PLUGINS="1"), 3)
    lines = result.stderr.splitlines()
    assert lines[0] == "error: 5 plugin problem(s) with OMNI_STRICT_PLUGINS=1:"
    assert lines[-1] == "Fix or uninstall the plugins named above, or unset OMNI_STRICT_PLUGINS to skip them."
    for plugin in BROKEN:
        assert sum(f"plugin '{plugin}' from omni-{plugin} 0.1.0: " in line for line in lines) == 1
    assert f"  - {CONFLICT_MESSAGE}" in lines


# --- recovery commands -------------------------------------------------------------------------


def test_recovery_commands_work_while_broken_plugins_are_installed(zoo):
    venv = zoo
    config = venv.home / "config" / "config.toml"
    for env in ({}, {"OMNI_STRICT_PLUGINS": "1"}):
        # none of these loads a plugin, so none can be broken by one
        check(venv.omni("plugins", "list", **env), 3 if env else 0)  # strict: incompatible + conflict
        check(venv.omni("plugins", "list", "--all", **env), 3 if env else 0)
        shown = check(venv.omni("plugins", "show", "fixture-import-fails", "--json", **env)).json()
        assert shown["status"] == "ok" and shown["module"] == "omni_fixture_import_fails.hooks"
        check(venv.omni("plugins", "disable", "fixture-import-fails", **env))
        assert tomllib.loads(config.read_text())["plugins"]["disabled"] == ["fixture-import-fails"]
        check(venv.omni("plugins", "enable", "fixture-import-fails", **env))
        assert tomllib.loads(config.read_text())["plugins"]["disabled"] == []
        check(venv.omni("plugins", "pin", "model", "shared-model", "omni-fixture-dup-a", **env))
        check(venv.omni("plugins", "unpin", "model", "shared-model", **env))
        check(venv.omni("plugins", "freeze", **env))
        check(venv.omni("--help", **env))
        assert not health_file(venv).exists(), "a recovery command loaded plugins"
    # doctor loads everything, isolated: it reports instead of crashing
    assert "problem 1: " in check(venv.omni("doctor"), 1).stdout


# --- conflicts and pins ------------------------------------------------------------------------


def test_pin_resolves_a_conflict(install):
    venv = install("omni-fixture-good", "omni-fixture-dup-a", "omni-fixture-dup-b")
    assert "problem 1: " + CONFLICT_MESSAGE in check(venv.omni("doctor"), 1).stdout
    check(venv.omni("--strict", "plugins", "list", "--load"), 3)

    out = check(venv.omni("plugins", "pin", "model", "shared-model", "omni-fixture-dup-b")).stdout
    config_path = venv.home / "config" / "config.toml"
    assert out.strip() == f"model shared-model pinned to omni-fixture-dup-b; saved to {config_path}"
    assert tomllib.loads(config_path.read_text())["pins"] == {"model": {"shared-model": "omni-fixture-dup-b"}}
    assert listing(venv)["conflicts"] == []
    assert listing(venv, "--load")["conflicts"] == []
    assert "no problems found" in check(venv.omni("doctor")).stdout
    check(venv.omni("--strict", "plugins", "list", "--load"))
    snapshot = registries(venv)
    assert snapshot["providers"]["model"] == {"echo-model": "omni-fixture-good", "shared-model": "omni-fixture-dup-b"}

    check(venv.omni("plugins", "pin", "models", "SHARED-MODEL", "omni_fixture_dup_a"))  # names normalise
    assert registries(venv)["providers"]["model"]["shared-model"] == "omni-fixture-dup-a"

    check(venv.omni("plugins", "unpin", "model", "shared-model"))
    check(venv.omni("plugins", "unpin", "model", "SHARED-MODEL"))
    assert [c["name"] for c in listing(venv)["conflicts"]] == ["shared-model"]

    # a pin naming no provider is reported and decides nothing
    check(venv.omni("plugins", "pin", "model", "shared-model", "omni-fixture-nope"))
    doctor = check(venv.omni("doctor"), 1)
    assert "note: pin model.shared-model = 'omni-fixture-nope' names no installed provider; ignored" in doctor.stdout
    assert "problem 1: " + CONFLICT_MESSAGE in doctor.stdout


def test_pin_of_an_unknown_kind_is_refused(install):
    venv = install("omni-fixture-dup-a")
    result = check(venv.omni("plugins", "pin", "widget", "shared-model", "omni-fixture-dup-a"), 1)
    assert "unknown extension kind 'widget'" in result.stderr
    assert not (venv.home / "config" / "config.toml").exists()


# --- platforms ---------------------------------------------------------------------------------


def test_a_raising_platform_probe_is_reported_never_silent(install):
    venv = install("omni-fixture-good", "omni-fixture-platform", "omni-fixture-bad-probe")
    explained = check(venv.omni("explain", "platform"))
    assert re.search(
        r"^  ! fixture-broken\s+failed\s+probe raised RuntimeError: fixture probe exploded on purpose"
        r"  \[omni-fixture-bad-probe 0\.1\.0 \(plugin 'fixture-bad-probe'\)\]$",
        explained.stdout,
        re.M,
    )
    assert "=> cpu (only claimant)" in explained.stdout
    candidates = {c["name"]: c for c in check(venv.omni("explain", "platform", "--json")).json()["candidates"]}
    assert candidates["fixture-broken"]["outcome"] == "failed"
    assert candidates["fixture-accel"]["outcome"] == "rejected"
    assert candidates["fixture-accel"]["reason"] == "does not claim: FIXTURE_ACCEL is not 1"
    assert candidates["cpu"]["outcome"] == "selected"

    doctor = check(venv.omni("doctor"), 1)
    assert (
        "problem 1: platform probe 'fixture-broken' failed: "
        "probe raised RuntimeError: fixture probe exploded on purpose\n"
        "  fix: fix or disable the plugin providing it (omni-fixture-bad-probe 0.1.0 (plugin 'fixture-bad-probe'))"
    ) in doctor.stdout
    assert re.findall(r"^problem \d+", doctor.stdout, re.M) == ["problem 1"]
    check(venv.omni("--strict", "doctor"), 3)
    # the plugin itself loaded fine: only its probe is broken
    assert statuses(listing(venv, "--load"))["fixture-bad-probe"] == "ok"

    check(venv.omni("plugins", "disable", "fixture-bad-probe"))
    assert "no problems found" in check(venv.omni("doctor")).stdout


def test_platform_priority_and_forcing(install):
    venv = install("omni-fixture-platform")

    def explain(**env: str) -> dict[str, Any]:
        return check(venv.omni("explain", "platform", "--json", **env)).json()

    plain = explain()
    assert (plain["winner"], plain["rule"]) == ("cpu", "only claimant")

    accel = explain(FIXTURE_ACCEL="1")
    assert (accel["winner"], accel["rule"]) == ("fixture-accel", "highest priority (10) among claimants")
    outcomes = {c["name"]: (c["outcome"], c["reason"]) for c in accel["candidates"]}
    assert outcomes["fixture-accel"] == ("selected", "claims: FIXTURE_ACCEL=1 (priority 10)")
    assert outcomes["cpu"][0] == "rejected" and outcomes["cpu"][1].endswith("(priority -100)")

    doctor = check(venv.omni("doctor", "--json", FIXTURE_ACCEL="1")).json()
    assert doctor["hardware"]["platform"] == "fixture-accel"
    assert doctor["hardware"]["device_type"] == "fixture"
    assert doctor["hardware"]["device_count"] == 2
    assert doctor["hardware"]["default_attention_chain"] == ["FIXTURE_ATTN", "TORCH_SDPA"]

    # forcing skips the choice, not the probe: absent hardware is an error quoting the probe
    absent = check(venv.omni("explain", "platform", "--json", OMNI_PLATFORM="fixture-accel"), 1).json()
    assert absent["winner"] is None
    assert (
        "forces platform 'fixture-accel', but its probe says the hardware is absent: FIXTURE_ACCEL is not 1"
        in (absent["rule"])
    )
    forced = explain(OMNI_PLATFORM="fixture-accel", FIXTURE_ACCEL="1")
    assert (forced["winner"], forced["rule"]) == (
        "fixture-accel",
        "forced by OMNI_PLATFORM or config platform=fixture-accel",
    )
    assert {c["name"]: c["outcome"] for c in forced["candidates"]} == {
        "cpu": "not-considered",
        "fixture-accel": "selected",
    }
    assert explain(OMNI_PLATFORM="cpu", FIXTURE_ACCEL="1")["winner"] == "cpu"

    unknown = check(venv.omni("explain", "platform", OMNI_PLATFORM="nope"), 1)
    assert "=> nothing selected (OMNI_PLATFORM=nope names no installed platform (installed: cpu, fixture-accel))" in (
        unknown.stdout
    )
    check(venv.omni("doctor", OMNI_PLATFORM="nope"), 1)

    # the config file's platform = "..." forces too, and the environment overrides it
    config = venv.home / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('platform = "fixture-accel"\n')
    assert explain(FIXTURE_ACCEL="1")["winner"] == "fixture-accel"
    assert explain(OMNI_PLATFORM="cpu")["winner"] == "cpu"
