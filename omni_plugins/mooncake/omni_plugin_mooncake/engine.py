"""Mooncake's transfer engine as this connector uses it: importing it (with an error that says
what the machine lacks), starting one, and bounded transfers.

Facts about ``mooncake-transfer-engine`` 0.3.13 (checked on it, TCP over loopback) that shape
this module:

* ``batch_transfer_async_read/write`` returns a batch id, or **0** when it cannot even start
  (an unreachable peer); ``transfer_check_status(0)`` crashes the process, so 0 is never polled.
  ``transfer_check_status`` answers 1 (done), 0 (in flight), -1 (failed), -2 (the engine's own
  timeout) and frees a finished batch: its id is reused by the next batch, so an id is never
  polled again once it answered anything but 0.
* The first transfer to a peer opens its segment with a handshake that blocks the submitting
  call: up to ~60 s against a peer that accepts connections but does not answer (a stopped
  process), before returning 0. So the first submit to a session runs in a helper thread and
  the caller waits only as long as its own timeout.
* A transfer to a peer that stopped answering later stays in flight until the engine's own
  timeout (``MC_TRANSFER_TIMEOUT``, 30 s by default); one whose peer died fails at once. The
  blocking calls release the GIL.
* The peer checks every remote address against its registered buffers: an address outside
  them fails the transfer (-1) and never touches the peer's other memory.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from omni_core.errors import ConnectorError

#: what installs a working build, for the error messages
INSTALL_HINT = (
    "pip install 'omni-plugin-mooncake[cpu]' (mooncake-transfer-engine-non-cuda, any machine) or "
    "'omni-plugin-mooncake[cuda]' (mooncake-transfer-engine, CUDA 12 hosts); never both"
)

#: the longest poll interval of a transfer in flight
_POLL_MAX_S = 0.001


def import_problem(exc: BaseException) -> str:
    """Why ``mooncake.engine`` did not import, and what fixes it."""
    text = str(exc)
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "mooncake":
        return f"Mooncake's transfer engine is not installed ({text}): {INSTALL_HINT}"
    if "libibverbs" in text or "libmlx5" in text or "librdmacm" in text:
        return (
            f"mooncake.engine does not load: {text}. Every Mooncake wheel links rdma-core's user-space "
            "library libibverbs.so.1, even for protocol 'tcp' and on machines without RDMA hardware: "
            "install it (Debian/Ubuntu: apt-get install libibverbs1; RHEL/Fedora: dnf install libibverbs)"
        )
    if "libcudart" in text or "libcuda.so" in text or "libnvidia" in text:
        return (
            f"mooncake.engine does not load: {text}. This is the CUDA build of Mooncake "
            "(mooncake-transfer-engine), which needs the CUDA 12 runtime and the NVIDIA driver; this "
            "connector only moves host memory, so on a machine without them use the CPU build: "
            "pip uninstall -y mooncake-transfer-engine && pip install mooncake-transfer-engine-non-cuda"
        )
    return f"mooncake.engine does not load: {type(exc).__name__}: {text} ({INSTALL_HINT})"


def engine_class() -> Any:
    """``mooncake.engine.TransferEngine``; ImportError with :func:`import_problem`'s text."""
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise ImportError(import_problem(exc)) from exc
    return TransferEngine


def engine_problem() -> str | None:
    """None when ``mooncake.engine`` imports here, else why not (for ``health`` and test skips)."""
    try:
        engine_class()
    except ImportError as exc:
        return str(exc)
    return None


def rdma_devices(topology: str) -> list[str]:
    """The RDMA devices in the engine's topology (``{"cpu:0": [[preferred...], [available...]], ...}``)."""
    try:
        entries = json.loads(topology)
    except ValueError:
        return []
    found: set[str] = set()
    if not isinstance(entries, dict):
        return []
    for lists in entries.values():
        if not isinstance(lists, list):
            continue
        for names in lists:
            if isinstance(names, list):
                found.update(name for name in names if isinstance(name, str))
    return sorted(found)


def transfer_failed(message: str, *, abandoned: bool = False) -> ConnectorError:
    """A transfer that did not complete, as the core's :class:`ConnectorError` marked
    ``transfer_failed``; ``abandoned`` when it may still be in flight (past the caller's deadline),
    so its local buffer must stay alive until the engine gives it up."""
    error = ConnectorError(message)
    error.transfer_failed = True  # type: ignore[attr-defined]
    error.abandoned = abandoned  # type: ignore[attr-defined]
    return error


class Engine:
    """One started ``TransferEngine`` and the sessions it has reached before."""

    def __init__(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> None:
        cls = engine_class()
        self.protocol = protocol
        self._te: Any = cls()
        rc = self._te.initialize(local_hostname, metadata_server, protocol, device_name)
        if rc != 0:
            self._te = None
            raise RuntimeError(
                f"TransferEngine.initialize(local_hostname={local_hostname!r}, metadata_server={metadata_server!r}, "
                f"protocol={protocol!r}, device_name={device_name!r}) returned {rc}"
            )
        if protocol == "rdma":
            # with no RDMA device the engine starts anyway and moves data some other way: refuse
            devices = rdma_devices(self._te.get_local_topology())
            if not devices:
                self._te = None
                raise RuntimeError(
                    f"protocol 'rdma' (device_name={device_name!r}), but the transfer engine found no RDMA "
                    "device on this machine (check `ibv_devices`), so it would not use RDMA; use protocol 'tcp'"
                )
        self.rpc_port = int(self._te.get_rpc_port())
        #: sessions a transfer completed with: their segment is open, so a submit does not block
        self._reached: set[str] = set()
        self._lock = threading.Lock()

    # -- memory ---------------------------------------------------------------------------------

    def register(self, addr: int, length: int) -> None:
        te = self._te
        if te is None:
            raise RuntimeError("the transfer engine is closed")
        rc = te.register_memory(addr, length)
        if rc != 0:
            raise RuntimeError(f"TransferEngine.register_memory of {length:,} bytes returned {rc}")

    def unregister(self, addr: int) -> None:
        te = self._te
        if te is not None:
            te.unregister_memory(addr)

    # -- transfers ------------------------------------------------------------------------------

    def read(self, session: str, local: int, remote: int, length: int, deadline: float) -> None:
        """Copy ``length`` bytes at the peer's ``remote`` into local memory at ``local``."""
        self._transfer("read", session, local, remote, length, deadline)

    def write(self, session: str, local: int, remote: int, length: int, deadline: float) -> None:
        """Copy ``length`` bytes at ``local`` into the peer's memory at ``remote``."""
        self._transfer("write", session, local, remote, length, deadline)

    def _transfer(self, op: str, session: str, local: int, remote: int, length: int, deadline: float) -> None:
        te = self._te  # held for the whole transfer: a concurrent close() cannot pull it away
        if te is None:
            raise transfer_failed("the transfer engine is closed")
        submit = getattr(te, f"batch_transfer_async_{op}")
        with self._lock:
            reached = session in self._reached
        if reached:
            batch = submit(session, [local], [remote], [length])
        else:
            batch = self._submit_bounded(submit, session, local, remote, length, deadline)
        if batch <= 0:
            raise transfer_failed(
                f"the transfer engine could not start a transfer with {session} (returned {batch}): the "
                "producing process is gone, or unreachable from here"
            )
        pause = 0.00002
        while True:
            status = te.transfer_check_status(batch)
            if status == 1:
                with self._lock:
                    self._reached.add(session)
                return
            if status != 0:
                cause = "the engine's own timeout (MC_TRANSFER_TIMEOUT)" if status == -2 else f"status {status}"
                raise transfer_failed(
                    f"the transfer with {session} failed ({cause}): the producing process is gone or stopped "
                    "answering, or the payload is no longer where the handle says"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise transfer_failed(f"the transfer with {session} did not finish in time", abandoned=True)
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, _POLL_MAX_S)

    def _submit_bounded(
        self, submit: Callable[..., int], session: str, local: int, remote: int, length: int, deadline: float
    ) -> int:
        """The first submit to ``session`` opens its segment (a handshake that may block for a
        minute): run it in a helper thread and wait no longer than ``deadline``."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["batch"] = submit(session, [local], [remote], [length])
            except BaseException as exc:  # pragma: no cover - the binding returns codes
                box["error"] = exc

        thread = threading.Thread(target=run, name="omni-mooncake-handshake", daemon=True)
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            raise transfer_failed(
                f"the handshake with {session} did not finish in time (the producing process accepts "
                "connections but does not answer: stopped, or overloaded)",
                abandoned=True,
            )
        if "error" in box:
            raise transfer_failed(f"the transfer engine refused a transfer with {session}: {box['error']}")
        return int(box["batch"])

    def close(self) -> None:
        """Stop the engine (its listeners and threads; takes about a second)."""
        self._te = None  # the binding's destructor stops it once no helper thread holds it
