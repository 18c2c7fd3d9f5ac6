"""The plugin contract declared once (plugin API 1.1).

A static plugin declares its registrations in ``omni_plugin.toml`` only; its hook module is
``from omni_core.declared import *`` and its classes state no identity (the core sets ``name``,
``stage_keys``, ``device_types`` ... from the registration). Plugins written for API 1.0 keep
working; a plugin needing a newer API is ``incompatible`` with the fix. One provider string,
one alias matcher, one API-range check and one registry builder serve everyone.

The end-to-end tests pip-install real fixture plugins into a venv without torch and drive the
real ``omni`` executable; the rest run in-process against the real registrars and loaders.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import textwrap
import tomllib
from pathlib import Path
from typing import Any, ClassVar

import pytest
from omni_testenv import check

from omni_core._version import PLUGIN_API_VERSION
from omni_core.config import Settings
from omni_core.conflicts import Provider
from omni_core.discovery import PluginRecord, Status, api_compatible, check_api_range
from omni_core.errors import DeclarationMismatchError, RegistrationError
from omni_core.kinds import Kind
from omni_core.manifest import answers_to, names_of, parse_manifest
from omni_core.plugins import build_registries, plugin_set_of
from omni_core.registry import AttentionBackendRegistrar, ModelRegistrar, TTSAdapterRegistrar
from omni_core.speech.adapter import TTSAdapter

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "plugins"
DECLARED = "omni-fixture-declared"
#: what omni_core.identity sets on a class, per kind (kept in step with omni_core.identity.IDENTITY)
IDENTITY_ATTRS = {"name", "stage_keys", "model_archs", "detect_priority", "device_types"}


def _variant(tmp_path: Path, label: str, edit: dict[str, tuple[str, str]]) -> Path:
    """A copy of the declared fixture under another distribution name, with files edited."""
    dest = tmp_path / label / DECLARED
    shutil.copytree(FIXTURES / DECLARED, dest, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    for rel, (old, new) in edit.items():
        path = dest / rel
        text = path.read_text()
        assert old in text, (rel, old)
        path.write_text(text.replace(old, new))
    return dest


def _python(venv: Any, code: str, **env: str) -> Any:
    return check(venv.run([venv.python, "-c", textwrap.dedent(code)], env=venv.env(**env)))


# --- end to end: a 1.1 plugin declared once, beside 1.0 plugins -----------------------------


@pytest.fixture(scope="module")
def declared_venv(base_venv: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The declared fixture next to two API 1.0 fixtures (hand-written hooks, class attributes)."""
    from omni_testenv import clean_build_dirs

    site = tmp_path_factory.mktemp("declared-site")
    paths = [FIXTURES / DECLARED, FIXTURES / "omni-fixture-good", FIXTURES / "omni-fixture-tts-c"]
    clean_build_dirs(paths)
    base_venv.pip("install", "--quiet", "--no-deps", "--no-build-isolation", "--target", site, *paths)
    return base_venv.with_site(site, tmp_path_factory.mktemp("declared-home"))


def test_a_declared_plugin_registers_exactly_its_manifest_and_api_1_0_plugins_still_load(declared_venv):
    data = check(declared_venv.omni("plugins", "list", "--load", "--json")).json()
    plugins = {p["name"]: p for p in data["plugins"]}
    assert {n: p["status"] for n, p in plugins.items()} == {
        "cpu": "ok",
        "fixture-declared": "ok",
        "fixture-good": "ok",  # API 1.0: hand-written hooks, omni_api ">=1.0,<2"
        "fixture-tts-c": "ok",  # API 1.0: the class states its identity, in agreement
    }
    assert plugins["fixture-declared"]["omni_api"] == ">=1.1,<2"
    assert plugins["fixture-good"]["omni_api"] == ">=1.0,<2"
    assert all(p["warnings"] == [] and p["notes"] == [] and p["traceback"] == "" for p in plugins.values())
    # a declared command works like any other, and --help shows its declared help without importing it
    assert "Say who registered this command." in check(declared_venv.omni("--help")).stdout
    ran = check(declared_venv.omni("fixture-declared")).stdout
    assert ran.strip() == "declared once, registered by omni_core.declared"


def test_the_classes_get_their_identity_from_the_manifest(declared_venv):
    out = _python(
        declared_venv,
        """
        import json
        from omni_core.plugins import load_plugins
        from omni_fixture_declared.adapter import DeclaredAdapter  # imported directly, before any registry
        from omni_fixture_declared.attention import DeclaredBackend

        direct = [DeclaredAdapter.name, sorted(DeclaredAdapter.stage_keys), sorted(DeclaredAdapter.model_archs),
                  DeclaredAdapter.detect_priority, DeclaredBackend.name, list(DeclaredBackend.device_types)]
        plugins = load_plugins()
        adapter = plugins.tts_adapters.get("FIXTURE-DECLARED-TTS")
        backend = plugins.attention_backends.get("declared_attn")
        print(json.dumps({
            "direct": direct,
            "same": [adapter.load() is DeclaredAdapter, backend.load() is DeclaredBackend],
            "spec": [adapter.spec.detect_priority, list(adapter.spec.model_archs), list(backend.spec.device_types)],
            "matches": [DeclaredAdapter.matches(None, "DeclaredTTSModel"), DeclaredAdapter.matches("declared", None),
                        DeclaredAdapter.matches(None, "OtherModel")],
        }))
        """,
    ).json()
    assert out["direct"] == [
        "fixture-declared-tts",
        ["declared"],
        ["DeclaredTTSModel"],
        40,
        "DECLARED_ATTN",
        ["fixture"],
    ]
    assert out["same"] == [True, True]
    assert out["spec"] == [40, ["DeclaredTTSModel"], ["fixture"]]
    # detection (TTSAdapter.matches) runs on the derived attributes
    assert out["matches"] == [True, True, False]


def test_a_declared_plugin_whose_range_admits_api_1_0_is_warned(install_plugins, tmp_path):
    old_range = _variant(tmp_path, "old-range", {"omni_fixture_declared/omni_plugin.toml": (">=1.1,<2", ">=1.0,<2")})
    venv = install_plugins(old_range)
    data = check(venv.omni("plugins", "list", "--load", "--json")).json()
    plugin = next(p for p in data["plugins"] if p["name"] == "fixture-declared")
    assert plugin["status"] == "ok"
    assert plugin["warnings"] == [
        "its hooks come from omni_core.declared (plugin API 1.1), but omni_api '>=1.0,<2' admits API 1.0, "
        'whose cores cannot import them; declare omni_api = ">=1.1,<2"'
    ]
    # the conformance kit turns the warning into a registration problem
    kit = _python(
        venv,
        """
        import json
        from omni_core.testing import check_registration
        print(json.dumps(check_registration("fixture-declared")))
        """,
    ).json()
    assert kit == [f"plugin 'fixture-declared': {plugin['warnings'][0]}"]


def test_a_plugin_needing_a_newer_api_is_incompatible_with_the_fix(install_plugins, tmp_path):
    newer = _variant(tmp_path, "newer", {"omni_fixture_declared/omni_plugin.toml": (">=1.1,<2", ">=1.9,<2")})
    venv = install_plugins(newer)
    data = check(venv.omni("plugins", "list", "--json")).json()
    plugin = next(p for p in data["plugins"] if p["name"] == "fixture-declared")
    assert (plugin["status"], plugin["reason"], plugin["fix"]) == (
        "incompatible",
        f"supports omni plugin API >=1.9,<2, this core provides {PLUGIN_API_VERSION}",
        "upgrade the plugin (pip install -U omni-fixture-declared) or install a matching omni-core",
    )
    # never imported: its declared command is not offered, and doctor names the plugin with the fix
    doctor = check(venv.omni("doctor"), 1).stdout
    assert "plugin 'fixture-declared' from omni-fixture-declared 1.1.0: incompatible" in doctor
    assert "install a matching omni-core" in doctor


def test_a_class_that_restates_its_identity_differently_fails_to_load(install_plugins, tmp_path):
    lying = _variant(
        tmp_path,
        "lying",
        {
            "omni_fixture_declared/adapter.py": (
                "class DeclaredAdapter(TTSAdapter):\n",
                "class DeclaredAdapter(TTSAdapter):\n    detect_priority = 7\n",
            )
        },
    )
    venv = install_plugins(lying)
    out = _python(
        venv,
        """
        import json
        from omni_core.errors import DeclarationMismatchError, LazyImportError
        from omni_core.plugins import load_plugins
        from omni_core.testing import check_capabilities

        entry = load_plugins().tts_adapters.get("fixture-declared-tts")
        try:
            entry.load()
            caught = None
        except DeclarationMismatchError as exc:
            caught = [str(exc), isinstance(exc, LazyImportError)]
        print(json.dumps({"caught": caught, "kit": check_capabilities("fixture-declared")}))
        """,
    ).json()
    message = (
        "tts adapter 'fixture-declared-tts' (plugin 'fixture-declared'): DeclaredAdapter.detect_priority is 7, "
        "but 'fixture-declared-tts' is declared with 40. The registration (omni_plugin.toml) is the one source "
        "of these attributes: remove them from the class, or make the two agree"
    )
    assert out["caught"] == [message, True]  # a failed load, so every caller that handles one handles it
    assert out["kit"] == [f"tts adapter 'fixture-declared-tts': DeclarationMismatchError: {message}"]


# --- the in-repo plugins state each fact once ----------------------------------------------


def _in_repo_packages() -> list[Path]:
    return sorted(p.parent for p in REPO.glob("omni_plugins/*/omni_plugin_*/omni_plugin.toml"))


def _answers_detection_hooks(package: Path, declared: Any) -> bool:
    """A TTS adapter whose class defines identify, installed_models or ready_model (plugin API
    1.4), read from its source: the core's own tests run where the plugins are not installed."""
    if declared.kind is not Kind.TTS_ADAPTER:
        return False
    module, _, name = declared.ref.partition(":")
    source = package.joinpath(*module.split(".")[1:]).with_suffix(".py")
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return any(isinstance(f, ast.FunctionDef) and f.name in DETECTION_HOOKS for f in node.body)
    return False


DETECTION_HOOKS = ("identify", "installed_models", "ready_model")


@pytest.mark.parametrize("package", _in_repo_packages(), ids=lambda p: p.name)
def test_in_repo_plugins_declare_once(package: Path):
    manifest = parse_manifest(tomllib.loads((package / "omni_plugin.toml").read_text()), str(package))
    hooks = (package / "hooks.py").read_text()
    if not manifest.provides:  # the diffusion runtime registers nothing
        assert "hookimpl" not in hooks
        return
    # a connector or an executor follows the plugin API 1.2 contracts, a stage engine and a chat
    # model (whose stages name their architecture) the 1.3 ones, a cache backend and a TTS
    # adapter that answers the detection hooks the 1.4 ones (omni_core/_version.py)
    kinds = {d.kind.value for d in manifest.provides}
    chat = any("chat" in d.fields.get("tasks", ()) for d in manifest.provides)
    needs = "1.3" if "stage_engine" in kinds or chat else "1.2" if kinds & {"connector", "executor"} else "1.1"
    if "cache_backend" in kinds or any(_answers_detection_hooks(package, d) for d in manifest.provides):
        needs = "1.4"
    assert manifest.omni_api == f">={needs},<2"
    body = ast.parse(hooks).body
    code = [ast.unparse(n) for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    assert code == ["from omni_core.declared import *"], f"{package.name}/hooks.py is not the one-line hook module"
    for declared in manifest.provides:
        module, _, qualname = declared.ref.partition(":")
        source = REPO / "omni_plugins" / package.parent.name / (module.replace(".", "/") + ".py")
        if not source.exists():
            source = source.with_suffix("") / "__init__.py"
        tree = ast.parse(source.read_text())
        cls = next(
            (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == qualname.split(".")[-1]), None
        )
        if cls is None:
            continue  # a function (a command, a probe): nothing to restate
        stated = {
            t.id
            for node in cls.body
            for t in (node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)])
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(t, ast.Name)
        }
        assert not stated & IDENTITY_ATTRS, f"{declared.ref} restates {sorted(stated & IDENTITY_ATTRS)}"


# --- in process: registrars, identity, one builder, one matcher, one range check -----------


def test_register_declared_registers_exactly_the_manifest_entries():
    manifest = parse_manifest(
        {
            "omni_api": ">=1.1,<2",
            "model": [{"name": "fam", "ref": "pkg.f:F", "architectures": ["P"], "tasks": ["text-to-image"]}],
            "attention_backend": [{"name": "A_ATTN", "ref": "pkg.a:A", "device_types": ["cuda"], "priority": 3}],
        }
    )
    provider = Provider("demo", "omni-plugin-demo", "1.0")
    models = ModelRegistrar(provider, manifest.provides)
    backends = AttentionBackendRegistrar(provider, manifest.provides)
    assert [s.model_dump() for s in models.register_declared()] == [
        {
            "name": "fam",
            "ref": "pkg.f:F",
            "priority": 0,
            "architectures": ("P",),
            "model_types": (),
            "aliases": (),
            "tasks": ("text-to-image",),
            "config_match": {},
        }
    ]
    (backend,) = backends.register_declared()
    assert (backend.device_types, backend.priority) == (("cuda",), 3)
    assert TTSAdapterRegistrar(provider, manifest.provides).register_declared() == []
    with pytest.raises(RegistrationError, match="was given no manifest entries"):
        ModelRegistrar(provider).register_declared()
    bad = parse_manifest({"omni_api": ">=1.1", "model": [{"name": "m", "ref": "p.m:M", "tasks": "not-a-list"}]})
    with pytest.raises(RegistrationError, match="registered an invalid model 'm'"):
        ModelRegistrar(provider, bad.provides).register_declared()


class _Stated(TTSAdapter):
    """A 1.0-style class outside any plugin package: states its identity itself."""

    name: ClassVar[str] = "stated"
    model_archs: ClassVar[frozenset[str]] = frozenset({"StatedModel"})

    def capabilities(self) -> Any: ...
    def load(self) -> None: ...
    def build(self, request: Any, sampling: Any) -> Any: ...
    def generate(self, prepared: Any, seed: Any) -> Any: ...


class _Bare(_Stated):
    """Inherits the author's identity from its base; registered under another name."""


def _tts_set(*registrations: tuple[str, str, dict[str, Any]]) -> Any:
    registrar = TTSAdapterRegistrar(Provider("p", "omni-plugin-p", "1.0"))
    for name, ref, fields in registrations:
        registrar.register(name, ref, **fields)
    return plugin_set_of(registrar.offers())


def test_identity_agreeing_loads_and_disagreeing_is_refused_by_name():
    ref = f"{__name__}:_Stated"
    agreeing = _tts_set(("stated", ref, {"model_archs": ("StatedModel",)})).tts_adapters.get("stated")
    assert agreeing.load() is _Stated and _Stated.detect_priority == 100  # unstated: the core's default
    for fields, wrong in (
        ({"model_archs": ("OtherModel",)}, "_Stated.model_archs is frozenset({'StatedModel'}), but 'stated' is"),
        ({"model_archs": ("StatedModel",), "detect_priority": 5}, None),  # unstated by the author: set, not refused
    ):
        entry = _tts_set(("stated", ref, fields)).tts_adapters.get("stated")
        if wrong is None:
            assert entry.load() is _Stated and _Stated.detect_priority == 5
            continue
        with pytest.raises(DeclarationMismatchError, match=re.escape(wrong)):
            entry.load()
    # a subclass inheriting the author's name from its base cannot be served under another name
    bare = _tts_set(("bare", f"{__name__}:_Bare", {"model_archs": ("StatedModel",)})).tts_adapters.get("bare")
    with pytest.raises(DeclarationMismatchError, match=re.escape("_Bare.name is 'stated', but 'bare' is declared")):
        bare.load()


def test_build_registries_applies_filters_pins_and_conflicts():
    offers = []
    for plugin, priority in (("a", 0), ("b", 0), ("c", 5)):
        registrar = ModelRegistrar(Provider(plugin, f"omni-plugin-{plugin}", "1.0"))
        registrar.register("shared", f"pkg.{plugin}:M", priority=0)
        registrar.register(f"top-{plugin}", f"pkg.{plugin}:T", priority=priority)
        offers += registrar.offers()
    registries, resolution = build_registries(offers)
    models = registries[Kind.MODEL]
    assert "shared" not in models and [c.name for c in resolution.conflicts] == ["shared"]
    assert models.names() == ["top-a", "top-b", "top-c"]
    pinned = Settings(pins={(Kind.MODEL, "shared"): "omni-plugin-b"}, deny_by_kind={Kind.MODEL: frozenset({"top-a"})})
    plugin_set = plugin_set_of(offers, pinned)
    assert plugin_set.models.get("SHARED").provider == Provider("b", "omni-plugin-b", "1.0")
    assert plugin_set.models.get("shared").rule == "pinned to omni-plugin-b in the user config"
    assert plugin_set.models.filtered == {"top-a": "removed by OMNI_DISABLE_MODELS"}
    assert plugin_set.conflicts == [] and plugin_set.records == []


def test_one_provider_string_and_one_name_matcher():
    provider = Provider("flux", "omni-plugin-flux", "0.1.0")
    record = PluginRecord("flux", "omni_plugin_flux.hooks", "omni-plugin-flux", "0.1.0")
    registrar = ModelRegistrar(provider)
    registrar.register("flux1-dev", "pkg.f:F", architectures=("FluxPipeline",), aliases=("flux-dev",))
    (offer,) = registrar.offers()
    assert str(provider) == record.provider == offer.provider == "omni-plugin-flux 0.1.0 (plugin 'flux')"
    assert record.who == offer.who == provider

    spec = registrar.specs[0]
    declared = parse_manifest(
        {
            "omni_api": ">=1.1",
            "model": [
                {"name": "flux1-dev", "ref": "pkg.f:F", "architectures": ["FluxPipeline"], "aliases": ["flux-dev"]}
            ],
        }
    ).provides[0]
    for item in (spec, declared):  # a registered spec and a manifest entry answer alike
        assert names_of(item) == ("flux1-dev", "flux-dev")
        assert names_of(item, architectures=True) == ("flux1-dev", "flux-dev", "FluxPipeline")
        assert answers_to(item, "FLUX-DEV") and not answers_to(item, "fluxpipeline")
        assert answers_to(item, "fluxpipeline", architectures=True)
    registry = plugin_set_of(registrar.offers()).models
    assert registry.get("Flux-Dev").name == "flux1-dev" and "FluxPipeline" not in registry


def test_one_api_range_check():
    assert PLUGIN_API_VERSION == "1.4"
    assert api_compatible(">=1.0,<2") and api_compatible(">=1.1,<2")
    # what an API 1.0 core says of a 1.1 plugin: not admitted
    assert not api_compatible(">=1.1,<2", "1.0") and api_compatible(">=1.0,<2", "1.0")
    ok = check_api_range(">=1.1,<2")
    assert (ok.ok, ok.status, ok.reason, ok.fix) == (True, None, "", "")
    newer = check_api_range(">=2.0,<3", "omni-plugin-x")
    assert (newer.ok, newer.status) == (False, Status.INCOMPATIBLE)
    assert newer.reason == "supports omni plugin API >=2.0,<3, this core provides 1.4"
    assert newer.fix == "upgrade the plugin (pip install -U omni-plugin-x) or install a matching omni-core"
    garbage = check_api_range("soon")
    assert (garbage.ok, garbage.status, garbage.reason) == (
        False,
        Status.INVALID_MANIFEST,
        "omni_api 'soon' is not a version range",
    )


def test_statuses_are_enums_and_warnings_notes_traceback_are_separate_fields():
    record = PluginRecord("x", "x.hooks", "omni-plugin-x", "1.0")
    record.fail(Status.HOOK_FAILED, "boom", "fix it")
    record.traceback = "Traceback (most recent call last): ..."
    record.notes.append("also disabled")
    data = record.to_dict()
    assert (data["status"], data["warnings"], data["notes"], data["traceback"]) == (
        "hook-failed",
        [],
        ["also disabled"],
        "Traceback (most recent call last): ...",
    )
    assert json.loads(json.dumps(data)) == data
    assert Status(data["status"]) is Status.HOOK_FAILED and Status.HOOK_FAILED.is_problem
    assert not Status.DISABLED.is_problem and not Status.OK.is_problem
