"""A tiny random-weight Qwen2 language model, written offline in the real transformers layout.

The result loads through the production paths (``AutoModelForCausalLM.from_pretrained(dir)``,
``AutoTokenizer.from_pretrained(dir)``, ``apply_chat_template``) and in vLLM, so one checkpoint
checks both engines against each other. It is about 300 KB and answers in milliseconds on a CPU;
its text is gibberish: it exercises the serving path, not language.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the family name the manifest registers (and the marker records)
FAMILY = "causal-lm"

#: the architecture knobs. One head of 64 (head_dim 64): vLLM's CPU attention rejects smaller
#: head sizes, and the same checkpoint must load there.
TINY_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    # transformers' default (0.02) gives near-uniform logits: greedy decoding then turns on
    # near-ties and often repeats one token. 0.2 gives varied, well-separated choices.
    "initializer_range": 0.2,
}


def write_tiny_checkpoint(directory: Path | str, seed: int = 0) -> Path:
    """Write ``config.json``, ``generation_config.json``, ``model.safetensors`` (float32) and the
    tokenizer (:func:`~omni_plugin_llm.tiny_tokenizer.make_tokenizer`: byte-level BPE, ChatML
    template, 320 tokens) to ``directory``, plus omni's tiny-checkpoint marker
    (:func:`omni_core.tiny.write_marker`). The same seed writes the same weights. ``eos`` is
    ``<|im_end|>``, as in Qwen2 chat models."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from omni_core.tiny import write_marker
    from omni_plugin_llm import __version__
    from omni_plugin_llm.tiny_tokenizer import make_tokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    specials = make_tokenizer(directory)
    vocab = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    pad, eos = specials["<|endoftext|>"], specials["<|im_end|>"]
    config = Qwen2Config(
        **TINY_CONFIG,
        vocab_size=len(vocab),
        bos_token_id=pad,  # as Qwen2's own configs: <|endoftext|>
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = Qwen2ForCausalLM(config)
    model = model.to(torch.float32).eval()
    make_config: Any = GenerationConfig
    model.generation_config = make_config(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    from omni_core.quiet import quiet_libraries

    with quiet_libraries():  # transformers' "Writing model shards" bar is not the user's business
        model.save_pretrained(directory, safe_serialization=True)
    # the keys transformers 4.x reads (5.x writes rope_parameters and dtype): a vLLM install
    # pinned to transformers 4 then loads the same model
    path = directory / "config.json"
    saved = json.loads(path.read_text(encoding="utf-8"))
    saved.setdefault("rope_theta", (saved.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    saved.setdefault("torch_dtype", "float32")
    path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_marker(directory, family=FAMILY, seed=seed, provider=f"omni-plugin-llm {__version__} (plugin 'llm')")
    return directory
