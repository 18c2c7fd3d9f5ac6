"""Discovery is import-light: ``import omni_core`` and the recovery commands import neither torch
nor any plugin code, and loading imports hook modules only, never the referenced implementations.

Runs in a subprocess of this interpreter. In the dev env torch and the CPU plugin are installed,
so an accidental import would really happen and show up in ``sys.modules``; in tox's torch-less
``core`` env the CPU-specific checks skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

#: Runs ``omni ARGS...`` in-process (or just imports omni_core when ARGS is empty), then writes
#: the names in sys.modules and the top-level packages of every installed plugin to OUT.
SCRIPT = """
import json, sys
from importlib import metadata
out, args = sys.argv[1], sys.argv[2:]
import omni_core
code = None
if args:
    sys.argv = ["omni", *args]
    from omni_cli.main import main
    try:
        main()
    except SystemExit as exc:
        code = exc.code
plugin_packages = sorted({ep.value.split(".")[0] for ep in metadata.entry_points(group="omni.plugins")})
with open(out, "w") as fh:
    json.dump({"modules": sorted(sys.modules), "plugins": plugin_packages, "exit": code}, fh)
"""


#: whether this interpreter has the CPU plugin (not so in tox's ``core`` env)
CPU_PLUGIN = "cpu" in {ep.name for ep in metadata.entry_points(group="omni.plugins")}
needs_cpu_plugin = pytest.mark.skipif(not CPU_PLUGIN, reason="the CPU plugin is not installed here")


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    env.update(OMNI_CONFIG_DIR=str(tmp_path / "config"), OMNI_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def _imported(modules: list[str], package: str) -> list[str]:
    return [m for m in modules if m == package or m.startswith(package + ".")]


@needs_cpu_plugin
def test_dev_environment_really_has_torch():
    """Guard: the assertions below mean something only if torch could have been imported."""
    assert importlib.util.find_spec("torch") is not None


def test_import_omni_core_imports_no_torch_and_no_plugin(tmp_path: Path):
    seen = _run(tmp_path)
    assert _imported(seen["modules"], "torch") == []
    for package in seen["plugins"]:
        assert _imported(seen["modules"], package) == [], package


@pytest.mark.parametrize(
    "args",
    [
        ("plugins", "list", "--json"),
        ("plugins", "list", "--all"),
        pytest.param(("plugins", "show", "cpu"), marks=needs_cpu_plugin),
        ("plugins", "freeze"),
        ("--help",),
    ],
    ids=["list-json", "list-all", "show", "freeze", "help"],
)
def test_recovery_commands_import_no_torch_and_no_plugin_module(tmp_path: Path, args: tuple[str, ...]):
    seen = _run(tmp_path, *args)
    assert seen["exit"] == 0
    assert _imported(seen["modules"], "torch") == []
    for package in seen["plugins"]:
        assert _imported(seen["modules"], package) == [], package
    # nothing was loaded, so nothing was remembered either
    assert not (tmp_path / "cache" / "plugin-health.json").exists()


@needs_cpu_plugin
def test_loading_imports_hook_modules_but_no_implementation_and_no_torch(tmp_path: Path):
    seen = _run(tmp_path, "plugins", "list", "--load", "--json")
    assert seen["exit"] == 0
    assert _imported(seen["modules"], "torch") == []
    assert "omni_plugin_cpu.hooks" in seen["modules"]
    assert "omni_plugin_cpu.platform" not in seen["modules"]
    assert "omni_plugin_cpu.attention" not in seen["modules"]


@needs_cpu_plugin
def test_platform_probing_in_doctor_imports_no_torch(tmp_path: Path):
    """doctor probes every platform, describes the winner and checks every attention backend
    (importing their classes): the CPU plugin's platform and backend need no torch for that."""
    seen = _run(tmp_path, "doctor", "--json")
    assert _imported(seen["modules"], "torch") == []
    assert "omni_plugin_cpu.platform" in seen["modules"]
    assert "omni_plugin_cpu.attention" in seen["modules"]
