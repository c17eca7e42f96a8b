"""Programmatic rewards of the toy 2-D tier. Targets come from the prompt metadata (see ``models/toy2d.py``)."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from flowzoo.errors import ConfigError
from flowzoo.rewards import register
from flowzoo.rewards.base import Reward, RewardOutput


def _targets(metadata: Sequence[dict], key: str, reward: str, device: torch.device) -> torch.Tensor:
    try:
        return torch.tensor([m[key] for m in metadata], dtype=torch.float32, device=device)
    except KeyError:
        raise ValueError(f"reward {reward!r} needs prompt metadata {key!r} (the toy2d prompt set provides it)") from None


@register("toy_mode")
class ToyModeReward(Reward):
    """Dense: exp(-d^2 / (2 scale^2)) with d the distance to the class's minority mode."""

    accepts = ("points",)
    bounds = (0.0, 1.0)

    def __init__(self, scale: float = 0.5):
        if not (isinstance(scale, (int, float)) and scale > 0 and 0 < scale * scale < math.inf):
            raise ConfigError(f"reward 'toy_mode': scale must be a number > 0 whose square is finite and > 0, got "
                              f"{scale!r} (scale 0 would make the reward a constant)")
        self.scale = float(scale)

    def score(self, samples, prompts, metadata) -> RewardOutput:
        d2 = ((samples.float() - _targets(metadata, "mode_target", self.name, samples.device)) ** 2).sum(dim=1)
        return RewardOutput(torch.exp(-d2 / (2 * self.scale * self.scale)))


@register("toy_target")
class ToyTargetReward(Reward):
    """Sparse: 1 inside a small disc just outside the minority mode, else 0 (the base model rarely succeeds)."""

    accepts = ("points",)
    bounds = (0.0, 1.0)

    def score(self, samples, prompts, metadata) -> RewardOutput:
        d = ((samples.float() - _targets(metadata, "hard_target", self.name, samples.device)) ** 2).sum(dim=1).sqrt()
        radius = torch.tensor([m.get("hard_radius", 0.3) for m in metadata], dtype=torch.float32, device=samples.device)
        return RewardOutput((d < radius).float())
