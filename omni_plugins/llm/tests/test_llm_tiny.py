"""The tiny checkpoint: the real layout, deterministic, and decoding that is not degenerate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omni_plugin_llm.model import CausalLM

PROMPTS = ("Hello", "The quick brown fox", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")


def test_the_checkpoint_has_the_transformers_layout_and_the_marker(tiny_llm: Path) -> None:
    from omni_core.tiny import read_marker

    names = {p.name for p in tiny_llm.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert {"tokenizer_config.json", "omni-tiny.json"} <= names
    config = json.loads((tiny_llm / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]) == (64, 1, 1)
    assert (config["intermediate_size"], config["num_hidden_layers"], config["vocab_size"]) == (128, 2, 320)
    assert config["eos_token_id"] == 2 and config["torch_dtype"] == "float32"
    assert json.loads((tiny_llm / "generation_config.json").read_text())["eos_token_id"] == 2
    marker = read_marker(tiny_llm)
    assert marker is not None and marker["family"] == "causal-lm" and marker["random_weights"] is True


def test_the_tokenizer_is_chatml_with_im_end_as_eos(reference: tuple[Any, Any]) -> None:
    model, tokenizer = reference
    assert len(tokenizer) == 320 and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == model.generation_config.eos_token_id == 2
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_the_same_seed_writes_the_same_weights(tiny_llm: Path, tmp_path: Path) -> None:
    again = CausalLM.make_tiny(tmp_path / "again", seed=0)
    other = CausalLM.make_tiny(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (tiny_llm / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (tiny_llm / "model.safetensors").read_bytes()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_decoding_varies_and_does_not_end_at_once(reference: tuple[Any, Any], greedy: Any, prompt: str) -> None:
    _, tokenizer = reference
    tokens = greedy(tokenizer(prompt)["input_ids"], 16)
    assert len(tokens) == 16 and 2 not in tokens[:8]
    assert len(set(tokens)) >= 6, tokens  # random weights, yet no token repeated forever


def test_the_topology_is_one_generate_stage_final_for_text(tiny_llm: Path) -> None:
    topology = CausalLM.topology_for(tiny_llm)
    (stage,) = topology.stages
    assert (stage.name, stage.kind, stage.emits, stage.final) == ("generate", "ar", "tokens", "text")
    assert stage.engine == "omni_plugin_llm.engine:TransformersCausalLM" and stage.engine_name == "transformers"
    assert stage.architecture == "Qwen2ForCausalLM"


def test_a_config_without_architectures_is_named(tmp_path: Path) -> None:
    from omni_core.errors import CheckpointFormatError

    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    with pytest.raises(CheckpointFormatError, match="names no architectures"):
        CausalLM.topology_for(tmp_path)
