"""Is there an NVIDIA GPU here that torch can drive? Answered from files alone.

The probe runs during platform selection in every process, often before a fork, so it must
not import torch (seconds, and CUDA state that breaks forked workers) or initialise NVML
(fork errors and hangs). It reads:

* device nodes: ``/dev/nvidia[0-9]*`` (one per visible GPU), ``/proc/driver/nvidia/gpus/*``
  (one per GPU the driver manages), or on WSL2 ``/dev/dxg`` together with the WSL CUDA
  driver library;
* torch's own ``version.py`` as text, found with ``importlib.util.find_spec`` (which does not
  import torch), to tell a CUDA build (``cuda = '12.8'``) from a CPU or ROCm build.

Every path comes from a module-level function so tests can point them elsewhere. Errors
that mean "something is broken" (an unreadable torch install) are raised, not turned into
a quiet "no": omni records a probe that raised and ``omni doctor`` shows it.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from omni_core.platforms import ProbeResult

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
INSTALL_HINT = "install a CUDA build of torch (https://pytorch.org/get-started/locally/)"


def dev_dir() -> Path:
    """Where device nodes live."""
    return Path("/dev")


def proc_gpus_dir() -> Path:
    """The NVIDIA driver's per-GPU directory in procfs."""
    return Path("/proc/driver/nvidia/gpus")


def wsl_driver_dir() -> Path:
    """Where WSL2 mounts the Windows host's CUDA driver library."""
    return Path("/usr/lib/wsl/lib")


def torch_version_file() -> Path | None:
    """torch's ``version.py``, located without importing torch; None when torch is absent."""
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or ())
    if not locations:
        raise RuntimeError(f"torch at {spec.origin} is not a package; reinstall torch")
    for location in locations:
        candidate = Path(location) / "version.py"
        if candidate.is_file():
            return candidate
    return Path(locations[0]) / "version.py"  # reading it raises and names the path


@dataclass(frozen=True)
class TorchBuild:
    version: str
    #: CUDA version torch was built for, e.g. "12.8"; None for CPU and ROCm builds
    cuda: str | None
    hip: str | None = None

    @property
    def kind(self) -> str:
        if self.cuda:
            return "CUDA"
        return "ROCm" if self.hip else "CPU"


_ASSIGNMENT = re.compile(
    r"""^(?P<name>__version__|cuda|hip)\s*(?::[^=\n]*)?=\s*(?P<value>None|'[^'\n]*'|"[^"\n]*")\s*$""",
    re.MULTILINE,
)


def parse_torch_version(text: str) -> TorchBuild:
    """Read ``__version__``, ``cuda`` and ``hip`` from the text of torch's ``version.py``."""
    values: dict[str, str | None] = {}
    for match in _ASSIGNMENT.finditer(text):
        raw = match.group("value")
        values.setdefault(match.group("name"), None if raw == "None" else raw[1:-1])
    return TorchBuild(version=values.get("__version__") or "?", cuda=values.get("cuda"), hip=values.get("hip"))


def torch_build() -> TorchBuild | None:
    """The installed torch's build, or None when torch is not installed."""
    path = torch_version_file()
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RuntimeError(f"cannot read torch's version file {path}: {exc}; reinstall torch") from exc
    return parse_torch_version(text)


def nvidia_gpus() -> list[str]:
    """What shows an NVIDIA GPU is here: device nodes, else the driver's procfs entries, else
    the WSL2 GPU device with its CUDA library. Empty when nothing does."""
    nodes = sorted(str(p) for p in dev_dir().glob("nvidia[0-9]*"))
    if nodes:
        return nodes
    driver = proc_gpus_dir()
    gpus = sorted(str(p) for p in driver.glob("*")) if driver.is_dir() else []
    if gpus:
        return gpus
    dxg, libcuda = dev_dir() / "dxg", wsl_driver_dir() / "libcuda.so"
    if dxg.exists() and (libcuda.exists() or (wsl_driver_dir() / "libcuda.so.1").exists()):
        return [f"{dxg} (WSL2)"]
    return []


def _hidden_by_env() -> str | None:
    value = os.environ.get(VISIBLE_DEVICES_ENV)
    if value is None:
        return None
    first = value.split(",")[0].strip()
    if first == "" or first.startswith("-"):
        return f"{VISIBLE_DEVICES_ENV}={value!r} hides every GPU from this process"
    return None


def probe() -> ProbeResult:
    """Claim the machine when an NVIDIA GPU is present and torch is a CUDA build."""
    gpus = nvidia_gpus()
    if not gpus:
        return ProbeResult(
            False,
            f"no NVIDIA GPU: no {dev_dir() / 'nvidia[0-9]*'} device nodes and no {proc_gpus_dir()} entries",
        )
    shown = ", ".join(gpus[:4]) + (f", ... ({len(gpus)} in all)" if len(gpus) > 4 else "")
    hidden = _hidden_by_env()
    if hidden:
        return ProbeResult(False, f"NVIDIA GPU found ({shown}) but {hidden}")
    build = torch_build()
    if build is None:
        return ProbeResult(False, f"NVIDIA GPU found ({shown}) but torch is not installed: {INSTALL_HINT}")
    if build.cuda is None:
        return ProbeResult(False, f"NVIDIA GPU found but torch {build.version} is a {build.kind} build: {INSTALL_HINT}")
    return ProbeResult(True, f"NVIDIA GPU found ({shown}); torch {build.version} is built for CUDA {build.cuda}")
