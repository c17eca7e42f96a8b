"""Group-relative advantages (GRPO) and multi-reward aggregation.

A_i = (r_i - mean_group(r)) / (std + eps), with std either the group's (Flow-GRPO's per-prompt stat tracker) or the
whole batch's (``global_std``), then clipped to +-adv_clip. The std is the population one (``np.std``, Flow-GRPO's
flow_grpo/stat_tracking.py:27-29, eps 1e-4) or, with ``unbiased``, the sample one (``torch.std``, DanceGRPO's and
MixGRPO's group std, eps 1e-8). With several rewards, ``aggregation="sum"`` normalises the weighted sum of rewards;
``aggregation="advantage"`` normalises each reward within its groups and sums the weighted advantages (MixGRPO's
``advantage_aggr``).
"""

from __future__ import annotations

import math
from typing import Literal, Mapping, get_args

import torch

#: the advantage std modes and multi-reward aggregations (the one list of each: configs are typed with them)
StdMode = Literal["group", "batch"]
Aggregation = Literal["sum", "advantage"]
STD_MODES, AGGREGATIONS = get_args(StdMode), get_args(Aggregation)


def _group_moments(rewards: torch.Tensor, group: torch.Tensor, unbiased: bool):
    """Per-sample group mean and group std of ``rewards`` (float) by ``group`` id. The groups are found where the ids
    are (host-side, Trajectory's placement) and their index goes to the rewards' device: ``unique`` on a device tensor
    would wait for the device (its output size depends on the values)."""
    ids, inverse, counts = torch.unique(group, return_inverse=True, return_counts=True)
    inverse, counts = inverse.to(rewards.device), counts.to(rewards.device)
    means = rewards.new_zeros(len(ids)).index_add_(0, inverse, rewards) / counts
    centered = rewards - means[inverse]
    squares = rewards.new_zeros(len(ids)).index_add_(0, inverse, centered**2)
    var = squares / (counts - 1).clamp(min=1) if unbiased else squares / counts
    return means[inverse], var.sqrt()[inverse]


def group_advantages(
    rewards: torch.Tensor, group: torch.Tensor, std_mode: str = "group", eps: float = 1e-4, clip: float = 5.0,
    unbiased: bool = False,
) -> torch.Tensor:
    """Advantages [B] of ``rewards`` [B] relative to the samples sharing the same ``group`` id [B]."""
    if std_mode not in STD_MODES:
        raise ValueError(f"unknown std mode {std_mode!r}; known: {', '.join(STD_MODES)}")
    rewards = rewards.float()
    mean, std = _group_moments(rewards, group, unbiased)
    if std_mode == "batch":
        std = rewards.std(unbiased=unbiased).expand_as(rewards)
    return (((rewards - mean) / (std + eps)).clamp(-clip, clip)).to(torch.float32)


def zero_std_fraction(rewards: torch.Tensor, group: torch.Tensor) -> float:
    """The fraction of groups whose rewards are all equal (zero std): their advantages are all 0, so they teach
    nothing (Flow-GRPO logs it as ``zero_std_ratio``, scripts/train_sd3.py:132-166)."""
    ids, inverse = torch.unique(group, return_inverse=True)
    inverse = inverse.to(rewards.device)
    rewards = rewards.double()
    lo = rewards.new_full((len(ids),), math.inf).scatter_reduce(0, inverse, rewards, "amin")
    hi = rewards.new_full((len(ids),), -math.inf).scatter_reduce(0, inverse, rewards, "amax")
    return float((lo == hi).double().mean())


def combined_advantages(
    total: torch.Tensor,
    components: Mapping[str, torch.Tensor],
    weights: Mapping[str, float] | None,
    group: torch.Tensor,
    aggregation: str = "sum",
    std_mode: str = "group",
    clip: float = 5.0,
    eps: float = 1e-4,
    unbiased: bool = False,
) -> torch.Tensor:
    """Advantages of a (possibly multi-component) reward under the chosen aggregation."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; known: {', '.join(AGGREGATIONS)}")
    if aggregation == "sum" or not weights:
        return group_advantages(total, group, std_mode, eps=eps, clip=clip, unbiased=unbiased)
    # the merged advantage is clamped, not each reward's: MixGRPO sums the unclipped per-reward advantages
    # (Tencent-Hunyuan/MixGRPO fastvideo/train_grpo_flux.py:449-456) and clamps the sum in the loss (:567)
    parts = [w * group_advantages(components[name], group, std_mode, eps=eps, clip=math.inf, unbiased=unbiased)
             for name, w in weights.items()]
    return torch.stack(parts).sum(0).clamp(-clip, clip)
