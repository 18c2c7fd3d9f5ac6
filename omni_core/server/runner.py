"""Starting and stopping a server: what ``omni serve`` runs.

The order is chosen so that every mistake surfaces as early as it can:

1. the serving packages are importable (else: which to install);
2. every model directory is identified from its JSON files (a wrong path fails now, not after
   minutes of loading);
3. the port is bound (a taken port fails now, with the fix);
4. the app answers at once (``/health`` is 503 while loading) and the models load in the
   background, in turn; the ready line is printed when the last one is loaded, and a model
   that fails to load stops the server (exit 1) with the reason;
5. SIGTERM (or Ctrl-C): stop accepting, let in-flight requests and queued work finish for up
   to ``drain_timeout_s``, cancel what is left, exit 0 (130 for Ctrl-C).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from omni_core.errors import OmniError, ServerStartError
from omni_core.server.config import ServerConfig

log = logging.getLogger("omni.serve")

#: what ``omni serve`` imports -> the distribution that provides it (the ``serve`` extra)
_REQUIRED = {
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
    "prometheus_client": "prometheus-client",
    "python_multipart": "python-multipart",
    "numpy": "numpy",
    "PIL": "pillow",
    "imageio_ffmpeg": "imageio-ffmpeg",
    "soundfile": "soundfile",
}
#: the one fix for any of them (``omni doctor`` prints it too)
SERVE_FIX = "pip install 'omni-core[serve]'"


def missing_packages() -> list[str]:
    """The serving packages this environment lacks (``omni doctor`` reports them too)."""
    return [dist for module, dist in _REQUIRED.items() if not _importable(module)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        return False


def check_extras() -> None:
    missing = missing_packages()
    if missing:
        raise ServerStartError(
            f"omni serve needs {', '.join(missing)}, which this environment lacks: pip install 'omni-core[serve]'"
        )


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before any model loads; a taken port is a clear error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServerStartError(
            f"cannot listen on {host!r}: {exc.strerror}; pass --host an address of this machine"
        ) from None
    family, socktype, proto, _, address = infos[0]
    # with its protocol (IPPROTO_TCP) set, asyncio turns Nagle off on every connection; without
    # it a response's body waits for the client's delayed ACK (40 ms on every request)
    sock = socket.socket(family, socktype, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServerStartError(
                f"port {port} on {host} is already in use (another omni serve?); pick a free one with --port, "
                "or stop what listens there"
            ) from None
        if exc.errno == errno.EACCES:
            raise ServerStartError(
                f"no permission to listen on port {port}; ports below 1024 need privileges: use --port 8000 or above"
            ) from None
        raise ServerStartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _configure_logging() -> None:
    """omni's lines on stderr: one JSON line per request, errors as ``omni serve: ...``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access = logging.getLogger("omni.serve.access")
    access.handlers[:] = [handler]
    access.setLevel(logging.INFO)
    access.propagate = False
    errors = logging.StreamHandler(sys.stderr)
    errors.setFormatter(_ErrorFormatter("omni serve: %(levelname)s: %(message)s"))
    main = logging.getLogger("omni.serve")
    main.handlers[:] = [errors]
    main.setLevel(logging.INFO)
    main.propagate = False
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).setLevel(logging.WARNING)


class _ErrorFormatter(logging.Formatter):
    """Tracebacks in the log only with OMNI_DEBUG=1: the request id and the cause suffice."""

    def formatException(self, ei: Any) -> str:
        from omni_core.config import debugging

        return super().formatException(ei) if debugging() else ""

    def format(self, record: logging.LogRecord) -> str:
        record.levelname = record.levelname.lower()
        return super().format(record).rstrip()


def serve(config: ServerConfig, echo: Callable[[str], None] = print) -> int:
    """Run the server until SIGTERM or Ctrl-C; the exit status (0 drained, 130 Ctrl-C, 1 a
    model failed to load). Raises :class:`ServerStartError` (or the error identifying a model)
    before anything listens."""
    check_extras()
    import uvicorn

    from omni_core.server.app import create_app
    from omni_core.server.models import ModelTable

    _configure_logging()
    table = ModelTable(config)
    table.identify()
    sock = bind(config.host, config.port)
    app = create_app(config, table)
    state = app.state.omni
    uv_config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=max(1, round(config.drain_timeout_s)),
        timeout_keep_alive=5,
    )
    server = _Server(uv_config, on_signal=lambda: setattr(state, "draining", True))
    outcome: dict[str, int] = {"code": 0}

    def load() -> None:
        started = time.perf_counter()
        for model in table.models.values():
            echo(f"omni serve: loading {model.name}: {model.identity.describe()}")
            try:
                table.load(model, state.make_worker)
            except OmniError as exc:
                echo(f"omni serve: error: model {model.name!r} failed to load: {exc.message}")
                outcome["code"] = 1
                server.should_exit = True
                return
            except Exception as exc:  # a plugin's own failure, named
                echo(f"omni serve: error: model {model.name!r} failed to load: {type(exc).__name__}: {exc}")
                outcome["code"] = 1
                server.should_exit = True
                return
        names = ", ".join(table.models)
        seconds = time.perf_counter() - started
        echo(f"omni serve: ready in {seconds:.1f} s: {len(table.models)} model(s): {names}")

    url = url_of(sock)
    echo(f"omni serve: listening on {url} (playground: {url}/, API schema: {url}/openapi.json)")
    loader = threading.Thread(target=load, name="omni-load", daemon=True)
    loader.start()
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        drained = time.monotonic()
        state.draining = True
        table.close(timeout=max(0.0, config.drain_timeout_s))
        state.jobs.close()
        if server.signalled is not None:
            echo(f"omni serve: stopped ({time.monotonic() - drained:.1f} s to drain)")
    if outcome["code"]:
        return outcome["code"]
    return 130 if server.signalled == signal.SIGINT else 0


class _Server:
    """uvicorn's server, except that a signal ends it with omni's exit status instead of being
    raised again after the drain (uvicorn re-raises it, which makes a clean SIGTERM exit 143)."""

    def __new__(cls, config: Any, on_signal: Callable[[], None]) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            signalled: int | None = None

            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                handled = (signal.SIGINT, signal.SIGTERM)
                original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
                try:
                    yield
                finally:
                    for sig, handler in original.items():
                        signal.signal(sig, handler)

            def handle_exit(self, sig: int, frame: Any) -> None:
                if sig == signal.SIGINT:
                    from omni_core.guard import note_sigint

                    note_sigint()
                if self.signalled is None:
                    self.signalled = sig
                    on_signal()
                    log.info("draining: finishing in-flight requests (up to %s s)", config.timeout_graceful_shutdown)
                super().handle_exit(sig, frame)

        return Server(config)
