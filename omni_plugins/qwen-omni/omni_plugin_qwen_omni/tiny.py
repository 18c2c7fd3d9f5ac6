"""A tiny random-weight Qwen2.5-Omni checkpoint, written offline in the real on-disk layout.

What ``Qwen2_5OmniForConditionalGeneration.from_pretrained(dir)`` reads, and nothing else:
``config.json`` and ``generation_config.json`` (``save_pretrained``), ``model.safetensors``,
``spk_dict.pt`` (the speakers: ``from_pretrained`` refuses a directory without it) and the
tokenizer (``tokenizer.json``, ``tokenizer_config.json``: a byte-level BPE with the Qwen special
tokens, from :mod:`omni_plugin_llm.tiny_tokenizer`). About 2.5 MB; its text and speech are noise.

The sizes are the smallest the production paths accept: the thinker's one attention head is 64
wide (vLLM's CPU attention refuses heads narrower than 32), its rotary sections sum to half of
it; the encoders have one layer; the DiT and BigVGAN are a few channels wide.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: the thinker's vocabulary: the tokenizer's ids, then rows that are only embeddings (the talker's
#: text markers and the speakers' start tokens), as in the real checkpoint
THINKER_VOCAB = 384
TTS_TEXT_PAD, TTS_TEXT_BOS, TTS_TEXT_EOS = 370, 371, 372
#: the speakers of ``spk_dict.pt``, each with its start token (a thinker embedding row); the first
#: is the default voice, as in the real checkpoint
SPEAKERS = {"Chelsie": 373, "Ethan": 374}
CODEC_VOCAB = 64
CODEC_PAD, CODEC_BOS, CODEC_EOS, CODEC_MASK = 60, 61, 62, 63
ENC_EMB_DIM, MEL_DIM = 32, 80
#: the audio and vision specials of the Qwen2.5-Omni tokenizer, after the ChatML ones
MEDIA_SPECIALS = (
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
)
#: the tokenizer's named media tokens, as Qwen2.5-Omni's ``tokenizer_config.json`` has them
EXTRA_SPECIAL_TOKENS = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}


def tiny_config(ids: dict[str, int], user_token_id: int) -> Any:
    """The tiny ``Qwen2_5OmniConfig``; ``ids`` are the tokenizer's special token ids,
    ``user_token_id`` the id of ``user`` (the real config records it)."""
    from transformers import Qwen2_5OmniConfig

    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]}  # sums to head_dim/2
    media = {
        "audio_token_index": ids["<|AUDIO|>"],
        "image_token_index": ids["<|IMAGE|>"],
        "video_token_index": ids["<|VIDEO|>"],
        "audio_start_token_id": ids["<|audio_bos|>"],
        "audio_end_token_id": ids["<|audio_eos|>"],
        "vision_start_token_id": ids["<|vision_bos|>"],
        "vision_end_token_id": ids["<|vision_eos|>"],
    }
    text_config = {
        "vocab_size": THINKER_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "rope_parameters": rope,
        "tie_word_embeddings": False,
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    thinker_config = {
        "text_config": text_config,
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 1,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": 32,
            "output_dim": 64,
            "max_source_positions": 1500,
            "n_window": 100,
        },
        "vision_config": {
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [0],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
        },
        "user_token_id": user_token_id,
        **media,
    }
    talker_config = {
        "vocab_size": CODEC_VOCAB,
        "embedding_size": 64,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "rope_parameters": rope,
        "max_position_embeddings": 4096,
        "tts_text_start_token_id": TTS_TEXT_BOS,
        "tts_text_end_token_id": TTS_TEXT_EOS,
        "tts_text_pad_token_id": TTS_TEXT_PAD,
        "tts_codec_start_token_id": CODEC_BOS,
        "tts_codec_end_token_id": CODEC_EOS,
        "tts_codec_pad_token_id": CODEC_PAD,
        "tts_codec_mask_token_id": CODEC_MASK,
        **media,
    }
    token2wav_config = {
        "dit_config": {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "head_dim": 32,
            "ff_mult": 2,
            "emb_dim": 32,
            "num_embeds": CODEC_VOCAB,
            "mel_dim": MEL_DIM,
            "repeats": 2,
            "block_size": 24,
            "look_ahead_layers": [1],
            "look_backward_layers": [0],
            "dropout": 0.0,
            "enc_emb_dim": ENC_EMB_DIM,
            "enc_dim": 32,
            "enc_channels": [32, 32, 32, 32, 96],
            "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1],
            "enc_attention_channels": 16,
            "enc_res2net_scale": 2,
            "enc_se_channels": 16,
        },
        "bigvgan_config": {
            "mel_dim": MEL_DIM,
            "upsample_initial_channel": 64,
            "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [[1, 3, 5]],
            "upsample_rates": [5, 3, 2, 2, 2, 2],  # 240 samples per mel frame, as the real vocoder
            "upsample_kernel_sizes": [11, 7, 4, 4, 4, 4],
        },
    }
    return Qwen2_5OmniConfig(
        thinker_config=thinker_config,
        talker_config=talker_config,
        token2wav_config=token2wav_config,
        enable_audio_output=True,
    )


def write_tiny_checkpoint(directory: str | Path, seed: int = 0) -> Path:
    """Write the checkpoint into ``directory``; the same ``seed`` writes the same weights and
    speakers (the tokenizer does not depend on it)."""
    import torch
    from omni_plugin_llm.tiny_tokenizer import make_tokenizer
    from tokenizers import Tokenizer
    from transformers import Qwen2_5OmniForConditionalGeneration

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ids = make_tokenizer(
        directory,
        extra_specials=MEDIA_SPECIALS,
        extra_config={"extra_special_tokens": EXTRA_SPECIAL_TOKENS},
    )
    user = Tokenizer.from_file(str(directory / "tokenizer.json")).token_to_id("user")
    config = tiny_config(ids, user_token_id=int(user) if user is not None else ids["<|im_start|>"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5OmniForConditionalGeneration(config).eval()
        # transformers initialises every convolution with std 0.02, under which six upsampling
        # stages shrink the vocoder's output to ~1e-7: PyTorch's own (fan-in scaled) initialisation
        # keeps it near unit scale, so that a wrong waveform cannot pass for a right one in tests
        for module in model.token2wav.code2wav_bigvgan_model.modules():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
                module.reset_parameters()
        speakers = {
            name: {
                "bos_token": bos,
                "cond": torch.randn(1, ENC_EMB_DIM),
                "ref_mel": torch.randn(1, 40, MEL_DIM),
            }
            for name, bos in SPEAKERS.items()
        }
    from omni_core.quiet import quiet_libraries

    with quiet_libraries():  # transformers' "Writing model shards" bar is not the user's business
        model.save_pretrained(directory, safe_serialization=True)
    torch.save(speakers, directory / "spk_dict.pt")
    return directory
