"""The LoRA targets of the paper-scale adapters, counted on the real transformer configs built on the meta device
(no weights): what the adapters' own ``_add_lora`` wraps with each model's default targets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("peft")

from models.diffusers_common import ATTENTION_PROJECTIONS, DiffusersFlowModel  # noqa: E402
from models.sd3 import SD3Model  # noqa: E402
from models.wan import WanModel  # noqa: E402

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
RANK = 32  # the releases' LoraConfig(r=32, lora_alpha=64)


def wrapped_modules(model_class, transformer_class, config, targets=None):
    """(wrapped module names, LoRA parameter count) after the adapter's ``_add_lora`` on the meta device."""
    with torch.device("meta"):
        transformer = getattr(diffusers, transformer_class)(**config)
    holder = SimpleNamespace(transformer=transformer, device=torch.device("meta"), latent_dtype=torch.float32)
    names = DiffusersFlowModel._add_lora(holder, RANK, 2.0 * RANK, targets or model_class.default_lora_targets)
    return {n.split(".lora_")[0] for n in names}, sum(dict(transformer.named_parameters())[n].numel() for n in names)


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
