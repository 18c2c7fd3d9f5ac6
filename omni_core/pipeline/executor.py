"""Where a stage runs: the orchestrator launches each stage through an executor.

The core has two: ``process`` (a spawned process per stage, never forked) and ``inprocess``
(a thread of the orchestrator's process). A plugin adds more through
``omni_register_executors`` (a Ray actor per stage, ...): a :class:`StageExecutor` subclass
whose :meth:`~StageExecutor.launch` returns a :class:`StageHandle`. Wherever a stage runs, it
is the same :class:`~omni_core.pipeline.stage.StageLoop` speaking the same small messages over a
:class:`~omni_core.pipeline.stage.Channel`, and payloads travel through the same connectors.
"""

from __future__ import annotations

import abc
import os
import threading
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from omni_core.identity import DeclaredIdentity
from omni_core.kinds import Kind
from omni_core.pipeline.stage import Channel, PipeChannel, QueueChannel, StageLoop

if TYPE_CHECKING:
    from omni_core.pipeline.placement import ResolvedPipeline

#: the core's own executors; plugins cannot register these names
BUILTIN_EXECUTORS = ("process", "inprocess")


class StageHandle(abc.ABC):
    """A launched stage as the orchestrator sees it: a channel to it, and whether it lives."""

    channel: Channel
    #: shown in messages about the stage (``pid 1234``, ``actor 5f3a...``); None: nothing to show
    pid: int | None = None
    #: True when the orchestrator can bring the stage back after it died (a process, an actor)
    restartable: bool = True
    #: what runs the stage, for messages: ``process``, ``thread``, ``actor``
    noun: str = "process"

    @abc.abstractmethod
    def start(self) -> None:
        """Start the stage: it loads its engine and sends ``ready`` (or ``failed``) on its own."""

    @abc.abstractmethod
    def alive(self) -> bool: ...

    def exit_reason(self) -> str:
        """How a dead stage ended, worded to follow its name: ``was killed by SIGKILL``."""
        return "stopped"

    @abc.abstractmethod
    def stop(self, timeout: float) -> None:
        """Ask the stage to stop, wait up to ``timeout``, then end it by force."""

    def kill(self) -> None:
        """End the stage now (a stage that did not let go of a cancelled request)."""
        self.stop(0)

    def where(self) -> str:
        """`` (pid 1234)``: appended to the stage's name in messages."""
        return f" (pid {self.pid})" if self.pid else ""


class ThreadStage(StageHandle):
    """A stage on a thread of the orchestrator's process (``placement: inprocess``)."""

    restartable = False  # a thread stuck in native code cannot be stopped from outside
    noun = "thread"

    def __init__(self, pipeline: ResolvedPipeline, name: str, plugins: Any) -> None:
        self.channel, theirs = QueueChannel.pair()
        self._loop = StageLoop(pipeline, name, theirs, plugins=plugins)
        self._thread = threading.Thread(target=self._loop.serve, name=f"omni-stage-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float) -> None:
        self.channel.close()
        self._thread.join(timeout)


class ProcessStage(StageHandle):
    """A stage in its own spawned process (``placement: process``): never forked, so a parent
    that imported torch or holds threads is safe."""

    def __init__(self, pipeline: ResolvedPipeline, name: str) -> None:
        import multiprocessing

        from omni_core.pipeline.stage import stage_process_main

        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe(duplex=True)
        self.channel = PipeChannel(ours)
        self._theirs = theirs
        #: the engine starts processes: the stage runs non-daemonic, leading a process group
        self._group = pipeline.stage(name).starts_processes
        self._process = context.Process(
            target=stage_process_main,
            args=(theirs, pipeline.model_dump_json(), name),
            name=f"omni-stage-{name}",
            daemon=not self._group,
        )

    def start(self) -> None:
        self._process.start()
        self.pid = self._process.pid
        self._theirs.close()  # the child has its own copy; ours would keep EOF from showing
        if self._group:
            import atexit

            # before multiprocessing's own exit handler, which would wait for a non-daemonic child
            atexit.register(self._kill_group)

    def _kill_group(self) -> None:
        """Kill the stage and every process its engine started (they share its group)."""
        import signal

        if not self._group or self.pid is None:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def alive(self) -> bool:
        return self._process.is_alive()

    def exit_reason(self) -> str:
        self._process.join(5)  # its pipe closes a moment before it is reaped
        code = self._process.exitcode
        if code is None:
            return "is still running"
        if code < 0:
            import signal

            try:
                signame = signal.Signals(-code).name
            except ValueError:
                signame = f"signal {-code}"
            return f"was killed by {signame}"
        return f"exited with code {code}"

    def stop(self, timeout: float) -> None:
        try:
            self.channel.send({"op": "stop"})
        except (OSError, ValueError):
            pass
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._kill_group()  # what the engine started and did not stop
        self.channel.close()

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._kill_group()


class ExecutorOptions(BaseModel):
    """Options of an executor: ``pipeline.executors.<name>`` in a recipe (shared by every stage it
    runs) and ``pipeline.stages.<stage>.executor_options`` (one stage's). An executor subclasses
    these to declare its own; unknown options are errors at start-up."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class StageExecutor(DeclaredIdentity, abc.ABC, identity_of=Kind.EXECUTOR):
    """Launches the stages placed on it. One instance per running pipeline."""

    name: ClassVar[str]
    #: the recipe's ``pipeline.executors.<name>`` options
    options_type: ClassVar[type[ExecutorOptions]] = ExecutorOptions
    #: one stage's ``executor_options``
    stage_options_type: ClassVar[type[ExecutorOptions]] = ExecutorOptions
    #: the connector an edge gets when the recipe names none and one end runs here; stages
    #: that may sit on other machines need a network transport
    default_connector: ClassVar[str] = "shm"

    def __init__(self, options: dict[str, Any], pipeline: ResolvedPipeline, plugins: Any) -> None:
        self.options = self.options_type(**options)
        self.pipeline = pipeline
        self.plugins = plugins

    @abc.abstractmethod
    def launch(self, stage: str) -> StageHandle:
        """A handle for ``stage``, not started yet (the orchestrator calls ``start``); its
        ``executor_options`` are ``self.pipeline.stage(stage).executor_options``."""

    def close(self) -> None:
        """Release what the executor holds (a cluster connection); called after every stage stopped."""


class InProcessExecutor(StageExecutor):
    """``placement: inprocess``."""

    def launch(self, stage: str) -> StageHandle:
        return ThreadStage(self.pipeline, stage, self.plugins)


class ProcessExecutor(StageExecutor):
    """``placement: process``."""

    def launch(self, stage: str) -> StageHandle:
        return ProcessStage(self.pipeline, stage)


def builtin_executor(name: str) -> type[StageExecutor] | None:
    classes: dict[str, type[StageExecutor]] = {"inprocess": InProcessExecutor, "process": ProcessExecutor}
    cls = classes.get(name)
    if cls is not None and "name" not in cls.__dict__:
        cls.name = name
    return cls
