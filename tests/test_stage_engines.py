"""Stage engines (plugin API 1.3): a plugin's engine runs another plugin's pipeline stage.

The test pipeline (tests/fixtures/plugins/omni-fixture-pipeline) declares its token stage as
architecture ``FixtureTokenModel`` with its own engine named ``fixture``; the stage-engine
fixture (tests/fixtures/plugins/omni-fixture-stage-engine) registers ``shout``, which runs that
architecture and answers in capitals, so the answer itself says which engine ran. Both are
pip-installed into private sites; every check runs the real ``omni`` command."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving import OMNI, chat_marks, server_env

from omni_core.testing.install import install_plugin

pytestmark = chat_marks()

SHOUT_FIXTURE = Path(__file__).parent / "fixtures" / "plugins" / "omni-fixture-stage-engine"


@pytest.fixture(scope="session")
def shout_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield install_plugin(SHOUT_FIXTURE, tmp_path_factory.mktemp("shout-site"))


def omni(tmp_path: Path, sites: tuple[Path, ...], *args: object, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OMNI, *map(str, args)],
        env=server_env(tmp_path, sites=sites, **env),
        capture_output=True,
        text=True,
        timeout=180,
    )


def stages_of(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    assert result.returncode == 0, result.stderr
    return {s["name"]: s for s in json.loads(result.stdout)["stages"]}


def test_an_installed_engine_that_claims_a_stage_runs_it(
    chat_site: Path, shout_site: Path, chat_model: Path, tmp_path: Path
) -> None:
    stages = stages_of(omni(tmp_path, (chat_site, shout_site), "explain", "pipeline", "--model", chat_model, "--json"))
    tokens = stages["tokens"]
    assert (tokens["engine_name"], tokens["engine"]) == ("shout", "omni_fixture_stage_engine.engine:ShoutingTokens")
    assert "omni-fixture-stage-engine 1.0.0 runs FixtureTokenModel here" in str(tokens["engine_why"])
    # stages it does not claim keep the model's own engines, with the reason
    assert stages["hidden"]["engine_name"] == "model"
    assert "names no architecture" in str(stages["hidden"]["engine_why"])

    # and it really runs there: the answer is in capitals, the speech stages fed as before
    answer = omni(tmp_path, (chat_site, shout_site), "chat", "--model", chat_model, "hi", "--max-tokens", "4")
    assert answer.returncode == 0, answer.stderr
    text = answer.stdout.strip()
    assert text and text == text.upper() and any(c.isalpha() for c in text), answer.stdout


def test_without_the_engine_plugin_the_model_s_own_engine_runs(
    chat_site: Path, chat_model: Path, tmp_path: Path
) -> None:
    tokens = stages_of(omni(tmp_path, (chat_site,), "explain", "pipeline", "--model", chat_model, "--json"))["tokens"]
    assert tokens["engine_name"] == "fixture"
    assert tokens["engine_why"] == "the model's own (no installed stage engine runs FixtureTokenModel ar stages)"
    answer = omni(tmp_path, (chat_site,), "chat", "--model", chat_model, "hi", "--max-tokens", "4")
    assert answer.returncode == 0 and answer.stdout.strip() == answer.stdout.strip().lower(), answer.stdout


def test_an_engine_whose_probe_says_no_is_passed_over_with_its_reason(
    chat_site: Path, shout_site: Path, chat_model: Path, tmp_path: Path
) -> None:
    result = omni(
        tmp_path, (chat_site, shout_site), "explain", "pipeline", "--model", chat_model, OMNI_FIXTURE_SHOUT_OFF="1"
    )
    assert result.returncode == 0, result.stderr
    assert (
        "engine fixture: the model's own; shout cannot run it here: OMNI_FIXTURE_SHOUT_OFF is set" in result.stdout
    ), result.stdout


def test_an_engine_that_cannot_run_here_is_not_offered_as_a_choice(
    chat_site: Path, shout_site: Path, chat_model: Path, tmp_path: Path
) -> None:
    args = ("explain", "pipeline", "--model", chat_model, "--stage", "tokens.engine=turbo")
    offered = omni(tmp_path, (chat_site, shout_site), *args)
    assert offered.returncode == 1 and "can run on ['fixture', 'shout']" in offered.stderr, offered.stderr
    refused = omni(tmp_path, (chat_site, shout_site), *args, OMNI_FIXTURE_SHOUT_OFF="1")
    assert refused.returncode == 1 and "can run on ['fixture']" in refused.stderr, refused.stderr


def test_the_operator_chooses_the_engine_per_stage(
    chat_site: Path, shout_site: Path, chat_model: Path, tmp_path: Path
) -> None:
    sites = (chat_site, shout_site)
    forced = omni(
        tmp_path, sites, "explain", "pipeline", "--model", chat_model, "--json", "--stage", "tokens.engine=fixture"
    )
    tokens = stages_of(forced)["tokens"]
    assert (tokens["engine_name"], tokens["engine_why"]) == (
        "fixture",
        "the model's own, as --stage tokens.engine asks",
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("pipeline:\n  stages:\n    tokens: {engine: shout, engine_options: {volume: 11}}\n")
    chosen = stages_of(
        omni(tmp_path, sites, "explain", "pipeline", "--model", chat_model, "--json", "--recipe", recipe)
    )
    assert chosen["tokens"]["engine_name"] == "shout"
    assert chosen["tokens"]["engine_options"] == {"volume": 11}
    assert "as pipeline.stages.tokens.engine asks" in str(chosen["tokens"]["engine_why"])


def test_the_options_a_model_fixes_for_its_own_engine_do_not_reach_another(
    chat_site: Path, shout_site: Path, chat_model: Path, tmp_path: Path
) -> None:
    from omni_core.pipeline.placement import resolve_pipeline
    from omni_core.pipeline.topology import PipelineTopology, StageDef
    from omni_core.plugins import load_plugins

    sys.path.insert(0, str(shout_site))
    try:
        topology = PipelineTopology(
            name="t",
            stages=(
                StageDef(
                    name="tokens",
                    kind="ar",
                    engine="omni_fixture_pipeline.stages:TokenStage",
                    engine_name="fixture",
                    architecture="FixtureTokenModel",
                    emits="tokens",
                    final="text",
                    options={"load_seconds": 0},
                ),
            ),
        )
        plugins = load_plugins()
        mine = resolve_pipeline(
            topology, {"stages": {"tokens": {"engine": "fixture"}}}, model_dir=chat_model, plugins=plugins
        )
        theirs = resolve_pipeline(topology, {}, model_dir=chat_model, plugins=plugins)
    finally:
        sys.path.remove(str(shout_site))
    assert mine.stage("tokens").engine_options == {"load_seconds": 0}
    assert (theirs.stage("tokens").engine_name, theirs.stage("tokens").engine_options) == ("shout", {})


def test_the_kit_names_a_stage_engine_that_imports_torch_when_planned(
    chat_site: Path, shout_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning imports a stage engine's class (its option_problems) in the orchestrator's
    process. The fixture's engine subclasses the test pipeline's torch stage, so the kit's
    import-light check, which imports it as planning does, names torch."""
    import os

    from omni_core.testing import check_import_light

    for site in (chat_site, shout_site):
        monkeypatch.syspath_prepend(str(site))
    path = [str(shout_site), str(chat_site), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    problems = check_import_light("fixture-stage-engine")
    assert any("as planning a pipeline does) imported" in p and "'torch'" in p for p in problems), problems
