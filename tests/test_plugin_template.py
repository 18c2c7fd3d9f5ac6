"""`omni new-plugin`: every kind renders a package that installs, loads and passes its own tests.

The fast tests render in-process and check the package's shape, its manifest against its hooks,
and the CLI's refusals. The slow ones render with the ``omni`` executable of a venv without
torch (so the templates must ship with the installed omni-plugin-template), ``pip install`` the
result, check that omni lists it as "ok", and run the rendered package's own test suite there.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from omni_plugin_template import KIND_CHOICES, placeholders, render

from omni_core.kinds import Kind
from omni_core.manifest import parse_manifest
from omni_core.plugins import compare_with_manifest
from omni_core.registry import REGISTRAR_TYPES, Provider

KINDS = tuple(KIND_CHOICES)
PLACEHOLDER = re.compile(r"\{\{\s*\w+\s*\}\}")
#: modules a rendered hooks.py may import at run time (anything else would load with omni)
HOOK_IMPORTS = {"__future__", "typing", "omni_core"}


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
    assert "choose one of: model, tts, attention, platform, connector, offloader" in result.stderr
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
    assert (target / "omni_plugin_acme" / "model.py").is_file()


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
    pkg, impl = values["package"], kind  # the implementation module is named after the kind
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
        f"tests/test_{impl}.py",
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
    # a TTS adapter needs the speech runtime's audio stack; no kind depends on torch
    expected_core = "omni-core[speech]>=0.1,<0.2" if kind == "tts" else "omni-core>=0.1,<0.2"
    assert project["dependencies"] == [expected_core]
    assert project["optional-dependencies"] == {"test": ["pytest>=8"]}
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
    registrars = {k: REGISTRAR_TYPES[k](provider) for k in Kind}
    for k, registrar in registrars.items():
        hook = getattr(hooks, k.hook_name, None)
        if hook is not None:
            hook(registry=registrar)
    assert compare_with_manifest(manifest, registrars) == []
    for declared in manifest.provides:  # references point into the package and stay lazy
        assert declared.ref.startswith(f"{values['package']}.")
        assert declared.ref.partition(":")[0] not in sys.modules


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


@pytest.mark.slow
def test_base_venv_has_no_torch(base_venv: Any) -> None:
    """What the slow tests below prove holds without torch."""
    result = base_venv.run([base_venv.python, "-c", "import torch"])
    assert result.returncode != 0 and "No module named 'torch'" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_rendered_plugin_installs_loads_and_passes_its_own_tests(
    rendered: dict[str, Path], install_plugins: Callable[..., Any], tmp_path: Path, kind: str
) -> None:
    root = rendered[kind]
    values = placeholders(kind, plugin_name(kind))
    venv = install_plugins(root)

    plugins = {p["name"]: p for p in _listing(venv)["plugins"]}
    assert set(plugins) == {"cpu", values["name"]}
    plugin = plugins[values["name"]]
    assert (plugin["status"], plugin["reason"], plugin["warnings"]) == ("ok", "", [])
    assert (plugin["distribution"], plugin["version"]) == (values["distribution"], "0.1.0")
    assert plugin["module"] == f"{values['package']}.hooks"
    assert [(p["kind"], p["name"]) for p in plugin["provides"]] == [expected_extension(kind)]

    # The package's own suite, from outside its source tree so the installed copy is tested.
    result = venv.run(
        [venv.python, "-m", "pytest", root / "tests", "-p", "no:cacheprovider", "-q", "-rs"],
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


@pytest.mark.slow
def test_all_kinds_install_side_by_side(rendered: dict[str, Path], install_plugins: Callable[..., Any]) -> None:
    venv = install_plugins(*rendered.values())
    data = _listing(venv, "--strict")  # strict: any plugin problem would fail the command
    plugins = {p["name"]: p for p in data["plugins"]}
    assert set(plugins) == {"cpu", *(plugin_name(k) for k in KINDS)}
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
