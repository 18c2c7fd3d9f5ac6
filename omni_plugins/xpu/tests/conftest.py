"""Stand-ins for Intel GPU hardware and an XPU build of torch, for tests on any machine.

This is the only place fakes live. The hardware is files laid out like sysfs DRM render nodes
(``/sys/class/drm/renderD*/device/vendor``) and a torch install's ``version.py``; the torch
answers come from ``torch.xpu``'s own functions, monkeypatched to what an XPU build reports on a
Battlemage B60.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@dataclass
class FakeIntelMachine:
    drm: Path
    torch_dir: Path

    def add_render_node(self, name: str, vendor: str | None) -> None:
        device = self.drm / name / "device"
        device.mkdir(parents=True)
        if vendor is not None:
            (device / "vendor").write_text(vendor + "\n")

    def write_torch_version(self, xpu: str | None, version: str = "2.8.0+xpu") -> None:
        self.torch_dir.mkdir(parents=True, exist_ok=True)
        (self.torch_dir / "version.py").write_text(
            "from typing import Optional\n\n"
            f"__version__ = {version!r}\n"
            "debug = False\n"
            "cuda: Optional[str] = None\n"
            "hip: Optional[str] = None\n"
            f"xpu: Optional[str] = {xpu!r}\n"
        )


@pytest.fixture
def xpu_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeIntelMachine:
    """An Intel B60 next to an AMD card and a virtual render node, with an XPU torch."""
    from omni_plugin_xpu import platform

    machine = FakeIntelMachine(drm=tmp_path / "sys" / "class" / "drm", torch_dir=tmp_path / "site-packages" / "torch")
    machine.drm.mkdir(parents=True)
    (machine.drm / "card0").mkdir()  # display nodes are not render nodes
    machine.add_render_node("renderD128", "0x8086")
    machine.add_render_node("renderD129", "0x1002")
    machine.add_render_node("renderD130", None)
    machine.write_torch_version("20250201")
    monkeypatch.setattr(platform, "DRM_DIR", machine.drm)
    monkeypatch.setattr(platform, "torch_package_dir", lambda: machine.torch_dir)
    return machine


@dataclass
class FakeXpuRuntime:
    count: int = 2
    has_fp64: bool = False
    calls: list[tuple[str, Any]] = field(default_factory=list)


@pytest.fixture
def xpu_torch(monkeypatch: pytest.MonkeyPatch) -> FakeXpuRuntime:
    """torch.xpu answering as an XPU build on two Intel Arc Pro B60 GPUs."""
    import torch

    state = FakeXpuRuntime()

    def get_device_properties(device: Any = None) -> Any:
        return SimpleNamespace(
            name="Intel(R) Arc(TM) Pro B60 Graphics",
            driver_version="1.6.33578+11",
            total_memory=24 * 2**30,
            has_fp16=True,
            has_fp64=state.has_fp64,
            has_bfloat16_conversions=True,
        )

    monkeypatch.setattr(torch.xpu, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: state.count)
    monkeypatch.setattr(torch.xpu, "get_device_name", lambda device=None: "Intel(R) Arc(TM) Pro B60 Graphics")
    monkeypatch.setattr(torch.xpu, "mem_get_info", lambda device=None: (20 * 2**30, 24 * 2**30))
    monkeypatch.setattr(torch.xpu, "get_device_properties", get_device_properties)
    monkeypatch.setattr(torch.xpu, "synchronize", lambda device=None: state.calls.append(("synchronize", device)))
    monkeypatch.setattr(torch.xpu, "manual_seed_all", lambda seed: state.calls.append(("manual_seed_all", seed)))
    return state


@pytest.fixture
def xpu_plugins(omni_isolated: Path) -> Iterator[Any]:
    """The installed cpu and xpu plugins, loaded in isolation from the user's settings and from
    every other installed plugin (denied, so that no other platform's probe runs either)."""
    from omni_core.config import Settings
    from omni_core.discovery import discover
    from omni_core.plugins import load_plugins

    keep = frozenset({"cpu", "xpu"})
    settings = Settings.from_env()
    others = frozenset(r.name.casefold() for r in discover(settings)) - keep
    yield load_plugins(dataclasses.replace(settings, allow_plugins=keep, deny_plugins=others))
