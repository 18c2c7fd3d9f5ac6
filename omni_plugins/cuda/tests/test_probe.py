"""The probe decides from files alone: device nodes plus torch's version.py read as text."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omni_plugin_cuda import probe as probe_mod

CPU_TORCH = """\
from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '2.13.0+cpu'
debug = False
cuda: Optional[str] = None
git_version = 'cf30153c4c131c8164ee7798e5022d810682e2cb'
hip: Optional[str] = None
"""
CUDA_TORCH = CPU_TORCH.replace("2.13.0+cpu", "2.13.0+cu128").replace(
    "cuda: Optional[str] = None", "cuda: Optional[str] = '12.8'"
)
ROCM_TORCH = CPU_TORCH.replace("2.13.0+cpu", "2.13.0+rocm6.4").replace(
    "hip: Optional[str] = None", "hip: Optional[str] = '6.4.43482'"
)


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A fake filesystem root: returns a function that adds GPU nodes and a torch build."""
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    monkeypatch.setattr(probe_mod, "dev_dir", lambda: root / "dev")
    monkeypatch.setattr(probe_mod, "proc_gpus_dir", lambda: root / "proc/driver/nvidia/gpus")
    monkeypatch.setattr(probe_mod, "wsl_driver_dir", lambda: root / "usr/lib/wsl/lib")
    monkeypatch.setattr(probe_mod, "torch_version_file", lambda: None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def build(nodes: tuple[str, ...] = (), torch_text: str | None = None, proc: tuple[str, ...] = ()) -> Path:
        for node in nodes:
            (root / "dev" / node).touch()
        for entry in proc:
            (root / "proc/driver/nvidia/gpus" / entry).mkdir(parents=True)
        if torch_text is not None:
            version = root / "site-packages/torch/version.py"
            version.parent.mkdir(parents=True)
            version.write_text(torch_text)
            monkeypatch.setattr(probe_mod, "torch_version_file", lambda: version)
        return root

    return build


def test_no_device_nodes_means_no_claim(machine):
    machine(nodes=("nvidiactl", "nvidia-uvm"), torch_text=CUDA_TORCH)  # control nodes are not GPUs
    result = probe_mod.probe()
    assert result.claims is False
    assert result.reason.startswith("no NVIDIA GPU: no ") and "nvidia[0-9]*" in result.reason


def test_gpu_with_a_cpu_build_of_torch_is_not_claimed_and_says_what_to_install(machine):
    machine(nodes=("nvidia0", "nvidiactl"), torch_text=CPU_TORCH)
    result = probe_mod.probe()
    assert result.claims is False
    assert result.reason.startswith(
        "NVIDIA GPU found but torch 2.13.0+cpu is a CPU build: install a CUDA build of torch"
    )


def test_gpu_with_a_cuda_build_is_claimed_and_names_what_was_found(machine):
    root = machine(nodes=("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"), torch_text=CUDA_TORCH)
    result = probe_mod.probe()
    assert result.claims is True
    assert f"{root}/dev/nvidia0, {root}/dev/nvidia1" in result.reason
    assert "torch 2.13.0+cu128 is built for CUDA 12.8" in result.reason


def test_driver_procfs_entries_count_as_gpus(machine):
    machine(proc=("0000:17:00.0",), torch_text=CUDA_TORCH)
    result = probe_mod.probe()
    assert result.claims is True and "0000:17:00.0" in result.reason


def test_wsl2_gpu_is_found_through_dxg_and_the_driver_library(machine):
    root = machine(torch_text=CUDA_TORCH)
    (root / "dev/dxg").touch()
    assert probe_mod.probe().claims is False  # dxg alone is any GPU vendor
    (root / "usr/lib/wsl/lib").mkdir(parents=True)
    (root / "usr/lib/wsl/lib/libcuda.so.1").touch()
    result = probe_mod.probe()
    assert result.claims is True and "WSL2" in result.reason


def test_rocm_build_and_missing_torch_are_named(machine):
    machine(nodes=("nvidia0",))
    missing = probe_mod.probe()
    assert missing.claims is False and "torch is not installed" in missing.reason
    machine(torch_text=ROCM_TORCH)
    rocm = probe_mod.probe()
    assert rocm.claims is False and "torch 2.13.0+rocm6.4 is a ROCm build" in rocm.reason


@pytest.mark.parametrize("value", ["", "-1", " -1,0"])
def test_visible_devices_that_hide_every_gpu(machine, monkeypatch, value):
    machine(nodes=("nvidia0",), torch_text=CUDA_TORCH)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    result = probe_mod.probe()
    assert result.claims is False and "CUDA_VISIBLE_DEVICES" in result.reason and "hides every GPU" in result.reason
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert probe_mod.probe().claims is True


def test_an_unreadable_torch_install_raises_instead_of_answering_no(machine, monkeypatch, tmp_path):
    machine(nodes=("nvidia0",))
    monkeypatch.setattr(probe_mod, "torch_version_file", lambda: tmp_path / "gone/version.py")
    with pytest.raises(RuntimeError, match="cannot read torch's version file"):
        probe_mod.probe()


def test_version_file_parsing():
    assert probe_mod.parse_torch_version(CPU_TORCH) == probe_mod.TorchBuild("2.13.0+cpu", None, None)
    assert probe_mod.parse_torch_version(CUDA_TORCH).cuda == "12.8"
    assert probe_mod.parse_torch_version('__version__ = "2.1.0"\ncuda = "11.8"\n').cuda == "11.8"
    assert probe_mod.parse_torch_version(ROCM_TORCH).kind == "ROCm"


def test_the_installed_torch_is_read_without_importing_it():
    path = probe_mod.torch_version_file()
    assert path is not None and path.name == "version.py"
    build = probe_mod.torch_build()
    import torch

    assert build is not None and build.version == torch.__version__ and build.cuda == torch.version.cuda


PROBE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from omni_plugin_cuda import probe
    root = Path(sys.argv[1])
    probe.dev_dir = lambda: root / "dev"
    probe.torch_version_file = lambda: root / "version.py"
    result = probe.probe()
    print(json.dumps({"claims": result.claims, "reason": result.reason,
                      "heavy": sorted(m for m in ("torch", "pynvml", "nvidia_smi") if m in sys.modules)}))
    """
)


def test_running_the_probe_imports_neither_torch_nor_pynvml(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidia0").touch()
    (tmp_path / "version.py").write_text(CUDA_TORCH)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE_SCRIPT, str(tmp_path)], capture_output=True, text=True, check=True
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["claims"] is True, result
    assert "torch" not in result["heavy"] and "pynvml" not in result["heavy"] and "nvidia_smi" not in result["heavy"]
