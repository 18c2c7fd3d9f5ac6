"""Choosing a cache backend (omni_core.cache.choose_cache_backend): every check is made on
declarations and options, before a model is touched; the errors name the problem and the fix."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from omni_core.cache import CacheBackend, StepReport, choose_cache_backend
from omni_core.conflicts import Provider
from omni_core.errors import CacheConfigError
from omni_core.plugins import plugin_set_of
from omni_core.registry import CacheBackendRegistrar


class Recorder(CacheBackend):
    """A complete backend that records nothing; what these tests choose."""

    name: ClassVar[str]

    @classmethod
    def option_problems(cls, options: Any) -> list[str]:
        return [f"unknown option(s) {', '.join(map(repr, sorted(options)))}"] if set(options) - {"level"} else []

    @classmethod
    def declaration_problems(cls, family: str, declaration: Any) -> list[str]:
        return [] if "blocks" in declaration else ["it lacks 'blocks'"]

    def enable(self) -> None: ...
    def refresh(self, num_inference_steps: int, quality: Any = None) -> None: ...
    def disable(self) -> None: ...
    def is_enabled(self) -> bool:
        return False

    def report(self) -> StepReport:
        return StepReport()


class Incomplete(CacheBackend):  # no report(), no refresh(), ...
    name: ClassVar[str]


def plugins(**incompatible: tuple[str, ...]) -> Any:
    registrar = CacheBackendRegistrar(Provider("p", "omni-plugin-p", "1.0"))
    registrar.register("recorder", f"{__name__}:Recorder", incompatible_with=incompatible.get("recorder", ()))
    registrar.register("incomplete", f"{__name__}:Incomplete")
    return plugin_set_of(registrar.offers())


DECLARED = {"recorder": {"blocks": ["transformer_blocks"]}, "incomplete": {"blocks": []}}


def test_nothing_requested_is_no_backend_explained() -> None:
    choice, explanation = choose_cache_backend(plugins(), None, {}, "fam", DECLARED, set())
    assert choice is None
    assert explanation.rule == "no cache backend requested: every step is computed"
    assert choose_cache_backend(plugins(), "none", {}, "fam", DECLARED, set())[0] is None


def test_the_requested_backend_is_chosen_with_its_options() -> None:
    choice, explanation = choose_cache_backend(plugins(), "Recorder", {"level": 1}, "fam", DECLARED, set())
    assert choice is not None and choice.name == "recorder" and choice.options == {"level": 1}
    assert choice.backend_class is Recorder and Recorder.name == "recorder"
    assert explanation.winner == "recorder" and "family 'fam' declares its settings" in explanation.render()


@pytest.mark.parametrize(
    ("requested", "options", "declarations", "features", "incompatible", "words"),
    [
        ("nosuch", {}, DECLARED, set(), {}, "unknown cache backend 'nosuch'"),
        (None, {"level": 1}, DECLARED, set(), {}, "--cache-config was given without a cache backend"),
        ("recorder", {"speed": 2}, DECLARED, set(), {}, "--cache-config for 'recorder': unknown option(s) 'speed'"),
        ("recorder", {}, {"other": {}}, set(), {}, "has nothing to hook in family 'fam'"),
        ("recorder", {}, {"recorder": {}}, set(), {}, "declares recorder settings that cannot be served: it lacks"),
        (
            "recorder",
            {},
            DECLARED,
            {"offload:layerwise", "family:fam"},
            {"recorder": ("offload:layerwise",)},
            "cannot be combined with offload:layerwise (declared by omni-plugin-p)",
        ),
        ("incomplete", {}, DECLARED, set(), {}, "is broken: abstract methods not implemented"),
    ],
    ids=["unknown", "options-alone", "bad-option", "undeclared-family", "bad-declaration", "declared-clash", "broken"],
)
def test_refusals_name_the_problem(
    requested: str | None,
    options: dict[str, Any],
    declarations: dict[str, Any],
    features: set[str],
    incompatible: dict[str, tuple[str, ...]],
    words: str,
) -> None:
    with pytest.raises(CacheConfigError) as info:
        choose_cache_backend(plugins(**incompatible), requested, options, "fam", declarations, features)
    assert words in str(info.value)
