"""`omni new-plugin`: every kind renders a package that installs, loads and passes its own tests.

The fast tests render in-process and check the package's shape, its manifest against its hooks,
the CLI's refusals, and that the conformance kit's model and offloader checks catch what the
templates must keep. The slow ones render with the ``omni`` executable of a venv without torch
(so the templates must ship with the installed omni-plugin-template), ``pip install`` the
result, check that omni lists it as "ok", and run the rendered package's own test suite there.

The model kind renders an image family on omni's diffusion runtime, and the cache kind a cache
backend whose tests run on a tiny FLUX.1 pipeline built with that runtime's helpers: both are
installed with ``omni-plugin-diffusion`` (from this checkout), omni lists them without torch,
and their suites, end-to-end generation included, run with this interpreter's torch, diffusers
and transformers lent to the venv (:func:`generation_stack`), as a user's own install of them
would be.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from omni_plugin_template import KIND_CHOICES, placeholders, render
from omni_testenv import REPO

from omni_core.kinds import Kind
from omni_core.lazy import LazyRef
from omni_core.manifest import parse_manifest
from omni_core.plugins import compare_with_manifest
from omni_core.registry import REGISTRAR_TYPES, Provider, Registered
from omni_core.testing import CAPABILITY_CHECKS
from omni_core.testing.executors import STAGES, expected_words, kit_pipeline, kit_request

KINDS = tuple(KIND_CHOICES)
PLACEHOLDER = re.compile(r"\{\{\s*\w+\s*\}\}")
#: modules a rendered hooks.py may import at run time (anything else would load with omni)
HOOK_IMPORTS = {"__future__", "typing", "omni_core"}
#: the implementation module each kind renders, when it is not named after the kind
IMPLEMENTATION = {"model": "family", "cache": "backend"}
#: the test modules each kind renders beside test_conformance.py, when not test_<kind>.py
KIND_TESTS = {"model": ("test_family.py", "test_generate.py")}
#: the distribution a rendered model family depends on, installed beside it from this checkout
DIFFUSION_PLUGIN = REPO / "omni_plugins" / "diffusion"
#: the kinds whose rendered suites run on omni's diffusion runtime (installed beside them)
ON_DIFFUSION = ("model", "cache")


def plugin_name(kind: str) -> str:
    """Names with digits and several dashes exercise every placeholder's derivation."""
    return f"acme-{kind}-2"


def expected_extension(kind: str) -> tuple[str, str]:
    """(kind value, registered name) that the rendered plugin provides."""
    values = placeholders(kind, plugin_name(kind))
    name = f"{values['upper_name']}_ATTN" if kind == "attention" else values["name"]
    return KIND_CHOICES[kind].value, name


def cli(home: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """The real ``omni`` entry point of this interpreter, with a private config home and no
    OMNI_* settings leaking in from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    env.update(OMNI_CONFIG_DIR=str(home / "config"), OMNI_CACHE_DIR=str(home / "cache"))
    return subprocess.run(
        [sys.executable, "-c", "from omni_cli.main import main; main()", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


# ------------------------------------------------------------------------------------------
# fast: the CLI's refusals


def test_unknown_kind_is_refused_with_the_choices(tmp_path: Path) -> None:
    result = cli(tmp_path, "new-plugin", "--kind", "widget", "acme", "-o", tmp_path / "out")
    assert result.returncode != 0
    assert "unknown kind 'widget'" in result.stderr
    assert "choose one of: model, tts, attention, platform, connector, offloader, executor, cache" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["Acme", "acme_plugin", "1acme", "acme--x", "-acme", "acme-", "acme x", ""])
def test_invalid_name_is_refused_with_the_rule(tmp_path: Path, name: str) -> None:
    # "--" so that "-acme" reaches the command as a name, not as an option
    result = cli(tmp_path, "new-plugin", "--kind", "model", "-o", tmp_path / "out", "--", name)
    assert result.returncode != 0
    assert f"invalid plugin name {name!r}" in result.stderr
    assert "lowercase letters, digits and single dashes" in result.stderr
    assert not (tmp_path / "out").exists()


def test_existing_directory_is_kept_unless_forced(tmp_path: Path) -> None:
    out, target = tmp_path / "out", tmp_path / "out" / "omni-plugin-acme"
    first = cli(tmp_path, "new-plugin", "--kind", "connector", "acme", "-o", out)
    assert first.returncode == 0, first.stderr
    assert f"created {target}" in first.stdout
    (target / "my-work.txt").write_text("keep me")

    again = cli(tmp_path, "new-plugin", "--kind", "connector", "acme", "-o", out)
    assert again.returncode != 0
    assert "already exists" in again.stderr and "--force" in again.stderr
    assert (target / "my-work.txt").read_text() == "keep me"

    forced = cli(tmp_path, "new-plugin", "--kind", "model", "acme", "-o", out, "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (target / "my-work.txt").exists()
    assert not (target / "omni_plugin_acme" / "connector.py").exists()  # replaced, not merged
    assert (target / "omni_plugin_acme" / "family.py").is_file()


# ------------------------------------------------------------------------------------------
# fast: what every kind renders


@pytest.fixture(scope="module")
def rendered_here(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every kind rendered in-process from the templates in this checkout."""
    out = tmp_path_factory.mktemp("rendered-here")
    return {kind: render(kind, plugin_name(kind), out) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_renders_a_complete_package(rendered_here: dict[str, Path], kind: str) -> None:
    root = rendered_here[kind]
    values = placeholders(kind, plugin_name(kind))
    pkg, impl = values["package"], IMPLEMENTATION.get(kind, kind)
    files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert files == {
        "pyproject.toml",
        "README.md",
        f"{pkg}/__init__.py",
        f"{pkg}/omni_plugin.toml",
        f"{pkg}/hooks.py",
        f"{pkg}/{impl}.py",
        "tests/conftest.py",
        "tests/test_conformance.py",
        *(f"tests/{name}" for name in KIND_TESTS.get(kind, (f"test_{kind}.py",))),
    }
    for rel in files:
        text = (root / rel).read_text(encoding="utf-8")
        assert not PLACEHOLDER.search(text), f"unrendered placeholder in {rel}"
        if rel.endswith(".py"):
            ast.parse(text, filename=rel)
    assert 'pytest_plugins = ["omni_core.testing"]' in (root / "tests/conftest.py").read_text()
    conformance = (root / "tests/test_conformance.py").read_text()
    assert "(PluginConformance):" in conformance
    assert f'plugin_name = "{plugin_name(kind)}"' in conformance
    readme = (root / "README.md").read_text()
    assert "## What to edit next" in readme and values["distribution"] in readme


@pytest.mark.parametrize("kind", KINDS)
def test_pyproject_declares_the_plugin_without_torch(rendered_here: dict[str, Path], kind: str) -> None:
    values = placeholders(kind, plugin_name(kind))
    data = tomllib.loads((rendered_here[kind] / "pyproject.toml").read_text())
    project = data["project"]
    assert data["build-system"]["build-backend"] == "setuptools.build_meta"
    assert (project["name"], project["version"]) == (values["distribution"], "0.1.0")
    # a TTS adapter needs the speech runtime's audio stack, a model family the diffusion
    # runtime (which brings diffusers and transformers); no kind depends on torch
    expected = {"tts": "omni-core[speech]>=0.1,<0.2", "model": "omni-plugin-diffusion>=0.1,<0.2"}
    assert project["dependencies"] == [expected.get(kind, "omni-core>=0.1,<0.2")]
    # a cache backend's tests build a tiny pipeline with the diffusion runtime's helpers
    test_extra = ["pytest>=8", *(["omni-plugin-diffusion>=0.1,<0.2"] if kind == "cache" else [])]
    assert project["optional-dependencies"] == {"test": test_extra}
    assert project["entry-points"]["omni.plugins"] == {values["name"]: f"{values['package']}.hooks"}
    assert data["tool"]["setuptools"]["package-data"] == {values["package"]: ["omni_plugin.toml"]}


@pytest.mark.parametrize("kind", KINDS)
def test_hooks_register_exactly_what_the_manifest_declares(rendered_here: dict[str, Path], kind: str) -> None:
    """Checked in-process here for quick feedback; the slow tests check it through a real install."""
    root = rendered_here[kind]
    values = placeholders(kind, plugin_name(kind))
    pkg = root / values["package"]
    manifest = parse_manifest(tomllib.loads((pkg / "omni_plugin.toml").read_text()), str(pkg))
    assert [(d.kind.value, d.name) for d in manifest.provides] == [expected_extension(kind)]

    imported = runtime_imports((pkg / "hooks.py").read_text())
    assert set(imported) <= HOOK_IMPORTS, f"hooks.py imports {imported} when omni loads it"
    spec = importlib.util.spec_from_file_location(f"_rendered_{values['package']}_hooks", pkg / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    provider = Provider(values["name"], values["distribution"], "0.1.0")
    # the registrars get the manifest's entries, as omni hands them to omni_core.declared's hooks
    registrars = {k: REGISTRAR_TYPES[k](provider, manifest.provides) for k in Kind}
    for k, registrar in registrars.items():
        hook = getattr(hooks, k.hook_name, None)
        if hook is not None:
            hook(registry=registrar)
    assert compare_with_manifest(manifest, registrars) == []
    # it uses omni_core.declared, new in plugin API 1.1; a connector is a Connector subclass, and
    # the executor kind is new, in 1.2; the cache backend kind is new in 1.4
    api = {"connector": ">=1.2,<2", "executor": ">=1.2,<2", "cache": ">=1.4,<2"}
    assert manifest.omni_api == api.get(kind, ">=1.1,<2")
    for declared in manifest.provides:  # references point into the package and stay lazy
        assert declared.ref.startswith(f"{values['package']}.")
        assert declared.ref.partition(":")[0] not in sys.modules


def _registered(kind: Kind, name: str, ref: str, **fields: Any) -> Registered[Any]:
    provider = Provider("acme", "omni-plugin-acme", "0.1.0")
    spec = REGISTRAR_TYPES[kind](provider).register(name, ref, **fields)
    return Registered(spec, provider, LazyRef(ref, owner="acme"))


def _load_rendered(root: Path, module: str) -> Any:
    """A torch-free module of a rendered package, imported from its file."""
    pkg = root.name.removeprefix("omni-plugin-").replace("-", "_")
    spec = importlib.util.spec_from_file_location(
        f"_rendered_{pkg}_{module}", root / f"omni_plugin_{pkg}" / f"{module}.py"
    )
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def test_kit_checks_an_offloader_against_the_contract(rendered_here: dict[str, Path]) -> None:
    """The kit's offloader check passes the rendered strategy and names what a broken one lacks."""
    from omni_core.offload import Offloader

    check = CAPABILITY_CHECKS[Kind.OFFLOADER]
    name = plugin_name("offloader")
    strategy = _load_rendered(rendered_here["offloader"], "offloader").AcmeOffloader2Offloader
    assert check(_registered(Kind.OFFLOADER, name, "acme.offloader:S"), strategy) == []

    class Renamed(strategy):  # type: ignore[misc, valid-type]
        name = "other"

    class Unfinished(Offloader):
        name = "acme-offloader-2"

        def enable(self) -> None: ...

    entry = _registered(Kind.OFFLOADER, name, "acme.offloader:S")
    assert check(entry, Renamed) == [
        f"offloader {name!r}: Renamed.name is 'other', but {name!r} is declared with {name!r}"
    ]
    [unfinished] = check(entry, Unfinished)
    assert "abstract methods not implemented: ['disable', 'is_enabled', 'resident']" in unfinished
    [plain] = check(entry, object)
    assert "is not a subclass of omni_core.offload.Offloader" in plain


def test_kit_checks_a_cache_backend_against_the_contract(
    rendered_here: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kit's cache backend check passes the rendered backend (importable without torch) and
    names what a broken one lacks."""
    from omni_core.cache import CacheBackend

    check = CAPABILITY_CHECKS[Kind.CACHE_BACKEND]
    name = plugin_name("cache")
    values = placeholders("cache", name)
    # imported by its package name (its dataclasses need their module in sys.modules), so the
    # manifest beside it names the class, as when omni loads it
    monkeypatch.syspath_prepend(str(rendered_here["cache"]))
    for module in [m for m in sys.modules if m.split(".")[0] == values["package"]]:
        monkeypatch.delitem(sys.modules, module)
    module = importlib.import_module(f"{values['package']}.backend")
    backend = getattr(module, f"{values['class_prefix']}CacheBackend")
    assert backend.name == name
    entry = _registered(Kind.CACHE_BACKEND, name, "acme.backend:B")
    assert check(entry, backend) == []
    # the options and declarations omni checks before loading, answered without a model
    assert backend.option_problems({"threshold": 0.2, "warmup_steps": 2}) == []
    assert backend.option_problems({"threshold": 0}) == ["threshold must be a number above 0, not 0"]
    assert backend.declaration_problems("flux1-schnell", {"blocks": ["transformer_blocks"]}) == [
        "it lacks 'block_outputs' (what a block returns, in order (hidden_states among them))"
    ]

    class Unfinished(CacheBackend):
        def enable(self) -> None: ...

    [unfinished] = check(entry, Unfinished)
    assert "abstract methods not implemented: ['disable', 'is_enabled', 'refresh', 'report']" in unfinished
    [plain] = check(entry, object)
    assert "is not a subclass of omni_core.cache.CacheBackend" in plain


#: a connector that breaks the contract where it is easy to: a module of its own, so the kit's
#: spawned process imports it too
_CARELESS_CONNECTOR = """
from pathlib import Path

from omni_core.errors import ConnectorError
from omni_core.pipeline.payload import loads
from {package}.connector import {cls}


class Careless({cls}):
    def get(self, edge, request_id, handle, *, timeout):
        if not isinstance(handle, dict) or "path" not in handle:
            return None  # a malformed handle gives None instead of an error
        return loads(Path(handle["path"]).read_bytes())  # read, but left for a second get

    def cleanup(self, request_id):
        raise ConnectorError(f"no payloads of {{request_id}}")

    def check_payload_size(self, nbytes, edge):
        pass  # no size limit
"""


def test_kit_checks_a_connector_by_moving_payloads(
    rendered_here: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The kit's connector check passes the rendered spool connector, whose payloads really
    travel (in this process and to and from a spawned one), and names what a broken one gets
    wrong: read-once, malformed handles, cleanup, the size limit, the class to subclass."""
    check = CAPABILITY_CHECKS[Kind.CONNECTOR]
    name = plugin_name("connector")
    values = placeholders("connector", name)
    package, cls = values["package"], f"{values['class_prefix']}Connector"
    # imported by their module names, so the check's spawned process imports them too
    (tmp_path / "careless_connector.py").write_text(_CARELESS_CONNECTOR.format(package=package, cls=cls))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(rendered_here["connector"]))
    for module in [m for m in sys.modules if m.split(".")[0] in (package, "careless_connector")]:
        monkeypatch.delitem(sys.modules, module)
    spool = getattr(importlib.import_module(f"{package}.connector"), cls)
    entry = _registered(Kind.CONNECTOR, name, f"{package}.connector:{cls}")
    assert check(entry, spool) == []

    careless = importlib.import_module("careless_connector").Careless
    problems = "\n".join(check(_registered(Kind.CONNECTOR, name, "careless_connector:Careless"), careless))
    here, across = "(two instances in one process): ", "(owner here, a stage in a spawned process): "
    for expected in (
        f"{here}a second get of the handle of the stored payload returned instead of raising ConnectorError",
        f"{here}get of the malformed handle {{}} returned instead of raising ConnectorError",
        f"{here}get of the malformed handle {{'nbytes': 'x'}} returned instead of raising ConnectorError",
        f"{here}cleanup of a request it never saw raised ConnectorError",
        f"{here}put of a payload over max_payload_bytes (16) returned instead of raising PayloadError",
        f"{across}in the spawned process: a second get of the handle of the stored payload put by the owner",
        f"{across}a second get of the handle of the stored payload put by the spawned process",
    ):
        assert expected in problems, problems

    [plain] = check(entry, object)
    assert "is not a subclass of omni_core.pipeline.connector.Connector: subclass it" in plain


#: executors that break the contract where it is easy to, beside two that keep it (the core's
#: own, subclassed to get a name of their own): a module of its own, so the kit imports it by name
_CARELESS_EXECUTOR = """
import os

from omni_core.pipeline.executor import ExecutorOptions, InProcessExecutor, ProcessExecutor
from {package}.executor import {prefix}Executor, {prefix}Stage


class Spawned(ProcessExecutor):
    pass


class Threaded(InProcessExecutor):
    pass


class Placed(ProcessExecutor):
    pass


class Pathless({prefix}Executor):
    def environment(self, stage):
        env = super().environment(stage)
        env.pop("PYTHONPATH", None)  # the stages do not see this process's sys.path
        return env


class MisnamedStage({prefix}Stage):
    def start(self):
        super().start()
        self.pid = os.getpid()  # names the orchestrator's process, not the stage's


class LingeringStage({prefix}Stage):
    def stop(self, timeout):
        pass  # never ends the stage


class Misnamed({prefix}Executor):
    def launch(self, stage):
        handle = super().launch(stage)
        handle.__class__ = MisnamedStage
        return handle


class NeedsAddress(ExecutorOptions):
    address: str


class Unconfigurable({prefix}Executor):
    options_type = NeedsAddress  # a recipe without options cannot build it


class Lingering({prefix}Executor):
    def launch(self, stage):
        handle = super().launch(stage)
        handle.__class__ = LingeringStage
        return handle

    def close(self):
        pass  # leaves what the stages left
"""


@pytest.fixture
def executor_modules(rendered_here: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The rendered executor's module and the careless ones, importable by name here and in the
    processes the kit starts (which get this process's sys.path)."""
    values = placeholders("executor", plugin_name("executor"))
    package = values["package"]
    text = _CARELESS_EXECUTOR.format(package=package, prefix=values["class_prefix"])
    (tmp_path / "careless_executor.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(rendered_here["executor"]))
    for module in [m for m in sys.modules if m.split(".")[0] in (package, "careless_executor")]:
        monkeypatch.delitem(sys.modules, module)
    return importlib.import_module(f"{package}.executor"), importlib.import_module("careless_executor")


def test_kit_checks_an_executor_by_running_a_pipeline(executor_modules: Any, omni_isolated: Path) -> None:
    """The kit's executor check runs its two-stage pipeline on the executor (a request, a killed
    stage restarted, a close): the rendered subprocess executor and the core's own pass; what a
    broken one gets wrong is named: stages that do not see this process's sys.path, a handle
    naming the wrong process, a stop that leaves the stage running, options a recipe cannot leave
    out, the class to subclass, a name of the core's own."""
    rendered, careless = executor_modules
    check = CAPABILITY_CHECKS[Kind.EXECUTOR]
    name = plugin_name("executor")
    cls = getattr(rendered, f"{placeholders('executor', name)['class_prefix']}Executor")
    assert check(_registered(Kind.EXECUTOR, name, f"{cls.__module__}:{cls.__name__}"), cls) == []
    for good in ("Spawned", "Threaded"):
        entry = _registered(Kind.EXECUTOR, f"acme-{good.lower()}", f"careless_executor:{good}")
        assert check(entry, getattr(careless, good)) == [], good

    def problems(attr: str) -> str:
        entry = _registered(Kind.EXECUTOR, name, f"careless_executor:{attr}")
        return "\n".join(check(entry, getattr(careless, attr)))

    pathless = problems("Pathless")
    assert f"executor {name!r}: the kit's pipeline did not start on it: PipelineStartError: stage" in pathless
    assert "unknown connector 'omni-kit-inline'" in pathless
    assert "the stages must see this process's sys.path, e.g. as PYTHONPATH" in pathless
    misnamed = problems("Misnamed")
    for stage in STAGES:
        assert f"stage {stage!r}: its handle's pid is {os.getpid()}, but the stage runs in pid" in misnamed
    lingering = problems("Lingering")
    assert lingering.count("alive() is still True after the pipeline closed") == len(STAGES), lingering
    assert "stop(timeout) ends the stage" in lingering

    [unconfigurable] = problems("Unconfigurable").splitlines()
    assert "options_type (NeedsAddress) does not build from no options (address: Field required)" in unconfigurable

    [plain] = check(_registered(Kind.EXECUTOR, name, "careless_executor:os"), object)
    assert "must be a subclass of omni_core.pipeline.executor.StageExecutor" in plain
    [builtin] = check(_registered(Kind.EXECUTOR, "process", "careless_executor:Placed"), careless.Placed)
    assert "'process' is the core's own placement; register the executor under another name" in builtin


def test_the_rendered_executor_runs_a_pipeline_request(executor_modules: Any, omni_isolated: Path) -> None:
    """One request through the kit's pipeline on the rendered executor, its options applied: each
    stage in a process of its own, with the environment and priority the recipe gives it."""
    rendered, _ = executor_modules
    cls = getattr(rendered, f"{placeholders('executor', plugin_name('executor'))['class_prefix']}Executor")
    options = {"env": {"ACME_RUN": "shared"}}
    stage_options = {STAGES[1]: {"env": {"ACME_STAGE": "downstream"}, "nice": 3}}
    with kit_pipeline(cls, options=options, stage_options=stage_options) as pipeline:
        handles = dict(pipeline.stages)
        run = kit_request(pipeline, env=("ACME_RUN", "ACME_STAGE"))
    assert run.words == expected_words()
    source, target = (run.facts[stage] for stage in STAGES)
    pids = {source["pid"], target["pid"]}
    assert pids == {handles[s].pid for s in STAGES} and len(pids) == len(STAGES) and os.getpid() not in pids
    assert source["env"] == {"ACME_RUN": "shared", "ACME_STAGE": None}
    assert target["env"] == {"ACME_RUN": "shared", "ACME_STAGE": "downstream"}
    assert target["nice"] == min(source["nice"] + 3, 19)
    assert not any(handle.alive() for handle in handles.values())


def test_the_kits_own_transport_keeps_the_connector_contract() -> None:
    """The connector the executor check's stages use passes the connector check (across a
    spawned process too)."""
    from omni_core.testing.executors import KIT_CONNECTOR, KitConnector

    ref = "omni_core.testing.executors:KitConnector"
    assert CAPABILITY_CHECKS[Kind.CONNECTOR](_registered(Kind.CONNECTOR, KIT_CONNECTOR, ref), KitConnector) == []


def test_kit_checks_an_image_family_against_the_contract() -> None:
    """Torch-free, like the kit: a class with a GenerationProfile and open/plan/make_tiny passes;
    what an image or video family lacks is named; other models only need to be callable."""
    from omni_core.generation.request import GenerationProfile

    check = CAPABILITY_CHECKS[Kind.MODEL]
    profile = GenerationProfile(
        task="text-to-image", default_width=64, default_height=64, default_steps=2, default_guidance=1.0
    )

    class Family:
        @classmethod
        def open(cls, model_dir: Path, options: Any) -> Any: ...

        @classmethod
        def plan(cls, model_dir: Path, options: Any) -> Any: ...

        @classmethod
        def make_tiny(cls, directory: Path, seed: int = 0) -> None: ...

    Family.profile = profile  # type: ignore[attr-defined]

    def entry(**fields: Any) -> Registered[Any]:
        return _registered(Kind.MODEL, "acme", "acme.family:Family", **fields)

    assert check(entry(tasks=("text-to-image",)), Family) == []
    assert check(entry(), Family) == []  # no tasks registered: the profile alone marks a family

    [task] = check(entry(tasks=("text-to-video",)), Family)
    assert "Family.profile.task is 'text-to-image', not among the declared tasks ['text-to-video']" in task

    class NoPlan:
        profile = {"task": "text-to-image"}

        @classmethod
        def open(cls, model_dir: Path, options: Any) -> Any: ...

    problems = check(entry(tasks=("text-to-image",)), NoPlan)
    assert len(problems) == 2
    assert "its 'profile' must be an omni_core.generation.request.GenerationProfile, not dict" in problems[0]
    assert "lacks plan, make_tiny" in problems[1]
    # registered for an image task, so held to the contract even without a profile
    assert "its 'profile' must be" in check(entry(tasks=("text-to-image",)), object)[0]

    class EchoModel:  # a model for another task: no generation contract applies
        def generate(self, prompt: str) -> str:
            return prompt

    assert check(entry(tasks=("text-to-text",)), EchoModel) == []
    assert "is not a class or callable" in check(entry(), "not callable")[0]


def runtime_imports(source: str) -> list[str]:
    """Top-level names of the modules a source file imports when run (TYPE_CHECKING blocks
    excluded: they only serve type checkers)."""
    tree = ast.parse(source)
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for node in ast.walk(block)
    }
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return [name.split(".")[0] for name in names]


def test_rendered_code_passes_the_repository_lint_rules(rendered_here: dict[str, Path]) -> None:
    """The repository's ruff config excludes the templates (they are not valid Python before
    rendering), so lint what they render instead, as each package's own project."""
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed")
    rules = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["ruff"]
    for kind, root in rendered_here.items():
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "ruff",
                "check",
                "--isolated",
                "--no-cache",
                "--output-format",
                "concise",
                "--select",
                ",".join(rules["lint"]["select"]),
                "--ignore",
                ",".join(rules["lint"]["ignore"]),
                "--line-length",
                str(rules["line-length"]),
                "--target-version",
                rules["target-version"],
                ".",
            ],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, f"{kind}:\n{result.stdout}{result.stderr}"


# ------------------------------------------------------------------------------------------
# slow: render with a user's install, pip install, load, run the package's own tests


def _files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def rendered(
    base_venv: Any, tmp_path_factory: pytest.TempPathFactory, rendered_here: dict[str, Path]
) -> dict[str, Path]:
    """Every kind rendered by ``omni new-plugin`` of the torch-free base venv."""
    out = tmp_path_factory.mktemp("rendered")
    paths = {}
    for kind in KINDS:
        result = base_venv.omni("new-plugin", "--kind", kind, plugin_name(kind), "-o", str(out))
        assert result.returncode == 0, result.stderr
        paths[kind] = out / placeholders(kind, plugin_name(kind))["distribution"]
        assert f"created {paths[kind]}" in result.stdout
        # The installed omni-plugin-template ships exactly the templates of this checkout
        # (a missing package-data glob, or a stale build/ directory, would show here).
        assert _files(paths[kind]) == _files(rendered_here[kind])
    return paths


def _listing(venv: Any, *args: str, **env: str) -> dict[str, Any]:
    result = venv.omni(*args, "plugins", "list", "--json", "--load", **env)
    assert result.returncode == 0, result.stdout + result.stderr
    data: dict[str, Any] = result.json()
    return data


@pytest.fixture(scope="session")
def diffusion_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of omni-plugin-diffusion's sources, so pip's in-tree build never writes into the repo."""
    dest = tmp_path_factory.mktemp("diffusion-src") / "diffusion"
    shutil.copytree(
        DIFFUSION_PLUGIN, dest, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests")
    )
    return dest


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_closure(roots: list[str]) -> dict[str, importlib.metadata.Distribution]:
    """The distributions installed here that ``roots`` (requirement strings) need, transitively,
    with the extras they ask for."""
    from packaging.requirements import Requirement

    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [Requirement(r) for r in roots]
    while todo:
        requirement = todo.pop()
        key = _canonical(requirement.name)
        if key in found:
            continue
        try:
            dist = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional dependency this interpreter does not have
        found[key] = dist
        extras = {"", *requirement.extras}
        for text in dist.requires or ():
            needed = Requirement(text)
            if needed.marker is None or any(needed.marker.evaluate({"extra": e}) for e in extras):
                todo.append(needed)
    return found


@pytest.fixture(scope="session")
def generation_stack(base_venv: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that lends the torch-free base venv this interpreter's torch and what
    omni-plugin-diffusion needs (diffusers, transformers, tokenizers, Pillow, ...), by symlinks.

    It holds each distribution of that closure that the base venv lacks, omni's own excluded:
    its top-level packages and its ``.dist-info`` (so version checks and entry points see it),
    nothing else. On the venv's path after the plugins' site it stands in for a user's own
    install of torch and the diffusers stack; nothing is copied or downloaded.
    """
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("diffusers") is None:
        pytest.fail("the model template's end-to-end tests need torch and diffusers in the interpreter running them")
    listing = base_venv.run(
        [
            base_venv.python,
            "-c",
            "import importlib.metadata as m, json; print(json.dumps([d.metadata['Name'] for d in m.distributions()]))",
        ]
    )
    assert listing.returncode == 0, listing.stderr
    present = {_canonical(name) for name in json.loads(listing.stdout)}
    diffusion = importlib.metadata.distribution("omni-plugin-diffusion")
    needed = _requirement_closure(["torch", *(diffusion.requires or ())])
    stack = tmp_path_factory.mktemp("generation-stack")
    for key, dist in sorted(needed.items()):
        if key in present or key.startswith("omni-"):
            continue
        site = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or ()}
        for top in sorted(tops - {"..", "__pycache__"}):
            if top.endswith(".pth") or not (site / top).exists() or (stack / top).exists():
                continue
            (stack / top).symlink_to(site / top, target_is_directory=(site / top).is_dir())
    assert (stack / "torch").is_dir() and (stack / "diffusers").is_dir() and (stack / "transformers").is_dir()
    return stack


@pytest.mark.slow
def test_base_venv_has_no_torch(base_venv: Any) -> None:
    """What the slow tests below prove holds without torch."""
    result = base_venv.run([base_venv.python, "-c", "import torch"])
    assert result.returncode != 0 and "No module named 'torch'" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_rendered_plugin_installs_loads_and_passes_its_own_tests(
    rendered: dict[str, Path],
    install_plugins: Callable[..., Any],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    kind: str,
) -> None:
    root = rendered[kind]
    values = placeholders(kind, plugin_name(kind))
    # a model family installs with the diffusion runtime it depends on, a cache backend with
    # the runtime its tests build a tiny pipeline with
    runtime = [request.getfixturevalue("diffusion_src")] if kind in ON_DIFFUSION else []
    venv = install_plugins(root, *runtime)

    # listed and loaded without torch: its hooks import nothing heavy
    plugins = {p["name"]: p for p in _listing(venv)["plugins"]}
    assert set(plugins) == {"cpu", values["name"], *(["diffusion"] if runtime else [])}
    plugin = plugins[values["name"]]
    assert (plugin["status"], plugin["reason"], plugin["warnings"]) == ("ok", "", [])
    assert (plugin["distribution"], plugin["version"]) == (values["distribution"], "0.1.0")
    assert plugin["module"] == f"{values['package']}.hooks"
    assert [(p["kind"], p["name"]) for p in plugin["provides"]] == [expected_extension(kind)]

    # The package's own suite, from outside its source tree so the installed copy is tested.
    # A model family's suite makes a tiny checkpoint and generates with it, a cache backend's
    # runs a tiny pipeline: they run with torch and the diffusers stack lent to the venv.
    runner = venv.with_site(request.getfixturevalue("generation_stack"), venv.home) if runtime else venv
    result = runner.run(
        [runner.python, "-m", "pytest", root / "tests", "-p", "no:cacheprovider", "-q", "-rA"],
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    summary = output.strip().splitlines()[-1]
    assert re.search(r"\b\d+ passed\b", summary), output
    assert not re.search(r"\b(failed|errors?)\b", summary), output
    # Only the attention backend's numeric tests need torch: they skip here, nothing else does.
    skips = [line for line in output.splitlines() if line.startswith("SKIPPED")]
    assert all("torch" in line for line in skips), output
    assert bool(skips) == (kind == "attention"), output
    passed = {line.split()[1].partition("/tests/")[2] for line in output.splitlines() if line.startswith("PASSED")}
    if kind == "model":  # the end-to-end generation ran, and passed
        assert "test_generate.py::test_generates_images_end_to_end" in passed, output
        assert "test_family.py::test_resolution" in passed, output
    if kind == "cache":  # the backend really ran on the tiny pipeline, and passed
        for test in (
            "test_lossless_gives_the_pixels_of_no_cache",
            "test_caching_runs_fewer_block_passes_counted",
            "test_disable_restores_the_model_exactly",
        ):
            assert f"test_cache.py::{test}" in passed, output


#: run in the venv with every kind installed: the rendered offloader serving the rendered
#: family through omni's runtime, against the same generation without offload
_OFFLOAD_THE_FAMILY = """
import json, sys
from pathlib import Path
from omni_core import Omni
from {package}.family import {family}

directory = Path(sys.argv[1])
{family}.make_tiny(directory, seed=0)
fields = dict(width=32, height=32, num_inference_steps=2, seed=0)
with Omni(directory, progress=False) as omni:
    plain = omni.generate("a red fox in snow", **fields)
with Omni(directory, progress=False, offload="{offloader}", offload_options={{"record": True}}) as omni:
    offloaded = omni.generate("a red fox in snow", **fields)
    strategy, units = omni.generation.offloader, [omni.generation.pipeline.text_encoder,
                                                  omni.generation.pipeline.transformer]
    hooked = [bool(unit._forward_pre_hooks) for unit in units]
events = [[e.module, list(e.resident)] for e in strategy.events]
print(json.dumps({{
    "same_pixels": bool((plain.images[0].pixels == offloaded.images[0].pixels).all()),
    "offload": offloaded.metadata.offload, "family": offloaded.metadata.family, "events": events,
    "hooked": hooked, "hooked_after_close": [bool(unit._forward_pre_hooks) for unit in units],
    "enabled_after_close": strategy.is_enabled(),
}}))
"""


#: the rendered cache backend serving the rendered family through omni's runtime, once the
#: family declares settings for it, against the same generation without a cache backend
_CACHE_THE_FAMILY = """
import json, sys
from pathlib import Path
from omni_core import Omni
from {package}.family import {family}

directory = Path(sys.argv[1])
{family}.make_tiny(directory, seed=0)
# the family declares settings for the backend under its name: its one block list, whose
# blocks return hidden_states alone
{family}.cache_declarations = {{"{cache}": {{"blocks": ["transformer_blocks"], "block_outputs": ["hidden_states"]}}}}
fields = dict(width=32, height=32, num_inference_steps=8, seed=0)
with Omni(directory, progress=False) as omni:
    plain = omni.generate("a red fox in snow", **fields)
with Omni(directory, progress=False, cache="{cache}", cache_config={{"threshold": 2.0}}) as omni:
    cached = omni.generate("a red fox in snow", **fields)
    lossless = omni.generate("a red fox in snow", cache_quality="lossless", **fields)
    backend, blocks = omni.generation.cache, list(omni.generation.pipeline.transformer.transformer_blocks)
    hooked = ["forward" in vars(block) for block in blocks]
print(json.dumps({{
    "lossless_same_pixels": bool((plain.images[0].pixels == lossless.images[0].pixels).all()),
    "cache": cached.metadata.cache, "lossless": lossless.metadata.cache, "family": cached.metadata.family,
    "hooked": hooked, "hooked_after_close": ["forward" in vars(block) for block in blocks],
    "enabled_after_close": backend.is_enabled(),
}}))
"""


@pytest.mark.slow
def test_all_kinds_install_side_by_side(
    rendered: dict[str, Path],
    install_plugins: Callable[..., Any],
    diffusion_src: Path,
    generation_stack: Path,
    tmp_path: Path,
) -> None:
    venv = install_plugins(*rendered.values(), diffusion_src)
    data = _listing(venv, "--strict")  # strict: any plugin problem would fail the command
    plugins = {p["name"]: p for p in data["plugins"]}
    assert set(plugins) == {"cpu", "diffusion", *(plugin_name(k) for k in KINDS)}
    assert {p["status"] for p in plugins.values()} == {"ok"}
    assert data["conflicts"] == []

    # The platform template claims the machine only when its device is "visible", then beats the CPU.
    visible = f"{placeholders('platform', plugin_name('platform'))['upper_name']}_VISIBLE"
    select = (
        "from omni_core.platforms import select_platform\n"
        "from omni_core.plugins import load_plugins\n"
        "print(select_platform(load_plugins()).name)"
    )
    assert venv.run([venv.python, "-c", select]).stdout.strip() == "cpu"
    chosen = venv.run([venv.python, "-c", select], env=venv.env(**{visible: "1"}))
    assert chosen.stdout.strip() == plugin_name("platform"), chosen.stderr

    # The offloader template serves the model template through omni's runtime: the same pixels
    # as without offload, the text encoder and the transformer taking turns on the device.
    model, offloader = placeholders("model", plugin_name("model")), plugin_name("offloader")
    script = _OFFLOAD_THE_FAMILY.format(package=model["package"], family=model["class_prefix"], offloader=offloader)
    runner = venv.with_site(generation_stack, venv.home)
    result = runner.run([runner.python, "-c", script, tmp_path / "tiny"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["same_pixels"] and report["family"] == model["name"]
    assert report["offload"] == offloader
    # the prompt and the empty negative prompt are encoded, then 2 steps (guidance batched)
    encoder, denoiser = ["text_encoder", ["vae", "text_encoder"]], ["transformer", ["vae", "transformer"]]
    assert report["events"] == [encoder, encoder, denoiser, denoiser]
    # hooked while the model was open; closing it removed every hook
    assert report["hooked"] == [True, True]
    assert report["hooked_after_close"] == [False, False] and not report["enabled_after_close"]

    # The cache template serves the model template through omni's runtime once the family
    # declares settings for it: lossless gives the pixels of no cache, the startup profile
    # reuses steps, and closing the model removes every wrapper.
    cache_name = plugin_name("cache")
    script = _CACHE_THE_FAMILY.format(package=model["package"], family=model["class_prefix"], cache=cache_name)
    result = runner.run([runner.python, "-c", script, tmp_path / "tiny-cached"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["lossless_same_pixels"] and report["family"] == model["name"]
    assert report["lossless"]["computed"] == list(range(8)) and report["lossless"]["reused"] == []
    cache = report["cache"]
    assert (cache["backend"], cache["quality"]) == (cache_name, None)
    assert sorted(cache["computed"] + cache["reused"]) == list(range(8)) and cache["reused"]
    assert {0, 7} <= set(cache["computed"])  # the warm-up step and the last step always compute
    assert report["hooked"] == [True, True]
    assert report["hooked_after_close"] == [False, False] and not report["enabled_after_close"]
