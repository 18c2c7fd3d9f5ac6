"""The plugin as the runtime sees it, and the parts that need no Ray cluster: loading through the
registry, the options and how a recipe's mistakes are reported, the default connector, Ray's
death causes in words, and what the actors are given."""

from __future__ import annotations

import os
import random
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from omni_core.errors import PipelineConfigError
from omni_core.pipeline.executor import StageExecutor
from omni_core.testing import PluginConformance


class TestRayPluginConformance(PluginConformance):
    plugin_name = "ray"


def test_the_registry_loads_the_executor_named_ray(ray_plugins: Any) -> None:
    from omni_plugin_ray.executor import RayExecutor, RayOptions, RayStageOptions

    cls = ray_plugins.executors.load("ray")
    assert cls is RayExecutor and cls.name == "ray"
    assert issubclass(cls, StageExecutor)
    assert cls.options_type is RayOptions and cls.stage_options_type is RayStageOptions
    assert cls.default_connector == "tcp"
    assert [entry.name for entry in ray_plugins.executors] == ["ray"]


def test_loading_the_executor_class_does_not_import_ray() -> None:
    """Validating a recipe and `omni explain pipeline` load the class; Ray comes with the first stage."""
    import subprocess

    code = "import sys, omni_plugin_ray.executor; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_option_defaults() -> None:
    from omni_plugin_ray.executor import RayOptions, RayStageOptions

    options = RayOptions()
    assert options.address is None and options.namespace == "omni" and options.init_options == {}
    assert options.runtime_env == {} and options.startup_timeout == 120 and options.advertise_node_ip is True
    stage = RayStageOptions()
    assert stage.num_cpus == 0.5 and stage.num_gpus == 0 and stage.resources == {} and stage.node_ip is None
    assert 3 * stage.num_cpus <= 2  # a 3-stage pipeline fits on a 2-CPU machine


# -- a recipe, resolved (needs the test pipeline, not Ray) ---------------------------------------------


def test_edges_touching_a_ray_stage_default_to_tcp(model_dir: Path, plugins: Any) -> None:
    from omni_core.pipeline.placement import describe, plan_pipeline

    recipe = {
        "defaults": {"placement": "process"},
        "stages": {"tokens": {"placement": "ray"}, "wave": {"placement": "inprocess"}},
    }
    resolved = plan_pipeline(model_dir, recipe=recipe, plugins=plugins)
    connectors = {(e.source, e.target): (e.connector, e.why) for e in resolved.edges}
    assert connectors == {
        ("tokens", "hidden"): ("tcp", "default: stage 'tokens' runs on the ray executor, which asks for it"),
        ("tokens", "output"): ("tcp", "default: stage 'tokens' runs on the ray executor, which asks for it"),
        ("hidden", "wave"): ("shm", "default: the ends are separate processes"),
        ("wave", "output"): ("inprocess", "default: both ends share a process"),
    }
    assert resolved.stage("tokens").placement == "ray" and resolved.executors["ray"] == {}
    assert "tokens  ar         ray" in describe(resolved)


def test_a_recipe_naming_a_connector_keeps_it(model_dir: Path, plugins: Any) -> None:
    from omni_core.pipeline.placement import plan_pipeline

    recipe = {"defaults": {"placement": "ray"}, "edge_defaults": {"connector": "shm"}}
    resolved = plan_pipeline(model_dir, recipe=recipe, plugins=plugins)
    assert {e.connector for e in resolved.edges} == {"shm"}
    assert {e.why for e in resolved.edges} == {"recipe edge_defaults"}


BAD = {
    "misspelt executor option": (
        {"defaults": {"placement": "ray"}, "executors": {"ray": {"adress": "auto"}}},
        "pipeline.executors.ray",
        "adress",
    ),
    "misspelt stage option": (
        {"defaults": {"placement": "ray"}, "stages": {"hidden": {"executor_options": {"num_cpu": 1}}}},
        "pipeline.stages.hidden.executor_options",
        "num_cpu",
    ),
    "negative num_gpus": (
        {"defaults": {"placement": "ray"}, "stages": {"wave": {"executor_options": {"num_gpus": -1}}}},
        "pipeline.stages.wave.executor_options",
        "num_gpus",
    ),
    "zero startup_timeout": (
        {"defaults": {"placement": "ray"}, "executors": {"ray": {"startup_timeout": 0}}},
        "pipeline.executors.ray",
        "startup_timeout",
    ),
    "options for an executor no stage uses": (
        {"defaults": {"placement": "process"}, "executors": {"ray": {"address": "auto"}}},
        "pipeline.executors.ray",
        "no stage is placed on",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_a_bad_option_is_one_error_naming_the_field_before_anything_starts(
    model_dir: Path, plugins: Any, case: str
) -> None:
    from omni_core.pipeline.placement import plan_pipeline

    recipe, where, field = BAD[case]
    with pytest.raises(PipelineConfigError) as info:
        plan_pipeline(model_dir, recipe=recipe, plugins=plugins)
    assert where in str(info.value) and field in str(info.value)


# -- the pieces, without a cluster ---------------------------------------------------------------------


class _DiedError(Exception):
    pass


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "The actor died unexpectedly before finishing this task.\n\tclass_name: StageActor\n\tactor_id: ab\n"
            "The actor is dead because it was killed by `ray.kill`.",
            "was killed (ray.kill)",
        ),
        (
            "The actor died unexpectedly before finishing this task.\n\tpid: 1\nThe actor is dead because its worker "
            "process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
            "connection error code 2. End of file. Some common causes include: (1) the process was killed by the OOM",
            "died: its worker process died (SYSTEM_ERROR: Worker unexpectedly exits with a connection error code 2. "
            "End of file)",
        ),
        (
            "The actor died unexpectedly before finishing this task.\nThe actor is dead because its node has died.",
            "died: its node has died",
        ),
        ("something else entirely\nmore", "died: _DiedError: something else entirely"),
    ],
)
def test_ray_death_causes_in_a_few_words(text: str, reason: str) -> None:
    from omni_plugin_ray.executor import death_reason

    assert death_reason(_DiedError(text)) == reason


def test_the_actors_see_this_process_path_and_omni_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from omni_plugin_ray.executor import RayExecutor, python_paths

    extra = tmp_path / "site"
    extra.mkdir()
    monkeypatch.syspath_prepend(str(extra))
    monkeypatch.setenv("OMNI_PLUGINS", "zmq,ray")
    paths = python_paths()
    assert paths[0] == os.path.realpath(extra)
    assert not any(p.startswith(os.path.realpath(sys.prefix)) for p in paths)  # site-packages stay out

    executor = RayExecutor.__new__(RayExecutor)
    executor.options = RayExecutor.options_type(runtime_env={"env_vars": {"X": "1"}, "working_dir": "/w"})
    env = executor.runtime_env()
    assert env["working_dir"] == "/w"
    assert env["env_vars"]["X"] == "1" and env["env_vars"]["OMNI_PLUGINS"] == "zmq,ray"
    assert env["env_vars"]["PYTHONPATH"].split(os.pathsep)[0] == os.path.realpath(extra)

    executor.options = RayExecutor.options_type(runtime_env={"env_vars": {"PYTHONPATH": "/mine", "OMNI_PLUGINS": "x"}})
    env = executor.runtime_env()
    assert env["env_vars"]["PYTHONPATH"] == "/mine" and env["env_vars"]["OMNI_PLUGINS"] == "x"  # the recipe's win


def test_the_inbox_delivers_in_number_order_whatever_the_arrival_order() -> None:
    pytest.importorskip("ray", reason="omni_plugin_ray.actor imports Ray")
    import queue

    from omni_plugin_ray.actor import Inbox

    out: queue.Queue[Any] = queue.Queue()
    inbox = Inbox(out)
    numbers = list(range(2000))
    random.Random(0).shuffle(numbers)
    chunks = [numbers[i::4] for i in range(4)]
    threads = [threading.Thread(target=lambda c=c: [inbox.put(n, {"n": n}) for n in c]) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    inbox.put(5, {"n": "again"})  # a duplicate is dropped
    assert [out.get_nowait()["n"] for _ in range(2000)] == list(range(2000))
    assert out.empty() and inbox.waiting == 0


def test_a_stage_on_a_wildcard_host_advertises_its_node_ip(model_dir: Path, plugins: Any) -> None:
    pytest.importorskip("ray", reason="omni_plugin_ray.actor imports Ray")
    from omni_plugin_ray.actor import advertise_node_ip

    from omni_core.pipeline.placement import plan_pipeline

    recipe = {
        "defaults": {"placement": "ray"},
        "connectors": {
            "net": {"connector": "tcp", "extra": {"host": "0.0.0.0", "per_owner": {"wave": {"advertise_host": "w"}}}}
        },
        "edges": [
            {"from": "tokens", "to": "hidden", "connector": "net"},
            {"from": "hidden", "to": "wave", "connector": "net"},
        ],
    }
    resolved = plan_pipeline(model_dir, recipe=recipe, plugins=plugins)
    hidden = advertise_node_ip(resolved, "hidden", "10.1.2.3")
    for edge in hidden.edges_into("hidden") + hidden.edges_from("hidden"):
        assert edge.extra["per_owner"]["hidden"] == {"advertise_host": "10.1.2.3"}
        assert edge.extra["per_owner"]["wave"] == {"advertise_host": "w"}  # the recipe's own stays
    assert hidden.edge("tokens", "output").extra == {}  # the default tcp binds 127.0.0.1: untouched
    wave = advertise_node_ip(resolved, "wave", "10.1.2.3")
    assert wave is resolved  # it names its own advertise_host: nothing to do
    # the result is still a valid resolved pipeline, options included
    plugins.connectors.load("tcp").validate_options(hidden.edge("tokens", "hidden").extra)
