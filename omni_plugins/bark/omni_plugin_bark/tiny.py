"""A tiny random-weight Bark checkpoint in the layout ``BarkModel.from_pretrained`` and
``BarkProcessor.from_pretrained`` read, written locally (no hub access).

What it writes to ``directory``:

* ``config.json`` + ``model.safetensors``: a :class:`transformers.BarkModel` (architectures
  ``["BarkModel"]``) with one-layer, 16-wide semantic, coarse and fine GPTs and a small
  EnCodec codec at 24 kHz (75 codec frames per second), about 180k parameters;
* ``generation_config.json``: the nested Bark generation config, with the token layout
  (offsets, pad and infer tokens, window lengths) scaled down to the tiny vocabularies and
  ``semantic_config.max_new_tokens`` as the default semantic budget per sentence;
* ``tokenizer.json`` / ``tokenizer_config.json`` / ``processor_config.json``: a lower-casing
  ``BertTokenizer`` with a character-level vocabulary (letters, digits, punctuation, and
  their ``##`` continuations), the tokenizer Bark uses, built offline;
* ``speaker_embeddings_path.json`` + ``speaker_embeddings/v2/*.npy``: two voice presets
  (history prompts) ``v2/en_speaker_0`` and ``v2/en_speaker_1``, each a semantic prompt
  ``(T,)``, a coarse prompt ``(2, F)`` and a fine prompt ``(n_fine, F)``, in the
  ``BarkProcessor.save_pretrained`` layout.

Weights are drawn wider than Bark's own initialisation (std 0.5) so the text and the voice
preset visibly change the tokens, and the EnCodec codebooks (zero buffers at construction)
are drawn at random so the codes change the waveform.
"""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path

#: the voice presets make_tiny writes, in order (the first is the default voice)
TINY_VOICES = ("v2/en_speaker_0", "v2/en_speaker_1")

_SEMANTIC_VOCAB = 32  # semantic tokens 0..31; 32 is end-of-semantic (Bark: 10_000)
_CODEBOOK = 16  # EnCodec codebook size (Bark: 1024)
_FINE_CODEBOOKS = 4  # codebooks the fine model completes (Bark: 8)
_MAX_TEXT_TOKENS = 48  # max_input_semantic_length (Bark: 256)
_MAX_SEMANTIC_NEW = 64  # the longest semantic budget the position table allows
_DEFAULT_SEMANTIC_NEW = 20  # the default budget per sentence: about 0.4 s of audio
_COARSE_INPUT, _COARSE_HISTORY, _COARSE_WINDOW = 48, 60, 30  # Bark: 256, 630, 60
_FINE_INPUT, _FINE_HISTORY = 64, 32  # Bark: 1024, 512
_HIDDEN = 16
_INIT_STD = 0.5


def _vocabulary() -> list[str]:
    chars = list(string.ascii_lowercase + string.digits)
    punctuation = list(".,!?;:'\"-()")
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *punctuation, *(f"##{c}" for c in chars)]


def make_tiny(directory: str | Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint to ``directory`` (created if needed) and return it. The same
    seed writes the same weights and presets; the global torch RNG is left as it was."""
    import numpy as np
    import torch
    from transformers import BarkConfig, BarkModel, BarkProcessor, BertTokenizer, EncodecConfig, GenerationConfig
    from transformers.models.bark.generation_configuration_bark import BarkGenerationConfig

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    vocab = _vocabulary()

    # token layout of the semantic model's input: [semantic | eos | spare | text | text pad | infer]
    semantic_out = _SEMANTIC_VOCAB + 8
    text_offset = semantic_out
    text_pad = text_offset + len(vocab)
    semantic_infer = text_pad + 4
    # the coarse model's: [semantic | codebook 0 | codebook 1 | semantic pad | spare | infer]
    coarse_pad = _SEMANTIC_VOCAB + 2 * _CODEBOOK
    coarse_infer = coarse_pad + 2

    def gpt(block_size: int, vocab_in: int, vocab_out: int, **extra: int) -> dict[str, int | float]:
        return {
            "block_size": block_size,
            "input_vocab_size": vocab_in,
            "output_vocab_size": vocab_out,
            "num_layers": 1,
            "num_heads": 2,
            "hidden_size": _HIDDEN,
            "initializer_range": _INIT_STD,
            **extra,
        }

    codec = EncodecConfig(
        target_bandwidths=[1.5, 3.0],
        sampling_rate=24_000,
        audio_channels=1,
        hidden_size=16,
        num_filters=4,
        num_residual_layers=1,
        upsampling_ratios=[8, 5, 4, 2],  # hop 320 samples: 75 frames per second at 24 kHz
        num_lstm_layers=1,
        codebook_size=_CODEBOOK,
        codebook_dim=16,
        kernel_size=3,
        last_kernel_size=3,
    )
    config = BarkConfig(
        semantic_config=gpt(_MAX_TEXT_TOKENS + 1 + _MAX_SEMANTIC_NEW, semantic_infer + 1, semantic_out),
        coarse_acoustics_config=gpt(
            _COARSE_INPUT + 1 + _COARSE_HISTORY + _COARSE_WINDOW + 8, coarse_infer + 1, coarse_infer + 1
        ),
        fine_acoustics_config=gpt(
            _FINE_INPUT, _CODEBOOK + 1, _CODEBOOK + 1, n_codes_total=_FINE_CODEBOOKS, n_codes_given=1
        ),
        codec_config=codec.to_dict(),
    )
    generation = BarkGenerationConfig(
        semantic_config={
            "eos_token_id": _SEMANTIC_VOCAB,
            "max_new_tokens": _DEFAULT_SEMANTIC_NEW,
            "text_encoding_offset": text_offset,
            "text_pad_token": text_pad,
            "semantic_infer_token": semantic_infer,
            "semantic_vocab_size": _SEMANTIC_VOCAB,
            "max_input_semantic_length": _MAX_TEXT_TOKENS,
        },
        coarse_acoustics_config={
            "coarse_semantic_pad_token": coarse_pad,
            "coarse_infer_token": coarse_infer,
            "max_coarse_input_length": _COARSE_INPUT,
            "max_coarse_history": _COARSE_HISTORY,
            "sliding_window_len": _COARSE_WINDOW,
        },
        fine_acoustics_config={
            "max_fine_history_length": _FINE_HISTORY,
            "max_fine_input_length": _FINE_INPUT,
            "n_fine_codebooks": _FINE_CODEBOOKS,
        },
        sample_rate=codec.sampling_rate,
        codebook_size=_CODEBOOK,
    ).to_dict()
    for key in ("model_type", "transformers_version"):
        generation.pop(key, None)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BarkModel(config).eval()
        with torch.no_grad():
            for layer in model.codec_model.quantizer.layers:
                codebook = layer.codebook
                codebook.embed.normal_(0.0, 1.0)
                codebook.embed_avg.copy_(codebook.embed)
                codebook.cluster_size.fill_(1.0)
    # BarkModel.generate reads the nested sub-configs as dicts, as from a published checkpoint
    model.generation_config = GenerationConfig(**generation)
    model.save_pretrained(out, safe_serialization=True)

    with tempfile.TemporaryDirectory() as scratch:
        vocab_file = Path(scratch) / "vocab.txt"
        vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
        tokenizer = BertTokenizer(str(vocab_file), do_lower_case=True, model_max_length=_MAX_TEXT_TOKENS)
    BarkProcessor(tokenizer=tokenizer, speaker_embeddings=None).save_pretrained(out)

    rng = np.random.default_rng(seed)
    presets: dict[str, dict[str, str]] = {}
    (out / "speaker_embeddings" / "v2").mkdir(parents=True, exist_ok=True)
    for voice in TINY_VOICES:
        arrays = {
            "semantic_prompt": rng.integers(0, _SEMANTIC_VOCAB, size=24),
            "coarse_prompt": rng.integers(0, _CODEBOOK, size=(2, 36)),
            "fine_prompt": rng.integers(0, _CODEBOOK, size=(_FINE_CODEBOOKS, 36)),
        }
        presets[voice] = {}
        for key, array in arrays.items():
            relative = f"speaker_embeddings/{voice}_{key}.npy"
            np.save(out / relative, array.astype(np.int64), allow_pickle=False)
            presets[voice][key] = relative
    (out / "speaker_embeddings_path.json").write_text(
        json.dumps({"repo_or_path": str(out), **presets}, indent=2), encoding="utf-8"
    )
    return out
