"""``omni models show MODEL`` lists a model's voices (the default marked) with what else a request
may ask of it: the real ``omni`` on real tiny checkpoints of the installed families."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

OMNI = Path(sys.executable).parent / "omni"


def needs(plugin: str) -> pytest.MarkDecorator:
    found = importlib.util.find_spec(f"omni_plugin_{plugin}") is not None
    return pytest.mark.skipif(not found, reason=f"the {plugin} plugin is not installed here")


def omni(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    env.update(OMNI_CONFIG_DIR=str(home / "config"), OMNI_CACHE_DIR=str(home / "cache"))
    return subprocess.run([str(OMNI), *args], capture_output=True, text=True, env=env, cwd=home, timeout=600)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices")


def tiny(home: Path, family: str) -> Path:
    model = home / family
    if not model.exists():
        made = omni(home, "models", "make-tiny", family, str(model))
        assert made.returncode == 0, made.stderr
    return model


@needs("speecht5")
def test_a_speech_models_voices_are_listed_and_each_is_accepted(home: Path) -> None:
    model = tiny(home, "speecht5")
    shown = omni(home, "models", "show", str(model))
    assert shown.returncode == 0, shown.stderr
    lines = dict(line.split(None, 1) for line in shown.stdout.splitlines() if not line.startswith(("served", "sample")))
    assert lines["voices"] == "alba (default), bram, cleo"
    assert f"{model}  (random weights)" in shown.stdout
    assert "sample rate  16000 Hz native; on request: any from 8000 to 192000 Hz" in shown.stdout
    data = json.loads(omni(home, "models", "show", str(model), "--json").stdout)
    assert (data["family"], data["kind"], data["task"]) == ("speecht5", "tts_adapter", "speech")
    assert (data["voices"], data["default_voice"]) == (["alba", "bram", "cleo"], "alba")
    # what it lists is what speak takes, and a name outside it is refused with the same list
    spoken = omni(home, "speak", "--model", str(model), "Hi.", "--voice", data["voices"][-1], "-o", "x.wav")
    assert spoken.returncode == 0, spoken.stderr
    refused = omni(home, "speak", "--model", str(model), "Hi.", "--voice", "nobody", "-o", "y.wav")
    assert refused.returncode == 1
    assert "available: alba, bram, cleo" in refused.stderr


@needs("vits")
def test_a_model_without_voices_says_to_send_none(home: Path) -> None:
    shown = omni(home, "models", "show", str(tiny(home, "vits")))
    assert shown.returncode == 0, shown.stderr
    assert "voices       none to choose (send no voice)" in shown.stdout
    assert "speed        the model's own" in shown.stdout


@needs("llm")
def test_a_model_that_does_not_speak_has_no_voices_and_loads_nothing(home: Path) -> None:
    model = tiny(home, "causal-lm")
    shown = omni(home, "models", "show", str(model), "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert (data["family"], data["kind"], data["task"], data["voices"]) == ("causal-lm", "model", "chat", [])
    text = omni(home, "models", "show", str(model)).stdout
    assert "voices     none (it does not speak)" in text


def test_a_missing_model_is_named_with_the_fix(home: Path) -> None:
    shown = omni(home, "models", "show", str(home / "nowhere"))
    assert shown.returncode == 1
    assert shown.stdout == ""
    assert "does not exist; point it at a checkpoint directory" in shown.stderr
    assert "Traceback" not in shown.stderr
