"""omni's contract checks, run against the installed plugin, and what they say of an adapter
whose detection hooks do not agree with each other."""

from pathlib import Path

from omni_plugin_piper.adapter import PiperAdapter

from omni_core.speech.adapter import ReadyModel
from omni_core.testing import PluginConformance
from omni_core.testing.checks import _check_offered_models


class TestPiperPluginConformance(PluginConformance):
    plugin_name = "piper"


def test_the_shipped_hooks_agree() -> None:
    assert _check_offered_models("tts adapter 'piper'", PiperAdapter) == []


def test_a_default_voice_no_name_finds_is_reported(tmp_path: Path) -> None:
    class Stray(PiperAdapter):
        @classmethod
        def ready_model(cls) -> ReadyModel | None:
            return ReadyModel("nobody", tmp_path / "nobody.onnx", "a voice that is not installed")

    assert _check_offered_models("tts adapter 'stray'", Stray) == [
        "tts adapter 'stray': ready_model() offers 'nobody', which installed_models() does not list; "
        "offer one of the installed models, by a name --model finds"
    ]


def test_an_installed_model_identify_does_not_claim_is_reported(tmp_path: Path) -> None:
    class Unclaimed(PiperAdapter):
        @classmethod
        def installed_models(cls) -> dict[str, Path]:
            return {"ghost": tmp_path / "ghost.bin"}

        @classmethod
        def ready_model(cls) -> ReadyModel | None:
            return None

    assert _check_offered_models("tts adapter 'x'", Unclaimed) == [
        f"tts adapter 'x': identify() does not claim its installed model 'ghost' ({tmp_path / 'ghost.bin'})"
    ]
