"""Render a plugin package from the templates in ``common/`` and ``kinds/<kind>/``.

Template files end in ``.tmpl`` (so no tool mistakes them for live code) and may contain the
placeholders below, in file contents and in path names:

=====================  ==============================  ==========================
placeholder            meaning                         example for ``my-flux``
=====================  ==============================  ==========================
``{{name}}``           plugin name (entry point name)  ``my-flux``
``{{distribution}}``   distribution name               ``omni-plugin-my-flux``
``{{package}}``        import package                  ``omni_plugin_my_flux``
``{{class_prefix}}``   CamelCase stem for classes      ``MyFlux``
``{{upper_name}}``     UPPER_CASE registry name        ``MY_FLUX``
``{{kind}}``           extension kind value            ``model``
=====================  ==============================  ==========================
"""

from __future__ import annotations

import re
import shutil
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from omni_core.kinds import Kind

#: ``omni new-plugin --kind`` values and the extension kind each renders
KIND_CHOICES: dict[str, Kind] = {
    "model": Kind.MODEL,
    "tts": Kind.TTS_ADAPTER,
    "attention": Kind.ATTENTION_BACKEND,
    "platform": Kind.PLATFORM,
    "connector": Kind.CONNECTOR,
    "offloader": Kind.OFFLOADER,
    "executor": Kind.EXECUTOR,
    "cache": Kind.CACHE_BACKEND,
}

_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


class TemplateError(ValueError):
    """Bad arguments to :func:`render`; the message names the fix."""


def placeholders(kind: str, name: str) -> dict[str, str]:
    stem = name.replace("-", "_")
    return {
        "name": name,
        "distribution": f"omni-plugin-{name}",
        "package": f"omni_plugin_{stem}",
        "class_prefix": "".join(part.capitalize() for part in name.split("-")),
        "upper_name": stem.upper(),
        "kind": KIND_CHOICES[kind].value,
    }


def _substitute(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def _copy_tree(src: Traversable, dest: Path, values: dict[str, str]) -> None:
    for item in src.iterdir():
        if item.name == "__pycache__":
            continue
        target_name = _substitute(item.name, values)
        if item.is_dir():
            _copy_tree(item, dest / target_name, values)
            continue
        if target_name.endswith(".tmpl"):
            target_name = target_name[: -len(".tmpl")]
        out = dest / target_name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_substitute(item.read_text(encoding="utf-8"), values), encoding="utf-8")


def render(kind: str, name: str, output: Path, force: bool = False) -> Path:
    """Write the package ``omni-plugin-<name>/`` under ``output`` and return its path."""
    # the registry's own kind names (tts_adapter, attention_backend, ...) are accepted too
    kind = next((short for short, k in KIND_CHOICES.items() if kind.replace("-", "_") == k.value), kind)
    if kind not in KIND_CHOICES:
        raise TemplateError(f"unknown kind {kind!r}; choose one of: {', '.join(KIND_CHOICES)}")
    if not _NAME_RE.match(name):
        raise TemplateError(
            f"invalid plugin name {name!r}: use lowercase letters, digits and single dashes, "
            "starting with a letter (e.g. 'my-backend')"
        )
    values = placeholders(kind, name)
    target = Path(output) / values["distribution"]
    if target.exists():
        if not force:
            raise TemplateError(f"{target} already exists; choose another --output or pass --force")
        shutil.rmtree(target)
    root = resources.files(__name__)
    _copy_tree(root / "common", target, values)
    _copy_tree(root / "kinds" / kind, target, values)
    return target
