"""The ray executor on a real local Ray cluster (2 CPUs): the repository's three-stage test pipeline
(tiny random weights, real torch forward passes) with its stages in Ray actors, payloads over
the tcp connector, every output checked exactly against the same stage classes run in one
process. Faults on cue: a stage that raises, one that SIGKILLs its own worker, an actor killed
from outside, a hung stage, one that cannot load, one that cannot be placed."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the ray executor's tests need Ray installed (pip install ray)")

from ray_testkit import actors_of, same, shm_of  # noqa: E402

from omni_core.errors import PipelineStartError, StageFailedError  # noqa: E402
from omni_core.pipeline.orchestrator import Pipeline  # noqa: E402
from omni_core.pipeline.placement import plan_pipeline  # noqa: E402

PROMPT = "a short answer"
PARAMS = {"tokens": {"max_tokens": 12}}
ALL_RAY = {"defaults": {"placement": "ray"}, "edge_defaults": {"window": 3}}
#: a process stage feeds a ray stage, which feeds a stage on a thread of the orchestrator
MIXED = {
    "defaults": {"placement": "process"},
    "stages": {"hidden": {"placement": "ray"}, "wave": {"placement": "inprocess"}},
    "edge_defaults": {"window": 1},
}

pytestmark = pytest.mark.usefixtures("ray_cluster")


def pipeline_for(model_dir: Path, plugins: Any, recipe: dict[str, Any], **overrides: Any) -> Pipeline:
    """A pipeline, not started: ``with`` starts it (``Pipeline.__enter__`` calls ``start``, so a
    started one given to ``with`` would launch every stage a second time)."""
    resolved = plan_pipeline(model_dir, recipe=recipe, plugins=plugins, overrides=overrides or None)
    return Pipeline(resolved, plugins=plugins)


def ray_stages(pipeline: Pipeline) -> list[str]:
    return [s.name for s in pipeline.resolved.stages if s.placement == "ray"]


# -- outputs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", [ALL_RAY, MIXED], ids=["every stage on ray", "ray + process + inprocess"])
def test_outputs_equal_the_stages_run_in_one_process(
    model_dir: Path, plugins: Any, expected: Any, recipe: dict[str, Any]
) -> None:
    resolved = plan_pipeline(model_dir, recipe=recipe, plugins=plugins)
    on_ray = {s.name for s in resolved.stages if s.placement == "ray"}
    for edge in resolved.edges:
        if {edge.source, edge.target} & on_ray:  # the executor's default_connector, for the recipe names none
            ray_end = edge.source if edge.source in on_ray else edge.target
            why = f"default: stage {ray_end!r} runs on the ray executor, which asks for it"
            assert (edge.connector, edge.why) == ("tcp", why), edge
        else:
            assert edge.connector in ("shm", "inprocess"), edge
    with Pipeline(resolved, plugins=plugins) as pipeline:
        run_id = resolved.run_id
        assert actors_of(run_id) == sorted(f"omni-{run_id}-{name}-1" for name in on_ray)
        for name in on_ray:
            handle = pipeline.stages[name]
            assert handle.noun == "actor" and handle.restartable and handle.alive()
            assert handle.where().startswith(" (actor ") and f"pid {handle.pid})" in handle.where()
        results = [pipeline.run(PROMPT, params=PARAMS) for _ in range(2)]
        assert pipeline.health()["ok"] is True
    for result in results:
        assert same(result.outputs["text"], expected["text"])
        assert same(result.outputs["audio"], expected["audio"])
        assert set(result.stage_seconds) == {"tokens", "hidden", "wave"}
    assert actors_of(run_id) == [] and shm_of(run_id) == []
    assert ray.is_initialized()  # the caller's Ray session is the caller's to end
    assert all(not h.alive() for h in pipeline.stages.values())


def test_concurrent_requests_all_come_out_right(model_dir: Path, plugins: Any) -> None:
    """Six requests at once, one item per chunk: every stage's inbox interleaves the starts and
    chunks of several requests, which must reach the stage in the order they were sent."""
    from omni_fixture_pipeline.stages import reference

    prompts = [f"question {i}" for i in range(6)]
    params = {"tokens": {"max_tokens": 8}}
    recipe = {"defaults": {"placement": "ray"}, "edge_defaults": {"window": 1}}
    with pipeline_for(model_dir, plugins, recipe) as pipeline:
        streams = [pipeline.submit(p, params=params) for p in prompts]
        results = [s.result() for s in streams]
        hops = pipeline.hops
    for prompt, result in zip(prompts, results, strict=True):
        want = reference(model_dir, prompt, params)
        assert same(result.outputs["text"], want["text"]) and same(result.outputs["audio"], want["audio"])
    assert hops > 6 * 8 * 3  # chunks, takens and dones of every request went through the actors


def test_the_channel_keeps_the_order_of_what_was_sent() -> None:
    """Messages sent from several threads at once come back (through an actor that echoes its
    inbox) in the order each thread sent them; pushes made out of order enter it in number order."""
    from echo_actor import EchoActor
    from omni_plugin_ray.actor import remote_class
    from omni_plugin_ray.executor import ActorChannel, python_paths

    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(python_paths())}}
    actors = [
        remote_class(EchoActor).options(num_cpus=0, runtime_env=env).remote("{}", "echo", False) for _ in range(2)
    ]
    try:
        channel = ActorChannel(actors[0], created=actors[0].info.remote(), deadline=time.monotonic() + 60)
        per_thread, threads = 500, 4

        def send(t: int) -> None:
            for i in range(per_thread):
                channel.send({"t": t, "i": i})

        workers = [threading.Thread(target=send, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while len(got) < per_thread * threads and time.monotonic() < deadline:
            message = channel.recv(0.2)
            if message is not None:
                got.append(message)
        for w in workers:
            w.join()
        assert len(got) == per_thread * threads
        for t in range(threads):
            assert [m["i"] for m in got if m["t"] == t] == list(range(per_thread))

        numbers = list(range(300))
        random.Random(1).shuffle(numbers)
        ray.get([actors[1].push.remote(n, {"n": n}) for n in numbers])
        echoed = ActorChannel(actors[1], created=actors[1].info.remote(), deadline=time.monotonic() + 60)
        back: list[int] = []
        while len(back) < 300 and time.monotonic() < deadline:
            message = echoed.recv(0.2)
            if message is not None:
                back.append(message["n"])
        assert back == list(range(300))
    finally:
        for actor in actors:
            ray.kill(actor)


def test_a_stage_loop_that_raises_ends_the_channel_after_what_it_sent() -> None:
    """A loop that raises (a bug, not a stage failure) is a stage gone: its last messages still
    arrive, then EOF, and the actor is killed so that it holds nothing in the cluster."""
    from echo_actor import BreakingActor
    from omni_plugin_ray.actor import remote_class
    from omni_plugin_ray.executor import ActorChannel, python_paths

    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(python_paths())}}
    actor = remote_class(BreakingActor).options(num_cpus=0, runtime_env=env).remote("{}", "breaks", False)
    channel = ActorChannel(actor, created=actor.info.remote(), deadline=time.monotonic() + 60)
    channel.send({"op": "start", "rid": "r1"})
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    with pytest.raises(EOFError):
        while time.monotonic() < deadline:
            message = channel.recv(0.2)
            if message is not None:
                got.append(message)
    assert got == [{"ev": "seen", "op": "start", "rid": "r1"}]
    assert channel.dead == "ended: its stage loop raised KeyError: 'rid'"
    # ray.kill is asynchronous: a call sent just after it may still be served; the actor must be
    # gone soon after, not at once
    gone_by = time.monotonic() + 30
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() < gone_by:
            ray.get(actor.info.remote(), timeout=30)
            time.sleep(0.2)


# -- faults ---------------------------------------------------------------------------------------


def test_a_stage_that_raises_fails_its_request_only(model_dir: Path, plugins: Any, expected: Any) -> None:
    # shutdown_timeout: the orchestrator waits that long for the failed stage to "let go" of the
    # request it already reported failed, then restarts it (the core's behaviour for every
    # placement); kept short here
    with pipeline_for(model_dir, plugins, ALL_RAY, hidden={"shutdown_timeout": 2.0}) as pipeline:
        with pytest.raises(StageFailedError, match=r"stage 'hidden' failed on request .*told to fail after 2") as info:
            pipeline.run(PROMPT, params={**PARAMS, "hidden": {"fail_after": 2}})
        assert info.value.name == "hidden"
        again = pipeline.run(PROMPT, params=PARAMS)
        assert pipeline.restarts["tokens"] == pipeline.restarts["wave"] == 0
        run_id = pipeline.resolved.run_id
    assert same(again.outputs["audio"], expected["audio"])
    assert actors_of(run_id) == [] and shm_of(run_id) == []


def test_a_stage_that_kills_its_worker_fails_its_request_and_comes_back(
    model_dir: Path, plugins: Any, expected: Any
) -> None:
    """``die_after`` SIGKILLs the stage's own process: inside an actor, that is its Ray worker."""
    with pipeline_for(model_dir, plugins, ALL_RAY) as pipeline:
        run_id = pipeline.resolved.run_id
        with pytest.raises(
            StageFailedError,
            match=r"stage 'wave' \(actor [0-9a-f]{12} on [\d.]+, pid \d+\) died: its worker process died \(.*\) "
            r"while running request r\d+; it is being restarted",
        ) as info:
            pipeline.run(PROMPT, params={**PARAMS, "wave": {"die_after": 1}})
        assert info.value.name == "wave"
        again = pipeline.run(PROMPT, params=PARAMS)
        assert pipeline.restarts["wave"] == 1
        assert actors_of(run_id) == sorted(
            f"omni-{run_id}-{n}-{1 + (n == 'wave')}" for n in ("tokens", "hidden", "wave")
        )
    assert same(again.outputs["audio"], expected["audio"]) and same(again.outputs["text"], expected["text"])
    assert actors_of(run_id) == [] and shm_of(run_id) == []


def test_an_actor_killed_from_outside_fails_its_request_and_comes_back(
    model_dir: Path, plugins: Any, expected: Any
) -> None:
    with pipeline_for(model_dir, plugins, ALL_RAY) as pipeline:
        stream = pipeline.submit(PROMPT, params={**PARAMS, "hidden": {"delay_s": 0.3}})
        time.sleep(1.0)
        ray.kill(pipeline.stages["hidden"].actor)  # type: ignore[attr-defined]
        with pytest.raises(
            StageFailedError, match=r"stage 'hidden' \(actor .*\) was killed \(ray.kill\) while running"
        ):
            stream.result()
        again = pipeline.run(PROMPT, params=PARAMS)
        assert pipeline.restarts["hidden"] == 1
    assert same(again.outputs["audio"], expected["audio"])


def test_a_hung_stage_is_killed_after_its_shutdown_timeout_and_restarted(
    model_dir: Path, plugins: Any, expected: Any
) -> None:
    with pipeline_for(model_dir, plugins, ALL_RAY, wave={"request_timeout": 2.0, "shutdown_timeout": 1.0}) as pipeline:
        with pytest.raises(StageFailedError, match=r"stage 'wave' ran past its request_timeout \(2 s\)"):
            pipeline.run(PROMPT, params={**PARAMS, "wave": {"hang": True}})
        again = pipeline.run(PROMPT, params=PARAMS)
        assert pipeline.restarts["wave"] == 1
    assert same(again.outputs["audio"], expected["audio"])


# -- start-up ---------------------------------------------------------------------------------------


def test_a_stage_that_cannot_load_stops_the_start_naming_it(model_dir: Path, plugins: Any) -> None:
    recipe = {**ALL_RAY, "stages": {"wave": {"engine_options": {"fail_load": True}}}}
    resolved = plan_pipeline(model_dir, recipe=recipe, plugins=plugins)
    with pytest.raises(PipelineStartError, match=r"stage 'wave' failed to start: RuntimeError: .*fail while loading"):
        Pipeline(resolved, plugins=plugins).start()
    assert actors_of(resolved.run_id) == [] and shm_of(resolved.run_id) == []


def test_a_stage_the_cluster_cannot_place_stops_the_start_naming_it(model_dir: Path, plugins: Any) -> None:
    recipe = {
        "defaults": {"placement": "inprocess"},
        "executors": {"ray": {"startup_timeout": 3}},
        "stages": {"wave": {"placement": "ray", "executor_options": {"num_gpus": 1}}},
    }
    resolved = plan_pipeline(model_dir, recipe=recipe, plugins=plugins)
    began = time.monotonic()
    with pytest.raises(
        PipelineStartError,
        match=r"stage 'wave' failed to start: RayActorError: its Ray actor was not placed and started within "
        r"startup_timeout \(3 s\): it asks for \{'CPU': 0.5, 'GPU': 1(\.0)?\}; the cluster has \{'CPU': .*\} free",
    ):
        Pipeline(resolved, plugins=plugins).start()
    assert time.monotonic() - began < 30
    assert actors_of(resolved.run_id) == []


def test_a_node_ip_that_is_not_in_the_cluster_stops_the_start_naming_it(model_dir: Path, plugins: Any) -> None:
    recipe = {**ALL_RAY, "stages": {"hidden": {"executor_options": {"node_ip": "10.255.255.254"}}}}
    resolved = plan_pipeline(model_dir, recipe=recipe, plugins=plugins)
    with pytest.raises(PipelineStartError, match=r"stage 'hidden': .*node_ip is '10.255.255.254', which is not a live"):
        Pipeline(resolved, plugins=plugins).start()
    assert actors_of(resolved.run_id) == []


def test_multi_node_settings_on_one_node(model_dir: Path, plugins: Any, expected: Any) -> None:
    """What a cluster recipe sets, on this one node: every stage pinned to a node by IP, tcp bound
    on every interface with no advertise_host, so each stage advertises its Ray node's IP."""
    node_ip = ray.util.get_node_ip_address()
    recipe = {
        "defaults": {"placement": "ray", "executor_options": {"node_ip": node_ip}},
        "connectors": {"net": {"connector": "tcp", "extra": {"host": "0.0.0.0", "inline_threshold_bytes": 0}}},
        "edge_defaults": {"connector": "net", "window": 4},
    }
    with pipeline_for(model_dir, plugins, recipe) as pipeline:
        assert all(f" on {node_ip}, " in pipeline.stages[n].where() for n in ray_stages(pipeline))
        handles: list[dict[str, Any]] = []
        on_event = pipeline._on_event

        def spy(name: str, message: dict[str, Any]) -> None:
            if message.get("ev") == "chunk" and message.get("handle"):
                handles.append(message["handle"])
            on_event(name, message)

        pipeline._on_event = spy  # type: ignore[method-assign]
        result = pipeline.run(PROMPT, params=PARAMS)
    assert same(result.outputs["audio"], expected["audio"]) and same(result.outputs["text"], expected["text"])
    assert handles and all(h["addr"].startswith(f"tcp://{node_ip}:") for h in handles)


def test_without_a_session_the_executor_starts_ray_and_ends_it(model_dir: Path, pipeline_site: Path) -> None:
    """In a fresh process with no ``ray.init``: the first pipeline starts a local Ray (from a thread
    that then ends: Ray's processes must outlive it), a second pipeline shares it, and the last
    one to close shuts it down."""
    script = textwrap.dedent(
        f"""
        import sys, threading
        sys.path.insert(0, {str(pipeline_site)!r})
        import ray, torch
        from omni_core.plugins import load_plugins
        from omni_core.pipeline.orchestrator import Pipeline
        from omni_core.pipeline.placement import plan_pipeline
        from omni_fixture_pipeline.stages import reference

        plugins = load_plugins()
        # two pipelines of three stages at once: a quarter of a CPU each
        recipe = {{"defaults": {{"placement": "ray", "executor_options": {{"num_cpus": 0.25}}}},
                  "executors": {{"ray": {{"init_options": {{
                      "num_cpus": 2, "object_store_memory": 100 * 1024 * 1024}}}}}}}}
        want = reference({str(model_dir)!r}, "hi", {{"tokens": {{"max_tokens": 5}}}})

        def check(pipeline):
            got = pipeline.run("hi", params={{"tokens": {{"max_tokens": 5}}}}).outputs
            return all(torch.equal(a, b) for a, b in zip(got["audio"], want["audio"], strict=True))

        made = {{}}
        starter = threading.Thread(target=lambda: made.update(
            a=Pipeline(plan_pipeline({str(model_dir)!r}, recipe=recipe, plugins=plugins), plugins=plugins).start()))
        starter.start()
        starter.join()
        a = made["a"]
        print("a owns the session:", a.executors["ray"].owns_session, ray.is_initialized(), check(a))
        b = Pipeline(plan_pipeline({str(model_dir)!r}, recipe=recipe, plugins=plugins), plugins=plugins).start()
        a.close()
        print("after a closed:", ray.is_initialized(), check(b))
        b.close()
        print("after b closed:", ray.is_initialized())
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SIGTERM handler" not in out.stderr  # Ray's warning about a start off the main thread
    lines = [line for line in out.stdout.splitlines() if line.startswith(("a owns", "after"))]
    assert lines == [
        "a owns the session: True True True",
        "after a closed: True True",
        "after b closed: False",
    ], out.stdout + out.stderr[-3000:]
