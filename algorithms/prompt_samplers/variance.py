"""Variance-prioritised prompts, as in Curriculum Group Policy Optimization (CGPO, Li et al., CVPR 2026, arXiv
2605.17807).

The paper's rule: a prompt's group reward variance is an online signal of "partially mastered but unstable"; prompts
are sampled in proportion to their recent variance, and with categories a calibration based on proportional fairness
balances the categories. Ours, where the paper's exact formulas were not available to us (docs/prompt_samplers.md):

* the estimate ``v_p`` of a prompt is its last group's reward variance (population), or with ``smoothing`` s < 1 an
  exponential average ``v <- (1 - s) v + s var``; a prompt never drawn takes the mean estimate of the drawn ones (all
  prompts are equal before the first observation: the first draw is uniform);
* probabilities ``(1 - floor) v_p / sum v + floor / N``, so every prompt stays reachable (and a pool whose groups all
  had zero spread is drawn uniformly); ``floor: 0`` is CGPO's pure variance-proportional rule, the limit floor -> 0:
  when fewer prompts have spread than the draw needs (a sparse reward), every prompt with spread is drawn and the
  rest of the draw is uniform over the prompts without (a zero-variance prompt is never preferred to one with spread);
* ``groups`` distinct prompts per step (the pool must hold at least that many);
* with ``category_key`` (a metadata key, e.g. GenEval's ``tag``): category c gets a share
  ``(1 - calibration) n_c / N + calibration V_c / sum V`` of the groups (its size against its summed variance), the
  counts rounded by largest remainder and capped at the category's size, then prompts within it as above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from flowzoo.algorithms.prompt_samplers import register
from flowzoo.algorithms.prompt_samplers.base import GroupOutcome, Pool, PromptDraw, PromptSampler, SamplerConfig
from flowzoo.errors import ConfigError
from flowzoo.streams import PROMPT_CURRICULUM


@dataclass
class VarianceConfig(SamplerConfig):
    smoothing: float = 1.0  # weight of the newest group variance in a prompt's estimate (1: the last group's)
    floor: float = 0.05  # uniform share of the probabilities (every prompt stays reachable)
    category_key: str | None = None  # metadata key of a prompt's category; None: no category calibration
    calibration: float = 0.5  # 0: categories by size; 1: by summed variance

    def __post_init__(self) -> None:
        for name in ("smoothing", "floor", "calibration"):
            value = getattr(self, name)
            low_open = name == "smoothing"
            if not (0 < value <= 1 if low_open else 0 <= value <= 1):
                interval = "(0, 1]" if low_open else "[0, 1]"
                raise ConfigError(f"train.prompt_sampler.{name} must be in {interval}, got {value}")


def largest_remainder(shares: np.ndarray, total: int, caps: np.ndarray) -> np.ndarray:
    """Integer counts summing to ``total`` in proportion to ``shares`` (largest remainder), none above its cap."""
    counts = np.zeros(len(shares), dtype=int)
    left = total
    open_ = caps > 0
    while left > 0:
        s = np.where(open_, shares, 0.0)
        s = s / s.sum() if s.sum() > 0 else open_ / open_.sum()
        ideal = s * left
        add = np.minimum(np.floor(ideal).astype(int), caps - counts)
        remainder = np.where(open_ & (counts + add < caps), ideal - np.floor(ideal), -1.0)
        for i in np.argsort(-remainder, kind="stable")[: left - add.sum()]:
            if remainder[i] >= 0:
                add[i] += 1
        if add.sum() == 0:  # nothing fits: cannot happen while sum(caps) >= total
            break
        counts += add
        left -= int(add.sum())
        open_ = counts < caps
    return counts


@register("variance")
class VariancePrioritised(PromptSampler):
    """CGPO's curriculum: prompts drawn in proportion to their recent group reward variance (with category calibration
    where prompts have categories)."""
    Config = VarianceConfig

    def __init__(self, pool: Pool, groups: int, seed: int, config: VarianceConfig | None = None):
        super().__init__(pool, groups, seed, config)
        self.estimate = np.full(len(self.pool), np.nan)  # NaN: never drawn
        key = self.config.category_key
        labels = [str(m[key]) for _, m in self.pool] if key else ["all"] * len(self.pool)
        self.categories = sorted(set(labels))
        self.category = np.array([self.categories.index(c) for c in labels])

    @classmethod
    def check_pool(cls, pool: Pool, groups: int, config: VarianceConfig) -> None:
        super().check_pool(pool, groups, config)
        if len(pool) < groups:
            raise ConfigError(f"prompt sampler 'variance' draws {groups} distinct prompts per step (train.prompts_per_"
                              f"step) but the training pool holds {len(pool)}; use fewer groups or the uniform sampler")
        key = config.category_key
        if key is not None:
            missing = [p for p, m in pool if key not in m]
            if missing:
                raise ConfigError(f"train.prompt_sampler.category_key {key!r}: {len(missing)} of {len(pool)} training "
                                  f"prompts have no such metadata key (e.g. {missing[0]!r})")

    def probabilities(self, members: np.ndarray) -> np.ndarray:
        """The draw probabilities of the pool indices ``members`` (module docstring)."""
        est = self.estimate[members]
        seen = ~np.isnan(self.estimate)
        fill = float(self.estimate[seen].mean()) if seen.any() else 1.0
        v = np.where(np.isnan(est), fill, est)
        uniform = np.full(len(members), 1.0 / len(members))
        if v.sum() <= 0:
            return uniform
        return (1 - self.config.floor) * v / v.sum() + self.config.floor * uniform

    def choose(self, rng: np.random.Generator, members: np.ndarray, count: int) -> list[int]:
        """``count`` distinct pool indices of ``members`` by their probabilities (module docstring); with fewer than
        ``count`` of non-zero probability (``floor: 0``), all of those and the rest uniformly among the others."""
        p = self.probabilities(members)
        positive = p > 0
        if positive.sum() >= count:
            return rng.choice(members, size=count, replace=False, p=p).tolist()
        rest = rng.choice(members[~positive], size=count - int(positive.sum()), replace=False)
        return rng.permutation([*members[positive].tolist(), *rest.tolist()]).tolist()

    def draw(self, step, iteration, algorithm=None) -> PromptDraw:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, step, PROMPT_CURRICULUM]))
        everyone = np.arange(len(self.pool))
        if len(self.categories) == 1:
            return PromptDraw.of(self.pool, self.choose(rng, everyone, self.groups))
        sizes = np.bincount(self.category, minlength=len(self.categories))
        weights = self.probabilities(everyone)
        summed = np.bincount(self.category, weights=weights, minlength=len(self.categories))
        lam = self.config.calibration
        shares = (1 - lam) * sizes / sizes.sum() + lam * summed / summed.sum()
        counts = largest_remainder(shares, self.groups, sizes)
        chosen = []
        for c, count in enumerate(counts):
            if count:
                members = everyone[self.category == c]
                chosen += self.choose(rng, members, count)
        order = rng.permutation(len(chosen))  # categories interleaved, not in blocks
        return PromptDraw.of(self.pool, [chosen[i] for i in order])

    def observe(self, outcomes: Sequence[GroupOutcome]) -> None:
        s = self.config.smoothing
        for outcome in outcomes:
            if outcome.index is None:
                continue
            var = float(outcome.rewards.double().var(unbiased=False))
            old = self.estimate[outcome.index]
            self.estimate[outcome.index] = var if np.isnan(old) else (1 - s) * old + s * var

    def state_dict(self) -> dict[str, Any]:
        return {"estimate": self.estimate.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        estimate = np.asarray(state["estimate"], dtype=float)
        if estimate.shape != self.estimate.shape:
            raise ConfigError(f"the checkpoint's variance sampler holds {len(estimate)} prompts, the pool "
                              f"{len(self.estimate)}")
        self.estimate = estimate
