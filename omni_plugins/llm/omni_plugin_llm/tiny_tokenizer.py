"""A tiny byte-level BPE tokenizer in the Qwen2 layout, made offline for tiny checkpoints.

It is what a tiny random-weight language model (or the thinker of an omni model) needs beside
its weights so that ``AutoTokenizer.from_pretrained(DIR)``, ``apply_chat_template`` and vLLM
load it the way they load a real one: ``tokenizer.json`` (a trained byte-level BPE) and
``tokenizer_config.json`` (``Qwen2Tokenizer``, the ChatML template). Special tokens take the
first ids, in the order given; the rest is trained on a small fixed corpus, so the same call
always writes the same files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: the special tokens every tiny tokenizer has, at ids 0, 1, 2
CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: ChatML, the Qwen2 chat format: content is a string or a list of ``{"type": "text", ...}`` parts
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = (
    "Hello, how are you? I am a tiny model with random weights. " * 4,
    "system user assistant You are a helpful assistant. Say something short. " * 4,
) * 50


def make_tokenizer(
    directory: Path | str,
    *,
    vocab_size: int = 320,
    extra_specials: Sequence[str] = (),
    extra_config: dict[str, Any] | None = None,
) -> dict[str, int]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory``. The specials
    are :data:`CHATML_SPECIALS` then ``extra_specials``, at ids 0, 1, ...; ``vocab_size`` is
    the whole vocabulary (256 byte symbols, the specials, merges). ``extra_config`` adds keys
    to ``tokenizer_config.json`` (``extra_special_tokens``, ...). Returns each special's id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    specials = [*CHATML_SPECIALS, *extra_specials]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "Qwen2Tokenizer",
        "model_max_length": 32768,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "chat_template": CHATML_TEMPLATE,
        **(extra_config or {}),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    ids = {s: tokenizer.token_to_id(s) for s in specials}
    assert list(ids.values()) == list(range(len(specials))), ids  # the trainer puts specials first
    return {s: int(i) for s, i in ids.items() if i is not None}
