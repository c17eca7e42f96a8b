"""Tiny random FluxPipeline (and FluxKontextPipeline) and QwenImagePipeline built in code (like diffusers' own
``get_dummy_components``), no hub: saved with ``save_pretrained`` so that the adapters load them through their real
``from_pretrained`` path.

Shared by the flux / flux_kontext / qwen_image adapter tests, the export test and the paper-suite dry runs."""

from __future__ import annotations

import torch

from flowzoo.benchmark.perf.pipeline import tiny_clip_tokenizer, tiny_t5_tokenizer

FLUX_RESOLUTION = 16  # VAE factor 2 -> 8 x 8 latents -> 4 x 4 = 16 packed tokens of 16 channels
FLUX_MAX_SEQ = 8
QWEN_RESOLUTION = 16  # VAE factor 4 (two temporal-downsample entries) -> 4 x 4 latents -> 2 x 2 = 4 tokens
QWEN_MAX_SEQ = 256  # byte tokens: the chat template after its first 34 tokens is ~125, then the prompt
#: Qwen-Image's scheduler (Qwen/Qwen-Image scheduler/scheduler_config.json): dynamic exponential shift with
#: max_shift 0.9 over 8192 tokens and the grid stretched to end at 0.02
QWEN_SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192, max_shift=0.9, shift=1.0,
                      shift_terminal=0.02, time_shift_type="exponential", use_dynamic_shifting=True)
#: FLUX.1-dev's scheduler (black-forest-labs/FLUX.1-dev scheduler/scheduler_config.json)
FLUX_SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15, shift=3.0,
                      use_dynamic_shifting=True)


def build_tiny_flux(directory, tmp, pipeline_class: str = "FluxPipeline"):
    """FluxPipeline: CLIP (pooled) + T5, a 1 + 1-block FluxTransformer2DModel with the guidance embedding, a 2x VAE
    (``pipeline_class`` FluxKontextPipeline: the same components as FLUX.1-Kontext-dev's pipeline)."""
    import diffusers
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=True,
        axes_dims_rope=(2, 2, 4),
    )
    clip_tok, clip_vocab = tiny_clip_tokenizer(tmp)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=16, intermediate_size=24, num_attention_heads=2,
        num_hidden_layers=1, vocab_size=clip_vocab, max_position_embeddings=16, hidden_act="gelu"))
    t5_tok, t5_vocab = tiny_t5_tokenizer()
    text_encoder_2 = T5EncoderModel(T5Config(vocab_size=t5_vocab, d_model=32, d_kv=8, d_ff=32, num_layers=1,
                                             num_heads=4, relative_attention_num_buckets=8, decoder_start_token_id=0))
    vae = AutoencoderKL(
        sample_size=FLUX_RESOLUTION, in_channels=3, out_channels=3, block_out_channels=(4, 4),
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        layers_per_block=1, latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
        shift_factor=0.1159, scaling_factor=0.3611,  # FLUX.1-dev's VAE values
    )
    pipe = getattr(diffusers, pipeline_class)(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER), vae=vae,
        text_encoder=text_encoder, tokenizer=clip_tok, text_encoder_2=text_encoder_2, tokenizer_2=t5_tok,
    )
    pipe.save_pretrained(directory)
    return directory


def tiny_qwen_tokenizer():
    """A byte-level BPE Qwen2 tokenizer over single bytes and a few merges (no hub), with the chat template's special
    tokens."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {}
    for c in sorted(set(bytes_to_unicode().values())):
        vocab.setdefault(c, len(vocab))
    merges = ["c a", "ca t", "d o", "do g"]
    for merge in merges:
        vocab.setdefault(merge.replace(" ", ""), len(vocab))
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[special] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[tuple(m.split()) for m in merges],
                               additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    return tokenizer, len(vocab)


def build_tiny_qwen_image(directory):
    """QwenImagePipeline: a 1-layer Qwen2.5-VL text encoder (hidden 16), a 1-block QwenImageTransformer2DModel, a
    Qwen-Image VAE with z_dim 4."""
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                           QwenImageTransformer2DModel)
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    tokenizer, vocab = tiny_qwen_tokenizer()
    z_dim = 4
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=4 * z_dim, out_channels=z_dim, num_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(2, 2, 4),
    )
    vae = AutoencoderKLQwenImage(
        base_dim=z_dim * 2, z_dim=z_dim, dim_mult=[1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True],
        latents_mean=[0.1, -0.2, 0.3, 0.05], latents_std=[1.5, 2.0, 0.8, 1.2],
    )
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": vocab, "max_position_embeddings": 512,
                     "bos_token_id": vocab - 3, "eos_token_id": vocab - 3,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
                     "rope_theta": 1000000.0},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=16, vocab_size=vocab, vision_start_token_id=vocab - 3, vision_end_token_id=vocab - 3,
        vision_token_id=vocab - 3, image_token_id=vocab - 3, video_token_id=vocab - 3,
    )
    text_encoder = Qwen2_5_VLForConditionalGeneration(config)
    pipe = QwenImagePipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_SCHEDULER),
                             vae=vae, text_encoder=text_encoder, tokenizer=tokenizer)
    pipe.save_pretrained(directory)
    return directory
