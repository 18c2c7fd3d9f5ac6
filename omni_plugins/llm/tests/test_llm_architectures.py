"""Every declared architecture decodes through the engine exactly as ``model.generate`` does:
a tiny random model of each (the tiny tokenizer beside it), greedy tokens compared."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from llm_testkit import answer
from omni_plugin_llm.model import ARCHITECTURES

SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "initializer_range": 0.2,
}


def tiny_of(architecture: str, directory: Path, tokenizer_dir: Path) -> Path:
    import torch
    import transformers

    model_cls = getattr(transformers, architecture)
    extra: dict[str, Any] = {"sliding_window": 8} if architecture in ("Gemma2ForCausalLM", "MistralForCausalLM") else {}
    config = model_cls.config_class(**SIZES, **extra, vocab_size=320, bos_token_id=0, eos_token_id=2, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_cls(config).eval()
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)
    return directory


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_greedy_decoding_equals_generate(architecture: str, tiny_llm: Path, tmp_path: Path) -> None:
    import torch
    from omni_plugin_llm.engine import TransformersCausalLM
    from omni_plugin_llm.model import CausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = tiny_of(architecture, tmp_path / architecture, tiny_llm)
    stage = CausalLM.topology_for(directory).stage("generate")
    assert stage.architecture == architecture
    engine = TransformersCausalLM(directory, stage, {})
    model, tokenizer = AutoModelForCausalLM.from_pretrained(directory).eval(), AutoTokenizer.from_pretrained(directory)
    # a prompt longer than the sliding window, so Gemma2's and Mistral's windowed layers matter
    prompt = "Hello, how are you? I am a tiny model with random weights."
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=20)
    tokens, pieces = answer(engine, prompt, max_tokens=20)
    assert tokens == want[0, ids.shape[1] :].tolist()
    assert "".join(pieces) == tokenizer.decode(tokens, skip_special_tokens=True)
