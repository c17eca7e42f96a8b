"""Samplers that filter groups after their rollout and draw more prompts until the batch is full.

* ``dynamic`` -- DAPO's dynamic sampling (Yu et al., arXiv 2503.14476, "Dynamic Sampling"): groups whose rewards are
  all equal (accuracy 0 or 1) give zero advantage; over-sample and keep only groups with reward spread until the
  batch holds ``groups`` of them.
* ``difficulty`` -- balanced online difficulty filtering (Bae et al., arXiv 2504.03380): keep the groups whose pass
  rate (share of samples with reward above ``success_threshold``) is intermediate, ``low <= rate <= high``; their
  bound on the policy improvement peaks at pass rate 0.5. The band [0.25, 0.75] and the threshold 0.5 are ours.

Both draw rounds from one seeded shuffle of the pool per step (round r = positions r*B .. (r+1)*B - 1, so a step
draws no prompt twice while the pool is large enough) and stop after ``max_rounds`` draws (ours: 4; DAPO's released
recipe caps its generation batches as well). If the rounds end with fewer kept groups than the batch, the batch is
completed with the first groups that were not kept (their advantages are zero or small), so the update's batch size
never changes (ours). Every round's rollout is counted in the step's NFE and sampling time: the saving in steps is
paid for in samples, and the report shows both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flowzoo.algorithms.prompt_samplers import register
from flowzoo.algorithms.prompt_samplers.base import PromptDraw, PromptSampler, SamplerConfig, uniform_order
from flowzoo.errors import ConfigError
from flowzoo.streams import PROMPT_REFILL


@dataclass
class FilterConfig(SamplerConfig):
    max_rounds: int = 4  # rollouts per step at most, the first included

    def __post_init__(self) -> None:
        if not 1 <= self.max_rounds <= 64:
            raise ConfigError(f"train.prompt_sampler.max_rounds must be in [1, 64], got {self.max_rounds}")


class FilteringSampler(PromptSampler):
    """The shared draw of the filtering samplers; a subclass says which groups it keeps."""

    filters = True
    Config = FilterConfig

    def _order(self, step: int) -> list[int]:
        return uniform_order(len(self.pool), self.seed, step, self.groups * self.config.max_rounds, PROMPT_REFILL)

    def draw(self, step, iteration, algorithm=None) -> PromptDraw:
        return PromptDraw.of(self.pool, self._order(step)[: self.groups])

    def refill(self, step: int, iteration: int, round: int) -> PromptDraw | None:
        if round >= self.config.max_rounds:
            return None
        return PromptDraw.of(self.pool, self._order(step)[round * self.groups: (round + 1) * self.groups])


@register("dynamic")
class DynamicSampling(FilteringSampler):
    """DAPO's dynamic sampling: draw more prompts until the batch holds enough groups with reward spread (extra
    rollouts counted in NFE and time)."""

    def keeps(self, rewards: torch.Tensor) -> bool:
        return bool(rewards.max() > rewards.min())


@dataclass
class DifficultyConfig(FilterConfig):
    low: float = 0.25  # keep pass rates in [low, high]
    high: float = 0.75
    success_threshold: float = 0.5  # a sample passes when its reward is above this

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.low <= self.high <= 1:
            raise ConfigError(f"train.prompt_sampler: need 0 <= low <= high <= 1, got low {self.low}, high {self.high}")


@register("difficulty")
class BalancedDifficulty(FilteringSampler):
    """Balanced online difficulty filtering (Bae et al.): keep groups of intermediate pass rate, drawing more prompts
    until the batch is full (extra rollouts counted)."""
    Config = DifficultyConfig

    def keeps(self, rewards: torch.Tensor) -> bool:
        rate = float((rewards > self.config.success_threshold).double().mean())
        return self.config.low <= rate <= self.config.high
