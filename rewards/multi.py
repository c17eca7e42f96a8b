"""Weighted combinations of registered rewards.

``MultiReward`` scores with every component and returns their weighted sum as ``score``; each component's raw
score is kept in ``components`` (named by the reward) so the runner can log it and the advantage computation can
aggregate per reward instead (MixGRPO's ``advantage_aggr``; see ``algorithms.engine.advantages``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from flowzoo.rewards.base import Reward, RewardOutput


class MultiReward(Reward):
    name = "multi"

    def __init__(self, rewards: dict[str, Reward], weights: dict[str, float]):
        if set(rewards) != set(weights):
            raise ValueError(f"rewards {sorted(rewards)} and weights {sorted(weights)} name different components")
        self.rewards = rewards
        self.weights = {k: float(v) for k, v in weights.items()}
        kinds = [set(r.accepts) for r in rewards.values()]
        self.accepts = tuple(sorted(set.intersection(*kinds))) if kinds else ()

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        components: dict[str, torch.Tensor] = {}
        total = torch.zeros(samples.shape[0], dtype=torch.float32, device=samples.device)
        for name, reward in self.rewards.items():
            out = reward(samples, prompts, metadata)
            components[name] = out.score
            for sub, value in out.components.items():
                components[f"{name}/{sub}"] = value
            total = total + self.weights[name] * out.score
        return RewardOutput(total, components)
