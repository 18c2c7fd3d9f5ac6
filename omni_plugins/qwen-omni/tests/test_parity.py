"""The stage engines, called one after the other in this process, against transformers' own
``Qwen2_5OmniForConditionalGeneration.generate`` on the same tiny checkpoint.

Tolerance: none. With greedy decoding the stages run the same forward passes on the same inputs
in the same process (the talker's reply vectors are the same sums, token2wav's noise comes from
the same seed), so text tokens, codec codes and every waveform sample are equal, bit for bit.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import wave
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from omni_plugin_qwen_omni import reference  # noqa: E402
from omni_plugin_qwen_omni.prompt import SPEECH_SYSTEM_PROMPT  # noqa: E402

MESSAGES = [{"role": "user", "content": "Hello, how are you?"}]
#: greedy on both AR stages; the talker's other defaults (repetition penalty 1.05) are generate's
GREEDY = {"thinker": {"max_tokens": 12}, "talker": {"temperature": 0, "max_tokens": 40}}
#: what the tiny checkpoint (seed 0) says early to the test prompt, greedy: the thinker tokens
#: 333, 40, 43, 261, 117, 45, ...; to the first five of them, the talker codes 47, 35, 16, 49, 16,
#: then 32 for ever (``test_replies_that_end_by_themselves_match_generate`` checks both stop early)
EARLY_TOKEN = 45
EARLY_CODE = 32


@pytest.fixture(scope="module")
def tiny_omni_stops(tiny_omni: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights with an end-of-turn id and a stop code the tiny model says early, so that a
    reply ends by itself: the thinker stops at :data:`EARLY_TOKEN` (``generation_config.json``),
    the talker at :data:`EARLY_CODE` (its ``tts_codec_end_token_id``)."""
    directory = tmp_path_factory.mktemp("qwen-omni") / "tiny-stops"
    shutil.copytree(tiny_omni, directory)
    generation = json.loads((directory / "generation_config.json").read_text())
    generation["eos_token_id"] = [generation["eos_token_id"], EARLY_TOKEN]
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))
    config = json.loads((directory / "config.json").read_text())
    config["talker_config"]["tts_codec_end_token_id"] = EARLY_CODE
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def assert_same(got: reference.Answer, want: reference.Answer) -> None:
    assert got.tokens == want.tokens
    assert got.codes == want.codes
    assert got.wave is not None and want.wave is not None
    assert got.wave.dtype == torch.float32 and got.wave.ndim == 1
    assert torch.equal(got.wave, want.wave)


def test_the_stages_give_what_generate_gives(tiny_omni: Path, chain: Any) -> None:
    want = reference.generate(tiny_omni, MESSAGES, thinker_max_tokens=12, talker_max_tokens=40)
    got = chain(MESSAGES, GREEDY)
    assert len(want.tokens) == 12 and len(want.codes) == 40  # the budgets ended both: no stop token said
    assert float(want.wave.abs().max()) > 0.01  # a waveform, not silence
    assert_same(got, want)
    # 480 samples per code: two mel frames of 240 samples
    assert got.wave is not None and got.wave.shape == (40 * 480,)


def test_replies_that_end_by_themselves_match_generate(tiny_omni_stops: Path) -> None:
    """The thinker stops at its end-of-turn id (the talker then reads the text end marker) and the
    talker at its stop code, before either budget runs out."""
    want = reference.generate(tiny_omni_stops, MESSAGES, thinker_max_tokens=12, talker_max_tokens=40)
    got = reference.stages(tiny_omni_stops, MESSAGES, GREEDY)
    assert EARLY_TOKEN not in want.tokens and 1 < len(want.tokens) < 12
    assert EARLY_CODE not in want.codes and 0 < len(want.codes) < 40
    assert_same(got, want)


def test_another_voice_speaks_differently_and_matches_generate(tiny_omni: Path, chain: Any) -> None:
    params = {**GREEDY, "talker": {**GREEDY["talker"], "voice": "Ethan"}}
    want = reference.generate(tiny_omni, MESSAGES, thinker_max_tokens=12, talker_max_tokens=40, voice="Ethan")
    got = chain(MESSAGES, params)
    assert_same(got, want)
    chelsie = chain(MESSAGES, GREEDY)
    assert chelsie.wave is not None and got.wave is not None and not torch.equal(chelsie.wave, got.wave)


def wav_part(samples: Any, rate: int) -> dict[str, Any]:
    import numpy as np

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.asarray(samples) * 32767).astype("<i2").tobytes())
    data = base64.b64encode(buffer.getvalue()).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def tone(seconds: float, rate: int) -> Any:
    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    return 0.3 * np.sin(2 * np.pi * 440 * t)


def test_audio_input_matches_generate(tiny_omni: Path, chain: Any) -> None:
    messages = [{"role": "user", "content": [wav_part(tone(0.6, 16000), 16000), {"type": "text", "text": "What?"}]}]
    want = reference.generate(tiny_omni, messages, thinker_max_tokens=8, talker_max_tokens=24)
    got = chain(messages, {"thinker": {"max_tokens": 8}, "talker": {"temperature": 0, "max_tokens": 24}})
    assert_same(got, want)
    text_only = chain([{"role": "user", "content": "What?"}], {"thinker": {"max_tokens": 8}})
    assert text_only.tokens != got.tokens  # the audio was heard


def test_the_prompt_is_the_chat_template_with_qwens_speech_system_prompt(tiny_omni: Path) -> None:
    from omni_plugin_qwen_omni.model import QwenOmni
    from omni_plugin_qwen_omni.stages import ThinkerStage
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_omni)
    thinker = ThinkerStage(tiny_omni, QwenOmni.topology_for(tiny_omni).stage("thinker"), {})
    expected = tokenizer.apply_chat_template(
        [{"role": "system", "content": SPEECH_SYSTEM_PROMPT}, *MESSAGES], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    assert thinker.prompt(MESSAGES)["input_ids"][0].tolist() == list(expected)
    # a string is one user turn; parts are joined; a conversation's own system message is kept
    assert torch.equal(thinker.prompt("Hello, how are you?")["input_ids"], thinker.prompt(MESSAGES)["input_ids"])
    halves = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "how are you?"}]
    parts = [{"role": "user", "content": halves}]
    assert torch.equal(thinker.prompt(parts)["input_ids"], thinker.prompt(MESSAGES)["input_ids"])
    own = [{"role": "system", "content": "Be brief."}, *MESSAGES]
    assert thinker.prompt(own)["input_ids"][0].tolist() == list(
        tokenizer.apply_chat_template(own, add_generation_prompt=True, return_dict=True)["input_ids"]
    )


def test_a_chat_template_kept_beside_the_processor_is_used(tiny_omni: Path, tmp_path: Path) -> None:
    """Some checkpoints keep the template in ``chat_template.json`` (the processor's) only."""
    import json
    import shutil

    from omni_plugin_qwen_omni.model import QwenOmni
    from omni_plugin_qwen_omni.stages import ThinkerStage

    moved = tmp_path / "moved"
    shutil.copytree(tiny_omni, moved)
    config = json.loads((moved / "tokenizer_config.json").read_text())
    (moved / "chat_template.json").write_text(json.dumps({"chat_template": config.pop("chat_template")}))
    (moved / "tokenizer_config.json").write_text(json.dumps(config))
    stage = QwenOmni.topology_for(tiny_omni).stage("thinker")
    want = ThinkerStage(tiny_omni, stage, {}).prompt(MESSAGES)["input_ids"]
    assert torch.equal(ThinkerStage(moved, stage, {}).prompt(MESSAGES)["input_ids"], want)


def test_an_audio_part_becomes_as_many_audio_tokens_as_the_processor_counts(tiny_omni: Path) -> None:
    """The expansion Qwen2_5OmniProcessor makes (its own length formula), at any input rate."""
    from omni_plugin_qwen_omni.model import QwenOmni
    from omni_plugin_qwen_omni.stages import ThinkerStage
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

    thinker = ThinkerStage(tiny_omni, QwenOmni.topology_for(tiny_omni).stage("thinker"), {})
    for seconds, rate in ((0.6, 16000), (1.0, 44100)):
        inputs = thinker.prompt([{"role": "user", "content": [wav_part(tone(seconds, rate), rate)]}])
        frames = inputs["feature_attention_mask"].sum(-1)
        assert int(frames[0]) == int(seconds * 16000) // 160  # resampled to 16 kHz, one frame per 10 ms
        count = int((inputs["input_ids"] == thinker.audio_token_id).sum())
        assert count == int(_get_feat_extract_output_lengths(frames)[0])
        assert inputs["input_features"].shape == (1, 128, 3000)


def test_sampling_is_reproducible_with_a_seed(chain: Any) -> None:
    """Both AR stages sample with a generator of their own, seeded by the request."""
    params = {"thinker": {"max_tokens": 10, "temperature": 1.5, "seed": 7}, "talker": {"max_tokens": 20, "seed": 7}}
    first = chain(MESSAGES, params)
    again = chain(MESSAGES, params)
    assert again.tokens == first.tokens and again.codes == first.codes
    assert again.wave is not None and first.wave is not None and torch.equal(again.wave, first.wave)
    reseeded = chain(MESSAGES, {"thinker": {**params["thinker"], "seed": 8}, "talker": {"max_tokens": 20, "seed": 8}})
    assert reseeded.tokens != first.tokens and reseeded.codes != first.codes
