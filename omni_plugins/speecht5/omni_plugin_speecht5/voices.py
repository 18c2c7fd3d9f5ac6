"""Named SpeechT5 voices: x-vector speaker embeddings in ``voices.safetensors``.

SpeechT5 has no built-in speakers: every utterance is conditioned on a speaker embedding (an
x-vector, ``config.speaker_embedding_dim`` floats, 512 for the released model). This plugin
reads them from ``<checkpoint>/voices.safetensors``: one 1-D tensor per voice name, with the
voice order (the first is the default) in the file's metadata, because safetensors itself
keeps no order. Write one with :func:`save_voices`, e.g. from the CMU ARCTIC x-vectors that
the SpeechT5 model card uses.

Reading the names needs no torch (numpy only); the tensors are loaded with the model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omni_core.errors import CheckpointFormatError, ModelLoadError

VOICES_FILENAME = "voices.safetensors"
#: metadata key holding the JSON list of voice names, default first
ORDER_KEY = "omni_voice_order"


#: the core's error for a checkpoint that cannot be loaded (a missing voices file; a malformed one
#: raises its subclass CheckpointFormatError); the old name keeps working
VoicesError = ModelLoadError


def voices_path(model_dir: str | Path) -> Path:
    return Path(model_dir) / VOICES_FILENAME


def _missing(path: Path) -> ModelLoadError:
    return ModelLoadError(
        f"{path} does not exist: SpeechT5 speaks only in a voice given as an x-vector speaker "
        "embedding, and this checkpoint ships none. Add some with "
        "omni_plugin_speecht5.voices.save_voices(model_dir, {'name': xvector, ...}) "
        "(512-d x-vectors, e.g. from the CMU ARCTIC x-vector set the SpeechT5 model card uses)"
    )


def read_voice_names(model_dir: str | Path) -> tuple[str, ...]:
    """The voice names in order, default first, read from the file header only."""
    from safetensors import safe_open

    path = voices_path(model_dir)
    if not path.is_file():
        raise _missing(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            names = list(f.keys())
            metadata = f.metadata() or {}
    except Exception as exc:
        raise CheckpointFormatError(f"{path}: not a readable safetensors file ({exc})") from None
    if not names:
        raise CheckpointFormatError(f"{path} holds no voices; add at least one x-vector")
    order = metadata.get(ORDER_KEY)
    if order is None:
        return tuple(sorted(names))
    try:
        ordered = json.loads(order)
    except ValueError:
        raise CheckpointFormatError(f"{path}: metadata {ORDER_KEY!r} is not a JSON list of names") from None
    if not isinstance(ordered, list) or sorted(ordered) != sorted(names):
        raise CheckpointFormatError(
            f"{path}: metadata {ORDER_KEY!r} {ordered!r} does not list exactly the tensors {names!r}"
        )
    return tuple(str(n) for n in ordered)


def load_voices(model_dir: str | Path, dim: int) -> dict[str, Any]:
    """``{name: torch tensor of shape (1, dim)}`` in file order (default first)."""
    from safetensors.torch import load_file

    names = read_voice_names(model_dir)
    tensors = load_file(str(voices_path(model_dir)))
    voices: dict[str, Any] = {}
    for name in names:
        tensor = tensors[name].float().reshape(-1)
        if tensor.numel() != dim:
            raise CheckpointFormatError(
                f"{voices_path(model_dir)}: voice {name!r} has {tensor.numel()} values, but the model's "
                f"speaker_embedding_dim is {dim}"
            )
        voices[name] = tensor.unsqueeze(0)
    return voices


def save_voices(model_dir: str | Path, voices: Mapping[str, Any]) -> Path:
    """Write ``voices`` (name -> 1-D x-vector, numpy array or torch tensor) to the checkpoint;
    the first name becomes the default voice."""
    import numpy as np
    from safetensors.numpy import save_file

    if not voices:
        raise ValueError("save_voices needs at least one voice")
    arrays = {}
    for name, vector in voices.items():
        if not name or name != name.strip():
            raise ValueError(f"voice name {name!r} must be non-empty without surrounding spaces")
        if hasattr(vector, "detach"):
            vector = vector.detach().cpu().numpy()
        arrays[name] = np.ascontiguousarray(np.asarray(vector, dtype=np.float32).reshape(-1))
    path = voices_path(model_dir)
    save_file(arrays, str(path), metadata={ORDER_KEY: json.dumps(list(voices))})
    return path
