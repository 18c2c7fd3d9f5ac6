"""Every attention backend that can run here against a float64 ground truth.

The backends are discovered, not listed: every registered backend that loads, is available
on the platform this machine selects and is not lossy takes part (TORCH_SDPA, REFERENCE_ATTN
and CHUNKED_ATTN must be among them). A case a backend declares unsupported is skipped with
its own reason. CHUNKED_ATTN gets small block sizes through ``metadata.extra`` so that every
case crosses many block boundaries that do not divide the sequence lengths; the other
backends ignore those keys.

The ground truth below is written from the definition in omni_core.attention, independently
of the plugin's code, in float64. Rows whose keys are all masked are defined as zeros, the
output TORCH_SDPA gives on CPU for them.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from omni_core.attention import AttentionMetadata
from omni_core.attention.config import AttentionConfig
from omni_core.attention.selector import select_attention
from omni_core.config import Settings
from omni_core.platforms import select_platform
from omni_core.plugins import load_plugins
from omni_core.testing import reference_attention as ground_truth
from omni_core.testing import reference_attention_varlen

EXPECTED = {"TORCH_SDPA", "REFERENCE_ATTN", "CHUNKED_ATTN"}
#: max abs error against the float64 ground truth, per input dtype
MAX_ABS = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float64: 1e-10}
#: mean relative error (mean|out - ref| / mean|ref|), the domain's parity bar, per dtype
MEAN_REL = {torch.float32: 2e-3, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-9}
#: block sizes for CHUNKED_ATTN: small, coprime with the test lengths
SMALL_CHUNKS = {"chunk_size_q": 16, "chunk_size_k": 24}


# --- discovery ---------------------------------------------------------------------------------


@functools.cache
def _discovered() -> tuple[dict[str, Any], dict[str, str]]:
    """(runnable backends by name, why each other registered backend is left out).

    Loads plugins with default settings (no filter variables, no user config) into a private
    cache directory, and asks each backend about the platform this machine selects."""
    private = Path(tempfile.mkdtemp(prefix="omni-parity-"))
    settings = Settings(config_path=private / "config.toml", cache_dir=private / "cache")
    plugins = load_plugins(settings)
    platform = select_platform(plugins).instantiate()
    runnable: dict[str, Any] = {}
    left_out: dict[str, str] = {}
    for entry in plugins.attention_backends:
        try:
            cls = entry.load()
        except Exception as exc:  # a broken third-party backend is not this suite's concern
            left_out[entry.name] = f"failed to load: {exc}"
            continue
        availability = cls.availability(platform)
        if not availability.ok:
            left_out[entry.name] = availability.reason
        elif cls.lossy:
            left_out[entry.name] = "lossy: parity is not expected"
        else:
            runnable[entry.name] = cls
    return runnable, left_out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_name" in metafunc.fixturenames:
        metafunc.parametrize("backend_name", sorted(_discovered()[0]))


def test_expected_backends_are_discovered_and_runnable():
    runnable, left_out = _discovered()
    missing = EXPECTED - set(runnable)
    assert not missing, f"missing {missing}; left out: {left_out}"


# --- ground truth --------------------------------------------------------------------------------


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# --- cases ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    batch: int
    sq: int
    sk: int
    hq: int
    hkv: int
    head: int
    causal: bool = False
    #: None, "bool" (B, 1, Sq, Sk), "padding" (B, 1, 1, Sk) bool, "additive" (H, Sq, Sk) float,
    #: "bias" (Sq, Sk) finite float
    mask: str | None = None
    #: (cu_seqlens_q, cu_seqlens_k) for a packed batch of 1
    varlen: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    scale: float | None = None


CASES = [
    Case("plain", 1, 64, 64, 4, 4, 64),
    Case("gqa-8q2kv-h40", 2, 77, 77, 8, 2, 40),
    Case("mqa-causal-h72", 2, 65, 65, 6, 1, 72, causal=True),
    Case("causal-fewer-queries-h80", 1, 37, 101, 4, 2, 80, causal=True),
    Case("causal-more-queries-h96", 2, 61, 29, 4, 4, 96, causal=True),  # early rows see no key
    Case("cross-h96", 2, 23, 85, 8, 2, 96),
    Case("decode-gqa-h128", 2, 1, 150, 8, 2, 128),
    Case("decode-causal-3-queries", 1, 3, 100, 6, 2, 64, causal=True),
    Case("bool-mask-gqa", 2, 50, 70, 8, 2, 64, mask="bool"),
    Case("padding-mask-batch2", 2, 45, 45, 4, 4, 40, mask="padding"),
    Case("additive-mask-causal-h80", 1, 50, 70, 4, 4, 80, causal=True, mask="additive"),
    Case("bias-mask-mqa", 2, 33, 47, 6, 1, 72, mask="bias", scale=0.05),
    Case("varlen-causal-gqa", 1, 90, 90, 8, 2, 64, causal=True, varlen=((0, 13, 40, 41, 90), (0, 13, 40, 41, 90))),
    Case("varlen-cross-h40", 1, 60, 90, 4, 4, 40, varlen=((0, 5, 30, 31, 60), (0, 13, 40, 52, 90))),
    Case("varlen-causal-unequal-h96", 1, 60, 90, 4, 1, 96, causal=True, varlen=((0, 5, 30, 60), (0, 13, 40, 90))),
]


def make_mask(case: Case, dtype: torch.dtype) -> torch.Tensor | None:
    gen = torch.Generator().manual_seed(99)
    if case.mask == "bool":
        keep = torch.rand(case.batch, 1, case.sq, case.sk, generator=gen) > 0.4
        keep[..., -1] = True  # causal-free case: every row keeps a key
        return keep
    if case.mask == "padding":
        keep = torch.ones(case.batch, 1, 1, case.sk, dtype=torch.bool)
        keep[1, ..., 30:] = False  # the second sequence is padded after 30 keys
        return keep
    if case.mask == "additive":
        bias = torch.randn(case.hq, case.sq, case.sk, generator=gen)
        drop = torch.rand(case.hq, case.sq, case.sk, generator=gen) > 0.7
        drop[..., -1] = False  # the last key is visible to every row even under causal alignment
        return bias.masked_fill(drop, float("-inf")).to(dtype)
    if case.mask == "bias":
        return (2 * torch.randn(case.sq, case.sk, generator=gen)).to(dtype)
    return None


def run_case(backend_name: str, case: Case, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(backend output, float64 ground truth) for one case."""
    cls = _discovered()[0][backend_name]
    reason = cls.unsupported_reason(
        head_size=case.head,
        dtype=str(dtype).removeprefix("torch."),
        causal=case.causal,
        mask=case.mask is not None,
        varlen=case.varlen is not None,
        gqa=case.hq != case.hkv,
    )
    if reason:
        pytest.skip(f"{backend_name}: {reason}")
    q = rand(case.batch, case.sq, case.hq, case.head, dtype=dtype, seed=1)
    k = rand(case.batch, case.sk, case.hkv, case.head, dtype=dtype, seed=2)
    v = rand(case.batch, case.sk, case.hkv, case.head, dtype=dtype, seed=3)
    mask = make_mask(case, dtype)
    extra: dict[str, Any] = dict(SMALL_CHUNKS)
    if case.varlen is not None:
        extra["cu_seqlens_q"] = torch.tensor(case.varlen[0], dtype=torch.int32)
        extra["cu_seqlens_k"] = torch.tensor(case.varlen[1], dtype=torch.int32)
    impl = cls.create(case.hq, case.head, case.scale, case.causal, case.hkv, prefix="parity")
    out = impl.forward(q, k, v, AttentionMetadata(attn_mask=mask, extra=extra))
    scale = case.scale if case.scale is not None else case.head**-0.5
    if case.varlen is not None:
        ref = reference_attention_varlen(q, k, v, *case.varlen, scale=scale, causal=case.causal)
    else:
        ref = ground_truth(q, k, v, scale, case.causal, mask)
    assert out.shape == q.shape and out.dtype == dtype
    return out, ref


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert not out.isnan().any(), f"{what}: NaN in the output"
    diff = (out.double() - ref).abs()
    max_abs = diff.max().item()
    mean_rel = diff.mean().item() / ref.abs().mean().item()
    assert max_abs < MAX_ABS[dtype], f"{what}: max abs error {max_abs:.2e} >= {MAX_ABS[dtype]:.0e}"
    assert mean_rel < MEAN_REL[dtype], f"{what}: mean relative error {mean_rel:.2e} >= {MEAN_REL[dtype]:.0e}"


# --- parity --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_parity_with_ground_truth(backend_name, case, dtype):
    out, ref = run_case(backend_name, case, dtype)
    assert_close(out, ref, dtype, f"{backend_name} {case.id} {dtype}")


@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("gqa-8q2kv-h40", "additive-mask-causal-h80")])
def test_float64_inputs_stay_float64(backend_name, case):
    out, ref = run_case(backend_name, case, torch.float64)
    assert_close(out, ref, torch.float64, f"{backend_name} {case.id} float64")


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_rows_with_every_key_masked_are_zero_like_torch_sdpa(backend_name, kind):
    """TORCH_SDPA returns zeros (not NaN) for a query row that may attend to no key; every
    backend must agree, whether the row is emptied by a mask or by causal alignment."""
    cls = _discovered()[0][backend_name]
    if cls.unsupported_reason(mask=True, causal=True):
        pytest.skip(cls.unsupported_reason(mask=True, causal=True))
    q, k, v = rand(2, 40, 4, 32, seed=4), rand(2, 30, 4, 32, seed=5), rand(2, 30, 4, 32, seed=6)
    keep = torch.rand(2, 4, 40, 30, generator=torch.Generator().manual_seed(7)) > 0.5
    keep[..., 35, :] = False  # a whole row masked (and row 35 also has causal keys available)
    keep[0, 1, 20, :] = False  # one row in one head of one batch
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    extra = {"chunk_size_q": 8, "chunk_size_k": 7}
    for causal in (False, True):  # causal with 40 queries, 30 keys: queries 0-9 see no key
        impl = cls.create(4, 32, causal=causal)
        out = impl.forward(q, k, v, AttentionMetadata(attn_mask=mask, extra=extra))
        assert not out.isnan().any()
        assert torch.equal(out[:, 35], torch.zeros_like(out[:, 35]))
        assert torch.equal(out[0, 20, 1], torch.zeros_like(out[0, 20, 1]))
        if causal:
            assert torch.equal(out[:, :10], torch.zeros_like(out[:, :10]))
        assert_close(out, ground_truth(q, k, v, 32**-0.5, causal, keep), torch.float32, f"{backend_name} {kind}")


# --- CHUNKED_ATTN specifics ----------------------------------------------------------------------


def _chunked():
    return _discovered()[0]["CHUNKED_ATTN"]


@pytest.mark.parametrize(
    "chunks", [(1, 1), (5, 7), (16, 24), (33, 100), (1024, 1024)], ids=lambda c: f"q{c[0]}-k{c[1]}"
)
def test_chunked_block_sizes_do_not_change_the_result(chunks):
    case = Case("blocks", 2, 67, 83, 6, 2, 40, causal=True, mask="bool")
    q, k, v = rand(2, 67, 6, 40, seed=1), rand(2, 83, 2, 40, seed=2), rand(2, 83, 2, 40, seed=3)
    mask = make_mask(case, torch.float32)
    impl = _chunked().create(6, 40, causal=True, num_kv_heads=2)
    extra = {"chunk_size_q": chunks[0], "chunk_size_k": chunks[1]}
    out = impl.forward(q, k, v, AttentionMetadata(attn_mask=mask, extra=extra))
    assert_close(out, ground_truth(q, k, v, 40**-0.5, True, mask), torch.float32, f"chunks {chunks}")


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor (in elements) any torch op allocates while active; views and
    in-place results, which share an input's storage, allocate nothing and are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        inputs = [*args, *kwargs.values()]
        shared = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
        for t in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in shared:
                self.largest = max(self.largest, t.numel())
        return result


def test_chunked_never_materialises_the_score_matrix():
    """The largest tensor any op produces stays within one block of scores (or the output),
    far below the (batch, heads, seq_q, seq_k) matrix REFERENCE_ATTN builds. Checked on the
    ops themselves, so it does not depend on the allocator."""
    batch, seq, heads, kv_heads, head, block = 1, 768, 4, 2, 16, 96
    q = rand(batch, seq, heads, head, seed=1)
    k, v = rand(batch, seq, kv_heads, head, seed=2), rand(batch, seq, kv_heads, head, seed=3)
    mask = torch.rand(batch, 1, seq, seq, generator=torch.Generator().manual_seed(4)) > 0.1  # an input, not counted
    full_scores = batch * heads * seq * seq
    bound = max(batch * heads * block * block, q.numel())

    class SmallBlocks(_chunked().impl_class()):  # block sizes as class attributes
        chunk_size_q = block
        chunk_size_k = block

    impl = SmallBlocks(heads, head, causal=True, num_kv_heads=kv_heads)
    with _LargestTensor() as seen:
        out = impl.forward(q, k, v, AttentionMetadata(attn_mask=mask))
    assert seen.largest <= bound < full_scores // 16, (seen.largest, bound, full_scores)
    assert_close(out, ground_truth(q, k, v, head**-0.5, True, mask), torch.float32, "small blocks")

    # the probe does see a materialised score matrix when there is one
    reference = _discovered()[0]["REFERENCE_ATTN"].create(heads, head, causal=True, num_kv_heads=kv_heads)
    with _LargestTensor() as seen_ref:
        reference.forward(q, k, v, AttentionMetadata(attn_mask=mask))
    assert seen_ref.largest >= full_scores


_RSS_PROBE = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    from omni_core.attention import AttentionMetadata
    from omni_plugin_cpu.chunked import ChunkedBackend

    seq = int(sys.argv[1])
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, seq, 1, 32, generator=g) for _ in range(3))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    extra = {"chunk_size_q": 512, "chunk_size_k": 512}
    ChunkedBackend.create(1, 32).forward(q, k, v, AttentionMetadata(extra=extra))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"grew_kib": after - before}))
    """
)


def test_chunked_peak_memory_stays_bounded_in_a_fresh_process():
    """Real memory, measured by the kernel: the peak RSS of a fresh process grows by far less
    than the 256 MiB a (1, 1, 8192, 8192) float32 score matrix would take."""
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, "8192"], capture_output=True, text=True, check=True, timeout=120
    )
    grew_mib = json.loads(proc.stdout.strip().splitlines()[-1])["grew_kib"] / 1024
    assert grew_mib < 32, f"peak RSS grew by {grew_mib:.0f} MiB; a full score matrix is 256 MiB"


def test_chunked_rejects_bad_block_sizes_and_masks():
    impl = _chunked().create(2, 16)
    x = rand(1, 8, 2, 16)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="chunk_size_q must be a positive integer"):
            impl.forward(x, x, x, AttentionMetadata(extra={"chunk_size_q": bad}))
    with pytest.raises(ValueError, match="does not broadcast"):
        impl.forward(x, x, x, AttentionMetadata(attn_mask=torch.ones(3, 8, 8, dtype=torch.bool)))
    with pytest.raises(ValueError, match=r"boolean .* or an additive float mask"):
        impl.forward(x, x, x, AttentionMetadata(attn_mask=torch.ones(8, 8, dtype=torch.int64)))


@pytest.mark.parametrize("name", ["REFERENCE_ATTN", "CHUNKED_ATTN"])
def test_varlen_rejects_batched_input_and_mask_like_torch_sdpa(name):
    impl = _discovered()[0][name].create(2, 16)
    cu = torch.tensor([0, 4])
    x = rand(2, 4, 2, 16)
    with pytest.raises(ValueError, match="batch 1"):
        impl.forward(x, x, x, AttentionMetadata(extra={"cu_seqlens_q": cu}))
    y = rand(1, 4, 2, 16)
    with pytest.raises(ValueError, match="not both"):
        impl.forward(
            y, y, y, AttentionMetadata(attn_mask=torch.ones(4, 4, dtype=torch.bool), extra={"cu_seqlens_q": cu})
        )


@pytest.mark.parametrize("name", ["REFERENCE_ATTN", "CHUNKED_ATTN"])
def test_new_backends_are_explicit_only(name, omni_isolated):
    plugins = load_plugins(Settings(config_path=omni_isolated / "c.toml", cache_dir=omni_isolated / "cache"))
    platform = select_platform(plugins).instantiate()
    assert select_attention(plugins, platform).backend == "TORCH_SDPA"  # the CPU chain is SDPA only
    choice = select_attention(plugins, platform, AttentionConfig.parse(None, backend=name.lower()))
    assert choice.backend == name and choice.explicit
    impl = choice.create(4, 32, causal=True, num_kv_heads=2)
    q, k, v = rand(1, 9, 4, 32, seed=1), rand(1, 9, 2, 32, seed=2), rand(1, 9, 2, 32, seed=3)
    assert_close(impl.forward(q, k, v), ground_truth(q, k, v, 32**-0.5, True), torch.float32, name)
