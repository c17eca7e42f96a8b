"""Group-relative advantages (GRPO) and multi-reward aggregation.

A_i = (r_i - mean_group(r)) / (std + eps), with std either the group's (Flow-GRPO's per-prompt stat tracker) or the
whole batch's (``global_std``), then clipped to +-adv_clip. With several rewards, ``aggregation="sum"`` normalises
the weighted sum of rewards; ``aggregation="advantage"`` normalises each reward within its groups and sums the
weighted advantages (MixGRPO's ``advantage_aggr``).
"""

from __future__ import annotations

import math
from typing import Mapping

import torch

STD_MODES = ("group", "batch")
AGGREGATIONS = ("sum", "advantage")


def group_advantages(
    rewards: torch.Tensor, group: torch.Tensor, std_mode: str = "group", eps: float = 1e-4, clip: float = 5.0
) -> torch.Tensor:
    """Advantages [B] of ``rewards`` [B] relative to the samples sharing the same ``group`` id [B]."""
    if std_mode not in STD_MODES:
        raise ValueError(f"unknown std mode {std_mode!r}; known: {', '.join(STD_MODES)}")
    rewards = rewards.float()
    group = group.to(rewards.device)
    ids, inverse, counts = torch.unique(group, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(ids), dtype=rewards.dtype).index_add_(0, inverse, rewards)
    means = sums / counts
    centered = rewards - means[inverse]
    if std_mode == "group":
        var = torch.zeros(len(ids), dtype=rewards.dtype).index_add_(0, inverse, centered**2) / counts
        std = var.sqrt()[inverse]
    else:
        std = rewards.std(unbiased=False).expand_as(rewards)
    return ((centered / (std + eps)).clamp(-clip, clip)).to(torch.float32)


def combined_advantages(
    total: torch.Tensor,
    components: Mapping[str, torch.Tensor],
    weights: Mapping[str, float] | None,
    group: torch.Tensor,
    aggregation: str = "sum",
    std_mode: str = "group",
    clip: float = 5.0,
) -> torch.Tensor:
    """Advantages of a (possibly multi-component) reward under the chosen aggregation."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; known: {', '.join(AGGREGATIONS)}")
    if aggregation == "sum" or not weights:
        return group_advantages(total, group, std_mode, clip=clip)
    # the merged advantage is clamped, not each reward's: MixGRPO sums the unclipped per-reward advantages
    # (Tencent-Hunyuan/MixGRPO fastvideo/train_grpo_flux.py:449-456) and clamps the sum in the loss (:567)
    parts = [w * group_advantages(components[name], group, std_mode, clip=math.inf) for name, w in weights.items()]
    return torch.stack(parts).sum(0).clamp(-clip, clip)
