"""Building blocks for tiny random-weight checkpoints, shared by the family plugins.

Nothing here downloads: tokenizers are trained on a fixed built-in corpus with the
``tokenizers`` library (byte-level BPE, so any prompt encodes without unknown tokens), and
encoders are built from small configs with seeded random weights. Families compose these in
their ``tiny_components`` and save the pipeline with ``save_pretrained``, so tiny checkpoints
have exactly the on-disk layout of real ones and load through the same path.
"""

from __future__ import annotations

from typing import Any

#: enough varied text for a few hundred BPE merges; prompts outside it still encode (byte level)
CORPUS = (
    "a red fox in snow, a photo of a cat sitting on a wooden table, a watercolor painting of a lighthouse "
    "at dusk, an astronaut riding a horse on the moon, close-up portrait of an old man with a beard, "
    "a bowl of fruit, apples oranges and bananas, a city street at night with neon lights and rain, "
    "a mountain lake reflecting pine trees, the quick brown fox jumps over the lazy dog, "
    "hello world, high quality, detailed, cinematic lighting, blurry, low quality, worst quality, "
    "video of waves crashing on a beach, a dog running through a field of flowers, sunrise over the sea"
)


def tiny_tokenizer(
    *,
    vocab_size: int = 384,
    model_max_length: int = 77,
    bos: str | None = None,
    eos: str | None = "</s>",
    pad: str = "<pad>",
    unk: str | None = None,
    extra_special: tuple[str, ...] = (),
    add_bos: bool = False,
    add_eos: bool = True,
    padding_side: str = "right",
    chat_template: str | None = None,
) -> Any:
    """A ``PreTrainedTokenizerFast`` (byte-level BPE) with the special tokens a family expects.

    Deterministic: the same arguments always give the same vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [t for t in (pad, bos, eos, unk, *extra_special) if t]
    specials = list(dict.fromkeys(specials))
    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    single = " ".join([*([f"{bos}:0"] if bos and add_bos else []), "$A:0", *([f"{eos}:0"] if eos and add_eos else [])])
    special_ids = [
        (t, tok.token_to_id(t)) for t in (bos, eos) if t and ((t == bos and add_bos) or (t == eos and add_eos))
    ]
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=special_ids)
    kwargs: dict[str, Any] = {"pad_token": pad}
    for key, value in (("bos_token", bos), ("eos_token", eos), ("unk_token", unk)):
        if value:
            kwargs[key] = value
    if extra_special:
        kwargs["additional_special_tokens"] = list(extra_special)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=model_max_length, padding_side=padding_side, **kwargs
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def seeded(seed: int) -> None:
    """Seed torch before building a component, so each component's weights depend only on the seed."""
    import torch

    torch.manual_seed(seed)


def tiny_clip_text(
    seed: int,
    *,
    hidden_size: int = 32,
    projection_dim: int = 32,
    with_projection: bool = False,
    max_position_embeddings: int = 77,
    vocab_size: int = 384,
) -> Any:
    """A 2-layer CLIP text encoder (``CLIPTextModel``, or ``...WithProjection`` for SD3)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=max_position_embeddings,
        projection_dim=projection_dim,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    seeded(seed)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config).eval()


def tiny_clip_tokenizer(model_max_length: int = 77) -> Any:
    """Matches :func:`tiny_clip_text`: pad 0, bos 1, eos 2; CLIP pads with its eos text."""
    return tiny_tokenizer(
        model_max_length=model_max_length,
        pad="<|pad|>",
        bos="<|startoftext|>",
        eos="<|endoftext|>",
        add_bos=True,
        add_eos=True,
    )


def tiny_t5_encoder(seed: int, *, d_model: int = 32, umt5: bool = False, vocab_size: int = 384) -> Any:
    """A 2-layer T5 (or UMT5) encoder."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    cfg_cls, model_cls = (UMT5Config, UMT5EncoderModel) if umt5 else (T5Config, T5EncoderModel)
    config = cfg_cls(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=8,
        d_ff=d_model * 2,
        num_layers=2,
        num_heads=2,
        relative_attention_num_buckets=8,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    seeded(seed)
    return model_cls(config).eval()


def tiny_t5_tokenizer(model_max_length: int = 64) -> Any:
    """Matches :func:`tiny_t5_encoder`: pad 0, eos 1, unk 2; appends eos like T5."""
    return tiny_tokenizer(model_max_length=model_max_length, pad="<pad>", eos="</s>", unk="<unk>", add_eos=True)


# -- Qwen text encoders (Qwen2.5-VL, Qwen3) and their tokenizer -----------------------------------

#: Qwen's special tokens, trained first and in this order, so their ids are fixed (0..8)
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
)
QWEN_ENDOFTEXT_ID, QWEN_IM_START_ID, QWEN_IM_END_ID, QWEN_VISION_START_ID, QWEN_VISION_END_ID = range(5)
QWEN_IMAGE_PAD_ID, QWEN_VIDEO_PAD_ID = 5, 6

#: what Qwen's chat templates produce for plain-text messages (ChatML; Qwen3's ``enable_thinking=False``
#: adds the empty think block)
QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def tiny_qwen_tokenizer(*, vocab_size: int = 384, model_max_length: int = 32768) -> Any:
    """A ``Qwen2Tokenizer`` (the class Qwen2.5-VL and Qwen3 checkpoints name) with a small BPE
    vocabulary trained like :func:`tiny_tokenizer`, Qwen's pre-tokenizer and special tokens
    (pad ``<|endoftext|>``, eos ``<|im_end|>``, no bos, nothing appended) and a ChatML template."""
    import json

    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(QWEN_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    qwen = Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=model_max_length,
        additional_special_tokens=list(QWEN_SPECIAL_TOKENS[1:]),
    )
    qwen.chat_template = QWEN_CHAT_TEMPLATE
    return qwen


def tiny_qwen2_5_vl(seed: int, *, hidden_size: int = 32, vocab_size: int = 384) -> Any:
    """A ``Qwen2_5_VLForConditionalGeneration`` with a 2-layer text model (head_dim 16, one KV
    head, mrope sections that fill it) and a 2-block vision tower; token ids match
    :func:`tiny_qwen_tokenizer`. Text-to-image pipelines read its last hidden states."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    head_dim = 16
    sixteenth = head_dim // 16  # mrope sections (t, h, w) fill head_dim / 2 in Qwen's 2:3:3 ratio ([16, 24, 24])
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab_size,
            "hidden_size": hidden_size,
            "intermediate_size": hidden_size * 2,
            "num_hidden_layers": 2,
            "num_attention_heads": hidden_size // head_dim,
            "num_key_value_heads": 1,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": [2 * sixteenth, 3 * sixteenth, 3 * sixteenth],
            },
            "bos_token_id": QWEN_ENDOFTEXT_ID,
            "eos_token_id": QWEN_IM_END_ID,
            "tie_word_embeddings": False,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": hidden_size,
            "fullatt_block_indexes": [1],
        },
        image_token_id=QWEN_IMAGE_PAD_ID,
        video_token_id=QWEN_VIDEO_PAD_ID,
        vision_start_token_id=QWEN_VISION_START_ID,
        vision_end_token_id=QWEN_VISION_END_ID,
        tie_word_embeddings=False,
    )
    seeded(seed)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def tiny_qwen3(seed: int, *, hidden_size: int = 32, vocab_size: int = 384, causal_lm: bool = False) -> Any:
    """A 2-layer Qwen3 (``Qwen3Model``, or ``Qwen3ForCausalLM``), head_dim 16, one KV head, tied
    embeddings like the small Qwen3 models; token ids match :func:`tiny_qwen_tokenizer`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=2,
        num_attention_heads=hidden_size // 16,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        bos_token_id=QWEN_ENDOFTEXT_ID,
        eos_token_id=QWEN_IM_END_ID,
        pad_token_id=QWEN_ENDOFTEXT_ID,
    )
    seeded(seed)
    return (Qwen3ForCausalLM if causal_lm else Qwen3Model)(config).eval()
