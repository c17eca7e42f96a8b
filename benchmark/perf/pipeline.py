"""A tiny random StableDiffusion3Pipeline built in code (like diffusers' own ``get_dummy_components``), no hub, and
a cheap reward for it: what ``flowzoo perf`` and the SD3 adapter tests run on.

``build_tiny_sd3(directory, tmp)`` saves the pipeline with ``save_pretrained`` so that it is loaded through the
adapter's real ``from_pretrained`` path; ``tmp`` receives the tokenizer files.
"""

from __future__ import annotations

import torch

from flowzoo.rewards.base import Reward, RewardOutput

RESOLUTION = 32
MAX_SEQ = 8


def tiny_clip_tokenizer(tmp):
    """A byte-level BPE CLIP tokenizer from a vocab.json / merges.txt written here (no hub)."""
    import json

    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = sorted(set(bytes_to_unicode().values()))
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in chars:
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    merges = ["c a", "ca t</w>", "d o", "do g", "dog s</w>"]
    for merge in merges:
        vocab.setdefault(merge.replace(" ", ""), len(vocab))
    (tmp / "vocab.json").write_text(json.dumps(vocab))
    (tmp / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tokenizer = CLIPTokenizer(vocab=str(tmp / "vocab.json"), merges=str(tmp / "merges.txt"), model_max_length=16)
    return tokenizer, len(vocab)


def tiny_t5_tokenizer():
    """A sentencepiece-style Unigram T5 tokenizer over a few words and single letters (no hub)."""
    from transformers import T5Tokenizer

    words = ["a", "photo", "of", "cat", "two", "red", "dogs", "blue"]
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [("\u2581" + w, -1.0) for w in words] + [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    return T5Tokenizer(vocab=vocab, extra_ids=0), len(vocab)


def build_tiny_sd3(directory, tmp):
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from diffusers import StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(
        sample_size=RESOLUTION // 2, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
        num_attention_heads=2, caption_projection_dim=16, joint_attention_dim=32, pooled_projection_dim=32,
        out_channels=4,
    )
    clip_tok, clip_vocab = tiny_clip_tokenizer(tmp)
    clip_cfg = dict(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=16, intermediate_size=24, num_attention_heads=2,
        num_hidden_layers=2, vocab_size=clip_vocab, max_position_embeddings=16, projection_dim=16, hidden_act="gelu",
    )
    text_encoder = CLIPTextModelWithProjection(CLIPTextConfig(**clip_cfg))
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**clip_cfg))
    t5_tok, t5_vocab = tiny_t5_tokenizer()
    text_encoder_3 = T5EncoderModel(
        T5Config(vocab_size=t5_vocab, d_model=32, d_kv=8, d_ff=32, num_layers=2, num_heads=4,
                 relative_attention_num_buckets=8, decoder_start_token_id=0)
    )
    vae = AutoencoderKL(
        sample_size=RESOLUTION, in_channels=3, out_channels=3, block_out_channels=(4, 4),
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        layers_per_block=1, latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
        shift_factor=0.0609, scaling_factor=1.5035,
    )
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
        text_encoder=text_encoder, tokenizer=clip_tok, text_encoder_2=text_encoder_2, tokenizer_2=clip_tok,
        text_encoder_3=text_encoder_3, tokenizer_3=t5_tok,
    )
    pipe.save_pretrained(directory)
    return directory


class MeanBrightness(Reward):
    """A cheap differentiable-free reward for images and videos: the mean pixel value."""

    name = "mean_brightness"
    accepts = ("image", "video")

    def score(self, samples, prompts, metadata):
        return RewardOutput(samples.float().flatten(1).mean(1))
