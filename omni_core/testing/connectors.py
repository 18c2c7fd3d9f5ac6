"""The conformance kit's connector check: the contract of :mod:`omni_core.pipeline.connector`,
and a real transport.

:func:`connector_problems` (``CAPABILITY_CHECKS[Kind.CONNECTOR]``) checks the class, then moves
payloads through it the way a pipeline does:

* The class subclasses :class:`~omni_core.pipeline.connector.Connector` and implements every
  abstract method; its ``options_type`` subclasses
  :class:`~omni_core.pipeline.connector.ConnectorOptions`, refuses an unknown option, and has
  a default for every option (a recipe that names the connector without ``extra`` builds it
  with ``{}``, and so does the kit).
* **In this process**: an owner instance (``is_owner=True``, as the orchestrator builds it) and
  a second instance of the same run (``is_owner=False``, a stage) send each other a small
  nested payload (a dict with a list, a tuple, bytes, ints, floats, str, None, bools, and a
  numpy array and a torch tensor when those can be imported) and a *stored* one of over 1 MiB
  (past any inline threshold a connector has by default). Each arrives equal, with its type;
  its handle is a dict of plain values whose ``"nbytes"`` is the payload's encoded size; a
  second get of a stored payload's handle raises ConnectorError (read once). A handle that
  carries its payload inline (it holds the frame's bytes) is exempt from that: reading it
  twice decodes it twice, as the contract allows.
* Malformed handles (``{}``, ``{"nbytes": "x"}``) raise ConnectorError; a stored payload whose
  request was cleaned up on both ends is gone (ConnectorError); ``cleanup`` of a request
  nobody knows does not raise; ``health()`` is ``{"ok": True, ...}``; a payload over
  ``max_payload_bytes`` is refused with PayloadError; ``close()`` twice does not raise.
* **Across processes** (unless ``same_process_only``): the same exchange with a second
  instance in a process started with ``multiprocessing``'s ``spawn`` (a fresh interpreter, as
  a stage process is), which imports the class by its ``module:QualName``.

Every run id is new (``kit`` and 16 hex digits), every put and get has a timeout, the spawned
process is waited for within a bound and killed past it, and every instance is closed, the
owner last, so nothing of the check outlives it.

For a connector's own tests (its failure modes, its large payloads, its processes):
:func:`payload_cases` (seeded payloads of several dtypes and layouts; needs torch and numpy),
:func:`big_payload` (a tensor of any size, 256 MiB included, cheap to build),
:func:`payload_case` (either, by name), :func:`assert_same` (fails naming where a payload
arrived changed) and :class:`ConnectorProcess` (an instance of the connector in a spawned
process, as a stage's is, putting and getting payloads by case name on command)::

    from omni_core.testing.connectors import ConnectorProcess, assert_same, payload_cases

    def test_payloads_put_by_a_stage_process_arrive_here(run_id):
        here = MyConnector({}, ConnectorContext(run_id=run_id, owner="orchestrator", is_owner=True))
        with ConnectorProcess(MyConnector, run_id) as stage:
            for name in payload_cases():
                handle, _ = stage.put(EDGE, "req-1", name)
                assert_same(here.get(EDGE, "req-1", handle, timeout=10), payload_cases()[name], name)
        here.close()
"""

from __future__ import annotations

import functools
import importlib.util
import math
import multiprocessing
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from omni_core.errors import ConnectorError, PayloadError
from omni_core.kinds import Kind
from omni_core.pipeline.connector import Connector, ConnectorContext, ConnectorOptions, Edge

if TYPE_CHECKING:
    import torch

#: seconds each put and get of the check may take
TRANSFER_TIMEOUT_S = 10.0
#: seconds the spawned process gets to start (a fresh interpreter, importing the connector and
#: maybe torch) and to answer each step
CHILD_TIMEOUT_S = 120.0
#: the stored payload's size: over the default inline thresholds (64 KiB for shm and tcp)
STORED_BYTES = 1 << 20
#: the edges payloads travel on: one way, and back
FORWARD = Edge("kit_source", "kit_target")
BACKWARD = Edge("kit_target", "output")
#: a request id with characters a connector must make name-safe itself
REQUEST_ID = "kit-request/1 ✓"
MALFORMED_HANDLES: tuple[dict[str, Any], ...] = ({}, {"nbytes": "x"})
_PLAIN = (str, int, float, bool, type(None), bytes)


def _importable(module: str) -> bool:
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def sample_payloads(with_numpy: bool, with_torch: bool) -> dict[str, Any]:
    """The payloads the check sends: ``small`` (nested, every plain type) and ``stored`` (over
    :data:`STORED_BYTES`). The same values in every process: nothing random."""
    small: dict[Any, Any] = {
        "ints": [0, -7, 2**40, 2**70],
        "floats": (0.25, -1.5e300, math.inf),
        "text": "omni payload ✓",
        "raw": b"\x00\xffomni",
        "flags": [True, False, None],
        "nested": {"empty_list": [], "empty_tuple": (), 3: "an int key", "deeper": [{"a": (1, [2.5])}]},
    }
    stored: dict[str, Any] = {"blob": bytes(range(256)) * (STORED_BYTES // 256 + 1), "tag": "stored"}
    if with_numpy:
        import numpy as np

        small["array"] = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        stored["array"] = np.arange(4096, dtype=np.int64)
    if with_torch:
        import torch

        small["tensor"] = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 4
        stored["tensor"] = torch.arange(4096, dtype=torch.int32)
    return {"small": small, "stored": stored}


def difference(got: Any, want: Any, where: str = "payload") -> str | None:
    """Where ``got`` differs from ``want`` (values, types, dtypes, shapes), or None."""
    module = type(want).__module__.split(".")[0]
    if module == "numpy":
        np = sys.modules["numpy"]
        if type(got) is not np.ndarray:
            return f"{where} is a {type(got).__name__}, not a numpy array"
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"{where} is {got.dtype}{list(got.shape)}, not {want.dtype}{list(want.shape)}"
        return None if np.array_equal(got, want) else f"{where}: the array's values differ"
    if module == "torch":
        torch = sys.modules["torch"]
        if not isinstance(got, torch.Tensor):
            return f"{where} is a {type(got).__name__}, not a torch tensor"
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"{where} is {got.dtype}{list(got.shape)}, not {want.dtype}{list(want.shape)}"
        return None if torch.equal(got, want) else f"{where}: the tensor's values differ"
    if type(got) is not type(want):
        return f"{where} is a {type(got).__name__}, not a {type(want).__name__}"
    if isinstance(want, dict):
        if list(got) != list(want):
            return f"{where} has the keys {list(got)!r:.200}, not {list(want)!r:.200}"
        for key in want:
            found = difference(got[key], want[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return f"{where} has {len(got)} items, not {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            found = difference(g, w, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if got == want else f"{where} is {got!r:.80}, not {want!r:.80}"


def payload_cases() -> dict[str, Any]:
    """Payloads for a connector's own tests, by case name: torch tensors of several dtypes
    (float16, float32, bfloat16, int64 beyond 32 bits, a 0-d, a non-contiguous and an empty
    one), numpy arrays (float64, uint8, bool, non-contiguous, Fortran-ordered), empty bytes, a
    nested dict of tensors, arrays, lists, tuples and plain values, and ``large`` (2 MiB, past
    a default inline threshold). Seeded: every process builds the same values, so a spawned
    process compares what it got with its own copy. Needs torch and numpy."""
    import numpy as np
    import torch

    gen = torch.Generator().manual_seed(1234)
    rng = np.random.default_rng(1234)
    return {
        "float16": torch.randn(64, 33, generator=gen).half(),
        "float32": torch.randn(3, 5, 7, generator=gen),
        "bfloat16": torch.randn(1000, generator=gen).to(torch.bfloat16),
        "int64": torch.arange(-500, 500, dtype=torch.int64) * (2**40),
        "zero_dim": torch.tensor(3.5),
        "non_contiguous": torch.arange(120, dtype=torch.float32).reshape(10, 12).t()[::2],
        "empty_tensor": torch.empty(0, 4),
        "zero_bytes": b"",
        "numpy_float64": rng.standard_normal((17, 3)),
        "numpy_uint8": rng.integers(0, 255, size=(4, 4, 3), dtype=np.uint8),
        "numpy_non_contiguous": np.arange(60, dtype=np.int32).reshape(6, 10)[:, ::3],
        "numpy_bool": rng.integers(0, 2, size=50).astype(bool),
        "numpy_fortran": np.asfortranarray(rng.standard_normal((64, 48)).astype(np.float32)),
        "nested": {
            "audio": torch.randn(2, 480, generator=gen),
            "meta": {"sample_rate": 24000, "speaker": "Ethan", "done": False, "score": 0.25, "none": None},
            "codes": [np.arange(5, dtype=np.int16), torch.ones(3, dtype=torch.int32), b"\x00\xffraw"],
            "pair": (1, "two"),
        },
        "large": torch.randn(512, 1024, generator=gen),  # 2 MiB: over the inline threshold
    }


def assert_same(got: Any, want: Any, where: str = "payload") -> None:
    """Raise AssertionError, naming the place, unless ``got`` arrived as ``want`` was put: the
    same container types and keys in order, dtypes, shapes and values (bit-exact for floats),
    as :func:`difference` compares them. For a connector's own tests and the processes they spawn."""
    found = difference(got, want, where)
    if found is not None:
        raise AssertionError(found)


def big_payload(nbytes: int) -> torch.Tensor:
    """An int32 tensor of ``nbytes`` bytes (a multiple of 4) counting up from 0: every element
    differs, so a misplaced page shows, and 256 MiB of it builds in a fraction of a second, the
    same in every process. Needs torch."""
    import torch

    if nbytes < 0 or nbytes % 4:
        raise ValueError(f"big_payload needs a multiple of 4 bytes, not {nbytes:,}")
    return torch.arange(nbytes // 4, dtype=torch.int32)


def payload_case(name: str) -> Any:
    """One payload by name, the same in every process: a case of :func:`payload_cases`, or
    ``big_<MiB>`` (:func:`big_payload` of that many MiB, ``big_256``). What
    :class:`ConnectorProcess` builds by default."""
    if name.startswith("big_") and name[4:].isdigit():
        return big_payload(int(name[4:]) << 20)
    cases = payload_cases()
    if name not in cases:
        raise KeyError(f"no payload case {name!r}: one of {sorted(cases)}, or big_<MiB>")
    return cases[name]


def serve_connector(
    conn: Any,
    connector: type[Connector],
    context: ConnectorContext,
    extra: dict[str, Any],
    payloads: Callable[[Any], Any],
) -> None:  # pragma: no cover - runs in the spawned process; its answers are checked by the parent
    """The body of a :class:`ConnectorProcess`: build the connector, say ``("ready", pid)``, then
    run the parent's commands until ``stop`` (close the connector) or ``leave`` (exit without
    closing it, as a stage that crashed or forgot). Each answer is ``("ok", value)`` or
    ``("error", "Type: message and traceback")``."""
    instance = None
    leave = False
    kept: tuple[Any, Any] | None = None  # the last case put: a case put again is not rebuilt

    def build(case: Any) -> Any:
        nonlocal kept
        if kept is None or kept[0] != case:
            kept = None  # free the previous payload first
            kept = (case, payloads(case))
        return kept[1]

    try:
        try:
            instance = connector(extra, context)
        except BaseException as exc:
            conn.send(("error", f"{_raised(exc)}\n{traceback.format_exc(limit=-3)}"))
            return
        conn.send(("ready", os.getpid()))
        while True:
            try:
                command = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            op, args = command[0], command[1:]
            try:
                if op == "stop":
                    return
                if op == "leave":
                    leave = True
                    conn.send(("ok", None))
                    return
                if op == "put":
                    edge, request_id, case, timeout = args
                    payload = build(case)
                    start = time.perf_counter()
                    handle = instance.put(edge, request_id, payload, timeout=timeout)
                    conn.send(("ok", (handle, time.perf_counter() - start)))
                elif op == "get":
                    edge, request_id, handle, case, timeout = args
                    start = time.perf_counter()
                    got = instance.get(edge, request_id, handle, timeout=timeout)
                    seconds = time.perf_counter() - start
                    assert_same(got, payloads(case), str(case))
                    del got
                    conn.send(("ok", seconds))
                elif op == "cleanup":
                    instance.cleanup(args[0])
                    conn.send(("ok", None))
                elif op == "health":
                    conn.send(("ok", instance.health()))
                else:
                    conn.send(("error", f"KeyError: no command {op!r}"))
            except BaseException as exc:
                conn.send(("error", f"{_raised(exc)}\n{traceback.format_exc(limit=-3)}"))
    finally:
        if instance is not None and not leave:
            instance.close()
        conn.close()


class ConnectorProcess:
    """An instance of ``connector`` in a process of its own, started with ``multiprocessing``'s
    ``spawn`` (a fresh interpreter, as a pipeline's stage process is), driven from this one.

    The payloads never cross the control pipe: each side builds a case by its name with
    ``payloads`` (:func:`payload_case` by default; any function defined at a module's top
    level, taking the name), so only names, handles and timings travel. ``put`` answers the
    handle and the seconds the put took there; ``get`` gets a handle there and compares what
    arrived with its own copy of the case (:func:`assert_same`). A command that raises there,
    a process that dies or does not answer within ``answer_timeout`` fails with
    AssertionError, naming what happened. ``stop()`` (or leaving the ``with`` block) closes the
    connector and ends the process, killing it past the bound; ``leave()`` ends it without
    closing the connector, so what it put must outlive it. ``process`` is the
    ``multiprocessing`` process (``kill()`` it to test a crash), ``pid`` its id.

    ``connector`` is the class, defined at a module's top level (the process imports it by
    name); it is built as ``connector(extra, ConnectorContext(run_id, owner, is_owner))``.
    """

    def __init__(
        self,
        connector: type[Connector],
        run_id: str,
        extra: dict[str, Any] | None = None,
        *,
        owner: str = "stage",
        is_owner: bool = False,
        payloads: Callable[[Any], Any] = payload_case,
        answer_timeout: float = CHILD_TIMEOUT_S,
        wait: bool = True,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.answer_timeout = answer_timeout
        self.conn, theirs = context.Pipe()
        self.process = context.Process(
            target=serve_connector,
            args=(
                theirs,
                connector,
                ConnectorContext(run_id=run_id, owner=owner, is_owner=is_owner),
                extra or {},
                payloads,
            ),
            name=f"omni-connector-{owner}",
            daemon=True,
        )
        self.process.start()
        theirs.close()
        self._pid: int | None = None
        if wait:
            self.ready()

    def ready(self) -> int:
        """Wait until the process has built its connector; its pid. ``wait=False`` at
        construction defers this, to start several processes at once."""
        if self._pid is None:
            status, value = self._receive("to start and build its connector")
            if status != "ready":
                self._fail(f"the connector process could not build its connector: {value}")
            self._pid = int(value)
        return self._pid

    @property
    def pid(self) -> int:
        return self.ready()

    def put(self, edge: Edge, request_id: str, case: Any, *, timeout: float = 30.0) -> tuple[dict[str, Any], float]:
        """Put the payload ``case`` there: its handle, and the seconds the put took."""
        handle, seconds = self._call(("put", edge, request_id, case, timeout), f"a put of {case!r}")
        return handle, seconds

    def get(self, edge: Edge, request_id: str, handle: dict[str, Any], case: Any, *, timeout: float = 30.0) -> float:
        """Get ``handle`` there and check it arrived as the payload ``case``: the get's seconds."""
        seconds: float = self._call(("get", edge, request_id, handle, case, timeout), f"a get of {case!r}")
        return seconds

    def cleanup(self, request_id: str) -> None:
        self._call(("cleanup", request_id), f"cleanup({request_id!r})")

    def health(self) -> dict[str, Any]:
        health: dict[str, Any] = self._call(("health",), "health()")
        return health

    def leave(self) -> None:
        """End the process without closing its connector (``process.join`` waits for its exit)."""
        self._call(("leave",), "leave")

    def stop(self) -> None:
        """Close the connector and end the process (killed past the bound); idempotent."""
        if self.process.is_alive():
            try:
                self.conn.send(("stop",))
            except OSError:
                pass
            self.process.join(self.answer_timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
        self.conn.close()

    def __enter__(self) -> ConnectorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, command: tuple[Any, ...], what: str) -> Any:
        self.ready()
        self.conn.send(command)
        status, value = self._receive(what)
        if status != "ok":
            raise AssertionError(f"in the connector process, {what}: {value}")
        return value

    def _receive(self, what: str) -> Any:
        """The next answer; fails when the process ends or stays silent past the bound."""
        deadline = time.monotonic() + self.answer_timeout
        while not self.conn.poll(0.1):
            if not self.process.is_alive() and not self.conn.poll(0):
                self._fail(f"the connector process exited with {self.process.exitcode} without answering {what}")
            if time.monotonic() > deadline:
                self.process.kill()
                self._fail(f"the connector process did not answer {what} within {self.answer_timeout:g} s")
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self._fail(f"the connector process ended without answering {what}")

    def _fail(self, message: str) -> NoReturn:
        raise AssertionError(message)  # a check that failed, in the test that drives the process


def handle_problems(handle: Any, nbytes: int) -> list[str]:
    """What is wrong with a handle ``put`` returned for a payload of ``nbytes`` encoded bytes."""
    if not isinstance(handle, dict):
        return [f"put returned a {type(handle).__name__}, not a handle (a dict of plain values with 'nbytes')"]
    problems = []
    size = handle.get("nbytes")
    if type(size) is not int:
        problems.append(f"the handle's 'nbytes' is {size!r:.40}, not an int (the payload's encoded size)")
    elif size != nbytes:
        problems.append(f"the handle's 'nbytes' is {size:,}, but the payload's encoded size is {nbytes:,}")

    def plain(value: Any, where: str) -> str | None:
        if isinstance(value, dict):
            for key, item in value.items():
                if type(key) is not str:
                    return f"{where} has the key {key!r:.40}, not a str"
                found = plain(item, f"{where}[{key!r}]")
                if found:
                    return found
            return None
        if isinstance(value, list):
            return next((f for i, v in enumerate(value) if (f := plain(v, f"{where}[{i}]"))), None)
        if type(value) in _PLAIN:
            return None
        return (
            f"{where} is a {type(value).__name__}: a handle holds str, int, float, bool, None, bytes, "
            "and lists and dicts of them (it crosses processes as JSON or msgpack)"
        )

    found = plain(handle, "handle")
    if found:
        problems.append(f"the handle is not plain: {found}")
    return problems


def is_inline(handle: dict[str, Any]) -> bool:
    """True when the handle carries its payload: it holds the frame's bytes (``nbytes`` of them).
    Such a handle is read as often as it is passed to ``get``: read-once is for stored payloads."""
    nbytes = handle.get("nbytes")

    def carries(value: Any) -> bool:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return len(value) == nbytes
        if isinstance(value, dict):
            return any(carries(v) for v in value.values())
        if isinstance(value, list):
            return any(carries(v) for v in value)
        return False

    return carries(handle)


def _encoded_size(payload: Any) -> int:
    from omni_core.pipeline.payload import encode

    return encode(payload).nbytes


def _raised(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _expect_connector_error(call: Callable[[], Any], what: str) -> str | None:
    """None when ``call`` raises ConnectorError, else what it did instead."""
    try:
        call()
    except ConnectorError:
        return None
    except Exception as exc:
        return f"{what} raised {_raised(exc)}, not ConnectorError"
    return f"{what} returned instead of raising ConnectorError"


class _Exchange:
    """The steps of one check on two instances, each problem prefixed with where it happened."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.problems: list[str] = []

    def problem(self, text: str) -> None:
        text = f"{self.label}: {text}"
        if text not in self.problems:  # the same fault in several steps is named once
            self.problems.append(text)

    def put(self, conn: Connector, edge: Edge, payload: Any, what: str) -> dict[str, Any] | None:
        try:
            handle = conn.put(edge, REQUEST_ID, payload, timeout=TRANSFER_TIMEOUT_S)
        except Exception as exc:
            self.problem(f"put of the {what} raised {_raised(exc)}")
            return None
        found = handle_problems(handle, _encoded_size(payload))
        for text in found:
            self.problem(f"put of the {what}: {text}")
        return dict(handle) if isinstance(handle, dict) else None

    def get(self, conn: Connector, edge: Edge, handle: dict[str, Any], payload: Any, what: str) -> None:
        """Get ``handle`` and compare; a stored payload's handle must then be gone."""
        try:
            got = conn.get(edge, REQUEST_ID, handle, timeout=TRANSFER_TIMEOUT_S)
        except Exception as exc:
            self.problem(f"get of the {what} raised {_raised(exc)}")
            return
        found = difference(got, payload)
        if found:
            self.problem(f"the {what} did not arrive as it was put: {found}")
        if is_inline(handle):
            return  # an inline handle carries its payload: a second get decodes it again
        found = _expect_connector_error(
            lambda: conn.get(edge, REQUEST_ID, handle, timeout=TRANSFER_TIMEOUT_S),
            f"a second get of the handle of the {what}",
        )
        if found:
            self.problem(f"{found}; each stored payload is read once (the first get takes it)")


def _label(entry_name: str, where: str) -> str:
    return f"connector {entry_name!r} ({where})"


def _run_id() -> str:
    return f"kit{uuid.uuid4().hex[:16]}"


def _close(conn: Connector, label: str, problems: list[str]) -> None:
    for attempt in ("close()", "a second close()"):
        try:
            conn.close()
        except Exception as exc:
            text = f"{label}: {attempt} raised {_raised(exc)}; close is idempotent and never raises"
            if text not in problems:
                problems.append(text)
            return


def _build(cls: type[Connector], extra: dict[str, Any], run_id: str, owner: str, is_owner: bool) -> Connector:
    return cls(extra, ConnectorContext(run_id=run_id, owner=owner, is_owner=is_owner))


def class_problems(name: str, ref: str, obj: Any) -> list[str]:
    """What the class itself gets wrong (nothing is built)."""
    label = f"connector {name!r}"
    if not (isinstance(obj, type) and issubclass(obj, Connector)):
        return [
            f"{label}: {ref} is not a subclass of omni_core.pipeline.connector.Connector: subclass it and "
            "implement put, get, cleanup and close (docs/authoring/connectors.md)"
        ]
    if getattr(obj, "__abstractmethods__", None):
        return [f"{label}: {obj.__name__} leaves {sorted(obj.__abstractmethods__)} unimplemented"]
    options = getattr(obj, "options_type", None)
    if not (isinstance(options, type) and issubclass(options, ConnectorOptions)):
        return [
            f"{label}: {obj.__name__}.options_type is {options!r:.80}, not a subclass of "
            "omni_core.pipeline.connector.ConnectorOptions (the pydantic model of its extra options)"
        ]
    problems = []
    if not isinstance(getattr(obj, "same_process_only", None), bool):
        problems.append(f"{label}: {obj.__name__}.same_process_only must be True or False")
    try:
        obj.validate_options({"kit_no_such_option": 1})
        problems.append(
            f"{label}: {options.__name__} accepts an unknown option; keep ConnectorOptions' extra='forbid' so a "
            "recipe's typo is an error naming the field"
        )
    except Exception:
        pass
    try:
        obj.validate_options({})
    except Exception as exc:
        problems.append(
            f"{label}: {options.__name__} needs options ({_raised(exc)}); give every option a default: a recipe "
            "that names the connector on an edge builds it with no extra"
        )
    return problems


def transport_here(cls: type[Connector], name: str) -> list[str]:
    """Both ends in this process: an owner instance and a stage's instance of one run."""
    label = _label(name, "two instances in one process")
    ex = _Exchange(label)
    payloads = sample_payloads(_importable("numpy"), _importable("torch"))
    run_id = _run_id()
    built: list[Connector] = []
    try:
        owner = _build(cls, {}, run_id, "orchestrator", True)
        built.append(owner)
        stage = _build(cls, {}, run_id, "kit_stage", False)
        built.append(stage)
        for conn, who in ((owner, "the owner"), (stage, "a stage")):
            health = conn.health()
            if not (isinstance(health, dict) and health.get("ok") is True):
                ex.problem(f"health() of {who}'s new instance is {health!r:.200}, not a dict with 'ok': True")
        # a stage hands the orchestrator its output, and the other way round
        for producer, consumer in ((stage, owner), (owner, stage)):
            for kind in ("small", "stored"):
                what = f"{kind} payload"
                handle = ex.put(producer, FORWARD, payloads[kind], what)
                if handle is not None:
                    ex.get(consumer, FORWARD, handle, payloads[kind], what)
        for malformed in MALFORMED_HANDLES:
            found = _expect_connector_error(
                functools.partial(owner.get, FORWARD, REQUEST_ID, malformed, timeout=TRANSFER_TIMEOUT_S),
                f"get of the malformed handle {malformed!r}",
            )
            if found:
                ex.problem(found)
        # a request that failed: both ends clean up, and its unread payload is gone
        handle = ex.put(stage, FORWARD, payloads["stored"], "stored payload of a failed request")
        for conn in (stage, owner):
            try:
                conn.cleanup(REQUEST_ID)
            except Exception as exc:
                ex.problem(f"cleanup of a request raised {_raised(exc)}; cleanup never raises")
        if handle is not None and not is_inline(handle):
            gone = handle
            found = _expect_connector_error(
                lambda: owner.get(FORWARD, REQUEST_ID, gone, timeout=TRANSFER_TIMEOUT_S),
                "get of a stored payload after cleanup(request) on both ends",
            )
            if found:
                ex.problem(f"{found}; cleanup frees a request's payloads, read or not")
        for conn in (owner, stage):
            try:
                conn.cleanup("kit-unknown-request")
            except Exception as exc:
                ex.problem(f"cleanup of a request it never saw raised {_raised(exc)}; cleanup never raises")
        limited = _build(cls, {"max_payload_bytes": 16}, run_id, "kit_limited", False)
        built.append(limited)
        try:
            limited.put(FORWARD, REQUEST_ID, payloads["small"], timeout=TRANSFER_TIMEOUT_S)
            ex.problem("put of a payload over max_payload_bytes (16) returned instead of raising PayloadError")
        except PayloadError:
            pass
        except Exception as exc:
            ex.problem(f"put of a payload over max_payload_bytes (16) raised {_raised(exc)}, not PayloadError")
    except Exception as exc:
        ex.problem(f"the check stopped: {_raised(exc)}\n{traceback.format_exc(limit=-3)}")
    finally:
        for conn in reversed(built):  # the owner last: its close reclaims the run
            _close(conn, label, ex.problems)
    return ex.problems


def transport_across(cls: type[Connector], name: str) -> list[str]:
    """The owner here, a stage's instance in a spawned process: payloads both ways."""
    label = _label(name, "owner here, a stage in a spawned process")
    ex = _Exchange(label)
    ref = f"{cls.__module__}:{cls.__qualname__}"
    if "<locals>" in cls.__qualname__ or cls.__module__ == "__main__":
        return [f"{label}: {ref} cannot be imported by another process; define the class at a module's top level"]
    with_numpy, with_torch = _importable("numpy"), _importable("torch")
    payloads = sample_payloads(with_numpy, with_torch)
    run_id = _run_id()
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    owner: Connector | None = None
    process = context.Process(
        target=transport_child,
        args=(theirs, ref, name, run_id, with_numpy, with_torch),
        name=f"omni-kit-{name}",
        daemon=True,
    )
    try:
        owner = _build(cls, {}, run_id, "orchestrator", True)
        handles = {kind: ex.put(owner, FORWARD, payloads[kind], f"{kind} payload") for kind in ("small", "stored")}
        process.start()
        theirs.close()
        ours.send({kind: handle for kind, handle in handles.items() if handle is not None})
        answer = _receive(ours, "to get the payloads and put its own")
        if isinstance(answer, str):
            ex.problem(answer)
        else:
            child_problems, back = answer
            ex.problems += [f"{label}: in the spawned process: {p}" for p in child_problems]
            for kind, handle in back.items():
                ex.get(owner, BACKWARD, handle, payloads[kind], f"{kind} payload put by the spawned process")
            ours.send("done")
            process.join(CHILD_TIMEOUT_S)
            if process.exitcode not in (0, None):
                ex.problem(f"the spawned process exited with {process.exitcode}")
    except Exception as exc:
        ex.problem(f"the check stopped: {_raised(exc)}\n{traceback.format_exc(limit=-3)}")
    finally:
        if process.is_alive():
            process.kill()
            process.join(10)
        ours.close()
        theirs.close()
        if owner is not None:
            _close(owner, label, ex.problems)
    return ex.problems


def _receive(conn: Any, what: str) -> Any:
    """The next message, or a problem (a string) when none comes within the bound."""
    try:
        if not conn.poll(CHILD_TIMEOUT_S):
            return f"the spawned process did not answer within {CHILD_TIMEOUT_S:g} s ({what})"
        message = conn.recv()
    except (EOFError, OSError):
        return f"the spawned process ended without answering ({what}); its stderr says why"
    if isinstance(message, dict) and "error" in message:
        return f"in the spawned process: {message['error']}"
    return message


def transport_child(
    conn: Any, ref: str, name: str, run_id: str, with_numpy: bool, with_torch: bool
) -> None:  # pragma: no cover - runs in the spawned process; its result is checked by the parent
    """The spawned process's side of :func:`transport_across`: import the class by ``ref``,
    get the owner's payloads, put its own, and keep serving until the owner has read them."""
    from omni_core.identity import bind
    from omni_core.lazy import LazyRef
    from omni_core.registry import ConnectorSpec

    ex = _Exchange("")
    stage = None
    try:
        cls = LazyRef(ref).resolve()
        bind(cls, Kind.CONNECTOR, ConnectorSpec(name=name, ref=ref))
        stage = _build(cls, {}, run_id, "kit_stage", False)
        payloads = sample_payloads(with_numpy, with_torch)
        if not conn.poll(CHILD_TIMEOUT_S):
            return
        handles = conn.recv()
        for kind, handle in handles.items():
            ex.get(stage, FORWARD, handle, payloads[kind], f"{kind} payload put by the owner")
        back = {kind: ex.put(stage, BACKWARD, payloads[kind], f"{kind} payload") for kind in ("small", "stored")}
        problems = [p.removeprefix(": ") for p in ex.problems]
        conn.send((problems, {kind: handle for kind, handle in back.items() if handle is not None}))
        conn.poll(CHILD_TIMEOUT_S)  # the owner reads what this process put, then says "done"
    except BaseException as exc:
        try:
            conn.send({"error": f"{_raised(exc)}\n{traceback.format_exc(limit=-3)}"})
        except Exception:
            pass
    finally:
        if stage is not None:
            try:
                stage.close()
            except Exception:
                pass
        conn.close()


def connector_problems(name: str, ref: str, obj: Any) -> list[str]:
    """Every connector check for the class ``obj`` registered as ``name`` (``ref``)."""
    problems = class_problems(name, ref, obj)
    if problems:
        return problems
    problems = transport_here(obj, name)
    if not obj.same_process_only:
        problems += transport_across(obj, name)
    return problems
