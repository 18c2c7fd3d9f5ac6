"""Import-light helpers for platform probes: facts about the installed torch build, read from
its files. Probes must not import torch (it initialises drivers and costs seconds), yet most
need to know whether torch was built for their hardware."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import Any

#: ``name = literal`` or ``name: type = literal`` at the start of a line
_ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_]\w*)\s*(?::[^=]*)?=\s*(?P<value>.+?)\s*$")


def torch_package_dir() -> Path | None:
    """Where torch is installed, found without importing it (None when it is not installed)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def torch_build_info(torch_dir: Path) -> dict[str, Any]:
    """The literal assignments of ``torch/version.py`` (``__version__``, ``cuda``, ``hip``,
    ``xpu``, ...), read as text so that torch is not imported. Raises ``OSError`` when the file
    cannot be read: a probe reports that rather than guessing."""
    values: dict[str, Any] = {}
    for line in (torch_dir / "version.py").read_text(encoding="utf-8").splitlines():
        match = _ASSIGNMENT.match(line)
        if match is None:
            continue
        try:
            values[match["name"]] = ast.literal_eval(match["value"])
        except (ValueError, SyntaxError):
            continue  # an expression, not a literal: not a build fact
    return values
