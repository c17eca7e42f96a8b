"""The prompt-sampler hook: which prompts an iteration trains on, and what it learns from their outcomes.

An :class:`~algorithms.engine.base.Algorithm` owns one sampler (``Algorithm.use_prompts``). Every training iteration
``Algorithm.train_step(step)`` asks it for a :class:`PromptDraw` (one prompt per group, each with its index in the
training pool), rolls the groups out, and after the update hands it every group's outcome (:class:`GroupOutcome`:
the pool index and the group's rewards). A sampler that *filters* (``filters = True``: DAPO's dynamic sampling,
balanced difficulty filtering) is also asked, after the first rollout is scored, which groups to keep, and for more
prompts (``refill``) until the batch holds enough kept groups or ``max_rounds`` draws were made; the extra rollouts are
counted in the iteration's NFE and sampling time like any other.

Contract:

* draws are a pure function of (seed, step, the sampler's state), so every process of a data-parallel run draws the
  same prompts, and a resumed run repeats an uninterrupted one (``state_dict`` / ``load_state_dict`` hold the state;
  a stateless sampler returns ``{}``);
* ``check_pool`` refuses, at config load and in one line, a pool the sampler cannot serve;
* a sampler never sees the model or the rollout, only prompts and rewards, so any sampler composes with any
  algorithm. One exception is declared, not hidden: the ``replay_buffer`` sampler reads the prompts an algorithm's
  replay buffer can replay (``Algorithm.replayable_prompts``) when the algorithm has one.

Samplers are a registry (``algorithms.prompt_samplers.get``), chosen in a config as ``train.prompt_sampler:
{name: ..., <its arguments>}``; without one the algorithm's default is used (``Algorithm.default_prompt_sampler``:
uniform, or OP-GRPO's buffer prompts when its ``replay_prompts`` is ``buffer``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import numpy as np
import torch

from flowzoo.errors import ConfigError
from flowzoo.streams import PROMPT_ORDER

if TYPE_CHECKING:  # the algorithm is only read (its replayable prompts), never imported at run time
    from flowzoo.algorithms.engine.base import Algorithm

#: a training pool: (prompt, metadata) pairs
Pool = Sequence[tuple[str, dict]]


@dataclass
class PromptDraw:
    """One draw: group i trains on ``prompts[i]`` (pool index ``indices[i]``); ``from_buffer`` holds the positions
    whose prompt came from a replay buffer (OP-GRPO gives those groups replayed samples)."""

    prompts: list[str]
    metadata: list[dict]
    indices: list[int]
    from_buffer: frozenset[int] = frozenset()

    def __len__(self) -> int:
        return len(self.prompts)

    @staticmethod
    def of(pool: Pool, indices: Sequence[int], from_buffer: frozenset[int] = frozenset()) -> "PromptDraw":
        indices = [int(i) for i in indices]
        return PromptDraw([pool[i][0] for i in indices], [dict(pool[i][1]) for i in indices], indices, from_buffer)


@dataclass
class GroupOutcome:
    """What a group of an iteration gave: its prompt's pool index (None for prompts given directly to ``step``) and
    the rewards of its samples (fresh and replayed, as its advantages saw them)."""

    index: int | None
    prompt: str
    rewards: torch.Tensor


@dataclass
class SamplerConfig:
    """Arguments every sampler takes (none yet); a sampler's own ``Config`` subclasses it."""


def uniform_order(pool_size: int, seed: int, step: int, count: int, *tag: int) -> list[int]:
    """Pool indices of step ``step``: a seeded shuffle of enough copies of the pool, cut to ``count`` (every prompt
    once before any twice). The stream is ``SeedSequence([seed, step, PROMPT_ORDER, *tag])``: without ``tag`` it is
    the uniform draw every run made before samplers existed."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, step, PROMPT_ORDER, *tag]))
    copies = math.ceil(count / pool_size)
    return (rng.permutation(pool_size * copies)[:count] % pool_size).tolist()


class PromptSampler:
    """Uniform draws and no state; subclasses override what differs (see the module docstring)."""

    name: ClassVar[str | None] = None  # set by @register (algorithms/prompt_samplers/__init__.py)
    Config: ClassVar[type[SamplerConfig]] = SamplerConfig
    #: whether the template asks ``keeps``/``refill`` after the first rollout (dynamic sampling)
    filters: ClassVar[bool] = False

    def __init__(self, pool: Pool, groups: int, seed: int, config: SamplerConfig | None = None):
        self.check_pool(pool, groups, config or self.Config())
        self.pool = list(pool)
        self.groups = groups
        self.seed = seed
        self.config = config or self.Config()

    @classmethod
    def check_pool(cls, pool: Pool, groups: int, config: SamplerConfig) -> None:
        """Refuse (one-line ConfigError) a pool this sampler cannot serve ``groups`` prompts per iteration from."""
        if not pool:
            raise ConfigError(f"prompt sampler {cls.name!r}: the training prompt pool is empty")

    def draw(self, step: int, iteration: int, algorithm: "Algorithm | None" = None) -> PromptDraw:
        """The prompts of training step ``step`` (the algorithm's ``iteration`` = step - 1 in a run)."""
        return PromptDraw.of(self.pool, uniform_order(len(self.pool), self.seed, step, self.groups))

    def observe(self, outcomes: Sequence[GroupOutcome]) -> None:
        """Every group's outcome of the iteration (all draws of a filtering sampler, kept or not), in group order."""

    # ---- filtering samplers (``filters = True``) -----------------------------------------------------------------
    def keeps(self, rewards: torch.Tensor) -> bool:
        """Whether a group of these rewards is kept for the update."""
        return True

    def refill(self, step: int, iteration: int, round: int) -> PromptDraw | None:
        """Draw ``round`` (1, 2, ...) of step ``step`` when too few groups were kept so far, or None to stop."""
        return None

    # ---- state -----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; a stateless sampler has nothing to restore."""

