"""Guardrails that keep the architecture honest: vendors live in their plugins only.

* Nothing outside a vendor platform plugin asks ``torch.cuda`` (or another vendor module)
  anything: everyone else asks the current platform.
* The core holds no vendor or model names in its code (docstrings aside): dispatch goes
  through registries, never through if/elif chains over names.
"""

from __future__ import annotations

import ast
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
