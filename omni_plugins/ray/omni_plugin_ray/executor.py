"""The ``ray`` executor: each stage placed ``ray`` runs in a Ray actor of its own.

::

    pipeline:
      defaults: {placement: ray}
      executors:
        ray: {address: auto}                 # join a running cluster; omitted: a local Ray
      stages:
        thinker: {executor_options: {num_gpus: 1}}

The actor (:mod:`omni_plugin_ray.actor`) hosts the same :class:`~omni_core.pipeline.stage.StageLoop`
a stage process runs, on a thread, over a queue channel. The orchestrator's end of it is an
:class:`ActorChannel`: ``send`` numbers each message and calls ``actor.push`` (the actor puts
them in the stage's inbox in number order), ``recv`` takes the stage's messages in batches from
``actor.pull``, every wait bounded. Payloads never travel this way: they go through the edges'
connectors, ``tcp`` unless the recipe names another, since an actor may sit on any node.

Liveness is what Ray says: an actor call failing with ``RayActorError`` means the actor is gone
(``recv`` raises ``EOFError``, ``alive()`` turns false, ``exit_reason()`` is Ray's cause in a
few words); the orchestrator then launches a fresh actor, as it restarts a stage process.

Ray is imported only when a stage is launched.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import re
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from pydantic import Field

from omni_core.errors import PipelineStartError
from omni_core.pipeline.executor import ExecutorOptions, StageExecutor, StageHandle

if TYPE_CHECKING:
    from omni_core.pipeline.placement import ResolvedPipeline

#: seconds a bounded Ray wait may run past the timeout it stands for (a round trip, a busy node)
SLACK_S = 2.0
#: seconds close() waits for the pipeline's actors to be gone
CLOSE_TIMEOUT_S = 10.0
#: what a local Ray start gets unless ``init_options`` says otherwise
LOCAL_INIT_DEFAULTS: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}


class RayOptions(ExecutorOptions):
    """``pipeline.executors.ray``: shared by every stage placed ``ray``."""

    #: None: the Ray session this process already has (``ray.init`` called), else a new local
    #: Ray; ``"auto"`` or ``"ray://head:10001"``: join that cluster
    address: str | None = None
    #: the Ray namespace the stage actors are named in
    namespace: str = Field(default="omni", min_length=1)
    #: keyword arguments for ``ray.init`` when the executor calls it (a local start: ``num_cpus``...)
    init_options: dict[str, Any] = Field(default_factory=dict)
    #: the stage actors' runtime environment (``env_vars``, ``working_dir``, ``py_modules``...);
    #: the executor adds PYTHONPATH and the OMNI_* variables of this process unless it names them
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    #: seconds for ``ray.init``, and for each stage's actor to be placed and created
    startup_timeout: float = Field(default=120.0, gt=0)
    #: a stage whose tcp edges bind a wildcard host (0.0.0.0) and name no advertise_host for it
    #: advertises its Ray node's IP address
    advertise_node_ip: bool = True


class RayStageOptions(ExecutorOptions):
    """``pipeline.stages.<stage>.executor_options`` of a stage placed ``ray``."""

    #: CPUs the actor reserves; 0.5 lets a 3-stage pipeline fit on a 2-CPU machine. Ray also
    #: sets the actor's OMP_NUM_THREADS from it (rounded down, at least 1): CPU-bound stages
    #: want more
    num_cpus: float = Field(default=0.5, ge=0)
    #: GPUs the actor reserves (Ray sets CUDA_VISIBLE_DEVICES to them: keep ``devices: "0"``)
    num_gpus: float = Field(default=0, ge=0)
    #: custom Ray resources the actor reserves (``{"talker_node": 1}``)
    resources: dict[str, float] = Field(default_factory=dict)
    #: pin the actor to the node with this IP address; None: Ray chooses
    node_ip: str | None = Field(default=None, min_length=1)


# -- the Ray session ------------------------------------------------------------------------------


class _Session:
    """A Ray session this plugin started (or joined) with ``ray.init``, shared by every pipeline
    of the process that finds it running, and shut down when the last of them closes.

    ``ray.init`` runs on a thread of its own that lives as long as the session: the processes
    of a local Ray die with the *thread* that started them (Linux's parent-death signal), so a
    pipeline started from a short-lived thread would otherwise lose them when it ends."""

    def __init__(self, kwargs: dict[str, Any], timeout: float) -> None:
        self.users = 0
        #: seconds ray.init took
        self.started_s = 0.0
        self.error: BaseException | None = None
        self._up = threading.Event()
        self._down = threading.Event()
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, args=(kwargs,), name="omni-ray-session", daemon=True)
        self._thread.start()
        if not self._up.wait(timeout):
            self._abandoned = True  # shut it down if it ever comes up
            self._down.set()
            raise TimeoutError
        if self.error is not None:
            raise self.error

    def _run(self, kwargs: dict[str, Any]) -> None:
        import ray

        # Ray warns that it sets no SIGTERM handler off the main thread; its processes still end
        # with the driver (they get SIGTERM when this thread's process goes), so say nothing
        quiet = _DropMessage("SIGTERM handler is not set")
        worker_log = logging.getLogger("ray._private.worker")
        worker_log.addFilter(quiet)
        try:
            ray.init(**kwargs)
        except BaseException as exc:
            self.error = exc
            self._up.set()
            return
        finally:
            worker_log.removeFilter(quiet)
        self._up.set()
        self._down.wait()
        try:
            ray.shutdown()
        except Exception:
            pass

    def shutdown(self) -> None:
        self._down.set()
        self._thread.join(60)


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


_SESSION_LOCK = threading.Lock()
_OWNED: _Session | None = None


def _acquire(options: RayOptions, stage: str) -> _Session | None:
    """The session for a new executor: ours (counted), the caller's own (None), or a new one."""
    global _OWNED
    import ray

    with _SESSION_LOCK:
        if _OWNED is not None and ray.is_initialized():
            _OWNED.users += 1
            return _OWNED
        if ray.is_initialized():
            return None  # the caller's: never shut down by omni
        kwargs: dict[str, Any] = {"namespace": options.namespace}
        if options.address is None:
            kwargs.update(LOCAL_INIT_DEFAULTS)
            what = "start a local Ray"
        else:
            kwargs["address"] = options.address
            what = f"connect to the Ray cluster at {options.address!r}"
        kwargs.update(options.init_options)
        began = time.monotonic()
        try:
            session = _Session(kwargs, options.startup_timeout)
        except TimeoutError:
            raise PipelineStartError(
                f"stage {stage!r} (placement ray): could not {what} within startup_timeout "
                f"({options.startup_timeout:g} s); raise pipeline.executors.ray.startup_timeout, or check the "
                "address",
                name=stage,
            ) from None
        except Exception as exc:
            raise PipelineStartError(
                f"stage {stage!r} (placement ray): could not {what}: {type(exc).__name__}: {_first_line(exc)}; "
                "check pipeline.executors.ray.address and init_options",
                name=stage,
            ) from None
        session.users = 1
        session.started_s = time.monotonic() - began
        _OWNED = session
        return session


def _release(session: _Session | None) -> None:
    global _OWNED
    if session is None:
        return
    with _SESSION_LOCK:
        session.users -= 1
        if session.users > 0:
            return
        if _OWNED is session:
            _OWNED = None
    session.shutdown()


# -- words ----------------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def death_reason(exc: BaseException) -> str:
    """What Ray says about a dead actor, in a few words that follow the stage's name:
    ``was killed (ray.kill)``, ``died: its worker process died (SYSTEM_ERROR: ...)``."""
    text = str(exc)
    if "ray.kill" in text:
        return "was killed (ray.kill)"
    match = re.search(r"The actor is dead because (.*)", text, re.S)
    if match is None:
        if "creation task" in text:  # __init__ raised
            return "failed in its creation task: " + " ".join(text.split())[:300]
        return f"died: {type(exc).__name__}: {_first_line(exc)}"[:300]
    cause = " ".join(match.group(1).split("Some common causes")[0].split())
    worker = re.match(r"its worker process has died\. Worker exit type: (\S+) Worker exit detail: (.*?)\.?$", cause)
    if worker:
        return f"died: its worker process died ({worker.group(1)}: {worker.group(2)})"[:300]
    return f"died: {cause.rstrip('.')}"[:300]


def _resources(values: dict[str, float]) -> dict[str, float]:
    """The resources worth showing (no per-node markers, no memory byte counts)."""
    hidden = ("node:", "memory", "object_store_memory", "accelerator_type:")
    return {k: v for k, v in sorted(values.items()) if not k.startswith(hidden)}


# -- the channel and the handle -------------------------------------------------------------------


class ActorChannel:
    """The orchestrator's end of a stage actor: a :class:`~omni_core.pipeline.stage.Channel`.

    ``send`` numbers the message and calls ``actor.push`` without waiting (a dead actor shows
    in ``recv``; Ray does not report the dropped results of calls to it). ``recv`` returns the
    next message of the last batch ``actor.pull`` brought, and asks for another when it runs
    out. One pull is in flight at a time, and a pull that has not answered within the timeout
    is kept for the next ``recv``, never dropped with its messages.

    It also keeps the actor's liveness: ``dead`` is None while it lives, else why it is gone."""

    def __init__(
        self,
        actor: Any,
        *,
        created: Any = None,
        deadline: float | None = None,
        placement_problem: Any = None,
    ) -> None:
        self.actor = actor
        #: None while the actor lives, else how it ended (the words of exit_reason)
        self.dead: str | None = None
        #: where it runs, once created (``info()``)
        self.info: dict[str, Any] | None = None
        self._created = created
        self._deadline = deadline
        self._placement_problem = placement_problem
        self._ready = created is None
        #: it reported `failed` while starting: nothing more comes, and nothing to restart
        self._quiet = False
        self._seq = 0
        self._send_lock = threading.Lock()
        #: held while recv talks to Ray; the executor takes it before shutting Ray down
        self.calls = threading.Lock()
        self._pull: Any = None
        self._buffer: collections.deque[dict[str, Any]] = collections.deque()

    # -- sending ---------------------------------------------------------------------------------

    def send(self, message: dict[str, Any] | None) -> None:
        if self.dead is not None:
            raise EOFError
        with self._send_lock:  # numbers in the order the calls are made
            try:
                self.actor.push.remote(self._seq, message)  # the result (None) is not waited for
            except Exception:
                raise EOFError from None
            self._seq += 1

    # -- receiving -------------------------------------------------------------------------------

    def recv(self, timeout: float) -> dict[str, Any] | None:
        if self._buffer:
            return self._buffer.popleft()
        if self.dead is not None:
            raise EOFError
        if self._quiet:
            time.sleep(max(timeout, 0.0))
            return None
        if not self.calls.acquire(timeout=max(timeout, 0.0) + SLACK_S):
            return None
        try:
            if self.dead is not None:  # ended while we waited for the lock
                raise EOFError
            if not self._ready:
                return self._await_created(timeout)
            return self._pull_batch(timeout)
        finally:
            self.calls.release()

    def _pull_batch(self, timeout: float) -> dict[str, Any] | None:
        import ray
        from ray.exceptions import RayActorError

        try:
            if self._pull is None:
                self._pull = self.actor.pull.remote(max(timeout, 0.0))
            ready, _ = ray.wait([self._pull], timeout=max(timeout, 0.0) + SLACK_S)
            if not ready:
                return None
            ref, self._pull = self._pull, None
            reply = ray.get(ref)
        except RayActorError as exc:
            self.mark_dead(death_reason(exc))
            raise EOFError from None
        except Exception as exc:  # Ray itself is gone (shut down, the cluster lost), or a bug
            self.mark_dead(f"was lost: {type(exc).__name__}: {_first_line(exc)}")
            self.kill_actor()  # if it still lives, it must not hold its resources
            raise EOFError from None
        self._buffer.extend(reply["messages"])
        if reply.get("ended"):
            self.mark_dead(str(reply["ended"]))
            self.kill_actor()  # the loop is over: nothing must linger in the cluster
        if self._buffer:
            return self._buffer.popleft()
        if self.dead is not None:
            raise EOFError
        return None

    def _await_created(self, timeout: float) -> dict[str, Any] | None:
        """Wait (up to ``timeout``) for the actor to be placed and created; a synthetic
        ``failed`` message if it cannot be, so the orchestrator reports the stage's start failed."""
        import ray
        from ray.exceptions import RayActorError

        left = (self._deadline or float("inf")) - time.monotonic()
        try:
            ready, _ = ray.wait([self._created], timeout=max(0.0, min(timeout, left)))
            if ready:
                self.info = ray.get(ready[0])
                self._ready = True
                return None
        except RayActorError as exc:
            return self._failed_start(f"its Ray actor {death_reason(exc)}")
        except Exception as exc:  # its runtime_env could not be set up, ...
            return self._failed_start(f"its Ray actor could not start: {type(exc).__name__}: {_first_line(exc)}")
        if time.monotonic() >= (self._deadline or float("inf")):
            problem = self._placement_problem() if self._placement_problem else "it was not placed in time"
            self.kill_actor()
            return self._failed_start(problem)
        return None

    def _failed_start(self, message: str) -> dict[str, Any]:
        self._quiet = True
        return {"ev": "failed", "error": {"type": "RayActorError", "message": message}}

    # -- liveness ---------------------------------------------------------------------------------

    def mark_dead(self, reason: str) -> None:
        if self.dead is None:
            self.dead = reason

    def kill_actor(self) -> None:
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:
            pass

    def close(self) -> None:
        self.mark_dead(self.dead or "stopped")


class RayStage(StageHandle):
    """A stage in a Ray actor (``placement: ray``)."""

    noun = "actor"
    restartable = True

    def __init__(self, executor: RayExecutor, name: str, attempt: int) -> None:
        self.executor = executor
        self.name = name
        self.actor_name = f"omni-{executor.pipeline.run_id}-{name}-{attempt}"
        self.options = RayStageOptions(**executor.pipeline.stage(name).executor_options)
        self.actor: Any = None
        self.actor_id: str | None = None
        self.channel: ActorChannel = _NotStarted()  # type: ignore[assignment]

    def start(self) -> None:
        from omni_plugin_ray.actor import remote_class

        try:
            options = self.executor.actor_options(self.name, self.options, self.actor_name)
            self.actor = (
                remote_class()
                .options(**options)
                .remote(self.executor.pipeline_json, self.name, self.executor.options.advertise_node_ip)
            )
            created = self.actor.info.remote()
        except PipelineStartError:
            raise
        except Exception as exc:
            raise PipelineStartError(
                f"stage {self.name!r} (placement ray): its actor could not be created: {type(exc).__name__}: "
                f"{_first_line(exc)}",
                name=self.name,
            ) from None
        actor_id = getattr(self.actor, "_actor_id", None)  # Ray has no public accessor for it
        self.actor_id = actor_id.hex() if actor_id is not None else None
        self.channel = ActorChannel(
            self.actor,
            created=created,
            deadline=time.monotonic() + self.executor.options.startup_timeout,
            placement_problem=self._placement_problem,
        )

    def _placement_problem(self) -> str:
        import ray

        wanted: dict[str, float] = {
            "CPU": self.options.num_cpus,
            "GPU": self.options.num_gpus,
            **self.options.resources,
        }
        wanted = {k: v for k, v in wanted.items() if v}
        try:
            free = _resources(ray.available_resources())  # type: ignore[no-untyped-call]
            total = _resources(ray.cluster_resources())  # type: ignore[no-untyped-call]
        except Exception:
            free, total = {}, {}
        pinned = f" on node {self.options.node_ip}" if self.options.node_ip else ""
        return (
            f"its Ray actor was not placed and started within startup_timeout "
            f"({self.executor.options.startup_timeout:g} s): "
            f"it asks for {wanted or 'no resources'}{pinned}; the cluster has {free} free of {total}. Lower "
            f"pipeline.stages.{self.name}.executor_options (num_cpus, num_gpus, resources), add nodes, or raise "
            "pipeline.executors.ray.startup_timeout"
        )

    # -- the StageHandle contract ----------------------------------------------------------------

    @property
    def pid(self) -> int | None:  # type: ignore[override]
        info = self.channel.info
        return int(info["pid"]) if info else None

    def alive(self) -> bool:
        return self.actor is not None and self.channel.dead is None

    def exit_reason(self) -> str:
        if self.channel.dead is not None:
            return self.channel.dead
        return "is still running"

    def where(self) -> str:
        if self.actor is None:
            return ""
        text = f"actor {self.actor_id[:12] if self.actor_id else self.actor_name}"
        info = self.channel.info
        if info:
            text += f" on {info['node_ip']}, pid {info['pid']}"
        return f" ({text})"

    def stop(self, timeout: float) -> None:
        """``stop`` to the stage; up to ``timeout`` for its loop to end (it closes its engine and
        connectors); then the actor is killed, whatever it did."""
        import ray

        if self.actor is None:
            return
        channel = self.channel
        if channel.dead is None and channel.info is not None:
            try:
                channel.send({"op": "stop"})
                ray.get(self.actor.wait_ended.remote(timeout), timeout=timeout + SLACK_S)
            except Exception:
                pass
        channel.kill_actor()
        channel.mark_dead("stopped")

    def kill(self) -> None:
        if self.actor is None:
            return
        self.channel.kill_actor()
        self.channel.mark_dead("was killed (ray.kill)")


class _NotStarted:
    """The channel of a handle not started yet."""

    def __init__(self) -> None:
        self.dead: str | None = "was never started"
        self.info: dict[str, Any] | None = None
        self.calls = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        raise EOFError

    def recv(self, timeout: float) -> dict[str, Any] | None:
        raise EOFError

    def close(self) -> None:
        pass

    def kill_actor(self) -> None:
        pass

    def mark_dead(self, reason: str) -> None:
        pass


# -- the executor ---------------------------------------------------------------------------------


class RayExecutor(StageExecutor):
    """Stages as Ray actors, one each; see the module's docstring."""

    options_type = RayOptions
    stage_options_type = RayStageOptions
    #: an actor may sit on any node of the cluster: edges it touches travel over TCP
    default_connector = "tcp"
    options: RayOptions

    def __init__(self, options: dict[str, Any], pipeline: ResolvedPipeline, plugins: Any) -> None:
        super().__init__(options, pipeline, plugins)
        self.pipeline_json = pipeline.model_dump_json()
        self._lock = threading.Lock()
        self._connected = False
        self._session: _Session | None = None
        self._closed = False
        self._attempts: dict[str, itertools.count[int]] = {}
        self.handles: list[RayStage] = []

    # -- Ray ---------------------------------------------------------------------------------------

    def _connect(self, stage: str) -> None:
        if not self._connected:
            self._session = _acquire(self.options, stage)
            self._connected = True

    @property
    def owns_session(self) -> bool:
        """Whether this executor holds a Ray session omni started (and shuts down when unused)."""
        return self._session is not None

    def runtime_env(self) -> dict[str, Any]:
        """The stage actors' runtime environment: the recipe's, plus what makes the actor see the
        plugins this process sees: PYTHONPATH (this process's ``sys.path`` entries outside the
        Python installation) and the ``OMNI_*`` variables, unless the recipe names them."""
        env = dict(self.options.runtime_env)
        env_vars = {str(k): str(v) for k, v in (env.get("env_vars") or {}).items()}
        if "PYTHONPATH" not in env_vars:
            paths = python_paths()
            if paths:
                env_vars["PYTHONPATH"] = os.pathsep.join(paths)
        for key, value in os.environ.items():
            if key.startswith("OMNI_") and key not in env_vars:
                env_vars[key] = value
        env["env_vars"] = env_vars
        return env

    def actor_options(self, stage: str, options: RayStageOptions, actor_name: str) -> dict[str, Any]:
        """The ``.options(...)`` of a stage's actor."""
        result: dict[str, Any] = {
            "name": actor_name,
            "namespace": self.options.namespace,
            "num_cpus": options.num_cpus,
            "num_gpus": options.num_gpus,
            "max_restarts": 0,  # the orchestrator restarts a stage, with a fresh actor
            "max_task_retries": 0,
            "runtime_env": self.runtime_env(),
        }
        if options.resources:
            result["resources"] = dict(options.resources)
        if options.node_ip:
            result["scheduling_strategy"] = self._pin(stage, options.node_ip)
        return result

    def _pin(self, stage: str, node_ip: str) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        match = [n for n in nodes if n.get("NodeManagerAddress") == node_ip]
        if not match:
            known = sorted(str(n.get("NodeManagerAddress")) for n in nodes)
            raise PipelineStartError(
                f"stage {stage!r}: pipeline.stages.{stage}.executor_options.node_ip is {node_ip!r}, which is not "
                f"a live node of the Ray cluster; its nodes are {known}",
                name=stage,
            )
        return NodeAffinitySchedulingStrategy(node_id=match[0]["NodeID"], soft=False)

    # -- the StageExecutor contract ----------------------------------------------------------------

    def launch(self, stage: str) -> RayStage:
        with self._lock:
            if self._closed:
                raise PipelineStartError(f"stage {stage!r}: the pipeline is closing", name=stage)
            self._connect(stage)
            attempt = next(self._attempts.setdefault(stage, itertools.count(1)))
            handle = RayStage(self, stage, attempt)
            # an earlier actor of the stage that still lives has been replaced without being
            # stopped (the orchestrator restarts only dead ones: this is a pipeline started
            # twice): it would hold its resources until the driver exits
            orphans = [h for h in self.handles if h.name == stage and h.alive()]
            self.handles.append(handle)
        for orphan in orphans:
            orphan.kill()
        return handle

    def close(self) -> None:
        """Kill what is left of the pipeline's actors and wait (bounded) until Ray reports them
        gone; then shut Ray down if omni started it and no other pipeline of the process uses it.
        A session the caller started with ``ray.init`` is left as it is."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self.handles)
        if self._connected:
            self._await_gone([h for h in handles if h.actor is not None])
        # no reader may be inside a Ray call when Ray goes away
        held = [h.channel.calls for h in handles if h.channel.calls.acquire(timeout=SLACK_S + 1)]
        try:
            _release(self._session)
            self._session = None
        finally:
            for lock in held:
                lock.release()

    def _await_gone(self, handles: list[RayStage]) -> None:
        import ray
        from ray.exceptions import RayActorError

        for handle in handles:
            handle.channel.kill_actor()
            handle.channel.mark_dead(handle.channel.dead or "stopped")
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        waiting = list(handles)
        while waiting and time.monotonic() < deadline:
            probes = {}
            for handle in waiting:
                try:
                    probes[handle] = handle.actor.info.remote()
                except Exception:
                    pass
            still = []
            for handle, ref in probes.items():
                try:
                    ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
                    still.append(handle)  # it answered: not gone yet
                except RayActorError:
                    pass
                except Exception:
                    still.append(handle)
            waiting = still
            for handle in waiting:
                handle.channel.kill_actor()
            if waiting:
                time.sleep(0.1)


def python_paths() -> list[str]:
    """This process's ``sys.path`` entries outside the Python installation (its prefix and base
    prefix): directories a test, ``PYTHONPATH`` or an editable install put there."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    found: list[str] = []
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        real = os.path.realpath(entry)
        if any(real == p or real.startswith(p + os.sep) for p in prefixes):
            continue
        if real not in found:
            found.append(real)
    return found
