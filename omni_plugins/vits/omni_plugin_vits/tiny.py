"""A tiny random-weight VITS checkpoint, written offline in the standard on-disk layout.

The result loads through the production path (``VitsModel.from_pretrained(dir)``,
``VitsTokenizer.from_pretrained(dir)``) and through omni's detection (``architectures:
["VitsModel"]``). It is about 100 KB and says "hello world" in a few milliseconds on a CPU.
Its audio is noise: it exercises the serving path, not speech quality.
"""

from __future__ import annotations

import json
from pathlib import Path

#: the tiny checkpoint's alphabet: what an MMS-TTS (English) vocabulary holds, no phonemes
TINY_CHARACTERS = " '-abcdefghijklmnopqrstuvwxyz0123456789"

#: the architecture knobs of the tiny checkpoint (hidden 16, 2 heads: head_dim 8)
TINY_CONFIG = {
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "ffn_dim": 32,
    "window_size": 2,
    "flow_size": 16,
    "spectrogram_bins": 17,
    "use_stochastic_duration_prediction": True,  # as every MMS-TTS checkpoint
    "upsample_initial_channel": 16,
    "upsample_rates": [8, 8],  # 64 samples per spectrogram frame
    "upsample_kernel_sizes": [16, 16],
    "resblock_kernel_sizes": [3],
    "resblock_dilation_sizes": [[1, 3]],
    "depth_separable_num_layers": 1,
    "duration_predictor_num_flows": 1,
    "duration_predictor_filter_channels": 16,
    "prior_encoder_num_flows": 1,
    "prior_encoder_num_wavenet_layers": 1,
    "posterior_encoder_num_wavenet_layers": 1,
}


def tiny_vocab() -> dict[str, int]:
    """``<pad>`` is id 0, the blank the tokenizer inserts between characters; ``<unk>`` last."""
    vocab = {"<pad>": 0}
    for char in TINY_CHARACTERS:
        vocab[char] = len(vocab)
    vocab["<unk>"] = len(vocab)
    return vocab


def write_tiny_checkpoint(
    directory: str | Path,
    seed: int = 0,
    *,
    num_speakers: int = 1,
    sampling_rate: int = 16000,
    language: str | None = None,
) -> Path:
    """Write ``config.json``, ``model.safetensors`` and the tokenizer files (``vocab.json``,
    ``tokenizer_config.json``: character vocabulary, ``phonemize=false``, ``is_uroman=false``)
    to ``directory``. The same ``seed`` writes the same weights. ``num_speakers > 1`` adds a
    speaker embedding (a multi-speaker model with voices ``speaker_0`` ...); ``language``
    declares the checkpoint's language in its tokenizer config, as MMS-TTS checkpoints do."""
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    if num_speakers < 1:
        raise ValueError(f"num_speakers must be at least 1, got {num_speakers}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = tiny_vocab()
    vocab_file = directory / "vocab.json"
    vocab_file.write_text(json.dumps(vocab, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    config = VitsConfig(
        **TINY_CONFIG,
        vocab_size=len(vocab),
        num_speakers=num_speakers,
        speaker_embedding_size=8 if num_speakers > 1 else 0,
        sampling_rate=sampling_rate,
        pad_token_id=0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = VitsModel(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer = VitsTokenizer(
        str(vocab_file),
        language=language,
        add_blank=True,
        normalize=True,
        phonemize=False,
        is_uroman=False,
    )
    tokenizer.save_pretrained(directory)
    return directory
