"""Stand-ins for Ascend hardware and torch_npu, for tests on any machine.

This is the only place fakes live. They keep the real interfaces: the hardware is device
files laid out like ``/dev/davinci<N>``; ``torch_npu`` is a module with the real
``npu_fusion_attention`` signature, layouts (``BSND``, ``TND``), mask convention (True = masked
out), sparse modes and return value (a tuple whose first element is the output), which checks
its inputs as the kernel does and computes with torch on the CPU in float64; ``torch.npu``
answers as torch_npu registers it.
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
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]

MAX_TOKENS = 2147483647


@dataclass
class FakeAscendMachine:
    """An 8-NPU Atlas box laid out as files under ``dev``."""

    dev: Path

    def set_devices(self, *names: str) -> None:
        for old in self.dev.iterdir():
            old.unlink()
        for name in names:
            (self.dev / name).write_text("")


@pytest.fixture
def npu_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeAscendMachine:
    """The probe's device directory pointed at a fake Ascend machine (davinci0-7 + manager)."""
    from omni_plugin_npu import platform

    machine = FakeAscendMachine(dev=tmp_path / "dev")
    machine.dev.mkdir()
    machine.set_devices(*(f"davinci{i}" for i in range(8)), "davinci_manager", "devmm_svm", "hisi_hdc")
    monkeypatch.setattr(platform, "DEV_DIR", machine.dev)
    return machine


# --- the torch_npu stand-in --------------------------------------------------------------------


def _attend(q: Any, k: Any, v: Any, scale: float, blocked: Any) -> Any:
    """(S, N, D) attention in float64; ``blocked`` is (N or 1, Sq, Sk) with True = masked out.
    The math is the conformance kit's reference (rows with nothing to attend to are zeros)."""
    from omni_core.testing import reference_attention

    keep = None if blocked is None else ~blocked.unsqueeze(0)  # (1, N or 1, Sq, Sk), True = attend
    return reference_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), scale, mask=keep)[0]


def _compressed_causal(atten_mask: Any, sparse_mode: int) -> None:
    import torch

    expected = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)
    if atten_mask is None or tuple(atten_mask.shape) != (2048, 2048) or not torch.equal(atten_mask.cpu(), expected):
        raise RuntimeError(f"npu_fusion_attention: sparse_mode={sparse_mode} needs the 2048x2048 upper-triangular mask")


def _causal_block(sq: int, sk: int, sparse_mode: int) -> Any:
    import torch

    offset = sk - sq if sparse_mode == 3 else 0  # 3: right-down (end-aligned); 2: left-up
    rows, cols = torch.arange(sq).unsqueeze(1), torch.arange(sk).unsqueeze(0)
    return cols > rows + offset


class FakeTorchNpu(types.ModuleType):
    """``torch_npu`` as far as omni uses it."""

    def __init__(self, npu: Any) -> None:
        super().__init__("torch_npu")
        self.__spec__ = importlib.machinery.ModuleSpec("torch_npu", loader=None)
        self.__version__ = "2.6.0.post1"
        self.npu = npu
        self.calls: list[dict[str, Any]] = []

    def npu_fusion_attention(
        self,
        query,
        key,
        value,
        head_num,
        input_layout,
        pse=None,
        padding_mask=None,
        atten_mask=None,
        scale=1.0,
        keep_prob=1.0,
        pre_tockens=MAX_TOKENS,
        next_tockens=MAX_TOKENS,
        inner_precise=0,
        prefix=None,
        actual_seq_qlen=None,
        actual_seq_kvlen=None,
        sparse_mode=0,
        gen_mask_parallel=True,
        sync=False,
    ):
        import torch

        self.calls.append(
            {
                "layout": input_layout,
                "head_num": head_num,
                "sparse_mode": sparse_mode,
                "inner_precise": inner_precise,
                "atten_mask": atten_mask,
                "scale": scale,
                "actual_seq_qlen": actual_seq_qlen,
                "actual_seq_kvlen": actual_seq_kvlen,
                "q_shape": tuple(query.shape),
            }
        )
        if not (query.dtype == key.dtype == value.dtype) or query.dtype not in (
            torch.float16,
            torch.bfloat16,
            torch.float32,
        ):
            raise RuntimeError("npu_fusion_attention: q/k/v must share a dtype among float16, bfloat16, float32")
        if pse is not None or padding_mask is not None or prefix is not None or keep_prob != 1.0:
            raise AssertionError("omni calls npu_fusion_attention without pse, padding_mask, prefix or dropout")
        if (pre_tockens, next_tockens) != (MAX_TOKENS, MAX_TOKENS):
            raise AssertionError("omni calls npu_fusion_attention without token bands")
        if not isinstance(scale, float) or not isinstance(head_num, int) or not isinstance(inner_precise, int):
            raise RuntimeError("npu_fusion_attention: scale is a float, head_num and inner_precise ints")
        if atten_mask is not None and atten_mask.dtype not in (torch.bool, torch.uint8):
            raise RuntimeError("npu_fusion_attention: atten_mask must be bool or uint8 (True/1 = masked out)")
        if sparse_mode not in (0, 1, 2, 3):
            raise NotImplementedError(f"the stand-in implements sparse_mode 0-3, not {sparse_mode}")
        if sparse_mode in (2, 3):
            _compressed_causal(atten_mask, sparse_mode)
        if sparse_mode == 1 and atten_mask is None:
            raise RuntimeError("npu_fusion_attention: sparse_mode=1 (allMask) needs the full atten_mask")

        if input_layout == "BSND":
            out = self._bsnd(query, key, value, head_num, atten_mask, scale, sparse_mode)
        elif input_layout == "TND":
            out = self._tnd(
                query, key, value, head_num, atten_mask, scale, sparse_mode, actual_seq_qlen, actual_seq_kvlen
            )
        else:
            raise NotImplementedError(f"the stand-in implements BSND and TND, not {input_layout}")
        empty = torch.empty(0)
        return (out.to(query.dtype), empty, empty, empty, 0, 0, 0)

    @staticmethod
    def _check_heads(q_heads: int, kv_heads: int, head_num: int, v: Any, k: Any) -> None:
        if q_heads != head_num:
            raise RuntimeError(f"npu_fusion_attention: head_num {head_num} != query heads {q_heads}")
        if head_num % kv_heads or k.shape != v.shape:
            raise RuntimeError("npu_fusion_attention: key/value heads must divide head_num, and k, v match")

    def _bsnd(self, q: Any, k: Any, v: Any, head_num: int, atten_mask: Any, scale: float, sparse_mode: int) -> Any:
        import torch

        if q.dim() != 4 or k.dim() != 4:
            raise RuntimeError("npu_fusion_attention BSND takes (batch, seq, heads, dim) tensors")
        batch, sq, heads, _ = q.shape
        sk = k.shape[1]
        self._check_heads(heads, k.shape[2], head_num, v, k)
        blocked = None
        if sparse_mode in (2, 3):
            blocked = _causal_block(sq, sk, sparse_mode).expand(batch, 1, sq, sk)
        elif atten_mask is not None:
            shape = tuple(atten_mask.shape)
            allowed = {(batch, heads, sq, sk), (batch, 1, sq, sk), (1, 1, sq, sk), (sq, sk)}
            if shape not in allowed:
                raise RuntimeError(f"npu_fusion_attention: atten_mask shape {shape} not among {sorted(allowed)}")
            blocked = atten_mask.bool().reshape((1, 1, sq, sk) if len(shape) == 2 else shape)
            blocked = blocked.expand(batch, blocked.shape[1], sq, sk)
        return torch.stack(
            [_attend(q[b], k[b], v[b], scale, None if blocked is None else blocked[b]) for b in range(batch)]
        )

    def _tnd(self, q, k, v, head_num, atten_mask, scale, sparse_mode, seq_q, seq_kv) -> Any:
        import torch

        if q.dim() != 3 or k.dim() != 3:
            raise RuntimeError("npu_fusion_attention TND takes packed (tokens, heads, dim) tensors")
        self._check_heads(q.shape[1], k.shape[1], head_num, v, k)
        for ends, total in ((seq_q, q.shape[0]), (seq_kv, k.shape[0])):
            if not isinstance(ends, list) or not all(isinstance(e, int) for e in ends):
                raise RuntimeError("npu_fusion_attention TND: actual_seq_qlen/kvlen are lists of ints")
            if not ends or ends[-1] != total or any(b < a for a, b in itertools.pairwise([0, *ends])):
                raise RuntimeError("npu_fusion_attention TND: actual_seq lengths are cumulative ends up to T")
        if len(seq_q) != len(seq_kv):
            raise RuntimeError("npu_fusion_attention TND: actual_seq_qlen and actual_seq_kvlen differ in count")
        if sparse_mode in (0, 1) and atten_mask is not None:
            raise NotImplementedError("the stand-in's TND path takes no full atten_mask")
        pieces = []
        for (a, b), (c, d) in zip(itertools.pairwise([0, *seq_q]), itertools.pairwise([0, *seq_kv]), strict=True):
            blocked = _causal_block(b - a, d - c, sparse_mode).unsqueeze(0) if sparse_mode in (2, 3) else None
            pieces.append(_attend(q[a:b], k[c:d], v[c:d], scale, blocked))
        return torch.cat(pieces, dim=0)


@dataclass
class FakeNpuRuntime:
    """What the stand-in torch.npu answers, and the calls it saw."""

    count: int = 8
    name: str = "Ascend910B3"
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def device_count(self) -> int:
        return self.count

    def get_device_name(self, device: Any = None) -> str:
        return self.name

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return (60 * 2**30, 64 * 2**30)

    def synchronize(self, device: Any = None) -> None:
        self.calls.append(("synchronize", device))

    def manual_seed_all(self, seed: int) -> None:
        self.calls.append(("manual_seed_all", seed))


@pytest.fixture
def fake_torch_npu(monkeypatch: pytest.MonkeyPatch) -> FakeTorchNpu:
    """``torch_npu`` installed (as far as find_spec and import tell) and ``torch.npu`` registered."""
    import torch

    runtime = FakeNpuRuntime()
    module = FakeTorchNpu(runtime)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch, "npu", runtime, raising=False)
    return module


@pytest.fixture
def no_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_npu absent, as on this development machine (asserted, not assumed)."""
    import importlib.util

    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    assert importlib.util.find_spec("torch_npu") is None, "these tests expect the real torch_npu to be absent"


@pytest.fixture
def npu_plugins(omni_isolated: Path) -> Iterator[Any]:
    """The installed cpu and npu plugins, loaded in isolation from the user's settings and from
    every other installed plugin (denied, so that no other platform's probe runs either)."""
    from omni_core.config import Settings
    from omni_core.discovery import discover
    from omni_core.plugins import load_plugins

    keep = frozenset({"cpu", "npu"})
    settings = Settings.from_env()
    others = frozenset(r.name.casefold() for r in discover(settings)) - keep
    yield load_plugins(dataclasses.replace(settings, allow_plugins=keep, deny_plugins=others))


@pytest.fixture
def reference() -> Any:
    """The conformance kit's reference attention (float64, (batch, seq, heads, dim))."""
    from omni_core.testing import reference_attention

    return reference_attention
