"""When the rocm probe claims the machine, why not otherwise, and that it stays import-light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omni_plugin_rocm.platform import gfx_name, probe

from omni_core.platforms import explain_platform, select_platform
from omni_core.selection import Outcome

CPU = "cpu_cores_count 64\nsimd_count 0\ngfx_target_version 0\n"


def gpu(version: int) -> str:
    return f"cpu_cores_count 0\nsimd_count 1216\ngfx_target_version {version}\n"


def test_claims_an_mi300x_with_a_rocm_torch(rocm_machine):
    result = probe()
    assert result.claims is True
    assert "2 AMD GPU(s) (gfx942)" in result.reason
    assert "HIP 6.4.43482" in result.reason


def test_does_not_claim_without_the_kfd_device(rocm_machine):
    rocm_machine.kfd.unlink()
    result = probe()
    assert result.claims is False
    assert str(rocm_machine.kfd) in result.reason and "not found" in result.reason


def test_does_not_claim_when_the_topology_lists_only_cpus(rocm_machine):
    rocm_machine.set_nodes(CPU, CPU)
    result = probe()
    assert result.claims is False
    assert "lists no GPU" in result.reason


@pytest.mark.parametrize("variable", ["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"])
@pytest.mark.parametrize("value", ["", "-1"])
def test_does_not_claim_when_the_environment_hides_every_gpu(rocm_machine, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    result = probe()
    assert result.claims is False and f"{variable}={value!r} hides every GPU" in result.reason
    monkeypatch.setenv(variable, "0,1")
    assert probe().claims is True


def test_does_not_claim_without_torch(rocm_machine, monkeypatch):
    from omni_plugin_rocm import platform

    monkeypatch.setattr(platform, "torch_package_dir", lambda: None)
    result = probe()
    assert result.claims is False
    assert "torch is not installed" in result.reason and "gfx942" in result.reason


@pytest.mark.parametrize("version", ["2.13.0+cpu", "2.7.1+cu128"])
def test_does_not_claim_with_a_torch_built_without_hip(rocm_machine, version):
    rocm_machine.write_torch_version(hip=None, version=version)
    result = probe()
    assert result.claims is False
    assert f"torch {version}" in result.reason and "not a ROCm build" in result.reason


def test_reads_the_real_torch_build_without_importing_it():
    from omni_plugin_rocm.platform import torch_build_info, torch_package_dir

    torch_dir = torch_package_dir()
    assert torch_dir is not None and (torch_dir / "version.py").is_file()
    info = torch_build_info(torch_dir)
    import torch

    assert info["__version__"] == torch.__version__
    assert info["hip"] == torch.version.hip


@pytest.mark.parametrize(
    ("version", "name"), [(90402, "gfx942"), (90500, "gfx950"), (90010, "gfx90a"), (110000, "gfx1100")]
)
def test_gfx_target_versions_name_the_architecture(version, name):
    assert gfx_name(version) == name


def test_mixed_architectures_are_all_reported(rocm_machine):
    rocm_machine.set_nodes(CPU, gpu(90402), gpu(90500))
    assert "2 AMD GPU(s) (gfx942, gfx950)" in probe().reason


def test_an_old_kernel_without_gfx_target_version_still_counts_gpus(rocm_machine):
    rocm_machine.set_nodes(CPU.replace("gfx_target_version 0\n", ""), "simd_count 304\n")
    result = probe()
    assert result.claims is True and "1 AMD GPU(s)" in result.reason


def test_a_malformed_topology_raises_instead_of_hiding_the_gpu(rocm_machine):
    rocm_machine.set_nodes(CPU, "simd_count 1216\ngfx_target_version gfx942\n")
    with pytest.raises(ValueError, match="unreadable KFD node properties"):
        probe()


def test_a_raising_probe_is_recorded_not_swallowed(rocm_machine, rocm_plugins):
    rocm_machine.set_nodes("gfx_target_version ???\n")
    choice, explanation = explain_platform(rocm_plugins)
    rocm = next(c for c in explanation.candidates if c.name == "rocm")
    assert rocm.outcome is Outcome.FAILED
    assert "ValueError" in rocm.reason and "unreadable KFD node properties" in rocm.reason
    assert choice is not None and choice.name == "cpu"  # non-strict: the CPU wins, with the failure shown


def test_omni_selects_rocm_over_the_cpu_on_amd_hardware(rocm_machine, rocm_plugins):
    choice = select_platform(rocm_plugins)
    assert choice.name == "rocm"
    assert "highest priority" in choice.explanation.rule


def test_omni_keeps_the_cpu_without_amd_hardware(rocm_machine, rocm_plugins):
    rocm_machine.kfd.unlink()
    assert select_platform(rocm_plugins).name == "cpu"


_SUBPROCESS_PROBE = """
import json, sys
from pathlib import Path
from omni_plugin_rocm import platform
kfd, nodes, torch_dir = sys.argv[1:4]
platform.KFD_DEVICE, platform.KFD_TOPOLOGY_NODES = Path(kfd), Path(nodes)
if torch_dir != "-":
    platform.torch_package_dir = lambda: Path(torch_dir)
result = platform.probe()
print(json.dumps({"claims": result.claims, "reason": result.reason, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("torch_install", ["fake-rocm", "real"])
def test_running_the_probe_imports_neither_torch_nor_amd_libraries(rocm_machine, torch_install):
    torch_dir = str(rocm_machine.torch_dir) if torch_install == "fake-rocm" else "-"
    proc = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS_PROBE, str(rocm_machine.kfd), str(rocm_machine.nodes), torch_dir],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # with the real (CPU) torch the probe reads its version.py and declines; with the fake ROCm one it claims
    assert result["claims"] is (torch_install == "fake-rocm"), result["reason"]
    loaded = set(result["modules"])
    assert not {"torch", "amdsmi", "aiter"} & loaded, sorted({"torch", "amdsmi", "aiter"} & loaded)
    assert "omni_plugin_rocm.attention" not in loaded
