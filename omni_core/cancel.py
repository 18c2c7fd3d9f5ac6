"""Cancelling work that is already running: a request whose client hung up, or that ran past
its deadline, stops at the next step instead of running to the end.

The caller that runs a job (the server's model worker) opens a :func:`cancellable` scope
around it; long loops inside engines and adapters call :func:`check_cancelled` between steps
(a diffusion engine once per denoising step, a streaming TTS adapter once per chunk). Outside
a scope :func:`check_cancelled` does nothing, so the offline API and the CLI are unaffected::

    token = CancelToken()
    with cancellable(token):
        engine.generate(request)      # raises RequestCancelled soon after token.cancel("...")

The scope is per thread (a context variable), so two models running side by side in two
worker threads never see each other's token.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator

from omni_core.errors import RequestCancelled

__all__ = ["CancelToken", "RequestCancelled", "cancellable", "check_cancelled", "current_token"]


class CancelToken:
    """Set once, from any thread; read by the running job between steps."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""
        #: how many times the job checked in: one per step, so a rough progress measure
        self.checks = 0

    def cancel(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise RequestCancelled(self.reason or "the request was cancelled")


_current: contextvars.ContextVar[CancelToken | None] = contextvars.ContextVar("omni_cancel_token", default=None)


@contextlib.contextmanager
def cancellable(token: CancelToken) -> Iterator[CancelToken]:
    """Make ``token`` the one :func:`check_cancelled` reads in this thread while the block runs."""
    reset = _current.set(token)
    try:
        yield token
    finally:
        _current.reset(reset)


def current_token() -> CancelToken | None:
    return _current.get()


def check_cancelled() -> None:
    """Raise :class:`RequestCancelled` if the job running in this thread was cancelled; a
    no-op outside a :func:`cancellable` scope. Cheap: call it once per step."""
    token = _current.get()
    if token is not None:
        token.checks += 1
        token.raise_if_cancelled()
