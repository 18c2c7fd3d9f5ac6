"""The fault battery, plugin side: plugins that break in every way cannot take omni down.

Real fixture plugins are pip-installed into site directories next to the CPU plugin and driven
through the real ``omni`` executable. Every row of :data:`ROWS` is one scenario: the plugins it
sees, the setup, the command, the exit code, and the words the message must contain; every row
also checks that no traceback and no raw terminal control character reached the user
(:mod:`faults`). A fault found later gets a row here.

The fixture distributions (``tests/fixtures/plugins``):

* ``omni-fixture-faults``: one distribution, many plugins, each broken in one way: manifests
  that are not UTF-8, not TOML or of the wrong shape; ``sys.exit()`` and a self-raised
  ``KeyboardInterrupt`` at import, in a registration hook and in ``omni_configure``; a hook
  module importing numpy; plugin commands that exit 7, exit 2, raise, interrupt themselves or
  whose module exits on import; a plugin whose name, description, reason and help carry
  terminal escape sequences and a shell metacharacter.
* ``omni-fixture-probes``: platform probes that exit, interrupt, hang, find nothing or answer
  None, and a platform with a bug omni does not expect.
* ``omni-fixture-os-exit``: ``os._exit(0)`` in a registration hook.
* ``omni-fixture-squatter``: a third-party plugin that calls itself ``CPU``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from faults import assert_clean_failure, assert_no_control_chars, assert_unchanged, snapshot
from omni_testenv import REPO, Result, Venv

pytestmark = pytest.mark.slow

SITES = {
    "faults": ("omni-fixture-faults", "omni-fixture-probes"),
    "os-exit": ("omni-fixture-os-exit",),
    "squatter": ("omni-fixture-squatter",),
}
#: the hostile plugin's name, as its pyproject.toml spells it: ESC, then a shell command
HOSTILE = "evil\x1b[31m;rm -rf ~"
#: how omni must show it in a fix hint: ANSI-C quoted, one shell word, escapes visible
HOSTILE_QUOTED = "$'evil\\x1b[31m;rm -rf ~'"
#: every row runs with a short probe bound, so the hanging probe costs one second
PROBE_TIMEOUT = "1"


@pytest.fixture(scope="module")
def sites(base_venv: Venv, fixture_src: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each group of fixture distributions pip-installed once, into a site nobody changes."""
    found = {}
    for name, dists in SITES.items():
        site = tmp_path_factory.mktemp(f"site-{name}")
        packages = [fixture_src / d for d in dists]
        base_venv.pip("install", "--quiet", "--no-deps", "--no-build-isolation", "--target", site, *packages)
        found[name] = site
    return found


@pytest.fixture
def venv_for(base_venv: Venv, sites: dict[str, Path], torch_findable: Path, tmp_path: Path) -> Callable[[str], Venv]:
    """A venv that sees one site, with config and cache directories of this test's own
    (torch findable, as in a real install, so that a clean doctor is possible)."""

    def make(site: str) -> Venv:
        venv = base_venv.with_site(sites[site], tmp_path / "home")
        return dataclasses.replace(venv, extra_paths=[*venv.extra_paths, torch_findable])

    return make


@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    command: tuple[str, ...]
    code: int
    mentions: tuple[str, ...]
    site: str = "faults"
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    #: run first: ("omni", *args) runs omni (any exit code), ("write", relative path, text) writes
    #: a file under the test's home (config/..., cache/...)
    setup: tuple[tuple[str, ...], ...] = ()
    #: words that must not appear
    absent: tuple[str, ...] = ()


UTF8_MANIFEST = "omni_fixture_bad_utf8/omni_plugin.toml"
LOADED_BROKEN = {
    "fixture-exit-import": "importing 'omni_fixture_exit_import.hooks' raised SystemExit: sys.exit(3) was called",
    "fixture-kbint-import": (
        "importing 'omni_fixture_kbint_import.hooks' raised KeyboardInterrupt, though no Ctrl-C was pressed"
    ),
    "fixture-exit-hook": "omni_register_models raised SystemExit: sys.exit(4) was called",
    "fixture-kbint-hook": "omni_register_models raised KeyboardInterrupt, though no Ctrl-C was pressed",
    "fixture-exit-configure": "omni_configure raised SystemExit: sys.exit(5) was called",
    "fixture-kbint-configure": "omni_configure raised KeyboardInterrupt, though no Ctrl-C was pressed",
}

ROWS = [
    # --- 1. a manifest that is not UTF-8, not TOML, or the wrong shape: that plugin only -------
    Row(
        "manifest-not-utf8-listed",
        ("plugins", "list"),
        0,
        ("fixture-bad-utf8", "invalid-manifest", "not valid UTF-8 (byte 0xe9", UTF8_MANIFEST),
    ),
    Row(
        "manifest-not-toml-listed",
        ("plugins", "list"),
        0,
        ("fixture-bad-toml", "invalid-manifest", "omni_fixture_bad_toml/omni_plugin.toml", "Expected ']]'"),
    ),
    Row(
        "manifest-wrong-shape-listed",
        ("plugins", "list"),
        0,
        ("fixture-bad-shape", "omni_fixture_bad_shape/omni_plugin.toml", "[model] must be an array of tables"),
    ),
    Row(
        "manifest-not-utf8-through-a-corrupt-manifest-cache",
        ("plugins", "list"),
        0,
        ("fixture-bad-utf8", "invalid-manifest", "not valid UTF-8", UTF8_MANIFEST),
        setup=(("write", "cache/manifest-cache.json", '{"format": 1, "manifests": {"x": 1'),),
    ),
    Row(
        "manifest-not-utf8-through-a-warm-manifest-cache",
        ("plugins", "list"),
        0,
        ("fixture-bad-utf8", "invalid-manifest", "not valid UTF-8", UTF8_MANIFEST),
        setup=(("omni", "plugins", "list"), ("omni", "plugins", "list")),
    ),
    Row(
        "manifest-cache-entry-poisoned-is-not-trusted",
        ("plugins", "list"),
        0,
        ("cpu ", "ok"),
        site="squatter",
        setup=(("omni", "plugins", "list"), ("poison-manifest-cache",)),
        absent=("invalid-manifest",),
    ),
    Row("manifest-not-utf8-shown", ("plugins", "show", "fixture-bad-utf8"), 0, ("invalid-manifest", UTF8_MANIFEST)),
    Row(
        "manifest-not-utf8-disabled",
        ("plugins", "disable", "fixture-bad-utf8"),
        0,
        ("fixture-bad-utf8 is disabled; saved to",),
    ),
    Row(
        "manifest-not-utf8-disabled-then-listed",
        ("plugins", "list", "--all"),
        0,
        ("fixture-bad-utf8", "disabled"),
        setup=(("omni", "plugins", "disable", "fixture-bad-utf8"),),
        absent=("not valid UTF-8",),
    ),
    Row(
        "manifest-not-utf8-enabled-again",
        ("plugins", "enable", "fixture-bad-utf8"),
        0,
        ("fixture-bad-utf8 is enabled",),
        setup=(("omni", "plugins", "disable", "fixture-bad-utf8"),),
    ),
    Row(
        "manifest-not-utf8-in-doctor",
        ("doctor",),
        1,
        ("plugin 'fixture-bad-utf8'", "invalid-manifest", "not valid UTF-8", "omni plugins disable fixture-bad-utf8"),
    ),
    Row("manifest-not-utf8-safe-mode-doctor", ("--safe-mode", "doctor"), 0, ("no problems found",)),
    Row(
        "manifest-not-utf8-safe-mode-list",
        ("--safe-mode", "plugins", "list", "--all"),
        0,
        ("fixture-bad-utf8", "disabled"),
        absent=("not valid UTF-8",),
    ),
    Row(
        "manifest-not-utf8-OMNI_PLUGINS",
        ("plugins", "list", "--load"),
        0,
        ("fixture-bad-utf8", "invalid-manifest"),
        env={"OMNI_PLUGINS": "fixture-bad-utf8"},
    ),
    Row(
        "manifest-not-utf8-OMNI_DISABLE_PLUGINS",
        ("plugins", "show", "fixture-bad-utf8"),
        0,
        ("fixture-bad-utf8", "disabled by OMNI_DISABLE_PLUGINS"),
        env={"OMNI_DISABLE_PLUGINS": "fixture-bad-utf8"},
    ),
    # --- 2. SystemExit and KeyboardInterrupt from plugin code are that plugin's failure ------
    *(Row(f"{name}-load", ("plugins", "list", "--load"), 0, (name, reason)) for name, reason in LOADED_BROKEN.items()),
    Row(
        "exits-and-interrupts-in-doctor",
        ("doctor",),
        1,
        tuple(f"plugin {name!r} from omni-fixture-faults 0.1.0" for name in LOADED_BROKEN),
    ),
    Row(
        "exits-and-interrupts-remembered-by-list",
        ("plugins", "list"),
        0,
        ("hook-failed", LOADED_BROKEN["fixture-exit-hook"], "(last load"),
        setup=(("omni", "plugins", "list", "--load"),),
    ),
    Row("exits-and-interrupts-strict", ("--strict", "plugins", "list", "--load"), 3, tuple(LOADED_BROKEN)),
    Row(
        "probe-sys-exit",
        ("explain", "platform"),
        0,
        ("probe-exit", "failed", "probe raised SystemExit: sys.exit(9) was called", "=> cpu"),
    ),
    Row(
        "probe-keyboard-interrupt",
        ("explain", "platform"),
        0,
        ("probe-kbint", "failed", "probe raised KeyboardInterrupt, though no Ctrl-C was pressed", "=> cpu"),
    ),
    Row(
        "lazy-ref-sys-exit-on-import",
        ("plugins", "show", "fixture-fault-commands", "--import"),
        1,
        ("exits_on_import", "SystemExit: sys.exit(6) was called", "omni plugins disable fixture-fault-commands"),
    ),
    Row(
        "command-module-sys-exit-on-import",
        ("exit-on-import",),
        1,
        ("exits_on_import", "SystemExit: sys.exit(6) was called", "omni plugins disable fixture-fault-commands"),
    ),
    Row(
        "command-sys-exit-7",
        ("exit-seven",),
        1,
        ("plugin command 'exit-seven'", "fixture-fault-commands", "exited with code 7", "reports it as 1"),
    ),
    Row("command-sys-exit-2-kept", ("exit-two",), 2, ()),
    Row(
        "command-keyboard-interrupt",
        ("kbint-command",),
        1,
        ("plugin command 'kbint-command'", "KeyboardInterrupt, though no Ctrl-C was pressed", "omni plugins disable"),
    ),
    Row(
        "command-raises",
        ("crash-command",),
        1,
        ("plugin command 'crash-command'", "RuntimeError: fixture command crashed on purpose", "OMNI_DEBUG=1"),
    ),
    # --- 5. probes under a time bound -------------------------------------------------------
    Row(
        "probe-hangs-explain",
        ("explain", "platform"),
        0,
        ("probe-hang", "failed", "probe took longer than 1 s (OMNI_PROBE_TIMEOUT)", "=> cpu"),
    ),
    Row(
        "probe-hangs-doctor",
        ("doctor",),
        1,
        ("platform probe 'probe-hang' failed: probe took longer than 1 s", "fixture-probe-hang"),
    ),
    Row(
        "probe-timeout-not-a-number",
        ("explain", "platform"),
        1,
        ("OMNI_PROBE_TIMEOUT='soon'", "set it to e.g. 5"),
        env={"OMNI_PROBE_TIMEOUT": "soon"},
    ),
    # --- 6. a forced platform whose probe finds no hardware --------------------------------
    Row(
        "forced-platform-absent",
        ("explain", "platform"),
        1,
        ("OMNI_PLATFORM=probe-absent", "hardware is absent", "/dev/fixture0 not found", "Unset OMNI_PLATFORM"),
        env={"OMNI_PLATFORM": "probe-absent"},
    ),
    Row(
        "forced-platform-probe-answers-none",
        ("explain", "platform"),
        1,
        ("forces platform 'probe-none'", "probe answered None"),
        env={"OMNI_PLATFORM": "probe-none"},
    ),
    Row(
        "forced-platform-absent-from-config",
        ("explain", "attention"),
        1,
        ("forces platform 'probe-absent'", "/dev/fixture0 not found", "config.toml"),
        setup=(("write", "config/config.toml", 'platform = "probe-absent"\n'),),
    ),
    Row(
        "explain-attention-for-another-machine-needs-no-hardware",
        ("explain", "attention", "--platform", "probe-absent", "--role", "self"),
        0,
        ("platform probe-absent", "TORCH_SDPA"),
    ),
    # --- 7. a registration-time heavy import is reported by doctor -------------------------
    Row(
        "heavy-import-in-doctor",
        ("doctor",),
        1,
        ("plugin 'fixture-heavy'", "imports numpy when it registers", "import it lazily inside the function"),
    ),
    # --- 9. text from plugins is shown escaped, fix hints are shell-quoted -----------------
    Row("hostile-name-listed", ("plugins", "list"), 0, ("evil\\x1b[31m;rm -rf ~",)),
    Row(
        "hostile-reason-and-fix",
        ("plugins", "list", "--load"),
        0,
        ("\\x1b[2J\\x1b]0;pwned\\x07screen cleared\\r fix", f"`omni plugins disable {HOSTILE_QUOTED}`"),
    ),
    Row(
        "hostile-description-shown",
        ("plugins", "show", HOSTILE),
        0,
        ("\\x1b[31mred\\x07 and \\x9b2J C1 too\\r faked line",),
    ),
    Row("hostile-help", ("--help",), 0, ("hostile-help", "\\x1b]0;retitled\\x07 help")),
    Row("hostile-in-doctor", ("doctor",), 1, (HOSTILE_QUOTED,)),
    Row(
        "hostile-command-error",
        ("hostile-help",),
        1,
        ("comes from", "import-failed", "\\x1b]0;pwned\\x07", HOSTILE_QUOTED),
    ),
    # --- 10. exit codes and the unexpected ---------------------------------------------------
    Row(
        "unexpected-exception-is-one-line",
        ("explain", "attention"),
        1,
        ("internal error: AttributeError: fixture platform bug", "rerun with OMNI_DEBUG=1", "report it"),
        env={"OMNI_PLATFORM": "buggy-platform"},
    ),
    Row(
        "broken-config-list",
        ("plugins", "list"),
        1,
        ("config.toml", "delete it"),
        setup=(("write", "config/config.toml", "[plugins\ndisabled = 3\n"),),
        absent=("plugin commands unavailable",),  # the error is said once, not twice
    ),
    Row(
        "broken-config-disable",
        ("plugins", "disable", "fixture-bad-utf8"),
        1,
        ("config.toml", "delete it"),
        setup=(("write", "config/config.toml", "[plugins]\ndisabled = 3\n"),),
        absent=("plugin commands unavailable",),  # the error is said once, not twice
    ),
    Row(
        "broken-config-enable",
        ("plugins", "enable", "fixture-bad-utf8"),
        1,
        ("config.toml", "delete it"),
        setup=(("write", "config/config.toml", "\xff\xfe not utf-8"),),
        absent=("plugin commands unavailable",),  # the error is said once, not twice
    ),
    Row(
        "broken-config-show",
        ("plugins", "show", "cpu"),
        1,
        ("config.toml", "delete it"),
        setup=(("write", "config/config.toml", "unknown = 1\n"),),
        absent=("plugin commands unavailable",),  # the error is said once, not twice
    ),
    Row(
        "broken-config-doctor",
        ("doctor",),
        1,
        ("config.toml", "delete it"),
        setup=(("write", "config/config.toml", "platform = 3\n"),),
        absent=("plugin commands unavailable",),  # the error is said once, not twice
    ),
    # --- 3. os._exit: the next command names the plugin ------------------------------------
    Row(
        "os-exit-named-by-list",
        ("plugins", "list"),
        0,
        (
            "fixture-os-exit",
            "crashed",
            "the last omni run ended while loading plugin 'fixture-os-exit'",
            "omni_register_models",
            "os._exit",
            "omni plugins disable fixture-os-exit",
        ),
        site="os-exit",
        setup=(("omni", "plugins", "list", "--load"),),
    ),
    Row(
        "os-exit-named-by-show",
        ("plugins", "show", "fixture-os-exit"),
        0,
        ("status:       crashed", "os._exit"),
        site="os-exit",
        setup=(("omni", "plugins", "list", "--load"),),
    ),
    Row(
        "os-exit-disabled-then-doctor-is-clean",
        ("doctor",),
        0,
        ("no problems found",),
        site="os-exit",
        setup=(("omni", "plugins", "list", "--load"), ("omni", "plugins", "disable", "fixture-os-exit")),
        absent=("os._exit",),
    ),
    Row(
        "os-exit-not-blamed-without-a-crash",
        ("plugins", "list"),
        0,
        ("fixture-os-exit",),
        site="os-exit",
        absent=("crashed", "os._exit"),
    ),
    # --- 4. a plugin named like the built-in never replaces it -------------------------------
    Row(
        "squatter-refused",
        ("plugins", "list", "--load"),
        0,
        (
            "duplicate-name",
            "plugin name 'CPU' belongs to the built-in plugin 'cpu'",
            "`omni uninstall omni-fixture-squatter`",
        ),
        site="squatter",
    ),
    Row("squatter-cpu-still-selected", ("explain", "platform"), 0, ("=> cpu",), site="squatter", absent=("squat ",)),
    Row("squatter-safe-mode", ("--safe-mode", "explain", "platform"), 0, ("=> cpu",), site="squatter"),
    Row("squatter-doctor", ("doctor",), 1, ("omni-fixture-squatter", "duplicate-name"), site="squatter"),
    Row(
        "squatter-show-cpu",
        ("plugins", "show", "cpu"),
        0,
        ("omni-plugin-cpu", "built-in: yes", "same name:", "omni-fixture-squatter"),
        site="squatter",
    ),
    Row(
        "squatter-pinned-still-cpu",
        ("explain", "platform"),
        0,
        ("=> cpu",),
        site="squatter",
        setup=(("omni", "plugins", "pin", "platform", "cpu", "omni-fixture-squatter"),),
    ),
    Row(
        "builtin-disabled-says-how-back",
        ("plugins", "disable", "cpu"),
        0,
        ("cpu is disabled", "built-in plugin", "omni --safe-mode"),
        site="squatter",
    ),
    Row(
        "builtin-disabled-explain-names-it",
        ("explain", "platform"),
        1,
        ("installed but disabled: cpu", "omni --safe-mode"),
        site="squatter",
        setup=(("omni", "plugins", "disable", "cpu"),),
    ),
    Row(
        "builtin-disabled-safe-mode-recovers",
        ("--safe-mode", "explain", "platform"),
        0,
        ("=> cpu",),
        site="squatter",
        setup=(("omni", "plugins", "disable", "CPU"),),
    ),
    Row(
        "safe-mode-ignores-a-forced-third-party-platform",
        ("--safe-mode", "explain", "platform"),
        0,
        ("=> cpu", "ignored in safe mode"),
        site="squatter",
        env={"OMNI_PLATFORM": "squat"},
    ),
]


def _setup(venv: Venv, row: Row) -> None:
    for step in row.setup:
        if step[0] == "omni":
            venv.omni(*step[1:], OMNI_PROBE_TIMEOUT=PROBE_TIMEOUT)
        elif step[0] == "poison-manifest-cache":  # a wrong-shaped parse under a stamp that matches
            path = venv.home / "cache" / "manifest-cache.json"
            cache = json.loads(path.read_text())
            assert cache["manifests"], "nothing was cached to poison"
            for entry in cache["manifests"].values():
                entry["data"] = {"omni_api": ">=1.0,<2", "model": "not an array of tables"}
            path.write_text(json.dumps(cache))
        elif step[0] == "write":
            path = venv.home / step[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(step[2].encode("latin-1") if "\xff" in step[2] else step[2].encode())
        else:  # pragma: no cover - a typo in a row
            raise ValueError(step)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_fault(row: Row, venv_for: Callable[[str], Venv]) -> None:
    venv = venv_for(row.site)
    _setup(venv, row)
    config = venv.home / "config"
    before = snapshot([config])
    result = venv.omni(*row.command, **{"OMNI_PROBE_TIMEOUT": PROBE_TIMEOUT, **row.env})
    assert_clean_failure(result, row.code, *row.mentions)
    assert_no_control_chars(result)
    text = result.stdout + result.stderr
    for word in row.absent:
        assert word not in text, f"{word!r} should not appear:\n{text}"
    if row.command[:2] not in (("plugins", "disable"), ("plugins", "enable"), ("plugins", "pin")):
        assert_unchanged(before, [config])  # only the commands that write the config change it


# --- a real Ctrl-C still stops omni; a plugin's own KeyboardInterrupt does not -----------------


def _interrupt(venv: Venv, args: tuple[str, ...], ready: str, **env: str) -> Result:
    """Run omni, wait until it prints ``ready`` (on either stream), send SIGINT as a terminal's
    Ctrl-C would, and return what it printed and its exit code."""
    proc = subprocess.Popen(
        [str(venv.root / "bin" / "omni"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=venv.env(**env),
        # the test runner may run with SIGINT ignored (a background job): give omni the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    stream = proc.stdout if ready == "ready" else proc.stderr
    assert stream is not None
    seen = stream.readline()
    assert ready in seen, f"omni did not get to the point to interrupt: {seen!r}"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return Result(proc.returncode, out, err)


def test_ctrl_c_in_a_plugin_command_exits_130(venv_for: Callable[[str], Venv]) -> None:
    result = _interrupt(venv_for("faults"), ("wait-for-ctrl-c",), "ready")
    assert_clean_failure(result, 130, "interrupted")
    assert result.stderr.strip() == "interrupted"


def test_ctrl_c_while_a_plugin_imports_exits_130_and_blames_nobody(venv_for: Callable[[str], Venv]) -> None:
    venv = venv_for("faults")
    result = _interrupt(venv, ("plugins", "list", "--load"), "fixture-slow-import: importing", FIXTURE_SLOW_IMPORT="1")
    assert_clean_failure(result, 130, "interrupted")
    assert result.stderr.strip().splitlines()[-1] == "interrupted"
    # the user stopped it: no breadcrumb is left, so no plugin is later said to have crashed
    assert not list((venv.home / "cache" / "loading").glob("*.json"))
    listing = venv.omni("plugins", "list", OMNI_PROBE_TIMEOUT=PROBE_TIMEOUT)
    assert_clean_failure(listing, 0)
    assert "crashed" not in listing.stdout


def test_os_exit_is_recorded_before_the_plugin_runs(venv_for: Callable[[str], Venv]) -> None:
    venv = venv_for("os-exit")
    died = venv.omni("plugins", "list", "--load")
    assert died.returncode == 0 and died.stdout == ""  # os._exit(0): even looks like success
    (crumb,) = (venv.home / "cache" / "loading").glob("*.json")
    data = json.loads(crumb.read_text())
    assert {k: data[k] for k in ("plugin", "distribution", "version", "step")} == {
        "plugin": "fixture-os-exit",
        "distribution": "omni-fixture-os-exit",
        "version": "0.1.0",
        "step": "omni_register_models",
    }
    # the next command names it, makes it the plugin's remembered health and removes the crumb
    listed = venv.omni("plugins", "list", "--json")
    plugin = {p["name"]: p for p in listed.json()["plugins"]}["fixture-os-exit"]  # type: ignore[index]
    assert plugin["status"] == "crashed"
    assert plugin["fix"] == "disable it with `omni plugins disable fixture-os-exit`"
    assert not crumb.exists()
    # doctor says so first, on stderr, before it loads (and dies again)
    doctor = venv.omni("doctor")
    assert doctor.stderr.startswith(
        "warning: the last omni run ended while loading plugin 'fixture-os-exit' "
        "(omni-fixture-os-exit 0.1.0, omni_register_models); it may have called os._exit; "
        "disable it with `omni plugins disable fixture-os-exit`"
    )


def test_a_probe_that_hangs_does_not_keep_omni_alive(venv_for: Callable[[str], Venv]) -> None:
    """The hanging probe sleeps an hour; omni answers after the bound and exits at once."""
    venv = venv_for("faults")
    result = venv.run(
        [venv.root / "bin" / "omni", "explain", "platform", "--json"],
        env=venv.env(OMNI_PROBE_TIMEOUT="0.5"),
        timeout=60,  # far below the hour: the daemon thread must not hold the exit
    )
    assert_clean_failure(result, 0)
    outcomes = {c["name"]: (c["outcome"], c["reason"]) for c in json.loads(result.stdout)["candidates"]}
    assert outcomes["probe-hang"] == ("failed", "probe took longer than 0.5 s (OMNI_PROBE_TIMEOUT) and was abandoned")
    assert outcomes["cpu"][0] == "selected"


def test_internal_error_traceback_only_with_omni_debug(venv_for: Callable[[str], Venv]) -> None:
    venv = venv_for("faults")
    result = venv.omni(
        "explain", "attention", OMNI_PLATFORM="buggy-platform", OMNI_DEBUG="1", OMNI_PROBE_TIMEOUT=PROBE_TIMEOUT
    )
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert 'omni_fixture_buggy_platform/platform.py", line' in result.stderr
    assert "internal error: AttributeError: fixture platform bug" in result.stderr


# --- 8. registration stays linear in the number of names --------------------------------------


def _calls_to_load(n: int) -> int:
    """Python function calls (profiler events) the load steps make for one plugin with ``n``
    models: a count of work done, the same on any machine, unlike a time."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from registration_scale import steps
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    todo = steps(n)
    sys.setprofile(count)
    try:
        for step in todo.values():
            step()
    finally:
        sys.setprofile(None)
    return calls


def test_registration_work_grows_linearly_with_names() -> None:
    """Twice the names, twice the work: a duplicate check that scans every earlier name (how
    10,000 names took 30 s) would make it four times."""
    small, large = _calls_to_load(1000), _calls_to_load(2000)
    assert large / small < 2.2, (small, large)
    assert large < 200 * 2000, large  # a bounded number of calls per name


def test_ten_thousand_names_load_through_the_real_cli(base_venv: Venv, tmp_path: Path, torch_findable: Path) -> None:
    """A real plugin that declares and registers 10,000 models loads, and each is usable."""
    n = 10_000
    src = tmp_path / "src"
    pkg = src / "omni_fixture_scale"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""10,000 models."""\n')
    (pkg / "model.py").write_text("class Model:\n    pass\n")
    (pkg / "hooks.py").write_text(
        "from omni_core import hookimpl\n\n\n@hookimpl\ndef omni_register_models(registry):\n"
        f"    for i in range({n}):\n        registry.register(f'scale-{{i}}', 'omni_fixture_scale.model:Model')\n"
    )
    (pkg / "omni_plugin.toml").write_text(
        'omni_api = ">=1.0,<2"\n'
        + "".join(f'[[model]]\nname = "scale-{i}"\nref = "omni_fixture_scale.model:Model"\n' for i in range(n))
    )
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "omni-fixture-scale"\nversion = "0.1.0"\n'
        '[project.entry-points."omni.plugins"]\nfixture-scale = "omni_fixture_scale.hooks"\n'
        '[tool.setuptools]\npackages = ["omni_fixture_scale"]\n'
        '[tool.setuptools.package-data]\nomni_fixture_scale = ["omni_plugin.toml"]\n'
    )
    site = tmp_path / "site"
    base_venv.pip("install", "--quiet", "--no-deps", "--no-build-isolation", "--target", site, src)
    venv = base_venv.with_site(site, tmp_path / "home")
    script = (
        "from omni_core.plugins import load_plugins\n"
        "ps = load_plugins()\n"
        "r = ps.record('fixture-scale')\n"
        "print(r.status.value, len(ps.models), ps.models.get('SCALE-9999').name)\n"
    )
    result = venv.run([venv.python, "-c", script], env=venv.env(), timeout=300)
    assert_clean_failure(result, 0)
    assert result.stdout.split() == ["ok", str(n), "scale-9999"]


def test_plugin_texts_never_reach_the_terminal_raw_in_json_either(venv_for: Callable[[str], Venv]) -> None:
    """JSON output keeps the exact text, escaped by JSON itself (readable back unchanged)."""
    venv = venv_for("faults")
    result = venv.omni("plugins", "list", "--json")
    assert_clean_failure(result, 0)
    assert_no_control_chars(result)
    names = [p["name"] for p in json.loads(result.stdout)["plugins"]]
    assert HOSTILE in names


def test_omni_core_import_stays_light_with_the_new_modules() -> None:
    """The helpers on the `omni plugins list` path import no pydantic, pluggy or torch."""
    code = (
        "import sys\n"
        "import omni_core.breadcrumb, omni_core.guard, omni_core.text, omni_core.discovery\n"
        "print(sorted(m for m in ('pydantic', 'pluggy', 'torch', 'numpy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.strip() == "[]"
