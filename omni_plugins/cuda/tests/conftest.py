"""Shared fixtures: stand-in kernel packages and a stand-in GPU (monkeypatched torch.cuda)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, ModuleType]], dict[str, ModuleType]]:
    """Put stand-in modules into sys.modules for one test."""

    def _install(modules: dict[str, ModuleType]) -> dict[str, ModuleType]:
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        return modules

    return _install


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Callable[..., dict[str, Any]]:
    """Make torch.cuda report GPUs: ``gpu(capability=(9, 0), count=2, cudnn=91000)``.
    Returns a dict that records synchronize / manual_seed_all calls."""
    import torch

    def _gpu(
        capability: tuple[int, int] = (9, 0),
        count: int = 2,
        cudnn: int | None = 91000,
        name: str = "NVIDIA H100 80GB HBM3",
        memory: tuple[int, int] = (70 * 2**30, 80 * 2**30),
        bf16: bool = True,
    ) -> dict[str, Any]:
        record: dict[str, Any] = {"synchronize": 0, "seeds": [], "capability_of": []}

        def get_device_capability(device: Any = None) -> tuple[int, int]:
            record["capability_of"].append(device)
            return capability

        def synchronize(device: Any = None) -> None:
            record["synchronize"] += 1

        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_capability", get_device_capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: memory)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)
        monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
        monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: record["seeds"].append(seed))
        monkeypatch.setattr(torch.backends.cudnn, "version", lambda: cudnn)
        monkeypatch.setattr(torch.version, "cuda", "12.8")
        return record

    return _gpu
