"""Registrars validate what a plugin registers; registries resolve names lazily."""

from __future__ import annotations

import sys

import pytest

from omni_core.conflicts import Offer
from omni_core.errors import ConflictError, LazyImportError, RegistrationError, UnknownExtensionError
from omni_core.kinds import Kind
from omni_core.lazy import IMPORT_TIMINGS, LazyRef
from omni_core.manifest import parse_manifest
from omni_core.plugins import build_registries, compare_with_manifest
from omni_core.registry import ModelRegistrar, PlatformRegistrar, Provider, Registry

PROVIDER = Provider("demo", "omni-plugin-demo", "1.0")


def test_registrar_validates_each_call_and_names_the_plugin():
    registrar = ModelRegistrar(PROVIDER)
    spec = registrar.register("flux", "pkg.flux:Flux", architectures=["FluxPipeline"], tasks=("text-to-image",))
    assert spec.architectures == ("FluxPipeline",)
    with pytest.raises(RegistrationError, match="plugin 'demo' registered an invalid model 'bad name'"):
        registrar.register("bad name", "pkg.x:X")
    with pytest.raises(RegistrationError, match="ref"):
        registrar.register("x", "pkg.x.X")
    with pytest.raises(RegistrationError, match="twice"):
        registrar.register("FLUX", "pkg.flux:Flux")
    with pytest.raises(RegistrationError, match="probe"):
        PlatformRegistrar(PROVIDER).register("gpu", "pkg.p:P", probe="not a ref")


def test_manifest_comparison_reports_every_difference():
    registrar = ModelRegistrar(PROVIDER)
    registrar.register("flux", "pkg.flux:Flux", architectures=("FluxPipeline",))
    registrar.register("extra", "pkg.extra:Extra")
    manifest = parse_manifest(
        {
            "omni_api": ">=1",
            "model": [
                {"name": "flux", "ref": "pkg.flux:Flux", "architectures": ["FluxPipeline", "Flux2Pipeline"]},
                {"name": "missing", "ref": "pkg.m:M"},
            ],
        }
    )
    problems = compare_with_manifest(manifest, {Kind.MODEL: registrar})
    assert any("'missing' is declared but not registered" in p for p in problems)
    assert any("'extra' is registered but not declared" in p for p in problems)
    assert any("architectures: declared ('FluxPipeline', 'Flux2Pipeline')" in p for p in problems)
    matching = parse_manifest(
        {"omni_api": ">=1", "model": [{"name": "flux", "ref": "pkg.flux:Flux", "architectures": ["FluxPipeline"]}]}
    )
    only = ModelRegistrar(PROVIDER)
    only.register("flux", "pkg.flux:Flux", architectures=("FluxPipeline",))
    assert compare_with_manifest(matching, {Kind.MODEL: only}) == []


def _registry(*offers: Offer) -> Registry:
    return build_registries(offers)[0][Kind.MODEL]


def _offer(name: str, ref: str, dist: str = "omni-plugin-demo", priority: int = 0) -> Offer:
    registrar = ModelRegistrar(Provider(dist, dist, "1"))
    registrar.register(name, ref, priority=priority)
    return registrar.offers()[0]


def test_registry_lookups_are_lazy_case_insensitive_and_explain_misses():
    registry = _registry(_offer("Json", "json:dumps"), _offer("a", "x.a:A", "d1"), _offer("a", "x.a:A", "d2"))
    entry = registry.get("JSON")
    assert not entry.lazy.resolved
    import json

    assert registry.load("json") is json.dumps and entry.lazy.resolved
    assert IMPORT_TIMINGS["json:dumps"] >= 0
    with pytest.raises(ConflictError, match=r"d1 1 .* and d2 1"):
        registry.get("a")
    with pytest.raises(UnknownExtensionError, match="available: Json"):
        registry.get("nope")


def test_lazy_ref_import_errors_name_the_reference_and_the_fix():
    sys.modules.pop("omni_no_such_module", None)
    with pytest.raises(LazyImportError, match=r"cannot import 'omni_no_such_module'.*omni plugins disable"):
        LazyRef("omni_no_such_module:thing", owner="demo").resolve()
    with pytest.raises(LazyImportError, match="has no attribute 'nothing_here'"):
        LazyRef("json:nothing_here").resolve()


def test_models_resolve_by_alias_and_ambiguous_aliases_are_errors():
    registrar = ModelRegistrar(Provider("p", "omni-plugin-p", "1"))
    registrar.register("flux", "json:dumps", aliases=("flux-old", "FluxLegacy"))
    other = ModelRegistrar(Provider("q", "omni-plugin-q", "1"))
    other.register("sd3", "json:loads", aliases=("fluxlegacy",))
    registry = _registry(*registrar.offers(), *other.offers())
    assert registry.get("FLUX-OLD").name == "flux" and "flux-old" in registry
    with pytest.raises(ConflictError, match=r"alias 'FluxLegacy' is claimed by flux .* and sd3"):
        registry.get("FluxLegacy")
