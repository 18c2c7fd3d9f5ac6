"""The Sana family: declarations for the shared diffusion runtime.

``sana`` serves ``SanaPipeline`` (Sana 600M/1.6B and Sana 1.5): a Gemma2 text encoder
(gemma-2-2b-it's decoder, last hidden state, prompts prefixed with Sana's "complex human
instruction"), ``SanaTransformer2DModel`` and ``AutoencoderDC`` (DC-AE, 32x spatial
compression, 32 latent channels), with a flow-matching DPM-Solver++ scheduler.

Each ``SanaTransformerBlock`` has two attention modules:

* ``attn1``, self attention over the image tokens, is *linear* attention
  (``SanaLinearAttnProcessor2_0``: a ReLU kernel and two matrix products, no softmax). It never
  calls ``scaled_dot_product_attention``, so no attention backend can serve it and none is
  declared for it.
* ``attn2``, cross attention to the prompt, is softmax attention through
  ``scaled_dot_product_attention`` with the prompt's padding mask: role ``cross``, and the
  family declares ``attention_masks`` so backends that cannot take a mask are passed over.

Nothing here is imported when plugins load; torch, diffusers and transformers are imported
inside the methods that build or run a model.
"""

from __future__ import annotations

from typing import Any, ClassVar

from omni_plugin_diffusion.family import AttentionRoles, DiffusersFamily
from omni_plugin_diffusion.tiny import seeded, tiny_tokenizer

from omni_core.generation.request import GenerationProfile

#: DC-AE stage layout of the released f32c32 autoencoder: three convolutional stages, then
#: three EfficientViT (linear attention) stages
_DCAE_BLOCKS = ("ResBlock", "ResBlock", "ResBlock", "EfficientViTBlock", "EfficientViTBlock", "EfficientViTBlock")


class Sana(DiffusersFamily):
    """Sana text-to-image (``Efficient-Large-Model/Sana_1600M_1024px_diffusers``).

    The pipeline bins the requested size to the nearest aspect ratio the checkpoint was
    trained on (by its ``sample_size``), generates there and resizes and crops the result to
    exactly the requested width and height."""

    pipeline_class = "SanaPipeline"
    profile = GenerationProfile(
        task="text-to-image",
        default_width=1024,
        default_height=1024,
        # DC-AE 32x spatial compression, 1x1 patches
        size_multiple=32,
        min_size=32,
        # the 4K checkpoints
        max_size=4096,
        default_steps=20,
        default_guidance=4.5,
        supports_negative_prompt=True,
    )
    #: attn2 (cross) is the only attention that reaches scaled_dot_product_attention; attn1 is
    #: linear attention computed in its processor, so it has no role to serve
    attention_roles: ClassVar[AttentionRoles] = (("transformer.transformer_blocks.*.attn2", "cross", "cross"),)
    #: the cross attention masks the prompt's padding
    attention_masks = True
    #: the routed call sites are the cross attention, whose heads are cross_attention_head_dim wide
    head_size_keys: ClassVar[dict[str, str]] = {"cross": "cross_attention_head_dim"}
    dit_modules = ("transformer",)
    encoder_modules = ("text_encoder",)
    resident_modules = ("vae",)
    block_attrs = ("transformer.transformer_blocks",)

    @classmethod
    def tiny_components(cls, seed: int) -> dict[str, Any]:
        from diffusers import AutoencoderDC, DPMSolverMultistepScheduler, SanaTransformer2DModel
        from transformers import Gemma2Config, Gemma2Model

        latent, text_dim = 4, 32
        seeded(seed)
        transformer = SanaTransformer2DModel(
            in_channels=latent,
            out_channels=latent,
            num_attention_heads=2,
            attention_head_dim=8,
            num_layers=2,
            num_cross_attention_heads=2,
            cross_attention_head_dim=8,
            cross_attention_dim=16,
            caption_channels=text_dim,
            mlp_ratio=2.5,
            # the 512px aspect-ratio bins (1024px checkpoints have 32): the smallest generation
            # size that keeps resolution binning, the pipeline's default, on
            sample_size=16,
            patch_size=1,
        )
        seeded(seed + 1)
        # six stages like the released DC-AE, so the tiny one compresses 32x as well
        vae = AutoencoderDC(
            in_channels=3,
            latent_channels=latent,
            attention_head_dim=8,
            encoder_block_types=_DCAE_BLOCKS,
            decoder_block_types=_DCAE_BLOCKS,
            encoder_block_out_channels=(4, 8, 8, 16, 16, 16),
            decoder_block_out_channels=(4, 8, 8, 16, 16, 16),
            encoder_layers_per_block=(1, 1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1, 1, 1),
            encoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
            decoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
            upsample_block_type="interpolate",
            downsample_block_type="Conv",
            decoder_norm_types=("batch_norm", "batch_norm", "batch_norm", "rms_norm", "rms_norm", "rms_norm"),
            decoder_act_fns=("relu", "relu", "relu", "silu", "silu", "silu"),
            scaling_factor=0.41407,
        )
        seeded(seed + 2)
        text_encoder = Gemma2Model(
            Gemma2Config(
                vocab_size=384,
                hidden_size=text_dim,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                # the complex human instruction plus 300 prompt tokens
                max_position_embeddings=2048,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
            )
        ).eval()
        # Gemma: <pad> 0, <bos> 1 prepended, <eos> 2 not appended, padded on the right
        tokenizer = tiny_tokenizer(
            model_max_length=2048, pad="<pad>", bos="<bos>", eos="<eos>", unk="<unk>", add_bos=True, add_eos=False
        )
        # the released scheduler: DPM-Solver++ on flow sigmas, flow shift 3 (1024px and 2K)
        scheduler = DPMSolverMultistepScheduler(flow_shift=3.0, use_flow_sigmas=True, prediction_type="flow_prediction")
        return {
            "transformer": transformer,
            "vae": vae,
            "text_encoder": text_encoder,
            "tokenizer": tokenizer,
            "scheduler": scheduler,
        }
