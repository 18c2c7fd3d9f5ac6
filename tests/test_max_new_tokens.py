"""``max_new_tokens`` means one thing for every installed TTS family: the most output tokens of
the whole request, counted as the family's ``usage`` counts them; a one-pass family refuses it.
Real adapters on their own tiny checkpoints."""

from __future__ import annotations

import pytest

from omni_core import Omni
from omni_core.errors import SpeechRequestError
from omni_core.plugins import get_plugins
from omni_core.speech.adapter import TTSAdapter

pytestmark = pytest.mark.slow

TEXT = "Hello world. This is omni speaking. Goodbye now."


def tiny_families() -> list[str]:
    """The installed TTS families that write a tiny checkpoint of their own."""
    base = TTSAdapter.make_tiny.__func__  # type: ignore[attr-defined]
    return [e.name for e in get_plugins().tts_adapters if getattr(e.load().make_tiny, "__func__", None) is not base]


FAMILIES = tiny_families()


def test_the_shipped_families_are_here() -> None:
    """Guard: the checks below mean something only with an autoregressive and a one-pass family."""
    assert {"speecht5", "bark", "vits"} <= set(FAMILIES)


@pytest.fixture(scope="module", params=FAMILIES)
def omni(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    family = request.param
    cls = get_plugins().tts_adapters.load(family)
    model = cls.make_tiny(tmp_path_factory.mktemp(family) / "ck", seed=0)
    with Omni(model) as opened:
        yield opened


def test_the_budget_bounds_the_whole_request_in_usages_unit(omni) -> None:  # type: ignore[no-untyped-def]
    if "max_new_tokens" in omni.capabilities.unsupported_fields:
        with pytest.raises(SpeechRequestError, match="does not support 'max_new_tokens'"):
            omni.speak(TEXT, max_new_tokens=5)
        assert omni.speak(TEXT, seed=0).metadata.get("usage") is None  # no token count to budget
        return
    full = omni.speak(TEXT, seed=0).metadata["usage"]["output_tokens"]
    for budget in (3, 8, max(3, full // 2)):
        result = omni.speak(TEXT, seed=0, max_new_tokens=budget)
        spent = result.metadata["usage"]["output_tokens"]
        assert 0 < spent <= budget, (budget, spent)
    # a budget beyond what the model makes anyway changes nothing
    assert omni.speak(TEXT, seed=0, max_new_tokens=full + 50).metadata["usage"]["output_tokens"] == full
