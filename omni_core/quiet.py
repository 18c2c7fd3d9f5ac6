"""Keeping the model libraries' own chatter off an omni user's terminal.

diffusers and transformers print advisory warnings (an optional backend they fall back from)
and nested per-file progress bars while they load or save a checkpoint. To someone running
``omni generate`` or ``omni speak`` that is third-party noise: omni says what it loads itself,
and shows one bar for the load (diffusers' component bar, when progress is on) and one for the
work. Errors still reach the user: only what is below ERROR is silenced, only while the block
runs, and each library's settings are restored after it.

A library that is not installed is skipped; nothing is imported until the block is entered
(runtimes enter it right before they import those libraries anyway).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Iterator
from typing import Any

#: the libraries' logging modules; each has get/set_verbosity and the progress-bar switches
_LIBRARIES = ("diffusers.utils.logging", "transformers.utils.logging")
_ERROR = 40  # logging.ERROR


def _logging_module(name: str) -> Any:
    top = name.split(".")[0]
    try:
        if importlib.util.find_spec(top) is None:
            return None
        return importlib.import_module(name)
    except Exception:  # a broken install: its own errors will show when it is really used
        return None


@contextlib.contextmanager
def quiet_libraries(progress: bool = False) -> Iterator[None]:
    """Silence the libraries' warnings and bars; keep diffusers' load bar when ``progress``."""
    saved = []
    for name in _LIBRARIES:
        module = _logging_module(name)
        if module is None:
            continue
        saved.append((module, module.get_verbosity(), module.is_progress_bar_enabled()))
        module.set_verbosity(_ERROR)
        keep_bar = progress and name.startswith("diffusers")  # one bar per load, not one per file
        (module.enable_progress_bar if keep_bar else module.disable_progress_bar)()
    try:
        yield
    finally:
        for module, verbosity, bar in saved:
            module.set_verbosity(verbosity)
            (module.enable_progress_bar if bar else module.disable_progress_bar)()
