"""The vLLM stage engine on a tiny checkpoint: one engine for the whole session (conftest),
checked against plain transformers. Needs vLLM (``.venv-vllm``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from omni_core.errors import ChatRequestError
from omni_core.testing import run_stage_engine

pytest.importorskip("vllm", reason="vLLM is not installed here (scripts/bootstrap-vllm.sh makes .venv-vllm)")

PROMPT = "Hello, how are you?"
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": [{"type": "text", "text": "Say something short."}]},
]


def run(engine: Any, request: Any, **params: Any) -> list[int]:
    return list(engine.run(iter([request]), params))


def finish(engine: Any, request: Any, **params: Any) -> str:
    return run_stage_engine(engine, request, **params)[2]


def text_of(engine: Any, ids: list[int]) -> str:
    return "".join(engine.for_output(i) for i in ids)


def test_greedy_tokens_equal_transformers(vllm_engine: Any, reference: Any, greedy: Any) -> None:
    _, tokenizer = reference
    ids = run(vllm_engine, PROMPT, max_tokens=24, ignore_eos=True)
    assert ids == greedy(tokenizer(PROMPT)["input_ids"], 24)
    assert len(set(ids)) > 3  # the checkpoint answers varied tokens: equality means something


def test_chat_messages_go_through_the_chat_template(vllm_engine: Any, reference: Any, greedy: Any) -> None:
    _, tokenizer = reference
    flat = [
        {"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else "Say something short."}
        for m in MESSAGES
    ]
    text = tokenizer.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert run(vllm_engine, MESSAGES, max_tokens=16, ignore_eos=True) == greedy(prompt_ids, 16)


def test_tokens_stream_as_they_are_made(vllm_engine: Any) -> None:
    start = time.perf_counter()
    tokens = vllm_engine.run(iter([PROMPT]), {"max_tokens": 200, "ignore_eos": True})
    first = next(tokens)
    first_at = time.perf_counter() - start
    assert vllm_engine._engine.has_unfinished_requests()  # the first token is out, the answer is not
    rest = list(tokens)
    last_at = time.perf_counter() - start
    assert isinstance(first, int) and len(rest) == 199
    assert first_at < last_at / 2, (first_at, last_at)
    assert not vllm_engine._engine.has_unfinished_requests()


def test_closing_the_stream_aborts_the_request(vllm_engine: Any) -> None:
    whole = run(vllm_engine, PROMPT, max_tokens=8, ignore_eos=True)
    tokens = vllm_engine.run(iter([PROMPT]), {"max_tokens": 2000, "ignore_eos": True})
    taken = [next(tokens) for _ in range(3)]
    tokens.close()
    assert taken == whole[:3]
    assert not vllm_engine._engine.has_unfinished_requests()  # vLLM forgot it: no slot held
    assert run(vllm_engine, PROMPT, max_tokens=8, ignore_eos=True) == whole  # and the next request is clean


def test_max_tokens_and_the_text_of_each_token(vllm_engine: Any, reference: Any) -> None:
    _, tokenizer = reference
    ids = run(vllm_engine, PROMPT, max_tokens=16, ignore_eos=True)
    assert len(ids) == 16
    pieces = [vllm_engine.for_output(i) for i in ids]
    assert all(isinstance(p, str) for p in pieces)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)


def test_stop_string_ends_the_answer_before_it(vllm_engine: Any) -> None:
    ids = run(vllm_engine, PROMPT, max_tokens=40, ignore_eos=True)
    text = text_of(vllm_engine, ids)
    # a stop string from the middle of the greedy answer, first found where it is cut
    start = next(i for i in range(8, len(text) - 3) if "\ufffd" not in text[i : i + 3] and text[i : i + 3].strip())
    stop = text[start : start + 3]
    cut = text.find(stop)
    stopped = run(vllm_engine, PROMPT, max_tokens=40, ignore_eos=True, stop=[stop])
    assert len(stopped) < len(ids) and stopped == ids[: len(stopped)]
    assert text_of(vllm_engine, stopped) == text[:cut]


def test_the_answer_says_how_it_ended(vllm_engine: Any) -> None:
    assert finish(vllm_engine, PROMPT, max_tokens=5, ignore_eos=True) == "length"
    text = text_of(vllm_engine, run(vllm_engine, PROMPT, max_tokens=40, ignore_eos=True))
    start = next(i for i in range(8, len(text) - 3) if "\ufffd" not in text[i : i + 3] and text[i : i + 3].strip())
    assert finish(vllm_engine, PROMPT, max_tokens=40, ignore_eos=True, stop=[text[start : start + 3]]) == "stop"


def test_seeded_sampling_is_reproducible(vllm_engine: Any) -> None:
    params = {"max_tokens": 16, "ignore_eos": True, "temperature": 1.0, "top_p": 0.95}
    a = run(vllm_engine, PROMPT, seed=11, **params)
    assert run(vllm_engine, PROMPT, seed=11, **params) == a
    assert run(vllm_engine, PROMPT, seed=12, **params) != a
    assert a != run(vllm_engine, PROMPT, max_tokens=16, ignore_eos=True)  # not the greedy answer


def test_request_mistakes_are_refused_by_name(vllm_engine: Any) -> None:
    with pytest.raises(ChatRequestError, match="'beam_width'"):
        run(vllm_engine, PROMPT, beam_width=2)
    with pytest.raises(ChatRequestError, match="max_tokens must be int"):
        run(vllm_engine, PROMPT, max_tokens="many")
    with pytest.raises(ChatRequestError, match="stop strings must not be empty"):
        run(vllm_engine, PROMPT, stop=[""])
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(ChatRequestError, match=r"messages\[0\].content\[0\] is a 'image_url' part"):
        run(vllm_engine, image)
    with pytest.raises(ChatRequestError, match="vLLM refused"):
        run(vllm_engine, PROMPT, top_p=0)
    with pytest.raises(ChatRequestError, match="vLLM refused the request"):
        run(vllm_engine, "Hello, how are you? " * 200)  # longer than max_model_len 512
    assert len(run(vllm_engine, PROMPT, max_tokens=2)) == 2  # and the engine serves on


def test_option_problems_checks_names_and_types_against_engine_args() -> None:
    from omni_plugin_vllm.engine import VllmStageEngine

    problems = VllmStageEngine.option_problems
    assert problems({"dtype": "float32", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 4}) == []
    assert problems({"gpu_memory_utilization": 0.5, "compilation_config": {"mode": 0}, "seed": 3}) == []
    (unknown,) = problems({"max_model_length": 256})
    assert "'max_model_length' is not a vLLM engine argument" in unknown and "'max_model_len'" in unknown
    (bad,) = problems({"max_model_len": "long"})
    assert "'max_model_len' takes int, got str 'long'" in bad
    (flag,) = problems({"enforce_eager": "yes"})
    assert "'enforce_eager' takes bool" in flag
    (model,) = problems({"model": "/elsewhere"})
    assert "omni sets" in model
    parallel, dtype = problems({"tensor_parallel_size": True, "dtype": "bfloat61"})
    assert "'tensor_parallel_size' takes int, got bool True" in parallel
    assert "'dtype' takes one of 'auto', " in dtype and "did you mean 'bfloat16'?" in dtype


def test_engine_arguments_defaults(vllm_engine: Any, tiny_llm: Any) -> None:
    arguments = vllm_engine.arguments
    assert arguments["model"] == arguments["tokenizer"] == str(tiny_llm)
    assert arguments["enforce_eager"] is True  # the CPU's default: no compilation at start-up
    assert arguments["max_model_len"] == 512  # the stage's option beats the CPU default
    from omni_plugin_vllm.engine import engine_arguments

    assert engine_arguments(tiny_llm, {}, on_cpu=True)["max_model_len"] == 2048  # capped: the model says 4096
    assert "max_model_len" not in engine_arguments(tiny_llm, {}, on_cpu=False)  # vLLM decides on a GPU
