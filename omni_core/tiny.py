"""The tiny-checkpoint marker: one file, one format, read and written only here.

``omni models make-tiny`` (and the test helpers that make tiny checkpoints the same way)
writes ``omni-tiny.json`` next to the checkpoint's own files::

    {"family": "vits", "seed": 0, "provider": "omni-plugin-vits 0.1.0 (plugin 'vits')", "random_weights": true}

Runtimes read it to report ``random_weights`` (the CLI then says the output is noise, not
speech or pictures), and the embedded default is remade when its provider changes.
Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the marker's file name, inside the checkpoint directory
MARKER_FILENAME = "omni-tiny.json"


def write_marker(directory: Path | str, *, family: str, seed: int, provider: str) -> Path:
    """Write the marker of a tiny random-weight checkpoint of ``family`` into ``directory``
    (atomically: a reader never sees half a marker). Returns its path."""
    from omni_core.fsutil import atomic_write_text

    marker = {"family": family, "seed": seed, "provider": provider, "random_weights": True}
    return atomic_write_text(Path(directory) / MARKER_FILENAME, json.dumps(marker, indent=2) + "\n")


def read_marker(directory: Path | str) -> dict[str, Any] | None:
    """The marker of the checkpoint in ``directory``; None when there is none or it is not a
    JSON object (a checkpoint without a readable marker is treated as real weights)."""
    try:
        data = json.loads((Path(directory) / MARKER_FILENAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def has_random_weights(directory: Path | str) -> bool:
    """Whether the checkpoint in ``directory`` is a tiny one made by omni (random weights)."""
    return bool((read_marker(directory) or {}).get("random_weights"))
