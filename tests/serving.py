"""A real ``omni serve`` process for the tests: started on a free loopback port, waited for
until its ready line, read and stopped like an operator would (SIGTERM).

    server = start_server(["--model", f"img={d}"], home=tmp_path)
    httpx.get(server.url + "/health")
    assert server.stop() == 0            # SIGTERM: drain, exit 0
    assert "ready" in server.stdout

The process runs this checkout's ``omni`` (the venv the tests run in). ``home`` holds its
config directory; ``cache`` (default: under ``home``) its cache, where the embedded defaults
are made: pass one shared directory to make them once per session. ``site`` directories
(fixture plugins installed with ``pip --target``) go on its ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OMNI = Path(sys.executable).parent / "omni"
#: the fixture plugin of the fault tests: an image family and a voice that fail on cue
FAULTS_FIXTURE = Path(__file__).parent / "fixtures" / "plugins" / "omni-fixture-serve-faults"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(home: Path, cache: Path | None = None, sites: Iterable[Path] = (), **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_") and k != "PYTHONPATH"}
    env.update(
        OMNI_CONFIG_DIR=str(home / "config"),
        OMNI_CACHE_DIR=str(cache or home / "cache"),
        PYTHONUNBUFFERED="1",
    )
    paths = [str(p) for p in sites]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    port: int
    stderr_path: Path
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stdout(self) -> str:
        return "\n".join(self.lines)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace") if self.stderr_path.exists() else ""

    def access_log(self) -> list[dict[str, object]]:
        """The server's request log lines (one JSON object per request)."""
        import json

        entries = []
        for line in self.stderr.splitlines():
            if line.startswith("{"):
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    continue
        return entries

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal the server and wait for it to exit; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(
                f"omni serve did not exit within {timeout} s of signal {sig}\n{self.stderr[-3000:]}"
            ) from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def launch(
    args: Iterable[str | Path],
    *,
    home: Path,
    cache: Path | None = None,
    sites: Iterable[Path] = (),
    port: int | None = None,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """Start ``omni serve ARGS --port PORT`` without waiting for it."""
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    stderr_path = home / f"serve-{port}.stderr"
    proc = subprocess.Popen(
        [str(OMNI), "serve", "--port", str(port), *[str(a) for a in args]],
        stdout=subprocess.PIPE,
        stderr=stderr_path.open("w"),
        stdin=subprocess.DEVNULL,
        text=True,
        env=env or server_env(home, cache, sites),
        cwd=home,
    )
    server = ServerProcess(proc, port, stderr_path)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            server.lines.append(line.rstrip("\n"))
            if "omni serve: ready" in line:
                server.ready.set()

    threading.Thread(target=read, daemon=True).start()
    return server


def start_server(
    args: Iterable[str | Path],
    *,
    home: Path,
    cache: Path | None = None,
    sites: Iterable[Path] = (),
    timeout: float = 180,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """Start ``omni serve`` and return once it printed its ready line (every model loaded)."""
    server = launch(args, home=home, cache=cache, sites=sites, env=env)
    deadline = time.monotonic() + timeout
    while not server.ready.wait(0.2):
        if server.proc.poll() is not None or time.monotonic() > deadline:
            server.kill()
            code = server.proc.returncode
            raise AssertionError(
                f"omni serve did not become ready (exit {code}):\n{server.stdout}\n{server.stderr[-4000:]}"
            )
    return server


# -- what the server's tests share -----------------------------------------------------------------


def make_tiny(family: str, directory: Path, home: Path, sites: Iterable[Path] = ()) -> Path:
    """``omni models make-tiny FAMILY DIRECTORY``, as a user runs it."""
    result = subprocess.run(
        [str(OMNI), "models", "make-tiny", family, str(directory)],
        env=server_env(home, sites=sites),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return directory


def client(server: ServerProcess, key: str = "unused") -> Any:
    """The official ``openai`` client, pointed at ``server``."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def pixels(b64: str) -> Any:
    """The RGB pixels of a base64 PNG, as a numpy array."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def assert_error(response: Any, status: int, *mentions: str, param: str | None = None) -> dict[str, Any]:
    """``response`` is the server's error: ``status``, the one error shape, words naming the
    cause (and the field), a request id, and never a stack trace."""
    assert response.status_code == status, response.text
    body = response.json()
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, body
    for mention in mentions:
        assert mention in error["message"], error["message"]
    if param is not None:
        assert error["param"] == param, error
    assert "Traceback" not in response.text and 'File "' not in response.text
    assert response.headers["x-request-id"].startswith("req_")
    return error


# -- a multi-stage model behind /v1/chat/completions --------------------------------------------------

#: the three-stage test pipeline (tokens -> hidden -> wave) the chat tests serve
PIPELINE_FIXTURE = Path(__file__).parent / "fixtures" / "plugins" / "omni-fixture-pipeline"
CHAT_MODEL = "chatty"
CHAT_MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say something"}]
#: what the chat tests need installed: the serve extra, torch and the connectors plugin
CHAT_NEEDS = ("fastapi", "torch", "httpx", "openai", "omni_plugin_connectors")


def chat_marks() -> list[Any]:
    """The chat test modules' ``pytestmark``: slow, and skipped, naming what is missing, where
    the environment lacks what they need (the core-only tox env)."""
    import importlib.util

    import pytest

    missing = [m for m in CHAT_NEEDS if importlib.util.find_spec(m) is None]
    return [
        pytest.mark.slow,
        pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}: the serve extra, torch, the connectors"),
    ]


#: the chat server's recipe: each stage its own process, streaming edges, and one request at
#: a time (so a request that is not let go is seen at once, as a 429)
CHAT_RECIPE = """\
pipeline:
  defaults: {placement: process}
  edge_defaults: {window: 1}
  max_requests: 1
"""


def post_chat(server: ServerProcess, body: dict[str, Any], **kwargs: Any) -> Any:
    import httpx

    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60, **kwargs)


def chat_events(server: ServerProcess, body: dict[str, Any]) -> tuple[Any, list[Any]]:
    """A streamed answer's response and its server-sent events, in order (``[DONE]`` as a str)."""
    import json

    import httpx

    got: list[Any] = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                got.append(data if data == "[DONE]" else json.loads(data))
    return r, got


def stage_processes(pid: int) -> list[int]:
    """The spawned processes (stage processes) of the process ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found
