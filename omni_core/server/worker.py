"""One model's queue and the thread that runs it.

A loaded model is not safe to call from two threads at once, and generation must never run
on the event loop (``/health`` answers while a long generation runs), so each model gets one
worker thread and a bounded queue in front of it:

* :meth:`ModelWorker.submit` refuses at once with :class:`~omni_core.errors.ServerBusyError`
  (429) when ``queue_size`` requests already wait: a client is told to come back, never left
  hanging;
* the thread takes the oldest job. If it has a ``batch_key`` (image requests that can share
  a pipeline call), it gathers waiting jobs with the same key, up to ``max_batch``. The clients
  of the last batches come back together, but their requests reach the queue one by one, so
  it waits for as many as recent batches held: at least ``batch_wait``, at most a quarter of
  the last run (and 50 ms). A lone client (nothing queued, recent batches of one) never waits,
  and a wait that ends short resets what is expected, so a drop in load costs one wait;
* every job runs inside :func:`omni_core.cancel.cancellable` with its own token: a client
  that hangs up or a deadline cancels a queued job before it starts and a running one at its
  next step;
* results go back to the event loop through ``call_soon_threadsafe``; whatever a job raises
  fails that job alone, and the thread goes on with the next one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from omni_core.cancel import CancelToken, cancellable
from omni_core.errors import EngineFailedError, ModelNotReadyError, RequestCancelled, ServerBusyError

log = logging.getLogger("omni.serve")

#: the longest a batch waits for companions, whatever the last run took
_MAX_WAIT_S = 0.050

#: runs a batch: the jobs' payloads in, one result (or exception) per job out
BatchRunner = Callable[[list["Job"]], list[Any]]


@dataclass(eq=False)
class Job:
    """One request's work, from the handler that submits it to the thread that runs it."""

    run: Callable[[Job], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    payload: Any = None
    #: jobs with equal keys may run together through ``run_batch``; None never batches
    batch_key: Hashable | None = None
    run_batch: BatchRunner | None = None
    token: CancelToken = field(default_factory=CancelToken)
    enqueued: float = field(default_factory=time.perf_counter)
    started: float | None = None
    finished: float | None = None
    batch_size: int = 1
    #: called on the worker thread when the job starts (video jobs mark themselves in progress)
    on_start: Callable[[Job], None] | None = None

    @property
    def queue_seconds(self) -> float:
        return (self.started or self.finished or time.perf_counter()) - self.enqueued

    @property
    def run_seconds(self) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or time.perf_counter()) - self.started

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        """Hand the outcome to the event loop (once; a job whose waiter left is dropped)."""
        self.finished = time.perf_counter()

        def deliver() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        try:
            self.loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the loop is closed: the server is gone, nobody is waiting
            pass


class ModelWorker:
    """The queue and the thread of one served model."""

    def __init__(
        self,
        name: str,
        *,
        queue_size: int,
        max_batch: int,
        batch_wait_s: float,
        observe_batch: Callable[[int], None] | None = None,
    ) -> None:
        self.name = name
        self.queue_size = queue_size
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self._observe_batch = observe_batch
        self._pending: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._running: list[Job] = []
        #: sizes of the last batches (what the next one expects) and how long the last run took
        self._recent: deque[int] = deque([1], maxlen=4)
        self._last_run_s = 0.0
        #: set when the thread died of something no job should have raised: the model is unusable
        self.fault: str | None = None
        self._thread = threading.Thread(target=self._main, name=f"omni-model-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- the event loop's side ----------------------------------------------------------------

    def submit(self, job: Job) -> None:
        with self._cond:
            if self.fault is not None:
                raise ModelNotReadyError(f"model {self.name!r} is out of service: {self.fault}", name=self.name)
            if self._stopping:
                raise ModelNotReadyError("the server is shutting down; retry on another replica", name=self.name)
            if len(self._pending) >= self.queue_size:
                raise ServerBusyError(
                    f"model {self.name!r} has {len(self._pending)} requests waiting (the limit, --queue-size); "
                    "retry after the Retry-After seconds",
                    name=self.name,
                )
            self._pending.append(job)
            self._cond.notify()

    @property
    def depth(self) -> int:
        """Requests waiting (not counting the batch that runs)."""
        return len(self._pending)

    @property
    def busy(self) -> int:
        return len(self._running)

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the queue ahead at the recent pace, at least 1."""
        running = self._running
        pace = max((j.run_seconds for j in running), default=1.0) or 1.0
        return max(1, min(60, round(pace * (1 + len(self._pending) / max(1, self.max_batch)))))

    def stop(self, timeout: float) -> bool:
        """Stop taking work, let what is queued or running finish for up to ``timeout`` seconds,
        then cancel the rest. True when everything finished in time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if not self._thread.is_alive():
            return True
        with self._cond:
            for job in list(self._pending) + self._running:
                job.token.cancel("the server shut down before this request finished")
        self._thread.join(5.0)
        return False

    # -- the thread's side ----------------------------------------------------------------------

    def _main(self) -> None:
        running: list[Job] = []
        try:
            while self.fault is None:
                batch = self._next_batch()
                if batch is None:
                    return
                running = batch
                self._run(batch)
        except BaseException as exc:  # plugin code ended the thread (SystemExit and the like)
            self.fault = f"its worker stopped: {type(exc).__name__}: {exc}"
            log.error("model %s: worker stopped: %s", self.name, exc, exc_info=exc)
            for job in running:
                job.settle(error=ModelNotReadyError(f"model {self.name!r} is out of service: {self.fault}"))
        # out of service: whatever waits is refused, and submit() refuses what comes
        with self._cond:
            for job in self._pending:
                job.settle(error=ModelNotReadyError(f"model {self.name!r} is out of service: {self.fault}"))
            self._pending.clear()

    def _engine_failed(self, exc: EngineFailedError) -> None:
        self.fault = f"its engine failed: {exc.message}"
        log.error("model %s is out of service: %s", self.name, exc.message)

    def _next_batch(self) -> list[Job] | None:
        with self._cond:
            while True:
                while not self._pending:
                    if self._stopping:
                        return None
                    self._cond.wait()
                job = self._pending.popleft()
                if job.token.cancelled:
                    job.settle(error=RequestCancelled(job.token.reason))
                    continue
                break
            batch = [job]
            if job.batch_key is None or self.max_batch == 1:
                return self._begin(batch)
            expected = min(self.max_batch, max(self._recent))
            if not self._pending and expected <= 1:
                self._recent.append(1)
                return self._begin(batch)  # a lone client never waits
            wait = max(self.batch_wait_s, min(_MAX_WAIT_S, 0.25 * self._last_run_s)) if self.batch_wait_s else 0.0
            deadline = time.monotonic() + wait
            while True:
                for other in list(self._pending):
                    if len(batch) >= self.max_batch:
                        break
                    if other.batch_key == job.batch_key and not other.token.cancelled:
                        self._pending.remove(other)
                        batch.append(other)
                remaining = deadline - time.monotonic()
                full = len(batch) >= max(expected, 2) or len(batch) >= self.max_batch
                if full or remaining <= 0 or self._stopping:
                    break
                self._cond.wait(remaining)
            if len(batch) < expected and not self._stopping:
                self._recent = deque([len(batch)], maxlen=4)  # the wait ended short: load dropped
            else:
                self._recent.append(len(batch))
            return self._begin(batch)

    def _begin(self, batch: list[Job]) -> list[Job]:
        now = time.perf_counter()
        for job in batch:
            job.started = now
            job.batch_size = len(batch)
        self._running = batch
        return batch

    def _run(self, batch: list[Job]) -> None:
        started = time.perf_counter()
        try:
            self._run_batch(batch)
        finally:
            self._last_run_s = time.perf_counter() - started

    def _run_batch(self, batch: list[Job]) -> None:
        if self._observe_batch is not None:
            self._observe_batch(len(batch))
        for job in batch:
            if job.on_start is not None:
                job.on_start(job)
        try:
            if len(batch) == 1:
                job = batch[0]
                try:
                    with cancellable(job.token):
                        job.settle(job.run(job))
                except EngineFailedError as exc:
                    self._engine_failed(exc)
                    job.settle(error=exc)
                except Exception as exc:  # fails this request alone
                    job.settle(error=exc)
                return
            runner = batch[0].run_batch
            assert runner is not None  # a batch_key comes with a run_batch
            try:
                # one pipeline call: the batch stops when every member was cancelled
                token = _AllCancelled([j.token for j in batch])
                with cancellable(token):
                    outcomes = runner(batch)
            except Exception as exc:
                if isinstance(exc, EngineFailedError):
                    self._engine_failed(exc)
                for job in batch:
                    job.settle(error=exc)
                return
            for job, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    job.settle(error=outcome)
                else:
                    job.settle(outcome)
        finally:
            with self._cond:
                self._running = []


class _AllCancelled(CancelToken):
    """The token of a shared call: cancelled only when every request in it is."""

    def __init__(self, tokens: list[CancelToken]) -> None:
        super().__init__()
        self._tokens = tokens

    @property
    def cancelled(self) -> bool:
        return all(t.cancelled for t in self._tokens)

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise RequestCancelled(self._tokens[0].reason or "every request of the batch was cancelled")
