"""The fault battery, part 5: a multi-stage model's recipe and checkpoint, as `omni explain pipeline`
sees them. Every row runs the real `omni` command with the test pipeline plugin installed
(tests/fixtures/plugins/omni-fixture-pipeline) and checks, through :func:`faults.assert_clean_failure`,
the exit code, words naming the cause and the fix, no traceback, and that the recipe and the checkpoint
are untouched. What happens to requests in a running pipeline (a stage that dies, hangs, raises or
sends too much) is checked against the real runtime in tests/test_pipeline_runtime.py.

Every fault found later gets a row here.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from faults import assert_clean_failure, assert_unchanged, snapshot

from omni_core.testing import install_plugin

OMNI = Path(sys.executable).parent / "omni"
FIXTURE = Path(__file__).parent / "fixtures" / "plugins" / "omni-fixture-pipeline"
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "safetensors", "omni_plugin_connectors")),
    reason="needs torch, safetensors and omni-plugin-connectors (the dev environment, `make test`)",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugin(FIXTURE, tmp_path_factory.mktemp("faults-pipeline-site"))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults-pipeline-home")


def omni(home: Path, site: Path, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_") and k != "PYTHONPATH"}
    env.update(OMNI_CONFIG_DIR=str(home / "config"), OMNI_CACHE_DIR=str(home / "cache"), PYTHONPATH=str(site))
    return subprocess.run(
        [str(OMNI), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def checkpoints(home: Path, site: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("faults-pipeline-models")
    made = {}
    for key, family in (("pipeline", "fixture-pipeline"), ("flux", "flux1-schnell")):
        proc = omni(home, site, "models", "make-tiny", family, root / key, cwd=root)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        made[key] = root / key
    return made


@dataclass
class Case:
    recipe: str | None
    words: tuple[str, ...]
    model: str = "pipeline"


CASES = {
    "recipe-unknown-field": Case(
        "pipeline:\n  defaults: {placment: process}\n",
        ("unknown field 'pipeline.defaults.placment'", "accepted: placement"),
    ),
    "recipe-field-of-the-model": Case(
        "pipeline:\n  stages:\n    tokens: {kind: generation}\n",
        ("pipeline.stages.tokens", "'kind' is the model's to declare", "engine_options"),
    ),
    "recipe-unknown-engine": Case(
        "pipeline:\n  stages:\n    tokens: {engine: turbo}\n",
        ("pipeline.stages.tokens.engine: no stage engine 'turbo'", "not installed", "can run on ['fixture']"),
    ),
    "recipe-engine-in-defaults": Case(
        "pipeline:\n  defaults: {engine: turbo}\n",
        ("pipeline.defaults.engine", "chosen per stage (pipeline.stages.<stage>.engine)"),
    ),
    "recipe-unknown-stage": Case(
        "pipeline:\n  stages:\n    talker: {placement: process}\n",
        ("pipeline.stages names 'talker', which is not a stage", "tokens", "hidden", "wave"),
    ),
    "recipe-edge-to-a-missing-stage": Case(
        "pipeline:\n  edges:\n    - {from: tokens, to: wave}\n",
        ("pipeline.edges[0] is tokens->wave, which is not an edge", "tokens->hidden"),
    ),
    "recipe-unknown-connector": Case(
        "pipeline:\n  edges:\n    - {from: tokens, to: hidden, connector: rdma}\n",
        ("pipeline.edges[0].connector", "unknown connector 'rdma'", "omni plugins list"),
    ),
    "recipe-same-process-connector-across-processes": Case(
        "pipeline:\n  defaults: {placement: process}\n"
        "  edges:\n    - {from: tokens, to: hidden, connector: inprocess}\n",
        ("edge tokens->hidden crosses processes", "only works within one process", "shm, tcp"),
    ),
    "recipe-bad-connector-option": Case(
        "pipeline:\n  connectors:\n    big: {connector: shm, extra: {inline: 4096}}\n"
        "  edges:\n    - {from: tokens, to: hidden, connector: big}\n",
        ("connector 'big'", "inline"),
    ),
    "recipe-window-zero": Case(
        "pipeline:\n  edge_defaults: {window: 0}\n", ("window must be -1 (hand over at the end) or at least 1",)
    ),
    "recipe-unknown-placement": Case(
        "pipeline:\n  defaults: {placement: gpu}\n", ("placement 'gpu' is not one of", "inprocess", "process")
    ),
    "recipe-executor-no-stage-uses": Case(
        "pipeline:\n  executors:\n    ray: {}\n", ("pipeline.executors.ray", "no stage is placed on")
    ),
    "recipe-not-yaml": Case("pipeline: [unclosed\n", ("not valid YAML",)),
    "not-a-pipeline-model": Case(None, ("not a pipeline model", "omni generate"), model="flux"),
}


@pytest.mark.parametrize("case", [pytest.param(c, id=i) for i, c in CASES.items()])
def test_a_bad_recipe_or_model_is_named_before_anything_starts(
    case: Case, checkpoints: dict[str, Path], home: Path, site: Path, tmp_path: Path
) -> None:
    model = checkpoints[case.model]
    args: list[str | Path] = ["explain", "pipeline", "--model", model]
    if case.recipe is not None:
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(case.recipe, encoding="utf-8")
        args += ["--recipe", recipe]
    before = snapshot([model, tmp_path])
    result = omni(home, site, *args, cwd=tmp_path)
    assert_clean_failure(result, 1, *case.words)
    assert_unchanged(before, [model, tmp_path])
