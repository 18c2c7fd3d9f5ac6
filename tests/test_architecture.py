"""Guardrails that keep the architecture honest: vendors live in their plugins only.

* Nothing outside a vendor platform plugin asks ``torch.cuda`` (or another vendor module)
  anything: everyone else asks the current platform.
* The core holds no vendor or model names in its code (docstrings aside): dispatch goes
  through registries, never through if/elif chains over names.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENDOR_PLUGINS = {"cuda", "rocm", "npu", "xpu"}
VENDOR_ATTRIBUTES = {("torch", "cuda"), ("torch", "npu"), ("torch", "xpu"), ("torch", "mps")}
VENDOR_MODULES = {"torch_npu", "pynvml", "amdsmi", "aiter", "intel_extension_for_pytorch", "flash_attn", "flashinfer"}
VENDOR_WORDS = {"cuda", "rocm", "hip", "npu", "xpu", "nvidia", "amd", "ascend", "intel", "musa", "mps"}


def python_files(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py") if ".venv" not in p.parts)


def non_vendor_sources() -> list[Path]:
    plugin_roots = [p for p in (REPO / "omni_plugins").iterdir() if p.is_dir() and p.name not in VENDOR_PLUGINS]
    return python_files(REPO / "omni_core", REPO / "cli", REPO / "plugin_template", *plugin_roots)


def test_only_vendor_plugins_ask_vendor_apis():
    offenders = []
    for path in non_vendor_sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if (node.value.id, node.attr) in VENDOR_ATTRIBUTES:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} uses {node.value.id}.{node.attr}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for name in names:
                    if name.split(".")[0] in VENDOR_MODULES or name in {"torch.cuda", "torch.npu", "torch.xpu"}:
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno} imports {name}")
    assert offenders == [], "ask omni_core.platforms.current_platform() instead:\n" + "\n".join(offenders)


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_core_code_names_no_vendor():
    offenders = []
    for path in python_files(REPO / "omni_core"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = _docstring_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if node.value.strip().lower() in VENDOR_WORDS:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} names {node.value!r}")
            if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and str(c.value).lower() in VENDOR_WORDS for c in node.comparators
            ):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} compares against a vendor name")
    assert offenders == [], "dispatch through registries, not names:\n" + "\n".join(offenders)


def test_guardrails_see_what_they_guard():
    # The scans above must actually cover the sources they promise to cover.
    names = {p.relative_to(REPO).as_posix() for p in non_vendor_sources()}
    assert "omni_core/platforms/__init__.py" in names and "cli/omni_cli/main.py" in names
    assert "omni_plugins/cpu/omni_plugin_cpu/platform.py" in names


# -- no vendor or model names in the core and the CLI ---------------------------------------------

#: vendors: hardware makers, their platforms and SDKs
VENDOR_NAMES = ("cuda", "rocm", "hip", "npu", "xpu", "nvidia", "amd", "ascend", "intel", "musa", "mps", "cann", "aiter")
#: model families and model makers' names
MODEL_NAMES = (
    "flux", "vits", "wan", "sana", "qwen", "bark", "speecht5", "hunyuan", "ltx", "sd3", "z-image", "zimage",
    "stable-diffusion", "whisper", "llama", "t5", "piper",
)  # fmt: skip
_NAME = re.compile(r"(?<![a-z0-9])(" + "|".join(re.escape(w) for w in VENDOR_NAMES + MODEL_NAMES) + r")(?![a-z])", re.I)

#: every permitted occurrence: (file, name) -> why. Anything else names a vendor or a model in
#: code that must work the same for all of them.
ALLOWED_NAMES = {
    # the import-light rule lists vendor SDK modules a hook module must not import: the list is
    # the point (the conformance kit and `omni doctor` check it), nothing dispatches on it
    ("omni_core/plugins.py", "npu"): "HEAVY_MODULES: torch_npu",
    ("omni_core/plugins.py", "intel"): "HEAVY_MODULES: intel_extension_for_pytorch",
    # the embedded defaults: `omni generate` / `omni speak` without --model use one family each
    # (speak: the fallback when no adapter offers a real voice), and the messages say which
    # plugin to install when it is missing
    ("cli/omni_cli/commands/generate.py", "flux"): "DEFAULT_IMAGE_FAMILY and its install hint",
    ("cli/omni_cli/commands/speak.py", "vits"): "FALLBACK_TTS_FAMILY",
    ("cli/omni_cli/commands/speak.py", "piper"): "REAL_VOICE_HINT: which plugin to install for a real voice",
    ("cli/omni_cli/commands/models.py", "vits"): "the install hint when no family can make a tiny checkpoint",
}


def _names_in(path: Path) -> list[tuple[int, str, str]]:
    """(line, name, text) for each vendor or model name in code: string constants (docstrings
    aside), identifiers, attribute, function and class names. ``_`` counts as a word break."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = _docstring_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            texts = [node.value]
        elif isinstance(node, ast.Name):
            texts = [node.id]
        elif isinstance(node, ast.Attribute):
            texts = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            texts = [node.name]
        else:
            continue
        for text in texts:
            for match in _NAME.finditer(text.replace("_", " ")):
                found.append((getattr(node, "lineno", 0), match.group(1).lower(), text))
    return found


def test_core_and_cli_name_no_vendor_or_model_beyond_the_allow_list():
    offenders, used = [], set()
    for path in python_files(REPO / "omni_core", REPO / "cli" / "omni_cli"):
        rel = path.relative_to(REPO).as_posix()
        for line, name, text in _names_in(path):
            if (rel, name) in ALLOWED_NAMES:
                used.add((rel, name))
            else:
                offenders.append(f"{rel}:{line} names {name!r} in {text[:80]!r}")
    assert offenders == [], (
        "the core and the CLI work the same for every vendor and model: ask a registry or the platform, "
        "or add the occurrence to ALLOWED_NAMES with the reason:\n" + "\n".join(offenders)
    )
    stale = sorted(set(ALLOWED_NAMES) - used)
    assert stale == [], f"allow-list entries that match nothing any more (remove them): {stale}"


def test_the_name_scan_sees_names():
    # the scan must catch what it is for: a vendor in a comparison, a model in a string
    assert [n for _, n, _ in _names_in(REPO / "cli" / "omni_cli" / "commands" / "speak.py")].count("vits") >= 1
    probe = _NAME.findall("if platform.device_type == 'cuda' or family.startswith('flux1') or torch_npu")
    assert [p.lower() for p in probe] == ["cuda", "flux", "npu"]
    assert _NAME.findall("ampere amdahl fluxion swan") == []


# -- layering: who may import whom ----------------------------------------------------------------

PLUGIN_PACKAGE = re.compile(r"^omni_plugin(s|_\w+)?$")
#: the templates `omni new-plugin` renders: a data package of the CLI, no plugin (no entry point)
TEMPLATES = "omni_plugin_template"


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) of every import statement, by ast."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
    return found


def _plugin_sources() -> list[Path]:
    return [p for p in python_files(REPO / "omni_plugins") if "build" not in p.parts]


def test_core_imports_neither_plugins_nor_the_cli():
    offenders = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in python_files(REPO / "omni_core")
        for line, module, _ in _imports(path)
        if PLUGIN_PACKAGE.match(module.split(".")[0]) or module.split(".")[0] == "omni_cli"
    ]
    assert offenders == [], "the core reaches plugins through entry points and registries only:\n" + "\n".join(
        offenders
    )


def test_plugins_never_import_the_cli():
    offenders = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in _plugin_sources()
        for line, module, _ in _imports(path)
        if module.split(".")[0] == "omni_cli"
    ]
    assert offenders == [], "plugins build on omni_core; the CLI is one client among others:\n" + "\n".join(offenders)


def _public(module: str) -> bool:
    """A public omni_core module: no part of its dotted path starts with ``_``, and it is not the
    conformance kit (``omni_core.testing`` is for plugins' test suites, not for clients)."""
    parts = module.split(".")
    return not any(p.startswith("_") for p in parts) and parts[:2] != ["omni_core", "testing"]


def test_cli_imports_only_public_core_modules_and_names():
    offenders = []
    for path in python_files(REPO / "cli" / "omni_cli"):
        for line, module, names in _imports(path):
            top = module.split(".")[0]
            where = f"{path.relative_to(REPO)}:{line}"
            if PLUGIN_PACKAGE.match(top) and top != TEMPLATES:
                offenders.append(f"{where} imports the plugin module {module}")
            elif top == "omni_core" and not _public(module):
                offenders.append(f"{where} imports the private module {module}")
            elif top == "omni_core":
                offenders += [
                    f"{where} imports the private name {module}.{n}"
                    for n in names
                    if n.startswith("_") and not n.startswith("__")
                ]
    assert offenders == [], "the CLI uses the core's public API only:\n" + "\n".join(offenders)


def test_layering_scans_see_imports():
    cli_main = _imports(REPO / "cli" / "omni_cli" / "main.py")
    assert any(module.startswith("omni_core") for _, module, _ in cli_main)
    assert any(m.startswith("omni_core") for p in _plugin_sources() for _, m, _ in _imports(p))
    assert not _public("omni_core._version") and not _public("omni_core.testing.kit") and _public("omni_core.plugins")


# -- docs/architecture.md names every base class the core defines ----------------------------------


def _core_classes() -> dict[str, list[str]]:
    """Class name -> its base expressions, for every class omni_core defines."""
    classes: dict[str, list[str]] = {}
    for path in python_files(REPO / "omni_core"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = [ast.unparse(b) for b in node.bases]
    return classes


def _subclassed_by_plugins(core: set[str]) -> set[str]:
    """Core classes that a class in a plugin or a template subclasses (imported from omni_core)."""
    found = set()
    for path in [*_plugin_sources(), *python_files(REPO / "plugin_template")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        from_core = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("omni_core")
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    name = ast.unparse(base).split("[")[0].split(".")[-1]
                    if name in from_core and name in core:
                        found.add(name)
    return found


def core_base_classes() -> set[str]:
    """The base classes and protocols the core defines, by this rule: a class of omni_core that
    is an ABC or a ``typing.Protocol`` (directly, or through another such class of the core), or
    that a class in ``omni_plugins/`` or ``plugin_template/`` subclasses (the documented bases
    plugins build on: conformance suites, families, ...). Private classes (``_Name``) are not
    bases anyone may build on and are left out."""
    classes = _core_classes()
    abstract = {n for n, bases in classes.items() if any(b in ("abc.ABC", "ABC", "Protocol") for b in bases)}
    grew = True
    while grew:
        more = {n for n, bases in classes.items() if any(b.split("[")[0] in abstract for b in bases)} - abstract
        abstract |= more
        grew = bool(more)
    return {n for n in abstract | _subclassed_by_plugins(set(classes)) if not n.startswith("_")}


def test_architecture_md_names_every_core_base_class():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    bases = core_base_classes()
    assert {"Platform", "AttentionBackend", "TTSAdapter", "GenerationModel", "Offloader"} <= bases
    missing = sorted(n for n in bases if not re.search(rf"`{re.escape(n)}`", text))
    assert missing == [], f"docs/architecture.md does not name these base classes of the core (as `Name`): {missing}"
