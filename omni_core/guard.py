"""Running plugin code so that nothing it raises can end omni, while the user's Ctrl-C still does.

``except Exception`` does not catch ``SystemExit`` or ``KeyboardInterrupt``, so a plugin that
calls ``sys.exit()`` (or raises ``KeyboardInterrupt`` itself) would end a command, or a
server, at once. :func:`contained` wraps every call into plugin code and turns both into
:class:`~omni_core.errors.PluginExitError`, an ordinary ``Exception`` that the caller records
against the plugin like any other failure.

Telling a plugin's ``KeyboardInterrupt`` from the user's Ctrl-C: Python raises
``KeyboardInterrupt`` for a SIGINT only through the SIGINT handler, which always runs in the
main thread. So omni wraps that handler (:func:`watch_sigint`) with one that counts each
SIGINT and then calls the original, unchanged. A ``KeyboardInterrupt`` caught in plugin code is
the user's when the count went up while that code ran, and the plugin's when it did not. Where
the count cannot be trusted, the user is believed, so a real Ctrl-C is never swallowed:

* in the main thread with our wrapper in place: trust the count;
* SIGINT ignored or left to the OS (``SIG_IGN`` / ``SIG_DFL``): no signal can raise it here,
  so it is the plugin's;
* in any other thread: signal handlers never run there, so it is the plugin's;
* someone replaced our wrapper since (a plugin, the embedding application): assume the user.

Standard library only: imported on the ``omni plugins list`` path.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from omni_core.errors import PluginExitError

#: SIGINTs delivered while our counting handler was installed, over the whole process
_SIGINTS = 0


class _CountingHandler:
    """Counts SIGINTs, then does whatever the handler it replaced did."""

    def __init__(self, previous: Callable[[int, FrameType | None], Any]) -> None:
        self.previous = previous

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        global _SIGINTS
        _SIGINTS += 1
        return self.previous(signum, frame)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def watch_sigint() -> None:
    """Start counting SIGINTs (main thread only; idempotent; the original handler still runs)."""
    if not _in_main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGINT)
        if isinstance(current, _CountingHandler) or not callable(current):
            return  # already counted, or no handler that could raise KeyboardInterrupt
        signal.signal(signal.SIGINT, _CountingHandler(current))
    except (ValueError, OSError):  # pragma: no cover - no signals here (some embedded interpreters)
        return


def sigint_count() -> int:
    return _SIGINTS


def note_sigint() -> None:
    """Count a SIGINT that a handler of its own received while it replaced ours (the server
    drains on Ctrl-C and then ends with 130: it was the user's)."""
    global _SIGINTS
    _SIGINTS += 1


def user_interrupted(since: int) -> bool:
    """Whether a ``KeyboardInterrupt`` caught now, in this thread, is the user's: a SIGINT
    arrived after :func:`sigint_count` returned ``since``, or that cannot be known."""
    if not _in_main_thread():
        return False  # handlers run in the main thread only: no signal raises it elsewhere
    try:
        current = signal.getsignal(signal.SIGINT)
    except (ValueError, OSError):  # pragma: no cover
        return True
    if isinstance(current, _CountingHandler):
        return _SIGINTS > since
    if current in (signal.SIG_IGN, signal.SIG_DFL):
        return False  # a SIGINT is ignored or kills the process: it never raises here
    return True  # our counter was replaced: believe the user


def _exit_text(code: object) -> str:
    return "sys.exit() was called" if code is None else f"sys.exit({code!r}) was called"


@contextlib.contextmanager
def contained() -> Iterator[None]:
    """Run plugin code: its ``SystemExit``, and a ``KeyboardInterrupt`` that is not the user's,
    become :class:`PluginExitError`; a real Ctrl-C goes on stopping omni."""
    watch_sigint()
    before = _SIGINTS
    try:
        yield
    except SystemExit as exc:
        raise PluginExitError(f"SystemExit: {_exit_text(exc.code)}") from exc
    except KeyboardInterrupt as exc:
        if user_interrupted(before):
            raise
        raise PluginExitError("KeyboardInterrupt, though no Ctrl-C was pressed") from exc
    except Exception:
        raise
    except BaseException as exc:  # a plugin's own BaseException subclass: still only its failure
        raise PluginExitError(f"{type(exc).__name__}: {exc}") from exc


def describe(exc: BaseException) -> str:
    """``Type: message`` for a failure in plugin code (a contained exit reads ``SystemExit: ...``)."""
    if isinstance(exc, PluginExitError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
