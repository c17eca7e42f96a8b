"""Tiny random FluxPipeline (and FluxKontextPipeline), QwenImagePipeline and QwenImageEditPipeline built in code
(like diffusers' own ``get_dummy_components``), no hub: saved with ``save_pretrained`` so that the adapters load them
through their real ``from_pretrained`` path.

Shared by the flux / flux_kontext / qwen_image / qwen_image_edit adapter tests, the export test and the paper-suite
dry runs."""

from __future__ import annotations

import torch

from flowzoo.benchmark.perf.pipeline import tiny_clip_tokenizer, tiny_t5_tokenizer

FLUX_RESOLUTION = 16  # VAE factor 2 -> 8 x 8 latents -> 4 x 4 = 16 packed tokens of 16 channels
FLUX_MAX_SEQ = 8
QWEN_RESOLUTION = 16  # VAE factor 4 (two temporal-downsample entries) -> 4 x 4 latents -> 2 x 2 = 4 tokens
QWEN_MAX_SEQ = 256  # byte tokens: the chat template after its first 34 tokens is ~125, then the prompt
#: the edit template after its first 64 tokens: ~250 byte tokens, the source image's 4 tokens, then the instruction
QWEN_EDIT_MAX_SEQ = 384
QWEN_EDIT_PATCH = 4  # the tiny vision tower's patch side (Qwen2.5-VL's is 14)
#: Qwen2.5-VL's image tokens (its tokenizer's special tokens)
QWEN_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
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


def tiny_qwen_tokenizer(vision: bool = False):
    """A byte-level BPE Qwen2 tokenizer over single bytes and a few merges (no hub), with the chat template's special
    tokens (and, with ``vision``, Qwen2.5-VL's image tokens the edit template and the processor use)."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {}
    for c in sorted(set(bytes_to_unicode().values())):
        vocab.setdefault(c, len(vocab))
    merges = ["c a", "ca t", "d o", "do g"]
    for merge in merges:
        vocab.setdefault(merge.replace(" ", ""), len(vocab))
    specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>") + (QWEN_VISION_TOKENS if vision else ())
    for special in specials:
        vocab[special] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[tuple(m.split()) for m in merges],
                               additional_special_tokens=list(specials[1:]))
    return tokenizer, len(vocab)


def tiny_qwen_components(tokenizer, vocab: int, vision: dict | None = None) -> dict:
    """The tiny Qwen-Image transformer, VAE and Qwen2.5-VL text encoder (its vision tower ``vision`` config, with the
    image token ids of a ``vision`` tokenizer, for the edit pipeline)."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    z_dim = 4
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=4 * z_dim, out_channels=z_dim, num_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(2, 2, 4),
    )
    vae = AutoencoderKLQwenImage(
        base_dim=z_dim * 2, z_dim=z_dim, dim_mult=[1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True],
        latents_mean=[0.1, -0.2, 0.3, 0.05], latents_std=[1.5, 2.0, 0.8, 1.2],
    )
    eos = vocab - 3 if vision is None else tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if vision is None:
        ids = dict(vision_start_token_id=eos, vision_end_token_id=eos, vision_token_id=eos, image_token_id=eos,
                   video_token_id=eos)
    else:
        start, end, image, video = tokenizer.convert_tokens_to_ids(list(QWEN_VISION_TOKENS))
        ids = dict(vision_start_token_id=start, vision_end_token_id=end, vision_token_id=image, image_token_id=image,
                   video_token_id=video)
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": vocab, "max_position_embeddings": 1024,
                     "bos_token_id": eos, "eos_token_id": eos,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
                     "rope_theta": 1000000.0},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16,
                       **(vision or {})},
        hidden_size=16, vocab_size=vocab, **ids,
    )
    text_encoder = Qwen2_5_VLForConditionalGeneration(config)
    return dict(transformer=transformer, vae=vae, text_encoder=text_encoder)


def build_tiny_qwen_image(directory):
    """QwenImagePipeline: a 1-layer Qwen2.5-VL text encoder (hidden 16), a 1-block QwenImageTransformer2DModel, a
    Qwen-Image VAE with z_dim 4."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    tokenizer, vocab = tiny_qwen_tokenizer()
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_SCHEDULER), tokenizer=tokenizer,
                             **tiny_qwen_components(tokenizer, vocab))
    pipe.save_pretrained(directory)
    return directory


def build_tiny_qwen_image_edit(directory):
    """QwenImageEditPipeline: the Qwen-Image pipeline's tiny components, its Qwen2.5-VL text encoder with a 1-block
    vision tower of 4 x 4 patches (2 x 2 merged), and a processor (the tokenizer with the image tokens, a
    Qwen2VLImageProcessor at the same patch sizes: a 16 x 16 source is 4 image tokens). The processor is saved as
    its two parts in ``processor/`` (what the adapter loads, ``models/qwen_image_edit.py``): transformers builds no
    Qwen2VLProcessor without torchvision's video processor."""
    import json

    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline
    from transformers import Qwen2VLImageProcessor

    tokenizer, vocab = tiny_qwen_tokenizer(vision=True)
    vision = dict(patch_size=QWEN_EDIT_PATCH, spatial_merge_size=2, temporal_patch_size=2, window_size=16,
                  fullatt_block_indexes=[0])
    pipe = QwenImageEditPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_SCHEDULER), tokenizer=tokenizer,
                                 processor=None, **tiny_qwen_components(tokenizer, vocab, vision))
    pipe.save_pretrained(directory)
    image_processor = Qwen2VLImageProcessor(patch_size=QWEN_EDIT_PATCH, merge_size=2, temporal_patch_size=2,
                                            min_pixels=(2 * QWEN_EDIT_PATCH) ** 2, max_pixels=64 * 64)
    image_processor.save_pretrained(directory / "processor")
    tokenizer.save_pretrained(directory / "processor")
    index = json.loads((directory / "model_index.json").read_text())
    index["processor"] = ["transformers", "Qwen2VLProcessor"]  # as Qwen/Qwen-Image-Edit's model_index.json
    (directory / "model_index.json").write_text(json.dumps(index, indent=2))
    return directory
