"""Stand-ins for AMD hardware, a ROCm build of torch and AITER, for tests on any machine.

This is the only place fakes live. They keep the real interfaces: the hardware is files laid
out like ``/dev/kfd`` and the KFD sysfs topology; ``torch.cuda``/``torch.version.hip`` answer
as a ROCm build does; the ``aiter`` stand-in has AITER's ``flash_attn_func`` and
``flash_attn_varlen_func`` signatures, layouts and return type (a tuple), checks its inputs as
the kernels do, and computes attention with torch on the CPU in float64.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import itertools
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]

CPU_NODE = "cpu_cores_count 64\nsimd_count 0\nmem_banks_count 1\ngfx_target_version 0\n"


def gpu_node(target_version: int) -> str:
    return f"cpu_cores_count 0\nsimd_count 1216\nmem_banks_count 1\ngfx_target_version {target_version}\n"


@dataclass
class FakeRocmMachine:
    """An MI300X box laid out as files: /dev/kfd, KFD topology nodes, and a ROCm torch install."""

    root: Path
    kfd: Path
    nodes: Path
    torch_dir: Path

    def write_torch_version(self, hip: str | None, version: str = "2.7.1+rocm6.4") -> None:
        self.torch_dir.mkdir(parents=True, exist_ok=True)
        (self.torch_dir / "version.py").write_text(
            "from typing import Optional\n\n"
            "__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'xpu']\n"
            f"__version__ = {version!r}\n"
            "debug = False\n"
            "cuda: Optional[str] = None\n"
            "git_version = '0123456789abcdef'\n"
            f"hip: Optional[str] = {hip!r}\n"
            "xpu: Optional[str] = None\n"
        )

    def set_nodes(self, *properties: str) -> None:
        for old in sorted(self.nodes.glob("*/properties")):
            old.unlink()
            old.parent.rmdir()
        for i, text in enumerate(properties):
            (self.nodes / str(i)).mkdir(parents=True)
            (self.nodes / str(i) / "properties").write_text(text)


def make_machine(root: Path) -> FakeRocmMachine:
    machine = FakeRocmMachine(
        root=root,
        kfd=root / "dev" / "kfd",
        nodes=root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes",
        torch_dir=root / "site-packages" / "torch",
    )
    machine.kfd.parent.mkdir(parents=True)
    machine.kfd.write_text("")
    machine.nodes.mkdir(parents=True)
    machine.set_nodes(CPU_NODE, gpu_node(90402), gpu_node(90402))
    machine.write_torch_version("6.4.43482-0f2d60242")
    return machine


@pytest.fixture
def rocm_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRocmMachine:
    """The probe's path helpers pointed at a fake MI300X machine (2 GPUs, ROCm torch)."""
    from omni_plugin_rocm import platform

    machine = make_machine(tmp_path / "machine")
    for name in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(platform, "KFD_DEVICE", machine.kfd)
    monkeypatch.setattr(platform, "KFD_TOPOLOGY_NODES", machine.nodes)
    monkeypatch.setattr(platform, "torch_package_dir", lambda: machine.torch_dir)
    return machine


@dataclass
class FakeHipTorch:
    """What the stand-in torch.cuda answers, and the calls it saw."""

    arch: str = "gfx942:sramecc+:xnack-"
    count: int = 2
    calls: list[tuple[str, Any]] = field(default_factory=list)


@pytest.fixture
def rocm_torch(monkeypatch: pytest.MonkeyPatch) -> FakeHipTorch:
    """torch answering as a ROCm build on an MI300X: torch.version.hip set, torch.cuda = HIP."""
    import torch

    state = FakeHipTorch()

    def get_device_properties(device: Any) -> Any:
        state.calls.append(("get_device_properties", device))
        return SimpleNamespace(
            name="AMD Instinct MI300X", gcnArchName=state.arch, total_memory=192 * 2**30, major=9, minor=4
        )

    monkeypatch.setattr(torch.version, "hip", "6.4.43482-0f2d60242")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: state.count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "AMD Instinct MI300X")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (150 * 2**30, 192 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 4))
    monkeypatch.setattr(torch.cuda, "get_device_properties", get_device_properties)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: state.calls.append(("synchronize", device)))
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: state.calls.append(("manual_seed_all", seed)))
    return state


# --- the aiter stand-in ------------------------------------------------------------------------


def _attend(q: Any, k: Any, v: Any, scale: float, causal: bool) -> Any:
    """(S, H, D) attention in float64 with GQA and bottom-right causal alignment, as AITER does;
    rows with nothing to attend to are zero, as AITER documents. The math is the conformance
    kit's reference."""
    from omni_core.testing import reference_attention

    return reference_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), scale, causal)[0]


def _check_common(q: Any, k: Any, v: Any, dropout_p: float, window_size: Any, alibi_slopes: Any) -> None:
    import torch

    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"aiter mha_fwd: only fp16 and bf16 are supported, got {q.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError("aiter mha_fwd: query, key and value must have the same dtype")
    if q.shape[-1] != k.shape[-1] or k.shape[:-1] != v.shape[:-1]:
        raise RuntimeError("aiter mha_fwd: head dimensions / key-value shapes do not match")
    if q.shape[-2] % k.shape[-2]:
        raise RuntimeError("aiter mha_fwd: number of query heads must be divisible by key/value heads")
    if q.shape[-1] > 256:
        raise RuntimeError("aiter mha_fwd: head size above 256 is not supported")
    if dropout_p != 0.0 or tuple(window_size) not in ((-1, -1), (-1, -1, 0)) or alibi_slopes is not None:
        raise AssertionError("the omni backend must call aiter without dropout, windows or alibi")


def make_fake_aiter() -> types.ModuleType:
    import torch

    module = types.ModuleType("aiter")
    module.__spec__ = importlib.machinery.ModuleSpec("aiter", loader=None)
    module.calls = []  # type: ignore[attr-defined]

    def flash_attn_func(
        q,
        k,
        v,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        alibi_slopes=None,
        deterministic=True,
        return_lse=False,
        return_attn_probs=False,
    ):
        module.calls.append(("flash_attn_func", {"causal": causal, "softmax_scale": softmax_scale}))
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise RuntimeError("aiter flash_attn_func takes (batch, seqlen, nheads, headdim) tensors")
        _check_common(q, k, v, dropout_p, window_size, alibi_slopes)
        if q.shape[0] != k.shape[0]:
            raise RuntimeError("aiter flash_attn_func: batch sizes differ")
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        out = torch.stack([_attend(q[b], k[b], v[b], scale, causal) for b in range(q.shape[0])]).to(q.dtype)
        return (out,)  # AITER's FlashAttnFunc returns tuple(result)

    def flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        alibi_slopes=None,
        deterministic=False,
        return_lse=False,
        return_attn_probs=False,
        block_table=None,
    ):
        module.calls.append(
            (
                "flash_attn_varlen_func",
                {
                    "causal": causal,
                    "softmax_scale": softmax_scale,
                    "cu_seqlens_q": cu_seqlens_q,
                    "cu_seqlens_k": cu_seqlens_k,
                    "max_seqlen_q": max_seqlen_q,
                    "max_seqlen_k": max_seqlen_k,
                },
            )
        )
        if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
            raise RuntimeError("aiter flash_attn_varlen_func takes packed (total, nheads, headdim) tensors")
        _check_common(q, k, v, dropout_p, window_size, alibi_slopes)
        for cu in (cu_seqlens_q, cu_seqlens_k):
            if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
                raise RuntimeError("aiter flash_attn_varlen_func: cu_seqlens must be 1-D int32 tensors")
            if cu.device != q.device:
                raise RuntimeError("aiter flash_attn_varlen_func: cu_seqlens must be on the device of q")
        if cu_seqlens_q.shape != cu_seqlens_k.shape:
            raise RuntimeError("aiter flash_attn_varlen_func: cu_seqlens_q and cu_seqlens_k differ in length")
        if not isinstance(max_seqlen_q, int) or not isinstance(max_seqlen_k, int):
            raise RuntimeError("aiter flash_attn_varlen_func: max_seqlen_q/k must be Python ints")
        bq, bk = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        if bq[-1] != q.shape[0] or bk[-1] != k.shape[0]:
            raise RuntimeError("aiter flash_attn_varlen_func: cu_seqlens do not end at the packed length")
        longest_q = max(b - a for a, b in itertools.pairwise(bq))
        longest_k = max(b - a for a, b in itertools.pairwise(bk))
        if longest_q > max_seqlen_q or longest_k > max_seqlen_k:
            raise RuntimeError("aiter flash_attn_varlen_func: a sequence is longer than max_seqlen")
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        pieces = [
            _attend(q[bq[i] : bq[i + 1]], k[bk[i] : bk[i + 1]], v[bk[i] : bk[i + 1]], scale, causal)
            for i in range(len(bq) - 1)
        ]
        return (torch.cat(pieces, dim=0).to(q.dtype),)

    module.flash_attn_func = flash_attn_func  # type: ignore[attr-defined]
    module.flash_attn_varlen_func = flash_attn_varlen_func  # type: ignore[attr-defined]
    return module


@pytest.fixture
def fake_aiter(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``aiter`` installed (as far as find_spec and import can tell) as the CPU stand-in."""
    module = make_fake_aiter()
    monkeypatch.setitem(sys.modules, "aiter", module)
    return module


@pytest.fixture
def no_aiter(monkeypatch: pytest.MonkeyPatch) -> None:
    """AITER absent, as on this development machine (asserted, not assumed)."""
    import importlib.util

    monkeypatch.delitem(sys.modules, "aiter", raising=False)
    assert importlib.util.find_spec("aiter") is None, "these tests expect the real aiter to be absent"


@pytest.fixture
def rocm_plugins(omni_isolated: Path) -> Iterator[Any]:
    """The installed cpu and rocm plugins, loaded in isolation from the user's settings and from
    every other installed plugin (denied, so that no other platform's probe runs either)."""
    from omni_core.config import Settings
    from omni_core.discovery import discover
    from omni_core.plugins import load_plugins

    keep = frozenset({"cpu", "rocm"})
    settings = Settings.from_env()
    others = frozenset(r.name.casefold() for r in discover(settings)) - keep
    yield load_plugins(dataclasses.replace(settings, allow_plugins=keep, deny_plugins=others))


@pytest.fixture
def reference() -> Any:
    """The conformance kit's reference attention (float64, (batch, seq, heads, dim))."""
    from omni_core.testing import reference_attention

    return reference_attention
