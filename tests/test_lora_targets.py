"""The LoRA targets of the paper-scale adapters, counted on the real transformer configs built on the meta device
(no weights): what the adapters' own ``_add_lora`` wraps with each model's default targets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("peft")

from flowzoo.models.diffusers_common import ATTENTION_PROJECTIONS, DiffusersFlowModel  # noqa: E402
from flowzoo.models.sd3 import SD3Model  # noqa: E402
from flowzoo.models.wan import WanModel  # noqa: E402

#: stabilityai/stable-diffusion-3.5-medium transformer/config.json, written out here (SD3Transformer2DModel)
SD35_MEDIUM = dict(
    sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64, num_attention_heads=24,
    joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048, out_channels=16,
    pos_embed_max_size=384, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm",
)
#: Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json (WanTransformer3DModel)
WAN21_1_3B = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
    eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024,
)
RANK = 32  # the SD3 / Wan releases' LoraConfig(r=32, lora_alpha=64); FLUX and Qwen-Image: r 64 (Flow-GRPO), 128 (DanceGRPO)


def wrapped_modules(model_class, transformer_class, config, targets=None, rank=RANK):
    """(wrapped module names, LoRA parameter count) after the adapter's ``_add_lora`` on the meta device."""
    with torch.device("meta"):  # the LoRA layers too: allocating and initialising them for real takes minutes
        transformer = getattr(diffusers, transformer_class)(**config)
        holder = SimpleNamespace(transformer=transformer, device=torch.device("meta"), latent_dtype=torch.float32)
        names = DiffusersFlowModel._add_lora(holder, rank, 2.0 * rank, targets or model_class.default_lora_targets)
    assert all(p.is_meta for p in transformer.parameters())
    params = dict(transformer.named_parameters())  # once: a lookup per name walks the whole module tree
    return {n.split(".lora_")[0] for n in names}, sum(params[n].numel() for n in names)


def test_sd3_medium_trains_the_released_joint_attention_only():
    wrapped, params = wrapped_modules(SD3Model, "SD3Transformer2DModel", SD35_MEDIUM)
    # 24 blocks x 8 projections of ``attn``, less the last block's to_add_out (context_pre_only); each 1536 -> 1536
    assert len(wrapped) == 24 * 8 - 1 == 191
    assert params == 191 * RANK * (1536 + 1536) == 18_776_064
    assert not [n for n in wrapped if ".attn2." in n]
    assert all(".attn." in n for n in wrapped)


def test_unprefixed_targets_would_also_wrap_sd35_attn2():
    """The discriminating case: the suffix match of the bare names reaches the dual-attention layers 0-12."""
    wrapped, params = wrapped_modules(SD3Model, "SD3Transformer2DModel", SD35_MEDIUM, ATTENTION_PROJECTIONS)
    assert len([n for n in wrapped if ".attn2." in n]) == 13 * 4 == 52
    assert (len(wrapped), params) == (243, 23_887_872)


def test_wan_keeps_flow_grpos_unprefixed_list():
    wrapped, params = wrapped_modules(WanModel, "WanTransformer3DModel", WAN21_1_3B)
    # 30 blocks x (attn1 + attn2) x (q, k, v, out); text-to-video has no added k/v projections; dim 1536
    assert len([n for n in wrapped if ".attn1." in n]) == len([n for n in wrapped if ".attn2." in n]) == 120
    assert params == 240 * RANK * (1536 + 1536) == 23_592_960


#: black-forest-labs/FLUX.1-dev transformer/config.json (FluxTransformer2DModel): 19 double-stream and 38
#: single-stream blocks of 24 heads x 128, T5 width 4096, CLIP pooled 768, the guidance embedding
FLUX1_DEV = dict(
    patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128, num_attention_heads=24,
    joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56),
)
#: Qwen/Qwen-Image transformer/config.json (QwenImageTransformer2DModel): 60 blocks of 24 heads x 128, Qwen2.5-VL
#: width 3584
QWEN_IMAGE = dict(
    patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128, num_attention_heads=24,
    joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56),
)
DIM, MLP = 24 * 128, 4 * 24 * 128  # 3072, and the 4x GELU MLP of both models
#: Flow-GRPO's Qwen-Image target names, typed from scripts/train_qwenimage.py:410-423 at 27b6ef8
QWEN_IMAGE_LORA_NAMES = ("attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj",
                         "attn.add_v_proj", "attn.to_add_out", "img_mlp.net.0.proj", "img_mlp.net.2",
                         "txt_mlp.net.0.proj", "txt_mlp.net.2")


def test_flux_trains_flow_grpos_released_targets():
    from flowzoo.models.flux import FluxModel

    wrapped, params = wrapped_modules(FluxModel, "FluxTransformer2DModel", FLUX1_DEV, targets=None, rank=64)
    double = [n for n in wrapped if n.startswith("transformer_blocks.")]
    single = [n for n in wrapped if n.startswith("single_transformer_blocks.")]
    # 19 double blocks x (8 attention projections + 2 x 2 MLP layers); 38 single blocks x attn q/k/v (no to_out)
    assert (len(double), len(single)) == (19 * 12, 38 * 3) and len(wrapped) == 342
    per_double = 8 * (DIM + DIM) + 2 * ((DIM + MLP) + (MLP + DIM))
    assert params == 64 * (19 * per_double + 38 * 3 * (DIM + DIM)) == 179_306_496


def test_flux_dance_grpo_targets_are_the_image_stream_attention():
    """Per block on FLUX.1-dev's widths (one double and one single block: the 57-block build is the test above's)."""
    from flowzoo.models.flux import FLUX_DANCE_GRPO_LORA_TARGETS, FluxModel

    config = dict(FLUX1_DEV, num_layers=1, num_single_layers=1)
    wrapped, params = wrapped_modules(FluxModel, "FluxTransformer2DModel", config, FLUX_DANCE_GRPO_LORA_TARGETS,
                                      rank=128)
    assert len(wrapped) == 4 + 3 and not [n for n in wrapped if "add_" in n or ".ff" in n]
    assert params == 7 * 128 * (DIM + DIM)  # rank 128 (finetune_flux_grpo_8gpus_lora.sh:58)
    # on the full model: 19 x 4 + 38 x 3 = 190 modules, 149,422,080 parameters
    assert (19 * 4 + 38 * 3) * 128 * (DIM + DIM) == 149_422_080


def test_qwen_image_trains_flow_grpos_released_targets():
    """On Qwen-Image's widths with 2 of its 60 identical blocks (the 60-block build costs ~8 s on this CI's CPUs; the
    count scales per block)."""
    from flowzoo.models.qwen_image import QwenImageModel

    wrapped, params = wrapped_modules(QwenImageModel, "QwenImageTransformer2DModel", dict(QWEN_IMAGE, num_layers=2),
                                      rank=64)
    per_block = 8 * (DIM + DIM) + 2 * ((DIM + MLP) + (MLP + DIM))  # joint attention + image and text MLPs
    assert len(wrapped) == 2 * 12 and params == 64 * 2 * per_block
    assert {n.split(".", 2)[2] for n in wrapped} == set(QWEN_IMAGE_LORA_NAMES)
    assert (60 * 12, 64 * 60 * per_block) == (720, 424_673_280)  # the 60-block model
