"""Tiny text encoders for the FLUX.2 pipelines (nothing is downloaded).

FLUX.2 feeds the transformer the hidden states of three decoder layers stacked along the
feature axis, so the tiny decoders keep enough layers for the pipelines' default layer
indices (``text_encoder_out_layers``) and stay tiny by being narrow (hidden size 32).
"""

from __future__ import annotations

from typing import Any

#: ``Flux2Pipeline``'s default ``text_encoder_out_layers`` (Mistral Small 3.x has 40 layers)
MISTRAL_OUT_LAYERS: tuple[int, ...] = (10, 20, 30)
#: ``Flux2KleinPipeline``'s default ``text_encoder_out_layers`` (Qwen3-4B has 36 layers)
QWEN3_OUT_LAYERS: tuple[int, ...] = (9, 18, 27)

#: Mistral Small 3.x's instruction format, for messages whose content is a string or a list
#: of ``{"type": "text", "text": ...}`` parts (what ``Flux2Pipeline`` sends)
MISTRAL_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set text = message['content'] %}"
    "{%- else %}{%- set text = message['content'] | selectattr('type', 'equalto', 'text') "
    "| map(attribute='text') | join('') %}{%- endif %}"
    "{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[INST]' + text + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- text + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)


def tiny_mistral_tokenizer(model_max_length: int = 512) -> Any:
    """A byte-level BPE tokenizer with Mistral's special tokens and instruction template.

    The real FLUX.2 [dev] checkpoint ships a ``PixtralProcessor``; ``Flux2Pipeline`` only
    calls ``apply_chat_template`` on it for text-to-image, which a tokenizer provides, so the
    tiny checkpoint saves a ``PreTrainedTokenizerFast`` (the processor class needs torchvision)."""
    from omni_plugin_diffusion.tiny import tiny_tokenizer

    return tiny_tokenizer(
        model_max_length=model_max_length,
        pad="<pad>",
        bos="<s>",
        eos="</s>",
        unk="<unk>",
        extra_special=("[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[IMG]"),
        add_bos=False,  # the chat template writes it
        add_eos=False,
        chat_template=MISTRAL_CHAT_TEMPLATE,
    )


def tiny_mistral3(seed: int, *, hidden_size: int = 32, vocab_size: int = 512) -> Any:
    """A ``Mistral3ForConditionalGeneration`` (Pixtral vision tower + Mistral decoder), the
    class of FLUX.2 [dev]'s text encoder, with a narrow 30-layer decoder."""
    from omni_plugin_diffusion.tiny import seeded
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    config = Mistral3Config(
        vision_config={
            "model_type": "pixtral",
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "head_dim": 8,
            "image_size": 64,
            "patch_size": 16,
        },
        text_config={
            "model_type": "mistral",
            "vocab_size": vocab_size,
            "hidden_size": hidden_size,
            "intermediate_size": hidden_size * 2,
            "num_hidden_layers": max(MISTRAL_OUT_LAYERS),
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "max_position_embeddings": 1024,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        image_token_index=vocab_size - 1,
        spatial_merge_size=2,
    )
    seeded(seed)
    return Mistral3ForConditionalGeneration(config).eval()


def tiny_qwen3_deep(seed: int, *, hidden_size: int = 32, vocab_size: int = 512) -> Any:
    """A ``Qwen3ForCausalLM``, the class of FLUX.2 [klein]'s text encoder, with a narrow
    27-layer decoder (the shared ``tiny_qwen3`` has 2 layers; [klein] reads layer 27). Token
    ids match the shared ``tiny_qwen_tokenizer``."""
    from omni_plugin_diffusion.tiny import QWEN_ENDOFTEXT_ID, QWEN_IM_END_ID, seeded
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=max(QWEN3_OUT_LAYERS),
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=QWEN_ENDOFTEXT_ID,
        eos_token_id=QWEN_IM_END_ID,
        pad_token_id=QWEN_ENDOFTEXT_ID,
    )
    seeded(seed)
    return Qwen3ForCausalLM(config).eval()
