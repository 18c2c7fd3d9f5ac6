"""Attention selection: per-role spec > category > default > platform chain > TORCH_SDPA;
explicit choices run or fail with the reason; automatic ones fall back with reasons recorded.

The selector is driven with hand-built registries here; loading real installed plugins into
those registries is covered by the plugin tests.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from omni_core.attention import AttentionBackend, AttentionImpl
from omni_core.attention.config import AttentionConfig, AttentionConfigError, AttentionSpec
from omni_core.attention.selector import CallProfile, explain_attention, select_attention
from omni_core.platforms import MemoryInfo, Platform
from omni_core.plugins import PluginSet, plugin_set_of
from omni_core.registry import AttentionBackendRegistrar, Provider
from omni_core.selection import Outcome


class _Impl(AttentionImpl):
    def forward(self, query: Any, key: Any, value: Any, metadata: Any = None) -> Any:
        return query


class _Base(AttentionBackend):
    @classmethod
    def impl_class(cls) -> type[AttentionImpl]:
        return _Impl


class Sdpa(_Base):
    name = "TORCH_SDPA"
    supports_mask = True
    supports_gqa = True


class Fast(_Base):
    name = "FAST_ATTN"
    device_types = ("fixture",)
    supported_head_sizes = (64, 128)
    supports_gqa = True


class NeedsPackage(_Base):
    name = "NEEDS_PKG_ATTN"
    required_packages = ("omni_package_that_is_not_installed",)


class Lossy(_Base):
    name = "LOSSY_ATTN"
    lossy = True


class Quantised(_Base):
    name = "QUANT_ATTN"
    supported_options = frozenset({"quant"})

    @classmethod
    def check_option_values(cls, spec: AttentionSpec) -> None:
        if spec.quant and spec.quant.dtype_qk not in (None, "int8"):
            raise ValueError(f"QUANT_ATTN quantises QK to int8 only, not {spec.quant.dtype_qk}")


class VendorFlash(_Base):
    name = "VENDOR_FA"
    device_types = ("fixture",)


class FixturePlatform(Platform):
    name = "fixture"
    device_type = "fixture"
    attention_aliases: ClassVar[dict[str, str]] = {"FLASH_ATTN": "VENDOR_FA"}
    chain: tuple[str, ...] = ("NEEDS_PKG_ATTN", "LOSSY_ATTN", "FAST_ATTN", "TORCH_SDPA")

    def device_count(self) -> int:
        return 1

    def device_name(self, index: int = 0) -> str:
        return "fixture"

    def memory_info(self, index: int = 0) -> MemoryInfo:
        return MemoryInfo(1, 1)

    def supported_dtypes(self) -> tuple[str, ...]:
        return ("float32",)

    def default_attention_chain(self, head_size: int | None = None, packed_mask_free: bool = False) -> tuple[str, ...]:
        return self.chain


def plugin_set(
    *backends: type[AttentionBackend],
    duplicate: type[AttentionBackend] | None = None,
    filtered: dict[str, str] | None = None,
) -> PluginSet:
    offers = []
    for i, cls in enumerate([*backends, *([duplicate] if duplicate else [])]):
        registrar = AttentionBackendRegistrar(Provider(f"p{i}", f"omni-plugin-p{i}", "1.0"))
        # the registration carries device_types: omni refuses a class that states them otherwise
        registrar.register(cls.name, f"{cls.__module__}:{cls.__qualname__}", device_types=cls.device_types)
        offers += registrar.offers()
    plugin_set = plugin_set_of(offers)
    plugin_set.attention_backends.filtered.update({k.casefold(): v for k, v in (filtered or {}).items()})
    return plugin_set


ALL = (Sdpa, Fast, NeedsPackage, Lossy, Quantised, VendorFlash)


def outcomes(explanation) -> dict[str, tuple[Outcome, str]]:
    return {c.name: (c.outcome, c.reason) for c in explanation.candidates}


def test_automatic_walks_the_chain_and_records_why_each_was_passed_over():
    choice, explanation = explain_attention(plugin_set(*ALL), FixturePlatform(), call=CallProfile(head_size=64))
    assert choice is not None and choice.backend == "FAST_ATTN" and not choice.explicit
    seen = outcomes(explanation)
    assert seen["NEEDS_PKG_ATTN"] == (Outcome.REJECTED, "package(s) not installed: omni_package_that_is_not_installed")
    assert seen["LOSSY_ATTN"][0] is Outcome.REJECTED and "lossy" in seen["LOSSY_ATTN"][1]
    assert seen["TORCH_SDPA"][0] is Outcome.NOT_CONSIDERED
    assert seen["QUANT_ATTN"] == (Outcome.NOT_CONSIDERED, "not in fixture's default chain: explicit only")
    assert explanation.winner == "FAST_ATTN" and "defaulting to FAST_ATTN" in explanation.rule


def test_unsupported_call_falls_back_to_torch_sdpa_with_the_reason():
    choice, explanation = explain_attention(plugin_set(*ALL), FixturePlatform(), call=CallProfile(head_size=80))
    assert choice is not None and choice.backend == "TORCH_SDPA"
    assert outcomes(explanation)["FAST_ATTN"] == (Outcome.REJECTED, "head size 80 not in [64, 128]")
    masked, explanation = explain_attention(plugin_set(*ALL), FixturePlatform(), call=CallProfile(mask=True))
    assert masked is not None and masked.backend == "TORCH_SDPA"
    assert "does not support attention masks" in outcomes(explanation)["FAST_ATTN"][1]


def test_torch_sdpa_is_appended_to_a_chain_that_forgets_it():
    platform = FixturePlatform()
    platform.chain = ("NEEDS_PKG_ATTN",)
    choice = select_attention(plugin_set(*ALL), platform)
    assert choice.backend == "TORCH_SDPA"


def test_nothing_runnable_is_an_error_that_shows_the_explanation():
    platform = FixturePlatform()
    platform.chain = ("NEEDS_PKG_ATTN",)
    with pytest.raises(AttentionConfigError, match="no attention backend can run role 'self'") as info:
        select_attention(plugin_set(NeedsPackage), platform)
    assert "TORCH_SDPA" in str(info.value) and "not installed" in str(info.value)


def test_explicit_choice_wins_even_outside_the_chain_and_is_case_insensitive():
    choice = select_attention(plugin_set(*ALL), FixturePlatform(), AttentionConfig.parse("quant_attn"))
    assert choice.backend == "QUANT_ATTN" and choice.explicit
    assert choice.explanation.rule == "explicit choice in default"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("NEEDS_PKG_ATTN", "package(s) not installed"),
        ("MISSING_ATTN", "not installed: no active plugin provides it"),
        ("FAST_ATTN", "head size 80 not in [64, 128]"),
    ],
)
def test_explicit_choice_that_cannot_run_is_an_error_never_a_swap(name, reason):
    with pytest.raises(AttentionConfigError, match="chosen explicitly for role 'self'") as info:
        select_attention(
            plugin_set(*ALL), FixturePlatform(), AttentionConfig.parse(name), call=CallProfile(head_size=80)
        )
    assert reason in str(info.value) and name in str(info.value)


def test_lossy_backends_run_when_chosen_explicitly():
    assert (
        select_attention(plugin_set(*ALL), FixturePlatform(), AttentionConfig.parse("LOSSY_ATTN")).backend
        == "LOSSY_ATTN"
    )


def test_role_then_category_then_default_precedence():
    config = AttentionConfig.parse(
        {
            "default": {"backend": "TORCH_SDPA"},
            "per_role": {"cross": {"backend": "LOSSY_ATTN"}, "video.to_audio": {"backend": "QUANT_ATTN"}},
        }
    )
    plugins, platform = plugin_set(*ALL), FixturePlatform()
    assert select_attention(plugins, platform, config, "video.to_audio", "cross").backend == "QUANT_ATTN"
    assert select_attention(plugins, platform, config, "text.to_video", "cross").backend == "LOSSY_ATTN"
    assert select_attention(plugins, platform, config, "video.self", "self").backend == "TORCH_SDPA"
    assert select_attention(plugins, platform, AttentionConfig(), "video.self", "self").backend == "FAST_ATTN"


def test_option_blocks_are_validated_by_the_chosen_backend():
    plugins, platform = plugin_set(*ALL), FixturePlatform()
    ok = AttentionConfig.parse({"default": {"backend": "QUANT_ATTN", "quant": {"dtype_qk": "int8"}}})
    assert select_attention(plugins, platform, ok).spec.quant.dtype_qk == "int8"
    bad_value = AttentionConfig.parse({"default": {"backend": "QUANT_ATTN", "quant": {"dtype_qk": "fp8_e4m3"}}})
    with pytest.raises(AttentionConfigError, match="int8 only, not fp8_e4m3"):
        select_attention(plugins, platform, bad_value)
    unsupported = AttentionConfig.parse({"default": {"backend": "TORCH_SDPA", "block_sparse": {"sparsity": 0.5}}})
    with pytest.raises(AttentionConfigError, match=r"TORCH_SDPA does not support option block\(s\) \['block_sparse'\]"):
        select_attention(plugins, platform, unsupported)
    orphan = AttentionConfig.parse({"default": {"quant": {"dtype_qk": "int8"}}})
    with pytest.raises(AttentionConfigError, match="without a backend"):
        select_attention(plugins, platform, orphan)


def test_platform_maps_a_shared_name_to_its_own_kernel_and_says_so():
    choice = select_attention(plugin_set(*ALL), FixturePlatform(), AttentionConfig.parse("flash_attn"))
    assert choice.backend == "VENDOR_FA"
    assert "fixture serves FLASH_ATTN with VENDOR_FA" in choice.explanation.candidates[0].reason


def test_conflicting_and_filtered_backends_explain_themselves():
    plugins = plugin_set(
        Sdpa, Fast, duplicate=Fast, filtered={"LOSSY_ATTN": "removed by OMNI_DISABLE_ATTENTION_BACKENDS"}
    )
    _, explanation = explain_attention(plugins, FixturePlatform(), call=CallProfile(head_size=64))
    seen = outcomes(explanation)
    assert "omni-plugin-p1 1.0" in seen["FAST_ATTN"][1] and "omni-plugin-p2 1.0" in seen["FAST_ATTN"][1]
    assert seen["LOSSY_ATTN"][1] == "installed but removed by OMNI_DISABLE_ATTENTION_BACKENDS"
    assert explanation.winner == "TORCH_SDPA"


def test_global_shorthand_and_config_backend_must_not_disagree():
    assert AttentionConfig.parse(None, backend="cudnn_attn").default.backend == "CUDNN_ATTN"
    assert AttentionConfig.parse("CUDNN_ATTN", backend="cudnn_attn").default.backend == "CUDNN_ATTN"
    with pytest.raises(AttentionConfigError, match="given twice"):
        AttentionConfig.parse({"default": {"backend": "FLASH_ATTN"}}, backend="TORCH_SDPA")
    with pytest.raises(AttentionConfigError, match=r"default\.quant\.q_block_size"):
        AttentionConfig.parse({"default": {"backend": "X", "quant": {"q_block_size": 3}}})
    with pytest.raises(AttentionConfigError, match="skip_layers"):
        AttentionConfig.parse({"default": {"backend": "X", "block_sparse": {"skip_layers": "a-b"}}})
