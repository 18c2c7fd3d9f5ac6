"""Reports say what ran, and each fact has one owner: the attention report of a generation, the
reference attention of the conformance kit, the tiny-checkpoint marker, the platform's offload
answer, and the speech engine's ownership of the device and the seeds.

Real tiny models in this interpreter (the dev ``.venv``: torch, diffusers and the plugins
installed editable); the diffusion runtime's own test family (a tiny PixArt) is reused from
``omni_plugins/diffusion/tests``."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

HAVE_RUNTIME = all(importlib.util.find_spec(m) for m in ("torch", "diffusers", "omni_plugin_diffusion"))
pytestmark = pytest.mark.skipif(not HAVE_RUNTIME, reason="needs torch, diffusers and the diffusion plugin")

REPO = Path(__file__).resolve().parent.parent
FOX = "a red fox in snow"


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime_family() -> Any:
    sys.path.insert(0, str(REPO / "omni_plugins" / "diffusion" / "tests"))
    try:
        import runtime_family
    finally:
        sys.path.remove(str(REPO / "omni_plugins" / "diffusion" / "tests"))
    return runtime_family


@pytest.fixture(scope="module")
def plugins() -> Any:
    """The diffusion runtime, the offload strategies and the speech families (the CPU platform
    and its attention backends always load)."""
    from omni_core.config import Settings
    from omni_core.plugins import load_plugins

    keep = frozenset({"cpu", "diffusion", "offload", "vits", "speecht5", "bark"})
    return load_plugins(dataclasses.replace(Settings.from_env(), allow_plugins=keep, strict=False))


@pytest.fixture(scope="module")
def tiny_pixart(tmp_path_factory: pytest.TempPathFactory, runtime_family: Any) -> Path:
    directory = tmp_path_factory.mktemp("reports") / "tiny-pixart"
    runtime_family.TinyPixArt.make_tiny(directory, seed=0)
    return directory


def _open(family: type, model: Path, plugins: Any, attention: Any = None, **options: Any) -> Any:
    from omni_core.attention.config import AttentionConfig
    from omni_core.generation.model import EngineOptions

    config = AttentionConfig.parse(attention)
    return family.open(
        model, EngineOptions(family="tiny-pixart", attention=config, plugins=plugins, progress=False, **options)
    )


def _request(**fields: Any) -> Any:
    from omni_core.generation.request import GenerationRequest

    return GenerationRequest(prompt=FOX, seed=0, **fields)


# --- reports say what ran -------------------------------------------------------------------------


def test_per_role_report_names_the_two_backends_that_ran(runtime_family: Any, tiny_pixart: Path, plugins: Any) -> None:
    attention = {"default": {"backend": "TORCH_SDPA"}, "per_role": {"cross": {"backend": "REFERENCE_ATTN"}}}
    engine = _open(runtime_family.TinyPixArt, tiny_pixart, plugins, attention)
    result = engine.generate(_request())
    assert dict(engine.router.calls) == {("self", "TORCH_SDPA"): 6, ("cross", "REFERENCE_ATTN"): 6}
    assert result.metadata.attention == {"self": "TORCH_SDPA", "cross": "REFERENCE_ATTN"}
    assert result.metadata.to_dict()["attention"] == {"self": "TORCH_SDPA", "cross": "REFERENCE_ATTN"}


def test_a_declared_role_that_made_no_call_is_not_reported(
    runtime_family: Any, tiny_pixart: Path, plugins: Any
) -> None:
    """A role whose glob matches no module is configured (and explained) but never ran: the
    report leaves it out instead of filling it in from the configuration."""

    class WithUnusedRole(runtime_family.TinyPixArt):
        attention_roles = (("*.attn2", "cross", "cross"), ("*.attn9", "unused", "self"), ("*", "self", "self"))

    engine = _open(WithUnusedRole, tiny_pixart, plugins, {"per_role": {"unused": {"backend": "REFERENCE_ATTN"}}})
    assert engine.choices["unused"].backend == "REFERENCE_ATTN"
    result = engine.generate(_request())
    assert result.metadata.attention == {"self": "TORCH_SDPA", "cross": "TORCH_SDPA"}


def test_a_transformer_that_made_no_attention_call_is_an_error(
    runtime_family: Any, tiny_pixart: Path, plugins: Any
) -> None:
    """diffusers' classic AttnProcessor computes attention with baddbmm + softmax, never through
    SDPA: no chosen backend runs, so the generation fails naming the family and the roles."""
    from diffusers.models.attention_processor import AttnProcessor

    from omni_core.errors import ModelRuntimeError

    engine = _open(runtime_family.TinyPixArt, tiny_pixart, plugins, "REFERENCE_ATTN")
    engine.pipeline.transformer.set_attn_processor(AttnProcessor())
    with pytest.raises(ModelRuntimeError) as caught:
        engine.generate(_request())
    message = str(caught.value)
    assert message.startswith("tiny-pixart: transformer ran without making one attention call")
    assert "(cross, self)" in message and "never ran" in message


def test_an_attention_site_no_role_declares_is_an_error_not_another_roles_backend(
    runtime_family: Any, tiny_pixart: Path, plugins: Any
) -> None:
    """Only the cross sites are declared: the self-attention calls used to borrow a role's
    backend silently; now the first one fails naming its module path."""
    from omni_core.errors import ModelRuntimeError

    class CrossOnly(runtime_family.TinyPixArt):
        attention_roles = (("*.attn2", "cross", "cross"),)

    engine = _open(CrossOnly, tiny_pixart, plugins)
    assert set(engine.choices) == {"cross"}  # no "self" is invented for undeclared sites
    with pytest.raises(ModelRuntimeError, match=r"attention call at transformer\.transformer_blocks\.0\.attn1 matches"):
        engine.generate(_request())


def test_explicit_and_automatic_choices_walk_the_same_path(plugins: Any) -> None:
    """An explicit choice is a chain of one: the same candidate checks, then the options."""
    from omni_core.attention.config import AttentionConfig, AttentionConfigError
    from omni_core.attention.selector import CallProfile, explain_attention
    from omni_core.platforms import select_platform
    from omni_core.selection import Outcome

    platform = select_platform(plugins).instantiate()
    auto, _ = explain_attention(plugins, platform, AttentionConfig(), "self")
    explicit, explanation = explain_attention(plugins, platform, AttentionConfig.parse("REFERENCE_ATTN"), "self")
    assert auto is not None and auto.backend == "TORCH_SDPA" and auto.spec is None
    assert explicit is not None and explicit.backend == "REFERENCE_ATTN" and explicit.explicit
    outcomes = {c.name: c.outcome for c in explanation.candidates}
    assert outcomes["REFERENCE_ATTN"] is Outcome.SELECTED and outcomes["TORCH_SDPA"] is Outcome.NOT_CONSIDERED
    # the shared candidate check refuses an explicit backend that cannot serve the call
    with pytest.raises(AttentionConfigError, match=r"chosen explicitly for role 'self' \(default\) but cannot run"):
        config = AttentionConfig.parse("TORCH_SDPA")
        explain_attention(plugins, platform, config, "self", call=CallProfile(dtype="int8"))


# --- one reference attention ----------------------------------------------------------------------


def _qkv(hq: int = 4, hkv: int = 4, sq: int = 7, sk: int = 9, head: int = 16) -> tuple[Any, Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    return (
        torch.randn(2, sq, hq, head, generator=gen),
        torch.randn(2, sk, hkv, head, generator=gen),
        torch.randn(2, sk, hkv, head, generator=gen),
    )


def _torch_sdpa(q: Any, k: Any, v: Any, mask: Any) -> Any:
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_reference_attention_matches_torch_sdpa_with_masks_and_fully_masked_rows(kind: str) -> None:
    import torch

    from omni_core.testing import reference_attention

    q, k, v = _qkv()
    keep = torch.rand(2, 1, 7, 9, generator=torch.Generator().manual_seed(1)) > 0.4
    keep[..., 0] = True
    keep[0, :, 3] = False  # query 3 of batch 0 sees no key at all
    if kind == "bool":
        mask = keep
    else:  # a real-valued bias, and -inf where masked
        mask = torch.randn(2, 1, 7, 9, generator=torch.Generator().manual_seed(2)).masked_fill(~keep, float("-inf"))
    ref = reference_attention(q, k, v, mask=mask)
    sdpa = _torch_sdpa(q, k, v, mask).transpose(1, 2)
    assert not ref.isnan().any()
    assert torch.equal(ref[0, 3], torch.zeros_like(ref[0, 3]))  # the documented choice: zeros
    assert torch.equal(sdpa[0, 3], torch.zeros_like(sdpa[0, 3]))  # ... which is torch's on the CPU
    assert (ref - sdpa.double()).abs().max().item() < 1e-5


def test_the_reference_backend_is_the_reference_attention() -> None:
    """REFERENCE_ATTN of the CPU plugin runs the kit's reference (in float32), GQA and causal
    (aligned to the end, so early queries of a longer query see no key) included."""
    import torch
    from omni_plugin_cpu.reference import ReferenceBackend

    from omni_core.attention import AttentionMetadata
    from omni_core.testing import reference_attention

    q, k, v = _qkv(hq=4, hkv=2, sq=9, sk=5)
    out = ReferenceBackend.create(4, 16, None, True, 2).forward(q, k, v, AttentionMetadata())
    expected = reference_attention(q, k, v, causal=True, dtype=torch.float32)
    assert torch.equal(out, expected)
    assert torch.equal(out[:, :4], torch.zeros_like(out[:, :4]))  # queries 0-3 see no key


def test_the_kit_fails_a_backend_whose_fully_masked_rows_are_nan() -> None:
    """A naive kernel (softmax of the masked scores) passes the plain and masked cases but
    gives NaN where a query sees no key: the kit's reference names that case."""
    from omni_core.attention import AttentionBackend, AttentionImpl
    from omni_core.testing.checks import _check_attention_backend

    class NaiveImpl(AttentionImpl):
        def forward(self, query: Any, key: Any, value: Any, metadata: Any = None) -> Any:
            import torch

            mask = metadata.attn_mask if metadata is not None else None
            q, k, v = (t.transpose(1, 2).float() for t in (query, key, value))
            scores = (q @ k.transpose(-1, -2)) * self.softmax_scale
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
            return (scores.softmax(-1) @ v).transpose(1, 2)

    class NaiveBackend(AttentionBackend):
        name = "NAIVE_ATTN"
        supports_mask = True
        supports_causal = False

        @classmethod
        def impl_class(cls) -> type[AttentionImpl]:
            return NaiveImpl

    # what the kit reads of a registry entry: its name and declared device types
    entry = SimpleNamespace(name="NAIVE_ATTN", spec=SimpleNamespace(device_types=()))
    problems = _check_attention_backend(entry, NaiveBackend)
    assert [p for p in problems if "against the reference" in p] == [
        "NAIVE_ATTN fully masked rows: max abs error nan against the reference (float32, tol 1e-4)"
    ]


def test_no_hand_written_reference_attention_is_left_in_the_plugins() -> None:
    """softmax(q @ k^T) is written once, in omni_core.attention.reference; backend tests and
    the vendor kernels' stand-ins compare against (or are built on) that one."""
    offenders = []
    for path in sorted((REPO / "omni_plugins").glob("*/tests/*.py")) + sorted(
        (REPO / "omni_plugins").glob("*/omni_plugin_*/**/*.py")
    ):
        # attention is softmax over a product of queries and keys; a sampler's softmax over logits is not
        if re.search(r"softmax\([^)\n]*(@|matmul|bmm|einsum)", path.read_text(encoding="utf-8")):
            offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


# --- one tiny-checkpoint marker -------------------------------------------------------------------


def test_the_marker_is_written_and_read_in_one_place(
    runtime_family: Any, tiny_pixart: Path, plugins: Any, tmp_path: Path
) -> None:
    from omni_core.tiny import MARKER_FILENAME, has_random_weights, read_marker, write_marker

    copy = tmp_path / "pixart"
    shutil.copytree(tiny_pixart, copy)
    assert read_marker(copy) is None and not has_random_weights(copy)
    assert _open(runtime_family.TinyPixArt, copy, plugins).generate(_request()).metadata.random_weights is False
    write_marker(copy, family="tiny-pixart", seed=0, provider="tests")
    assert read_marker(copy) == {"family": "tiny-pixart", "seed": 0, "provider": "tests", "random_weights": True}
    assert _open(runtime_family.TinyPixArt, copy, plugins).generate(_request()).metadata.random_weights is True
    (copy / MARKER_FILENAME).write_text("[1, 2]")  # not an object: not a marker
    assert read_marker(copy) is None and not has_random_weights(copy)


def test_only_omni_core_tiny_names_the_marker_file() -> None:
    sources = [*(REPO / "omni_core").rglob("*.py"), *(REPO / "cli").rglob("*.py")]
    sources += [p for p in (REPO / "omni_plugins").glob("*/omni_plugin_*/**/*.py")]
    naming = sorted(str(p.relative_to(REPO)) for p in sources if "omni-tiny.json" in p.read_text(encoding="utf-8"))
    assert naming == ["omni_core/tiny.py"]


# --- Platform.supports_offload is the offload choice's to check -----------------------------------


@pytest.fixture(scope="module")
def no_offload_platform() -> Any:
    from omni_plugin_cpu.platform import CpuPlatform

    class NoOffload(CpuPlatform):  # a platform whose device cannot take weights moved in on use
        name = "no-offload"
        supports_offload = False

    return NoOffload()


def test_a_platform_without_offload_refuses_it_before_loading(
    runtime_family: Any, tiny_pixart: Path, plugins: Any, no_offload_platform: Any
) -> None:
    from omni_core.offload import OffloadConfigError, choose_offloader

    with pytest.raises(OffloadConfigError) as caught:
        choose_offloader(plugins, ("model_cpu",), {"platform:no-offload"}, no_offload_platform)
    assert "the no-offload platform does not support offload" in str(caught.value)
    assert "Drop --offload" in str(caught.value)
    # through the runtime: refused at planning, before any weight is read
    with pytest.raises(OffloadConfigError, match="no-offload platform does not support offload"):
        _open(runtime_family.TinyPixArt, tiny_pixart, plugins, offload=("model_cpu",), platform=no_offload_platform)
    # asking for no offload is fine there
    assert choose_offloader(plugins, (), set(), no_offload_platform)[0] is None


def test_the_cpu_platform_runs_offload(runtime_family: Any, tiny_pixart: Path, plugins: Any) -> None:
    engine = _open(runtime_family.TinyPixArt, tiny_pixart, plugins, offload=("model_cpu",))
    assert engine.platform.supports_offload is True
    assert engine.generate(_request()).metadata.offload == "model_cpu"


# --- the speech engine owns the device and the seeds ----------------------------------------------


class _SeedLog:
    """The CPU platform, noting every seed it is given (the engine's and the segments')."""

    def __new__(cls, seeds: list[int]) -> Any:
        from omni_plugin_cpu.platform import CpuPlatform

        class Logged(CpuPlatform):
            def seed_everything(self, seed: int) -> None:
                seeds.append(seed)
                super().seed_everything(seed)

        return Logged()


TINY_TTS = {"vits": "VitsAdapter", "speecht5": "SpeechT5Adapter", "bark": "BarkAdapter"}


@pytest.fixture(scope="module")
def tiny_tts(tmp_path_factory: pytest.TempPathFactory, plugins: Any) -> Any:
    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            made[family] = tmp_path_factory.mktemp(family) / f"tiny-{family}"
            plugins.tts_adapters.get(family).load().make_tiny(made[family], seed=0)
        return made[family]

    return make


@pytest.mark.parametrize("family", sorted(TINY_TTS))
def test_the_engine_seeds_every_segment_by_the_one_rule(family: str, tiny_tts: Any, plugins: Any) -> None:
    import numpy as np

    from omni_core.speech.engine import SpeechEngine
    from omni_core.speech.seeding import segment_seed

    seeds: list[int] = []
    engine = SpeechEngine(tiny_tts(family), plugins=plugins, platform=_SeedLog(seeds))
    assert engine.adapter.ctx.platform is engine.platform
    assert str(engine.adapter.ctx.device) == "cpu"
    text = "Hello there. How are you today? Fine."
    spoken = engine.speak({"input": text, "seed": 11})
    pieces = len(seeds) - 1
    assert pieces >= 2, seeds
    # the engine seeds the request, then each segment gets segment_seed(seed, i) on its platform
    assert seeds == [11, *(segment_seed(11, i) for i in range(pieces))]
    seeds.clear()
    chunks = list(engine.stream({"input": text, "seed": 11}))
    assert seeds == [11, *(segment_seed(11, i) for i in range(len(chunks)))]
    # so the streamed chunks concatenate to what speak returned
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), spoken.audio.samples)


def test_no_speech_adapter_picks_a_device_or_seeds_torch_itself() -> None:
    for family in TINY_TTS:
        source = next((REPO / "omni_plugins" / family).glob("omni_plugin_*/adapter.py")).read_text(encoding="utf-8")
        for forbidden in ("manual_seed", "current_platform", "seed_everything", 'torch.device("cpu")'):
            assert forbidden not in source, (family, forbidden)
