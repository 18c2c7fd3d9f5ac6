"""The multi-stage runtime on a real three-stage test pipeline (tests/fixtures/plugins/omni-fixture-pipeline):
real stage processes (spawned), real connectors (the installed omni-plugin-connectors), real forward passes on
tiny random weights. Every output is checked exactly against the same stage classes called in one process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the test pipeline's stages run torch")
pytest.importorskip("omni_plugin_connectors", reason="the pipeline runtime needs omni-plugin-connectors installed")

from omni_core.errors import (  # noqa: E402
    EngineFailedError,
    PipelineConfigError,
    PipelineStartError,
    RequestCancelled,
    StageFailedError,
)
from omni_core.pipeline.orchestrator import Pipeline  # noqa: E402
from omni_core.pipeline.placement import describe, plan_pipeline  # noqa: E402
from omni_core.testing import plugin_site  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "plugins" / "omni-fixture-pipeline"
PROMPT = "a short answer"


@pytest.fixture(scope="session")
def pipeline_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture plugin installed into its own site directory, put on sys.path (spawned stage
    processes inherit it)."""
    return plugin_site(FIXTURE, tmp_path_factory.mktemp("pipeline-site"))


@pytest.fixture(scope="session")
def plugins(pipeline_site: Path) -> Any:
    from omni_core.plugins import load_plugins

    return load_plugins()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory, pipeline_site: Path) -> Path:
    from omni_fixture_pipeline.model import FixturePipeline

    path = tmp_path_factory.mktemp("pipeline-model") / "tiny"
    FixturePipeline.make_tiny(path)
    return path


@pytest.fixture(scope="session")
def expected(model_dir: Path) -> dict[str, list[Any]]:
    from omni_fixture_pipeline.stages import reference

    return reference(model_dir, PROMPT, {"tokens": {"max_tokens": 12}})


def shm_of(run_id: str) -> list[str]:
    return sorted(p for p in os.listdir("/dev/shm") if p.startswith(f"omni-{run_id}-"))


def same(got: list[Any], want: list[Any]) -> bool:
    from omni_fixture_pipeline.compare import same_items  # importable once pipeline_site ran

    return same_items(got, want)


def start(model_dir: Path, plugins: Any, placement: dict[str, Any] | None = None, **overrides: Any) -> Pipeline:
    resolved = plan_pipeline(model_dir, recipe=placement or {}, plugins=plugins, overrides=overrides or None)
    return Pipeline(resolved, plugins=plugins).start()


PLACEMENTS = {
    "all in one process": {"defaults": {"placement": "inprocess"}, "edge_defaults": {"window": 1}},
    "each stage its own process, shm, window 3": {
        "defaults": {"placement": "process"},
        "edge_defaults": {"window": 3},
    },
    "each stage its own process, tcp, window 2": {
        "defaults": {"placement": "process"},
        "edge_defaults": {"window": 2, "connector": "tcp"},
    },
    "mixed, hand over at the end": {
        "defaults": {"placement": "process"},
        "stages": {"hidden": {"placement": "inprocess"}},
    },
}


@pytest.mark.parametrize("placement", list(PLACEMENTS), ids=list(PLACEMENTS))
def test_outputs_equal_the_stages_run_in_one_process(
    model_dir: Path, plugins: Any, expected: Any, placement: str
) -> None:
    with start(model_dir, plugins, PLACEMENTS[placement]) as pipeline:
        run_id = pipeline.resolved.run_id
        results = [pipeline.run(PROMPT, params={"tokens": {"max_tokens": 12}}) for _ in range(2)]
        assert pipeline.health()["ok"] is True
    for result in results:
        assert set(result.outputs) == {"text", "audio"}
        assert same(result.outputs["text"], expected["text"])
        assert same(result.outputs["audio"], expected["audio"])
        assert set(result.stage_seconds) == {"tokens", "hidden", "wave"}
    assert shm_of(run_id) == []


def test_a_closed_pipeline_leaves_no_process_thread_or_port(model_dir: Path, plugins: Any) -> None:
    import threading

    pytest.importorskip("omni_plugin_zmq", reason="the tcp connector is omni-plugin-zmq")
    before = {t.name for t in threading.enumerate()}
    with start(model_dir, plugins, PLACEMENTS["each stage its own process, tcp, window 2"]) as pipeline:
        pipeline.run(PROMPT, params={"tokens": {"max_tokens": 4}})
        handles = list(pipeline.stages.values())
        ports = {c.health().get("addr") for c in pipeline.connectors.values()}
    assert ports and all(ports)
    assert all(not h.alive() for h in handles)
    time.sleep(0.5)
    left = {t.name for t in threading.enumerate()} - before
    assert not left, f"threads left running: {left}"
    import socket

    for addr in ports:  # nothing listens where the orchestrator's tcp connector served
        host, port = str(addr).removeprefix("tcp://").rsplit(":", 1)
        with socket.socket() as probe:
            assert probe.connect_ex((host, int(port))) != 0, f"{addr} still accepts connections"


def test_a_text_only_request_stops_after_the_stage_final_for_text(model_dir: Path, plugins: Any, expected: Any) -> None:
    with start(model_dir, plugins, PLACEMENTS["all in one process"]) as pipeline:
        result = pipeline.run(PROMPT, params={"tokens": {"max_tokens": 12}}, outputs=("text",))
    assert same(result.outputs["text"], expected["text"])
    assert set(result.outputs) == {"text"} and set(result.stage_seconds) == {"tokens"}


def test_streaming_edges_deliver_first_audio_before_the_text_is_done(model_dir: Path, plugins: Any) -> None:
    """With window 1 the wave stage starts on the first token; at the end, only after the last."""
    params = {"tokens": {"max_tokens": 10, "delay_s": 0.1}}
    first: dict[int, float] = {}
    for window in (1, -1):
        placement = {"defaults": {"placement": "inprocess"}, "edge_defaults": {"window": window}}
        with start(model_dir, plugins, placement) as pipeline:
            result = pipeline.run(PROMPT, params=params, outputs=("audio",))
        assert result.first_output_s is not None
        first[window] = result.first_output_s
    assert first[1] < 0.5, first  # one token's delay plus two cheap stages
    assert first[-1] >= 1.0, first  # ten tokens' delay


def test_concurrent_requests_flow_through_the_stages_at_once(model_dir: Path, plugins: Any) -> None:
    from omni_fixture_pipeline.stages import reference

    prompts = [f"question {i}" for i in range(4)]
    with start(model_dir, plugins, PLACEMENTS["each stage its own process, shm, window 3"]) as pipeline:
        streams = [pipeline.submit(p, params={"tokens": {"max_tokens": 6}}) for p in prompts]
        results = [s.result() for s in streams]
    for prompt, result in zip(prompts, results, strict=True):
        want = reference(pipeline.resolved and Path(pipeline.resolved.model_dir), prompt, {"tokens": {"max_tokens": 6}})
        assert same(result.outputs["audio"], want["audio"]) and same(result.outputs["text"], want["text"])


# -- faults -------------------------------------------------------------------------------------------


def test_a_stage_that_raises_fails_its_request_only(model_dir: Path, plugins: Any, expected: Any) -> None:
    with start(model_dir, plugins, PLACEMENTS["each stage its own process, shm, window 3"]) as pipeline:
        with pytest.raises(StageFailedError, match=r"stage 'hidden' failed on request .*told to fail after 2") as info:
            pipeline.run(PROMPT, params={"tokens": {"max_tokens": 12}, "hidden": {"fail_after": 2}})
        assert info.value.name == "hidden"
        began = time.monotonic()
        again = pipeline.run(PROMPT, params={"tokens": {"max_tokens": 12}})
        assert time.monotonic() - began < 5  # not held up by a restart: the stage let go at once
        assert pipeline.restarts == {"tokens": 0, "hidden": 0, "wave": 0}
        with pytest.raises(RuntimeError, match="already started"):
            pipeline.start()
        run_id = pipeline.resolved.run_id
    assert same(again.outputs["audio"], expected["audio"])
    assert shm_of(run_id) == []


def test_a_killed_stage_fails_its_request_and_is_restarted(model_dir: Path, plugins: Any, expected: Any) -> None:
    with start(model_dir, plugins, PLACEMENTS["each stage its own process, shm, window 3"]) as pipeline:
        with pytest.raises(StageFailedError, match=r"stage 'wave' \(pid \d+\) was killed by SIGKILL .*being restarted"):
            pipeline.run(PROMPT, params={"tokens": {"max_tokens": 12}, "wave": {"die_after": 1}})
        again = pipeline.run(PROMPT, params={"tokens": {"max_tokens": 12}})
        assert pipeline.restarts["wave"] == 1
        run_id = pipeline.resolved.run_id
    assert same(again.outputs["audio"], expected["audio"])
    assert shm_of(run_id) == []


def test_a_stage_past_max_restarts_is_reported_down(model_dir: Path, plugins: Any) -> None:
    with start(
        model_dir, plugins, PLACEMENTS["each stage its own process, shm, window 3"], wave={"max_restarts": 0}
    ) as pipeline:
        with pytest.raises(StageFailedError, match="not restarted again"):
            pipeline.run(PROMPT, params={"wave": {"die_after": 0}})
        with pytest.raises(EngineFailedError, match=r"stage 'wave' is down \(its process \(pid \d+\) was killed"):
            pipeline.run(PROMPT)
        text = pipeline.run(PROMPT, outputs=("text",))  # what does not need the stage still works
        assert text.outputs["text"]
        assert pipeline.health()["ok"] is False


def test_a_slow_stage_fails_past_its_request_timeout(model_dir: Path, plugins: Any) -> None:
    with start(
        model_dir, plugins, PLACEMENTS["each stage its own process, shm, window 3"], hidden={"request_timeout": 1.0}
    ) as pipeline:
        began = time.monotonic()
        with pytest.raises(StageFailedError, match=r"stage 'hidden' ran past its request_timeout \(1 s\)"):
            pipeline.run(PROMPT, params={"hidden": {"delay_s": 0.4}})
        assert time.monotonic() - began < 3
        pipeline.run(PROMPT, params={"tokens": {"max_tokens": 2}})  # and it serves on


def test_a_hung_stage_is_restarted_after_its_shutdown_timeout(model_dir: Path, plugins: Any, expected: Any) -> None:
    with start(
        model_dir,
        plugins,
        PLACEMENTS["each stage its own process, shm, window 3"],
        wave={"request_timeout": 1.0, "shutdown_timeout": 1.0},
    ) as pipeline:
        with pytest.raises(StageFailedError, match="request_timeout"):
            pipeline.run(PROMPT, params={"wave": {"hang": True}})
        result = pipeline.run(PROMPT, params={"tokens": {"max_tokens": 12}})
        assert pipeline.restarts["wave"] == 1
    assert same(result.outputs["audio"], expected["audio"])


def test_an_oversize_payload_fails_naming_the_limit(model_dir: Path, plugins: Any) -> None:
    placement = {
        "defaults": {"placement": "process"},
        "connectors": {"small": {"connector": "shm", "extra": {"max_payload_bytes": 100_000}}},
        "edges": [{"from": "tokens", "to": "hidden", "connector": "small"}],
    }
    with start(model_dir, plugins, placement) as pipeline:
        with pytest.raises(StageFailedError, match=r"stage 'tokens' failed .*max_payload_bytes \(100,000\)"):
            pipeline.run(PROMPT, params={"tokens": {"huge_bytes": 1_000_000}})
        run_id = pipeline.resolved.run_id
    assert shm_of(run_id) == []


def test_a_stage_that_cannot_load_stops_the_start_naming_it(model_dir: Path, plugins: Any) -> None:
    placement = {"defaults": {"placement": "process"}, "stages": {"wave": {"engine_options": {"fail_load": True}}}}
    resolved = plan_pipeline(model_dir, recipe=placement, plugins=plugins)
    with pytest.raises(PipelineStartError, match=r"stage 'wave' failed to start: RuntimeError: .*fail while loading"):
        Pipeline(resolved, plugins=plugins).start()


def test_a_stage_slower_to_load_than_its_startup_timeout(model_dir: Path, plugins: Any) -> None:
    placement = {
        "defaults": {"placement": "process"},
        "stages": {"hidden": {"startup_timeout": 1, "engine_options": {"load_seconds": 30}}},
    }
    resolved = plan_pipeline(model_dir, recipe=placement, plugins=plugins)
    began = time.monotonic()
    with pytest.raises(PipelineStartError, match=r"stage 'hidden' did not report ready within its startup_timeout"):
        Pipeline(resolved, plugins=plugins).start()
    assert time.monotonic() - began < 25


def test_cancelling_a_stream_frees_its_payloads(model_dir: Path, plugins: Any) -> None:
    with start(model_dir, plugins, PLACEMENTS["each stage its own process, shm, window 3"]) as pipeline:
        stream = pipeline.submit(PROMPT, params={"tokens": {"max_tokens": 40}, "wave": {"delay_s": 0.2}})
        chunks = iter(stream)
        next(chunks)
        stream.cancel()
        with pytest.raises(RequestCancelled):
            list(chunks)
        run_id = pipeline.resolved.run_id
        time.sleep(0.5)
        assert shm_of(run_id) == []
        pipeline.run(PROMPT, params={"tokens": {"max_tokens": 2}})


# -- validation ---------------------------------------------------------------------------------------

BAD = {
    "unknown field": ({"defaults": {"placment": "process"}}, "placment"),
    "unknown stage": ({"stages": {"talker": {}}}, "pipeline.stages names 'talker', which is not a stage"),
    "edge to a missing stage": (
        {"edges": [{"from": "tokens", "to": "wave"}]},
        r"pipeline.edges\[0\] is tokens->wave, which is not an edge",
    ),
    "unknown connector": (
        {"edges": [{"from": "tokens", "to": "hidden", "connector": "rdma"}]},
        r"pipeline.edges\[0\].connector: unknown connector 'rdma'",
    ),
    "same-process connector across processes": (
        {"defaults": {"placement": "process"}, "edges": [{"from": "tokens", "to": "hidden", "connector": "inprocess"}]},
        r"edge tokens->hidden crosses processes .* only works within one process",
    ),
    "bad window": ({"edges": [{"from": "tokens", "to": "hidden", "window": 0}]}, "window must be -1"),
    "unknown placement": ({"defaults": {"placement": "gpu"}}, "placement 'gpu' is not one of"),
    "unknown connector option": (
        {
            "connectors": {"x": {"connector": "shm", "extra": {"inline": 1}}},
            "edges": [{"from": "tokens", "to": "hidden", "connector": "x"}],
        },
        "inline",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_a_bad_placement_is_one_error_naming_the_field(model_dir: Path, plugins: Any, case: str) -> None:
    placement, message = BAD[case]
    with pytest.raises(PipelineConfigError, match=message):
        plan_pipeline(model_dir, recipe=placement, plugins=plugins)


def test_explain_shows_each_stage_and_why_each_connector(model_dir: Path, plugins: Any) -> None:
    text = describe(plan_pipeline(model_dir, recipe=PLACEMENTS["mixed, hand over at the end"], plugins=plugins))
    assert "tokens  ar" in text and "hidden  generation inprocess" in text
    assert "tokens -> hidden: tokens, shm" in text and "[default: the ends are separate processes]" in text
    assert "wave -> output: audio, shm" in text


def test_the_offline_api_runs_a_pipeline_model(model_dir: Path, plugins: Any, expected: Any, tmp_path: Path) -> None:
    from omni_core import Omni

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("pipeline:\n  defaults: {placement: process}\n  edge_defaults: {window: 2}\n")
    with Omni(model_dir, plugins=plugins, recipe=recipe, stages={"hidden": {"placement": "inprocess"}}) as omni:
        assert omni.identity.modality == "pipeline" and "multi-stage" in omni.identity.describe()
        assert omni.pipeline.resolved.stage("hidden").placement == "inprocess"
        assert omni.pipeline.resolved.stage("wave").placement == "process"
        result = omni.run(PROMPT, params={"tokens": {"max_tokens": 12}})
        chunks = list(omni.stream(PROMPT, params={"tokens": {"max_tokens": 12}}, outputs=("audio",)))
        pipeline = omni.pipeline
    assert same(result.outputs["audio"], expected["audio"]) and same(result.outputs["text"], expected["text"])
    assert len(chunks) == 6 and all(len(c.items) == 2 and c.modality == "audio" for c in chunks)
    assert same([i for c in chunks for i in c.items], expected["audio"])
    assert all(not h.alive() for h in pipeline.stages.values())  # close() stopped every stage


def test_explain_pipeline_command(model_dir: Path, pipeline_site: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("pipeline:\n  stages:\n    wave: {placement: inprocess}\n")
    env = {**os.environ, "PYTHONPATH": str(pipeline_site)}
    omni = Path(sys.executable).parent / "omni"
    out = subprocess.run(
        [omni, "explain", "pipeline", "--model", model_dir, "--recipe", recipe],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "wave    generation inprocess" in out.stdout and "hidden -> wave: hidden, shm" in out.stdout
    recipe.write_text("pipeline:\n  stages:\n    wave: {placment: inprocess}\n")
    bad = subprocess.run(
        [omni, "explain", "pipeline", "--model", model_dir, "--recipe", recipe],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "pipeline.stages.wave.placment" in bad.stderr and "Traceback" not in bad.stderr
