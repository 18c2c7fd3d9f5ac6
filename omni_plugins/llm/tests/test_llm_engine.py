"""The transformers engine on the tiny checkpoint: real forward passes, checked against plain
``model.generate`` and ``tokenizer.decode``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from llm_testkit import answer, finish_of

from omni_core.errors import ChatRequestError

PROMPTS = ("Hello", "The quick brown fox", "a", "say how")
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say something short."},
]
#: prompts whose greedy answer ends with <|im_end|> early (seed 0's weights), to find one
EOS_CANDIDATES = ("short user", "I random", "say how", "with a", "say model")


def text_of(tokenizer: Any, tokens: list[int]) -> str:
    return tokenizer.decode(tokens, skip_special_tokens=True)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_generate_and_the_text_equals_decode(
    llm_engine: Any, reference: tuple[Any, Any], greedy: Any, prompt: str
) -> None:
    _, tokenizer = reference
    tokens, pieces = answer(llm_engine, prompt, max_tokens=40)
    assert tokens == greedy(tokenizer(prompt)["input_ids"], 40)
    assert "".join(pieces) == text_of(tokenizer, tokens)


def test_chat_messages_render_through_the_chat_template(
    llm_engine: Any, reference: tuple[Any, Any], greedy: Any
) -> None:
    _, tokenizer = reference
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    want = greedy(tokenizer(text, add_special_tokens=False)["input_ids"], 24)
    tokens, pieces = answer(llm_engine, MESSAGES, max_tokens=24)
    assert tokens == want and "".join(pieces) == text_of(tokenizer, want)
    parts = [
        {**m, "content": [{"type": "text", "text": m["content"][:5]}, {"type": "text", "text": m["content"][5:]}]}
        for m in MESSAGES
    ]
    assert answer(llm_engine, parts, max_tokens=24)[0] == want  # text parts read as their joined text


def test_a_bad_content_part_is_a_clear_error(llm_engine: Any) -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}],
        }
    ]
    with pytest.raises(
        ChatRequestError, match=r"messages\[0\]\.content\[1\] is a 'image_url' part; this model reads text only"
    ):
        answer(llm_engine, messages)
    with pytest.raises(ChatRequestError, match="prompt string or a list of chat messages"):
        answer(llm_engine, {"prompt": "x"})


def test_a_model_without_a_chat_template_refuses_messages_and_takes_prompts(tiny_llm: Path, tmp_path: Path) -> None:
    import json

    from omni_plugin_llm.engine import TransformersCausalLM
    from omni_plugin_llm.model import CausalLM

    plain = shutil.copytree(tiny_llm, tmp_path / "plain")
    config = json.loads((plain / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    engine = TransformersCausalLM(plain, CausalLM.topology_for(plain).stage("generate"), {})
    with pytest.raises(ChatRequestError, match="has no chat template"):
        answer(engine, MESSAGES)
    assert len(answer(engine, "Hello", max_tokens=3)[0]) == 3


def test_seeded_sampling_is_reproducible_and_seeds_differ(llm_engine: Any) -> None:
    params = {"max_tokens": 24, "temperature": 1.0, "top_p": 0.95, "top_k": 50, "ignore_eos": True}
    first = answer(llm_engine, "Hello", seed=7, **params)
    assert answer(llm_engine, "Hello", seed=7, **params) == first
    assert answer(llm_engine, "Hello", seed=8, **params)[0] != first[0]
    assert answer(llm_engine, "Hello", max_tokens=24, temperature=0, seed=7) != first  # temperature 0: greedy


def test_top_k_1_and_a_tiny_top_p_are_greedy(llm_engine: Any) -> None:
    greedy_tokens = answer(llm_engine, "Hello", max_tokens=16)[0]
    assert answer(llm_engine, "Hello", max_tokens=16, temperature=1.5, top_k=1, seed=1)[0] == greedy_tokens
    assert answer(llm_engine, "Hello", max_tokens=16, temperature=1.5, top_p=1e-6, seed=1)[0] == greedy_tokens


def test_sampling_keeps_to_the_top_k(llm_engine: Any, reference: tuple[Any, Any]) -> None:
    import torch

    model, tokenizer = reference
    ids = tokenizer("Hello")["input_ids"]
    (token,) = answer(llm_engine, "Hello", max_tokens=1, temperature=5.0, top_k=3, seed=0)[0]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    assert token in torch.topk(logits, 3).indices.tolist()


def test_max_tokens_caps_the_answer(llm_engine: Any) -> None:
    for n in (1, 5):
        assert len(answer(llm_engine, "Hello", max_tokens=n, ignore_eos=True)[0]) == n


def test_eos_ends_the_answer_unless_ignored(llm_engine: Any, reference: tuple[Any, Any], greedy: Any) -> None:
    _, tokenizer = reference
    prompt = next(p for p in EOS_CANDIDATES if 2 in greedy(tokenizer(p)["input_ids"], 48))
    want = greedy(tokenizer(prompt)["input_ids"], 48)
    tokens, pieces = answer(llm_engine, prompt, max_tokens=48)
    assert tokens == want and tokens[-1] == 2 and len(tokens) < 48  # the eos is the last item
    assert pieces[-1] == "" or not pieces[-1].endswith("<|im_end|>")
    longer = answer(llm_engine, prompt, max_tokens=len(tokens) + 4, ignore_eos=True)[0]
    assert longer[: len(tokens)] == tokens and len(longer) == len(tokens) + 4


def test_a_stop_string_ends_the_text_before_it(llm_engine: Any, reference: tuple[Any, Any]) -> None:
    _, tokenizer = reference
    tokens, pieces = answer(llm_engine, "The quick brown fox", max_tokens=40)
    full = "".join(pieces)
    # a stop string spanning two tokens' text: what comes before it is the whole answer
    k = next(
        i
        for i in range(3, len(pieces) - 1)
        if len(pieces[i]) >= 1 and len(pieces[i + 1]) >= 1 and "\ufffd" not in pieces[i] + pieces[i + 1]
    )
    start = len("".join(pieces[:k])) + len(pieces[k]) - 1
    stop = full[start : start + 2]
    cut = full.find(stop)
    got_tokens, got_pieces = answer(llm_engine, "The quick brown fox", max_tokens=40, stop=["NEVER", stop])
    assert "".join(got_pieces) == full[:cut]
    assert got_tokens == tokens[: len(got_tokens)] and len(got_tokens) < len(tokens)
    assert stop in text_of(tokenizer, got_tokens)  # the token completing the stop string is the last item
    assert stop not in text_of(tokenizer, got_tokens[:-1])


def test_the_answer_says_how_it_ended(llm_engine: Any, reference: tuple[Any, Any], greedy: Any) -> None:
    _, tokenizer = reference
    assert finish_of(llm_engine, "Hello", max_tokens=5, ignore_eos=True) == "length"
    prompt = next(p for p in EOS_CANDIDATES if 2 in greedy(tokenizer(p)["input_ids"], 48))
    n = len(answer(llm_engine, prompt, max_tokens=48)[0])
    assert finish_of(llm_engine, prompt, max_tokens=48) == "stop"  # its end-of-sequence token
    assert finish_of(llm_engine, prompt, max_tokens=n) == "stop"  # the budget ends with it: its own end wins
    assert finish_of(llm_engine, prompt, max_tokens=n - 1) == "length"
    full = "".join(answer(llm_engine, "Hello", max_tokens=20, ignore_eos=True)[1])
    stop = next(full[i : i + 2] for i in range(4, len(full) - 2) if "\ufffd" not in full[i : i + 2])
    assert finish_of(llm_engine, "Hello", max_tokens=20, ignore_eos=True, stop=[stop]) == "stop"


def test_a_stop_string_that_never_comes_holds_nothing_back(llm_engine: Any) -> None:
    tokens, pieces = answer(llm_engine, "Hello", max_tokens=20, stop="\x00\x00never")
    assert (tokens, pieces) == answer(llm_engine, "Hello", max_tokens=20)


def test_the_text_state_is_per_request(llm_engine: Any) -> None:
    run = llm_engine.run(iter(["Hello"]), {"max_tokens": 30})
    for _ in range(3):  # an answer abandoned half way (a cancelled request) ...
        next(run)
    run.close()
    # ... leaves nothing behind: the next request's text starts afresh
    assert answer(llm_engine, "a", max_tokens=10) == answer(llm_engine, "a", max_tokens=10)


def test_tokens_are_handed_over_as_they_are_made(llm_engine: Any) -> None:
    calls = [0]
    hook = llm_engine.model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        run = llm_engine.run(iter(["Hello"]), {"max_tokens": 200, "ignore_eos": True})
        next(run)  # the first token comes before the answer is done ...
        assert calls[0] <= 3
        run.close()  # ... and a consumer that stops stops the model within a step
        assert calls[0] <= 3
    finally:
        hook.remove()


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 1.5}, "top_k"),
        ({"stop": [3]}, "stop"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"beam_width": 4}, "beam_width"),
    ],
)
def test_bad_params_are_refused_by_name(llm_engine: Any, params: dict[str, Any], field: str) -> None:
    with pytest.raises(ChatRequestError) as info:
        answer(llm_engine, "Hello", **params)
    assert info.value.field == field and field in str(info.value)


def test_unknown_engine_options_are_refused(tiny_llm: Path) -> None:
    from omni_plugin_llm.engine import TransformersCausalLM
    from omni_plugin_llm.model import CausalLM

    from omni_core.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="block_size"):
        TransformersCausalLM(tiny_llm, CausalLM.topology_for(tiny_llm).stage("generate"), {"block_size": 4})
