"""When the xpu probe claims the machine, why not otherwise, and that it stays import-light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omni_plugin_xpu.platform import intel_render_nodes, probe

from omni_core.platforms import select_platform


def test_claims_an_intel_gpu_with_an_xpu_torch(xpu_machine):
    result = probe()
    assert result.claims is True
    assert "1 Intel GPU render node(s) (renderD128)" in result.reason
    assert "torch 2.8.0+xpu built with XPU (xpu = 20250201)" in result.reason


def test_only_intel_vendor_render_nodes_count(xpu_machine):
    assert intel_render_nodes() == ["renderD128"]  # not the AMD card, the virtual node or card0


def test_does_not_claim_without_an_intel_gpu(xpu_machine):
    (xpu_machine.drm / "renderD128" / "device" / "vendor").write_text("0x10de\n")
    result = probe()
    assert result.claims is False and "no Intel GPU" in result.reason


def test_does_not_claim_without_torch(xpu_machine, monkeypatch):
    from omni_plugin_xpu import platform

    monkeypatch.setattr(platform, "torch_package_dir", lambda: None)
    result = probe()
    assert result.claims is False and "torch is not installed" in result.reason


def test_does_not_claim_with_a_torch_built_without_xpu(xpu_machine):
    xpu_machine.write_torch_version(None, version="2.13.0+cpu")
    result = probe()
    assert result.claims is False
    assert "torch 2.13.0+cpu" in result.reason and "built without XPU" in result.reason


def test_the_xpu_runtime_library_also_shows_an_xpu_build(xpu_machine):
    xpu_machine.write_torch_version(None)
    (xpu_machine.torch_dir / "lib").mkdir()
    (xpu_machine.torch_dir / "lib" / "libtorch_xpu.so").write_text("")
    result = probe()
    assert result.claims is True and "libtorch_xpu.so" in result.reason


def test_omni_selects_the_xpu_over_the_cpu(xpu_machine, xpu_plugins):
    choice = select_platform(xpu_plugins)
    assert choice.name == "xpu" and "highest priority" in choice.explanation.rule


def test_omni_keeps_the_cpu_without_intel_hardware(xpu_machine, xpu_plugins):
    (xpu_machine.drm / "renderD128" / "device" / "vendor").unlink()
    assert select_platform(xpu_plugins).name == "cpu"


_SUBPROCESS_PROBE = """
import json, sys
from pathlib import Path
from omni_plugin_xpu import platform
platform.DRM_DIR = Path(sys.argv[1])
if sys.argv[2] != "-":
    platform.torch_package_dir = lambda: Path(sys.argv[2])
result = platform.probe()
print(json.dumps({"claims": result.claims, "reason": result.reason, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("torch_install", ["fake-xpu", "real"])
def test_running_the_probe_imports_no_torch(xpu_machine, torch_install):
    torch_dir = str(xpu_machine.torch_dir) if torch_install == "fake-xpu" else "-"
    proc = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS_PROBE, str(xpu_machine.drm), torch_dir],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # the real torch here is the CPU build: the probe reads its version.py and declines
    assert result["claims"] is (torch_install == "fake-xpu"), result["reason"]
    assert not {"torch", "intel_extension_for_pytorch"} & set(result["modules"])
