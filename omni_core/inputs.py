"""Rules for input that every modality shares: the seed range and checkpoint files.

* **Seeds.** One range for ``omni generate``, ``omni speak`` and the offline API:
  ``0 <= seed < 2**32``. Every runtime can honour it (numpy's seeds stop at 2**32, torch's
  generators take 64 bits), so a seed that works for one model works for all of them.
* **Checkpoint JSON.** :func:`read_checkpoint_json` reads a config file of a checkpoint: a
  missing file is ``None``, a present but malformed one is a
  :class:`~omni_core.errors.CheckpointFormatError` naming the file as malformed.
* **Checkpoint integrity.** :func:`check_checkpoint_files` looks at the configs and the
  safetensors headers of a checkpoint before a runtime loads it, so a truncated download or a
  corrupt file is named, with its path, instead of surfacing as a loader's stack trace.

Standard library only: it runs before any weight is read, in processes that have no torch.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from omni_core.errors import CheckpointFormatError

#: seeds are whole numbers in [0, SEED_LIMIT)
SEED_LIMIT = 2**32


def seed_problem(seed: Any) -> str | None:
    """Why ``seed`` is not a valid seed, or None when it is (None itself is: draw one)."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        return f"seed must be a whole number from 0 to {SEED_LIMIT - 1}, not {seed!r}"
    if not 0 <= seed < SEED_LIMIT:
        return f"seed {seed} is out of range: use a whole number from 0 to {SEED_LIMIT - 1} (2**32 - 1)"
    return None


def check_seed(seed: Any) -> Any:
    """``seed`` unchanged, or ValueError naming the rule (for pydantic field validators)."""
    problem = seed_problem(seed)
    if problem:
        raise ValueError(problem)
    return seed


_FIX = "re-download or re-save the checkpoint (a partial copy or an edit gone wrong leaves such files)"


def read_checkpoint_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when the file does not exist. A file that exists but
    cannot be read, is not UTF-8 JSON, or holds something other than an object raises
    :class:`CheckpointFormatError`, naming the file as malformed (never as missing)."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise CheckpointFormatError(f"{path} is a directory, where the checkpoint needs a JSON file") from None
    except OSError as exc:
        raise CheckpointFormatError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise CheckpointFormatError(f"{path} is malformed: it is not UTF-8 text; {_FIX}") from None
    except json.JSONDecodeError as exc:
        raise CheckpointFormatError(
            f"{path} is malformed JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); {_FIX}"
        ) from None
    except ValueError as exc:  # e.g. a number too long to convert
        raise CheckpointFormatError(f"{path} is malformed JSON ({exc}); {_FIX}") from None
    if not isinstance(data, dict):
        raise CheckpointFormatError(
            f"{path} is malformed: it holds a JSON {type(data).__name__}, where a JSON object is expected; {_FIX}"
        )
    return data


#: config files loaders read: checked before loading (tokenizer vocabularies are left to the tokenizer)
_CONFIG_NAMES = ("config.json", "model_index.json", "generation_config.json")
_CONFIG_SUFFIX = "_config.json"
#: a safetensors header larger than this is not a header (the format caps it at 100 MB)
_MAX_HEADER = 100_000_000


def _checkpoint_files(directory: Path) -> list[Path]:
    """The files of ``directory`` and of its immediate subfolders (the layouts omni serves)."""
    files: list[Path] = []
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return files
    for entry in entries:
        if entry.is_file():
            files.append(entry)
        elif entry.is_dir() and not entry.name.startswith("."):
            try:
                files.extend(sorted(p for p in entry.iterdir() if p.is_file()))
            except OSError:
                continue
    return files


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file at ``path`` cannot be loaded (truncated, corrupt), or None.
    Reads the header only: the 8-byte length, the JSON header, and the file's size against the
    last tensor's end offset."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path} is truncated: {size} bytes, too short for a safetensors file"
            (length,) = struct.unpack("<Q", head)
            if length > _MAX_HEADER:
                return f"{path} is corrupt: it does not start with a safetensors header"
            if 8 + length > size:
                return f"{path} is truncated: its header alone needs {8 + length} bytes, the file has {size}"
            header = json.loads(f.read(length).decode("utf-8"))
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    except (UnicodeDecodeError, ValueError):
        return f"{path} is corrupt: its safetensors header is not valid JSON"
    if not isinstance(header, dict):
        return f"{path} is corrupt: its safetensors header is not a JSON object"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"{path} is corrupt: tensor {name!r} has no valid data_offsets in the header"
        end = max(end, offsets[1])
    if 8 + length + end > size:
        return f"{path} is truncated: its tensors need {8 + length + end} bytes, the file has {size}"
    return None


def check_checkpoint_files(directory: Path) -> None:
    """Raise :class:`CheckpointFormatError` for the first malformed config file or truncated or
    corrupt safetensors file in a checkpoint directory (and its component subfolders)."""
    for path in _checkpoint_files(Path(directory)):
        name = path.name
        if name in _CONFIG_NAMES or name.endswith(_CONFIG_SUFFIX):
            read_checkpoint_json(path)
        elif name.endswith(".safetensors"):
            problem = safetensors_problem(path)
            if problem:
                raise CheckpointFormatError(f"{problem}; {_FIX}")
