"""A tiny random-weight SpeechT5 checkpoint in the standard on-disk layout, made offline.

Layout (what ``save_pretrained`` writes for microsoft/speecht5_tts, plus the vocoder and voices)::

    config.json, generation_config.json, model.safetensors   SpeechT5ForTextToSpeech
    spm_char.model, tokenizer_config.json, ...               SpeechT5Tokenizer (sentencepiece)
    processor_config.json / preprocessor_config.json         SpeechT5Processor + feature extractor
    vocoder/config.json, vocoder/model.safetensors           SpeechT5HifiGan
    voices.safetensors                                       x-vector voices, default first

Everything is generated here: the sentencepiece model is trained on a small generated corpus,
and the weights are random. Two changes make random weights usable:

* the decoder's stop head is biased off (zero weights, bias -10), so every sentence runs to
  its frame budget instead of stopping at the first step or never (random stop logits do
  either); the budget (``maxlenratio`` or ``max_new_tokens``) is what ends generation here;
* the vocoder's convolutions get fan-in scaled weights, so the audio is audible (the stock
  initialisation gives about 1e-6, which is silence once quantised to 16 bits).

The vocoder upsamples by 16 (not 256 like the released one) to keep the audio short: a
sentence of 30 characters is at most 600 mel frames, 0.6 s at 16 kHz.
"""

from __future__ import annotations

import io
import math
import random
import string
from pathlib import Path
from typing import Any

TINY_VOICES = ("alba", "bram", "cleo")
_CHARS = string.ascii_letters + string.digits + " .,!?;:'\"-()"


def _train_tokenizer(directory: Path, seed: int) -> tuple[Any, Path]:
    """A char-level SpeechT5Tokenizer trained on generated text, and its scratch vocab file."""
    import sentencepiece as spm
    from transformers import SpeechT5Tokenizer

    rng = random.Random(seed)
    alphabet = _CHARS.replace(" ", "")
    corpus = [
        " ".join("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(10)) for _ in range(300)
    ]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=model,
        model_type="char",  # like the released spm_char.model
        vocab_size=len(alphabet) + 5,
        hard_vocab_limit=False,
        character_coverage=1.0,
        normalization_rule_name="identity",
        # the ids SpeechT5Config expects: <s>=0, <pad>=1, </s>=2, <unk>=3
        bos_id=0,
        pad_id=1,
        eos_id=2,
        unk_id=3,
        num_threads=1,
        minloglevel=2,
    )
    scratch = directory / "_train_spm.model"
    scratch.write_bytes(model.getvalue())
    return SpeechT5Tokenizer(vocab_file=str(scratch)), scratch


def make_tiny(directory: str | Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint to ``directory`` (created if needed) and return it."""
    import torch
    from transformers import (
        SpeechT5Config,
        SpeechT5FeatureExtractor,
        SpeechT5ForTextToSpeech,
        SpeechT5HifiGan,
        SpeechT5HifiGanConfig,
        SpeechT5Processor,
    )

    from omni_plugin_speecht5.adapter import VOCODER_SUBFOLDER
    from omni_plugin_speecht5.voices import save_voices

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    mel_bins = 20

    tokenizer, scratch = _train_tokenizer(directory, seed)
    try:
        feature_extractor = SpeechT5FeatureExtractor(num_mel_bins=mel_bins, sampling_rate=16000)
        # writes spm_char.model (copied from the scratch file), tokenizer and processor configs
        SpeechT5Processor(feature_extractor=feature_extractor, tokenizer=tokenizer).save_pretrained(directory)
    finally:
        scratch.unlink()

    config = SpeechT5Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        encoder_layers=1,
        encoder_attention_heads=2,  # head_dim 16
        encoder_ffn_dim=64,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_ffn_dim=64,
        encoder_max_relative_position=16,
        num_mel_bins=mel_bins,
        reduction_factor=2,
        speaker_embedding_dim=512,  # x-vectors, as in the released model
        speech_decoder_prenet_units=32,
        speech_decoder_postnet_layers=2,
        speech_decoder_postnet_units=32,
        speech_decoder_postnet_kernel=3,
        max_speech_positions=1024,
        max_text_positions=256,
        # the speech encoder pre-net is not part of the TTS model; keep its config small anyway
        conv_dim=(8,),
        conv_stride=(5,),
        conv_kernel=(10,),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = SpeechT5ForTextToSpeech(config).eval()
    with torch.no_grad():
        stop = model.speech_decoder_postnet.prob_out
        stop.weight.zero_()
        stop.bias.fill_(-10.0)
    model.save_pretrained(directory)

    vocoder_config = SpeechT5HifiGanConfig(
        model_in_dim=mel_bins,
        sampling_rate=16000,
        upsample_initial_channel=16,
        upsample_rates=(4, 4),
        upsample_kernel_sizes=(8, 8),
        resblock_kernel_sizes=(3,),
        resblock_dilation_sizes=((1, 3),),
    )
    vocoder = SpeechT5HifiGan(vocoder_config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in vocoder.named_parameters():
            if param.dim() == 3:
                # Conv1d weights are (out, in, k); ConvTranspose1d (in, out, k) with stride 4
                fan_in = param.shape[0] * param.shape[2] / 4 if name.startswith("upsampler") else param[0].numel()
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(fan_in))
    vocoder.save_pretrained(directory / VOCODER_SUBFOLDER)

    voices = torch.randn(len(TINY_VOICES), config.speaker_embedding_dim, generator=generator)
    save_voices(directory, dict(zip(TINY_VOICES, voices, strict=True)))
    return directory
