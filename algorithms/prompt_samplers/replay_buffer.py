"""OP-GRPO's buffer prompts as a sampler: a share of each step's groups takes a prompt the replay buffer holds.

The rule is OP-GRPO's ``replay_prompts: buffer`` (arXiv 2604.04142 reuses stored high-reward trajectories; which
groups get them is a documented knob of ours, docs/op_grpo.md): the step's uniform draw, whose last
``share_count(share, groups, iteration)`` groups are replaced by distinct stored prompts drawn uniformly (a seeded
permutation of the stored prompts in buffer order); fewer while the buffer holds fewer prompts (warm-up).

Which prompts are stored:

* an algorithm with a replay buffer (OP-GRPO: ``Algorithm.replayable_prompts``) -- the prompts it can replay now, so
  these groups also get replayed samples; the draws are bit-identical to OP-GRPO's before samplers existed;
* any other algorithm -- the sampler's own prompt buffer with OP-GRPO's rules (``algorithms/engine/replay.py``: the best
  sample of each group is offered if it beats its group's mean; one entry per prompt; scores decay each step; the
  weakest is evicted when full), holding rewards only. Flow-GRPO with this sampler is OP-GRPO's choice of prompts
  without any off-policy sample: the control the OP-GRPO study asks for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch

from flowzoo.algorithms.prompt_samplers import register
from flowzoo.algorithms.prompt_samplers.base import GroupOutcome, Pool, PromptDraw, PromptSampler, SamplerConfig, uniform_order
from flowzoo.algorithms.engine.replay import Admission, ReplayBuffer, ReplayEntry, admits
from flowzoo.algorithms.engine.plans import iteration_generator
from flowzoo.errors import ConfigError
from flowzoo.streams import OP_GRPO_GROUP_CHOICE

if TYPE_CHECKING:
    from flowzoo.algorithms.engine.base import Algorithm


def share_count(share: float, groups: int, iteration: int) -> int:
    """How many of an iteration's ``groups`` groups take a buffer prompt: ``floor(s B (i + 1)) - floor(s B i)`` for
    share s at iteration i, i.e. floor(s B) or ceil(s B), and over any run of iterations the total is within one group
    of s B per iteration (deterministic, so a resume is exact)."""
    x = share * groups
    return math.floor(x * (iteration + 1) + 1e-9) - math.floor(x * iteration + 1e-9)


@dataclass
class ReplayPromptsConfig(SamplerConfig):
    # share of each step's groups that take a buffer prompt, in [0, 1); None: the algorithm's off_policy_groups when
    # it replays (OP-GRPO), else 0.5 (the OP-GRPO study's setting)
    share: float | None = None
    # the sampler's own prompt buffer (algorithms without a replay buffer); OP-GRPO's defaults
    capacity: int = 1024
    decay: float = 0.95
    admission: Admission = "above_group_mean"
    min_reward: float | None = None

    def __post_init__(self) -> None:
        if self.share is not None and not 0 <= self.share < 1:
            raise ConfigError(f"train.prompt_sampler.share must be in [0, 1) (the other groups take dataset prompts, "
                              f"which feed the buffer) or null, got {self.share}")
        if self.capacity < 1:
            raise ConfigError(f"train.prompt_sampler.capacity must be >= 1, got {self.capacity}")
        if not 0 < self.decay <= 1:
            raise ConfigError(f"train.prompt_sampler.decay must be in (0, 1], got {self.decay}")
        if self.admission not in ("above_group_mean", "any"):
            raise ConfigError(f"train.prompt_sampler.admission must be one of above_group_mean, any; "
                              f"got {self.admission!r}")


@register("replay_buffer")
class ReplayPrompts(PromptSampler):
    """OP-GRPO's buffer prompts: a share of each step's groups takes a prompt of the replay buffer (the algorithm's,
    else the sampler's own prompt buffer with OP-GRPO's rules)."""
    Config = ReplayPromptsConfig

    def __init__(self, pool: Pool, groups: int, seed: int, config: ReplayPromptsConfig | None = None):
        super().__init__(pool, groups, seed, config)
        cfg = self.config
        self.own = ReplayBuffer(cfg.capacity, cfg.decay, unique=True)
        self.index_of = {}
        for i, (prompt, _) in enumerate(self.pool):
            self.index_of.setdefault(prompt, i)

    def share(self, algorithm: "Algorithm | None") -> float:
        if self.config.share is not None:
            return self.config.share
        replays = algorithm is not None and algorithm.replayable_prompts() is not None
        return float(algorithm.config.off_policy_groups) if replays else 0.5

    def stored(self, algorithm: "Algorithm | None") -> list[tuple[str, dict]]:
        """The prompts a buffer group may take, distinct, in buffer order."""
        replayable = None if algorithm is None else algorithm.replayable_prompts()
        if replayable is not None:
            return replayable
        return [(e.prompt, dict(e.metadata)) for e in self.own.entries]

    def draw(self, step: int, iteration: int, algorithm: "Algorithm | None" = None) -> PromptDraw:
        order = uniform_order(len(self.pool), self.seed, step, self.groups)
        base = PromptDraw.of(self.pool, order)
        stored = self.stored(algorithm)
        count = min(share_count(self.share(algorithm), self.groups, iteration), len(stored))
        if count == 0:
            return base
        gen = iteration_generator(self.seed, iteration, OP_GRPO_GROUP_CHOICE)
        chosen = [stored[j] for j in torch.randperm(len(stored), generator=gen)[:count].tolist()]
        keep = self.groups - count
        return PromptDraw(
            prompts=base.prompts[:keep] + [p for p, _ in chosen],
            metadata=base.metadata[:keep] + [dict(m) for _, m in chosen],
            indices=base.indices[:keep] + [self.index_of.get(p) for p, _ in chosen],
            from_buffer=frozenset(range(keep, self.groups)),
        )

    def observe(self, outcomes: Sequence[GroupOutcome]) -> None:
        """The own buffer's update (OP-GRPO's after_update rules): age every entry, then offer each group's best
        sample through the admission gate."""
        self.own.step()
        for outcome in outcomes:
            best = float(outcome.rewards.max())
            if admits(best, outcome.rewards, self.config.admission, self.config.min_reward):
                metadata = {} if outcome.index is None else dict(self.pool[outcome.index][1])
                self.own.offer(ReplayEntry(prompt=outcome.prompt, metadata=metadata, latents=torch.zeros(0),
                                           log_probs=torch.zeros(0), reward=best, version=0))

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.own.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.own.load_state_dict(state["buffer"])
