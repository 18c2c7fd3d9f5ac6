"""What a request may hold, and what each stage says when it cannot serve one (in this process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from omni_core.errors import ChatRequestError  # noqa: E402

MESSAGES = [{"role": "user", "content": "Hello, how are you?"}]


def test_an_unknown_voice_is_refused_naming_the_voices(chain: Any) -> None:
    with pytest.raises(ChatRequestError, match=r"unknown voice 'Nobody'; this checkpoint's voices are Chelsie, Ethan"):
        list(chain.talker.run(iter([]), {"voice": "Nobody"}))


def test_the_default_voice_is_chelsie_unless_the_engine_options_say(tiny_omni: Path, chain: Any) -> None:
    from omni_plugin_qwen_omni.model import QwenOmni
    from omni_plugin_qwen_omni.stages import TalkerStage

    assert chain.talker.default_voice == "Chelsie"
    stage = QwenOmni.topology_for(tiny_omni).stage("talker")
    assert TalkerStage(tiny_omni, stage, {"voice": "Ethan"}).default_voice == "Ethan"
    with pytest.raises(ChatRequestError, match="unknown voice 'Nobody'"):
        TalkerStage(tiny_omni, stage, {"voice": "Nobody"})


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
        {"type": "video", "video": "clip.mp4"},
    ],
    ids=["image_url", "input_image", "video"],
)
def test_images_and_video_are_refused_saying_why(chain: Any, part: dict[str, Any]) -> None:
    request = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    refused = r"messages\[0\]\.content\[1\].*not supported by this install.*torchvision"
    with pytest.raises(ChatRequestError, match=refused):
        list(chain.thinker.run(iter([request]), {}))


@pytest.mark.parametrize(
    ("request_input", "message"),
    [
        ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "%%%"}}]}], "not base64"),
        (
            [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "mp3"}}]}],
            "format 'mp3' is not supported",
        ),
        ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA"}}]}], "not a readable"),
        ([{"role": "robot", "content": "hi"}], "role is 'robot'"),
        ([{"role": "user", "content": [{"type": "file", "file": {}}]}], "is a 'file' part"),
        ([], "non-empty list of chat messages"),
        (42, "non-empty list of chat messages"),
    ],
    ids=["not-base64", "not-wav", "not-audio", "role", "part", "empty", "number"],
)
def test_a_malformed_request_is_refused_by_name(chain: Any, request_input: Any, message: str) -> None:
    with pytest.raises(ChatRequestError, match=message):
        list(chain.thinker.run(iter([request_input]), {}))


def test_unknown_or_mistyped_parameters_are_refused(chain: Any) -> None:
    with pytest.raises(ChatRequestError, match=r"stage 'thinker' takes no parameter\(s\) \['max_token'\]"):
        list(chain.thinker.run(iter([MESSAGES]), {"max_token": 3}))
    with pytest.raises(ChatRequestError, match="max_tokens must be an integer"):
        list(chain.thinker.run(iter([MESSAGES]), {"max_tokens": "3"}))
    with pytest.raises(ChatRequestError, match="stage 'talker' takes no parameter"):
        list(chain.talker.run(iter([]), {"speaker": "Ethan"}))
    with pytest.raises(ChatRequestError, match="stage 'token2wav' takes no parameter"):
        list(chain.token2wav.run(iter([]), {"voice": "Ethan"}))


def test_max_tokens_bounds_the_answer_and_nothing_is_spoken_of_one_token(chain: Any) -> None:
    items = list(chain.thinker.run(iter([MESSAGES]), {"max_tokens": 3}))
    assert len(items) == 3 and [i["last"] for i in items] == [False, False, True]
    assert items[-1]["hidden"] is None and all(i["hidden"].shape == (64,) for i in items[:-1])
    assert "prompt" in items[0] and all("prompt" not in i for i in items[1:])
    one = list(chain.thinker.run(iter([MESSAGES]), {"max_tokens": 1}))
    assert len(one) == 1 and one[0]["hidden"] is None
    assert list(chain.talker.run(iter(one), {"temperature": 0})) == []  # no reply to condition on
    assert list(chain.token2wav.run(iter([]), {})) == []


def test_text_pieces_hold_back_a_character_split_across_tokens(chain: Any) -> None:
    tokenizer = chain.thinker.tokenizer
    text = "Hé, 你好!"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text)  # the tiny vocabulary splits the multi-byte characters into bytes
    list(chain.thinker.run(iter([MESSAGES]), {"max_tokens": 1}))  # each run starts a fresh text stream
    pieces = [chain.thinker.for_output({"token_id": i, "last": n == len(ids) - 1}) for n, i in enumerate(ids)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert "" in pieces  # held back while a character was incomplete
    assert "你" in pieces


def test_a_system_prompt_is_added_only_when_the_conversation_has_none(tiny_omni: Path, chain: Any) -> None:
    from omni_plugin_qwen_omni.model import QwenOmni
    from omni_plugin_qwen_omni.prompt import SPEECH_SYSTEM_PROMPT
    from omni_plugin_qwen_omni.stages import ThinkerStage

    decode = chain.thinker.tokenizer.decode
    assert SPEECH_SYSTEM_PROMPT in decode(chain.thinker.prompt(MESSAGES)["input_ids"][0])
    own = [{"role": "system", "content": "Be brief."}, *MESSAGES]
    assert SPEECH_SYSTEM_PROMPT not in decode(chain.thinker.prompt(own)["input_ids"][0])
    bare = ThinkerStage(tiny_omni, QwenOmni.topology_for(tiny_omni).stage("thinker"), {"system_prompt": ""})
    assert decode(bare.prompt(MESSAGES)["input_ids"][0]).startswith("<|im_start|>user\n")


def finish_of(stage: Any, items: list[Any], params: dict[str, Any]) -> tuple[list[Any], str]:
    """One run's items, and how it ended (what ``run`` returned, as the stage loop reads it)."""
    run = stage.run(iter(items), params)
    got: list[Any] = []
    while True:
        try:
            got.append(next(run))
        except StopIteration as end:
            return got, str(end.value)


def test_the_speech_system_prompt_comes_only_when_audio_is_asked_for(chain: Any) -> None:
    from omni_plugin_qwen_omni.prompt import SPEECH_SYSTEM_PROMPT

    from omni_core.pipeline.stage import StageParams

    decode = chain.thinker.tokenizer.decode

    def prompt_of(outputs: tuple[str, ...] | None) -> str:
        params = {"max_tokens": 2} if outputs is None else StageParams({"max_tokens": 2}, outputs=outputs)
        first = next(iter(chain.thinker.run(iter([MESSAGES]), params)))
        return str(decode(first["prompt"]["ids"]))

    assert SPEECH_SYSTEM_PROMPT in prompt_of(("text", "audio")) and SPEECH_SYSTEM_PROMPT in prompt_of(("audio",))
    assert SPEECH_SYSTEM_PROMPT in prompt_of(None)  # called directly, outputs unknown: as for everything
    text_only = prompt_of(("text",))
    assert SPEECH_SYSTEM_PROMPT not in text_only and text_only.startswith("<|im_start|>user\n")


def test_the_thinker_says_how_its_answer_ended(chain: Any) -> None:
    items, finish = finish_of(chain.thinker, [MESSAGES], {"max_tokens": 3})
    assert (len(items), finish) == (3, "length")
    codes, spoken = finish_of(chain.talker, items, {"temperature": 0, "max_tokens": 2})
    assert (len(codes), spoken) == (2, "length")


def test_a_stop_string_ends_the_text_and_what_the_talker_speaks(chain: Any) -> None:
    items, _ = finish_of(chain.thinker, [MESSAGES], {"max_tokens": 12})
    pieces = [chain.thinker.for_output(item) for item in items]
    full = "".join(pieces)
    # a stop string across two tokens' text, ending in the (k+1)th token
    k = next(
        i
        for i in range(2, len(pieces) - 2)
        if pieces[i] and pieces[i + 1] and "\ufffd" not in pieces[i][-1] + pieces[i + 1][0]
    )
    start = len("".join(pieces[:k])) + len(pieces[k]) - 1
    stop = full[start : start + 2]
    cut = full.find(stop)
    stopped, finish = finish_of(chain.thinker, [MESSAGES], {"max_tokens": 12, "stop": ["NEVER", stop]})
    text = "".join(chain.thinker.for_output(item) for item in stopped)
    assert (text, finish) == (full[:cut], "stop")
    assert [i["token_id"] for i in stopped] == [i["token_id"] for i in items[: len(stopped)]]
    assert len(stopped) < len(items)
    # the token completing the stop string ends the reply the talker reads: it is not read itself
    assert stopped[-1]["last"] and stopped[-1]["hidden"] is None
    assert all(i["hidden"] is not None for i in stopped[:-1])
    talker = {"temperature": 0, "max_tokens": 40}
    spoken = list(chain.talker.run(iter(stopped), talker))
    reply = [*items[: len(stopped) - 1], {**items[len(stopped) - 1], "embed": None, "hidden": None, "last": True}]
    assert spoken == list(chain.talker.run(iter(reply), talker))
    with pytest.raises(ChatRequestError, match="stop must be a non-empty string"):
        list(chain.thinker.run(iter([MESSAGES]), {"stop": [""]}))
