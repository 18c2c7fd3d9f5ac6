"""Keeping the model libraries' own chatter off an omni user's terminal.

diffusers and transformers print advisory warnings (an optional backend they fall back from)
and nested per-file progress bars while they load or save a checkpoint. To someone running
``omni generate`` or ``omni speak`` that is third-party noise: omni says what it loads itself,
and shows one bar for the load (diffusers' component bar, when progress is on) and one for the
work. Errors still reach the user: only what is below ERROR is silenced, only while the block
runs, and each library's settings are restored after it.

A library that is not installed is skipped; nothing is imported until the block is entered
(runtimes enter it right before they import those libraries anyway).

This module is omni's one switch for that noise. ``omni --verbose`` (:func:`set_verbose`)
turns it off: every block lets the libraries speak at their own settings. The command line
also calls :func:`quiet_warnings` once, because a library's ``warnings.warn`` (a deprecation,
an optional backend it falls back from) fires outside any block too: at import, on every call
from a plugin. omni itself never warns through ``warnings``; what it has to say, it prints.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import warnings
from collections.abc import Iterator
from typing import Any

#: the libraries' logging modules; each has get/set_verbosity and the progress-bar switches
_LIBRARIES = ("diffusers.utils.logging", "transformers.utils.logging")
_ERROR = 40  # logging.ERROR

_verbose = False


def set_verbose(on: bool) -> None:
    """``--verbose``: let the libraries' warnings, logs and progress bars through, for this process."""
    global _verbose
    _verbose = on


def is_verbose() -> bool:
    return _verbose


def quiet_warnings() -> None:
    """Ignore Python warnings for the rest of the process, unless ``--verbose`` was given or the
    user chose warnings themselves (``python -W``, ``PYTHONWARNINGS``): those win. For the command
    line only; a program using omni as a library keeps its own warning settings."""
    if not _verbose and not sys.warnoptions:
        warnings.simplefilter("ignore")


def _logging_module(name: str, imported_only: bool) -> Any:
    top = name.split(".")[0]
    try:
        if imported_only and top not in sys.modules:
            return None
        if importlib.util.find_spec(top) is None:
            return None
        return importlib.import_module(name)
    except Exception:  # a broken install: its own errors will show when it is really used
        return None


@contextlib.contextmanager
def quiet_libraries(progress: bool = False, *, imported_only: bool = False) -> Iterator[None]:
    """Silence the libraries' warnings and bars; keep diffusers' load bar when ``progress``.
    Does nothing under ``--verbose``. ``imported_only``: leave alone a library this process has
    not imported yet, for a runtime that cannot know whether its model uses it (importing
    diffusers imports torch: seconds, for a model that may not need either)."""
    if _verbose:
        yield
        return
    saved = []
    for name in _LIBRARIES:
        module = _logging_module(name, imported_only)
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
