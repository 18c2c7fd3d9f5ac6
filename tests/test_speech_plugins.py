"""TTS adapter detection with real installed plugins: the fixture packages
``omni-fixture-tts-a`` / ``-b`` (both claim arch ``FixtureTTSModel`` at detect_priority 100) and
``-c`` (the same arch at 50) are pip-installed next to the CPU plugin and driven through the
real ``omni`` executable of a venv without torch or numpy.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "plugins"
TTS_FIXTURES = ("omni-fixture-tts-a", "omni-fixture-tts-b", "omni-fixture-tts-c")

A = "omni-fixture-tts-a 1.0.0 (plugin 'fixture-tts-a')"
B = "omni-fixture-tts-b 2.0.0 (plugin 'fixture-tts-b')"
C = "omni-fixture-tts-c 3.0.0 (plugin 'fixture-tts-c')"


@pytest.fixture(scope="session")
def tts_fixture_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the fixture packages, so pip's in-tree builds never write into the repo."""
    dest = tmp_path_factory.mktemp("tts-fixture-src")
    for name in TTS_FIXTURES:
        shutil.copytree(
            FIXTURES / name, dest / name, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
        )
    return dest


@pytest.fixture
def install(install_plugins: Callable[..., Any], tts_fixture_src: Path) -> Callable[..., Any]:
    def go(*names: str) -> Any:
        return install_plugins(*(tts_fixture_src / f"omni-fixture-tts-{n}" for n in names))

    return go


def check(result: Any, code: int = 0) -> Any:
    assert result.returncode == code, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def tiny(venv: Any, directory: Path) -> Path:
    result = check(venv.omni("models", "make-tiny", "fixture-tts-a", str(directory), "--seed", "4"))
    assert "random weights" in result.stdout and str(directory) in result.stdout
    return directory


def test_equal_priority_adapters_for_one_model_are_an_error_naming_both_plugins(install, tmp_path):
    venv = install("a", "b")
    model = tiny(venv, tmp_path / "model")
    result = check(venv.omni("explain", "tts", "--model", str(model)), 1)
    assert result.stderr.startswith("error: TTS adapters 'fixture-tts-a'")
    assert A in result.stderr and B in result.stderr
    assert "at detect_priority 100" in result.stderr and "--adapter NAME" in result.stderr

    # the overlap is a startup problem doctor names, whatever model is served later
    doctor = venv.omni("doctor", "--json")
    problems = [p["problem"] for p in json.loads(doctor.stdout)["problems"]]
    overlap = [p for p in problems if "both claim" in p]
    assert overlap == [
        f"TTS adapters 'fixture-tts-a' ({A}) and 'fixture-tts-b' ({B}) both claim ['FixtureTTSModel'] "
        "at detect_priority 100"
    ]
    assert doctor.returncode == 1

    # an explicit choice settles it, and says so
    chosen = check(venv.omni("explain", "tts", "--model", str(model), "--adapter", "fixture-tts-b", "--json"))
    data = chosen.json()
    assert data["winner"] == "fixture-tts-b" and data["rule"] == "explicit choice"
    assert data["architectures"] == ["FixtureTTSModel"]
    assert len(data["overlaps"]) == 1


def test_the_lower_detect_priority_wins_and_the_explanation_says_why(install, tmp_path):
    venv = install("a", "c")
    model = tiny(venv, tmp_path / "model")
    result = check(venv.omni("explain", "tts", "--model", str(model)))
    lines = result.stdout.splitlines()
    assert lines[0] == "tts adapter for model (arch=FixtureTTSModel, model_type=fixture_tts, stage=-):"
    assert any("fixture-tts-c" in line and "selected" in line and "matches (priority 50)" in line for line in lines)
    assert any(
        "fixture-tts-a" in line and "not-considered" in line and "matches too, but at priority 100" in line
        for line in lines
    )
    assert lines[-1] == "  => fixture-tts-c (first match in (detect_priority, name) order)"

    data = check(venv.omni("explain", "tts", "--model", str(model), "--json")).json()
    assert data["winner"] == "fixture-tts-c" and data["overlaps"] == []
    candidates = {c["name"]: c for c in data["candidates"]}
    assert candidates["fixture-tts-c"]["provider"] == C
    assert candidates["fixture-tts-a"]["outcome"] == "not-considered"
    assert not any("both claim" in p["problem"] for p in json.loads(venv.omni("doctor", "--json").stdout)["problems"])


def test_a_model_no_adapter_serves_lists_the_adapters(install, tmp_path):
    venv = install("a")
    model = tmp_path / "other"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["SomethingElse"]}))
    result = check(venv.omni("explain", "tts", "--model", str(model)), 1)
    assert "  => nothing selected (no TTS adapter serves this model (adapters: fixture-tts-a))" in result.stdout
    assert "does not match (priority 100)" in result.stdout
    missing = check(venv.omni("explain", "tts", "--model", str(tmp_path)), 1)
    assert "has no config.json" in missing.stderr


def test_models_list_and_make_tiny_use_the_adapters_makers(install, tmp_path):
    venv = install("a", "c")
    listing = check(venv.omni("models", "list")).stdout
    assert "fixture-tts-a" in listing and "fixture-tts-c" not in listing, "c has no maker"
    everything = check(venv.omni("models", "list", "--all", "--json")).json()["families"]
    assert {f["family"]: f["make_tiny"] for f in everything} == {"fixture-tts-a": True, "fixture-tts-c": False}

    model = tiny(venv, tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["FixtureTTSModel"] and config["init_seed"] == 4
    marker = json.loads((model / "omni-tiny.json").read_text())
    assert marker == {"family": "fixture-tts-a", "seed": 4, "provider": A, "random_weights": True}

    again = check(venv.omni("models", "make-tiny", "fixture-tts-a", str(model)), 1)
    assert "exists and is not empty" in again.stderr and "--force" in again.stderr
    check(venv.omni("models", "make-tiny", "fixture-tts-a", str(model), "--force", "--seed", "9"))
    assert json.loads((model / "config.json").read_text())["init_seed"] == 9

    no_maker = check(venv.omni("models", "make-tiny", "fixture-tts-c", str(tmp_path / "c")), 1)
    assert "'fixture-tts-c'" in no_maker.stderr and "has no tiny-checkpoint maker" in no_maker.stderr
    unknown = check(venv.omni("models", "make-tiny", "nope", str(tmp_path / "n")), 1)
    assert "no installed family is called 'nope'; families that make tiny checkpoints: fixture-tts-a." in unknown.stderr
    assert not (tmp_path / "c").exists() and not (tmp_path / "n").exists()


def test_nothing_installed_says_how_to_get_a_family(install):
    venv = install()
    assert "no installed family can make a tiny checkpoint" in check(venv.omni("models", "list")).stdout
