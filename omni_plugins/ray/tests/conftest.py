"""Shared fixtures: the plugin loaded through the registry, the repository's test pipeline
(tests/fixtures/plugins/omni-fixture-pipeline) installed into a private site directory, its tiny
checkpoint, and one real local Ray cluster for the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "plugins" / "omni-fixture-pipeline"
PROMPT = "a short answer"
#: the local cluster of these tests: 2 CPUs (the machine's), a small object store (nothing
#: large travels through it: payloads go through the connectors)
RAY_INIT = {
    "num_cpus": 2,
    "include_dashboard": False,
    "log_to_driver": False,
    "logging_level": "ERROR",
    "object_store_memory": 100 * 1024 * 1024,
}


@pytest.fixture(scope="session")
def ray_plugins() -> Any:
    """The installed plugins narrowed to this one, loaded the way the runtime loads them."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="ray"))


@pytest.fixture(scope="session")
def pipeline_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test pipeline plugin installed into its own site directory and put on ``sys.path``
    (the executor hands ``sys.path`` to the actors as PYTHONPATH)."""
    if not FIXTURE.is_dir():
        pytest.skip(f"the repository's test pipeline is not at {FIXTURE}")
    pytest.importorskip("torch", reason="the test pipeline's stages run torch")
    pytest.importorskip("safetensors", reason="the test pipeline's checkpoint is safetensors")
    from omni_core.testing import plugin_site  # not at the top: pytest_plugins imports it first, to rewrite asserts

    return plugin_site(FIXTURE, tmp_path_factory.mktemp("pipeline-site"))


@pytest.fixture(scope="session")
def plugins(pipeline_site: Path) -> Any:
    """Every installed plugin and the test pipeline (the connectors included: tcp, shm)."""
    from omni_core.plugins import load_plugins

    plugin_set = load_plugins()
    for needed in ("tcp", "shm", "inprocess"):
        if needed not in plugin_set.connectors:
            pytest.skip(f"connector {needed!r} is not installed (omni-plugin-zmq, omni-plugin-connectors)")
    return plugin_set


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory, pipeline_site: Path) -> Path:
    from omni_fixture_pipeline.model import FixturePipeline

    path = tmp_path_factory.mktemp("pipeline-model") / "tiny"
    FixturePipeline.make_tiny(path)
    return path


@pytest.fixture(scope="session")
def expected(model_dir: Path) -> dict[str, list[Any]]:
    from omni_fixture_pipeline.stages import reference

    items: dict[str, list[Any]] = reference(model_dir, PROMPT, {"tokens": {"max_tokens": 12}})
    return items


@pytest.fixture(scope="session")
def ray_cluster(pipeline_site: Path) -> Iterator[Any]:
    """A local Ray cluster, started once (the caller's own session: the executor must use it and
    never shut it down)."""
    ray = pytest.importorskip("ray", reason="the ray executor's tests need Ray installed (pip install ray)")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(**RAY_INIT)
    yield ray
    ray.shutdown()
