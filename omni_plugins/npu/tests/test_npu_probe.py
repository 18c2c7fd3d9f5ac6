"""When the npu probe claims the machine, why not otherwise, and that it stays import-light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omni_plugin_npu.platform import davinci_devices, probe

from omni_core.platforms import select_platform


def test_claims_an_ascend_box_with_torch_npu(npu_machine, fake_torch_npu):
    result = probe()
    assert result.claims is True
    assert "8 Ascend NPU(s)" in result.reason and "torch_npu installed" in result.reason


def test_only_numbered_davinci_nodes_are_npus(npu_machine):
    npu_machine.set_devices("davinci10", "davinci2", "davinci_manager", "davinci1x")
    assert davinci_devices() == ["davinci2", "davinci10"]


def test_does_not_claim_without_davinci_devices(npu_machine, fake_torch_npu):
    npu_machine.set_devices("davinci_manager", "nvidia0")
    result = probe()
    assert result.claims is False
    assert "davinci<N>" in result.reason and "no Ascend NPU" in result.reason


def test_does_not_claim_without_torch_npu(npu_machine, no_torch_npu):
    result = probe()
    assert result.claims is False
    assert "8 Ascend NPU(s)" in result.reason and "torch_npu is not installed" in result.reason


def test_omni_selects_the_npu_over_the_cpu(npu_machine, fake_torch_npu, npu_plugins):
    choice = select_platform(npu_plugins)
    assert choice.name == "npu" and "highest priority" in choice.explanation.rule


def test_omni_keeps_the_cpu_without_ascend_hardware(npu_machine, fake_torch_npu, npu_plugins):
    npu_machine.set_devices()
    assert select_platform(npu_plugins).name == "cpu"


_SUBPROCESS_PROBE = """
import importlib.machinery, json, sys, types
from pathlib import Path
if sys.argv[2] == "installed":  # find_spec must see torch_npu without importing it: a finder that
    class Finder:               # finds it but whose loader would fail loudly if it were executed
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "torch_npu":
                return importlib.machinery.ModuleSpec("torch_npu", Loader())
    class Loader:
        def create_module(self, spec):
            raise AssertionError("the probe imported torch_npu")
        def exec_module(self, module):
            raise AssertionError("the probe imported torch_npu")
    sys.meta_path.insert(0, Finder)
from omni_plugin_npu import platform
platform.DEV_DIR = Path(sys.argv[1])
result = platform.probe()
print(json.dumps({"claims": result.claims, "reason": result.reason, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("torch_npu", ["installed", "absent"])
def test_running_the_probe_imports_neither_torch_nor_torch_npu(npu_machine, torch_npu):
    proc = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS_PROBE, str(npu_machine.dev), torch_npu],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["claims"] is (torch_npu == "installed"), result["reason"]
    loaded = set(result["modules"])
    assert not {"torch", "torch_npu"} & loaded
    assert "omni_plugin_npu.attention" not in loaded
