"""Which prompts an iteration trains on: the prompt-sampler side of ``Algorithm`` (its base class
:class:`PromptIteration`). ``use_prompts(pool, groups, sampler)`` gives the algorithm its training pool and sampler
(``algorithms/prompt_samplers``), ``train_step(step)`` draws the step's prompts and trains on them; a filtering
sampler's extra rounds of prompts fill the batch (``_filled_batch``), and every group's outcome goes back to the
sampler."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from flowzoo.algorithms import prompt_samplers
from flowzoo.algorithms.engine.distributed import GatheredBatch
from flowzoo.algorithms.engine.trajectory import Trajectory
from flowzoo.algorithms.prompt_samplers import GroupOutcome, PromptDraw, PromptSampler

if TYPE_CHECKING:
    from flowzoo.algorithms.engine.config import AlgorithmConfig
    from flowzoo.algorithms.engine.stats import StepStats


class PromptIteration:
    """The prompt iteration of ``Algorithm`` (its base class). Uses the algorithm's ``config``, ``seed``,
    ``iteration``, ``dist``, ``collect``, ``score``, ``log`` and ``step``."""

    #: the prompt sampler of ``train_step`` (``use_prompts``); None until a training pool is given
    prompt_sampler: PromptSampler | None = None
    #: the draw the current iteration trains on (``train_step``), or None for prompts given to ``step`` directly
    current_draw: PromptDraw | None = None
    #: added to the group ids and noise keys of fresh rollouts: 0, or a filtering sampler's extra round's base
    group_base: int = 0

    @classmethod
    def default_prompt_sampler(cls, config: AlgorithmConfig) -> dict[str, Any]:
        """The sampler a config without ``train.prompt_sampler`` gets: uniform."""
        return {"name": "uniform"}

    @classmethod
    def check_prompt_sampler(cls, config: AlgorithmConfig, spec: dict[str, Any]) -> None:
        """Refuse (one-line ConfigError) a sampler this algorithm cannot train with; every sampler is fine here."""

    def replayable_prompts(self) -> list[tuple[str, dict]] | None:
        """The (prompt, metadata) pairs the algorithm's replay buffer can replay now, distinct, in buffer order; None
        for an algorithm without a replay buffer (the ``replay_buffer`` sampler then keeps its own)."""
        return None

    def use_prompts(self, pool: Sequence[tuple[str, dict]], groups: int,
                    sampler: str | dict[str, Any] | None = None) -> None:
        """Train on ``pool`` with ``groups`` prompts per iteration, drawn by ``sampler`` (a name or ``{name: ...,
        <arguments>}``; None: ``default_prompt_sampler``)."""
        spec = prompt_samplers.spec_of(sampler) or self.default_prompt_sampler(self.config)
        self.check_prompt_sampler(self.config, spec)
        self.prompt_sampler = prompt_samplers.build(spec, pool, groups, self.seed)

    def train_step(self, step: int) -> StepStats:
        """Training step ``step`` (from 1) on the prompts the sampler draws for it."""
        if self.prompt_sampler is None:
            raise RuntimeError("Algorithm.train_step needs a training pool: call use_prompts(pool, groups) first")
        draw = self.prompt_sampler.draw(step, self.iteration, self)
        return self.step(draw.prompts, draw.metadata, draw=draw, at_step=step)

    def _filled_batch(self, traj: Trajectory, batch: GatheredBatch, draw: PromptDraw, at_step: int,
                      outcomes: list[GroupOutcome]) -> tuple[Trajectory, GatheredBatch]:
        """A filtering sampler's batch: the first rollout's kept groups, then fresh rounds of prompts until
        ``len(draw)`` groups are kept or the sampler stops; completed with unkept groups in draw order when short.
        Round r's groups have ids (and noise keys) from ``r * G * B`` on, and sample no replayed trajectories."""
        sampler, groups = self.prompt_sampler, len(draw)
        parts, kept, unkept = [traj], [], []
        for outcome_gid, outcome in outcomes:
            (kept if sampler.keeps(outcome.rewards) else unkept).append(outcome_gid)
        rounds = 1
        while len(kept) < groups:
            more = sampler.refill(at_step, self.iteration, rounds)
            if more is None:
                break
            self.group_base = rounds * self.config.group_size * groups
            self.current_draw = more
            try:
                part = self.collect(more.prompts, more.metadata)
            finally:
                self.group_base, self.current_draw = 0, draw
            if part.rewards is None:
                self.score(part)
            part_batch = self.dist.gather_batch(part)
            for gid, outcome in self._outcomes(part_batch, more, rounds * self.config.group_size * groups):
                outcomes.append((gid, outcome))
                (kept if sampler.keeps(outcome.rewards) else unkept).append(gid)
            parts.append(part)
            rounds += 1
        chosen = (kept + unkept)[:groups]
        self.log("sampler_rounds", rounds)
        self.log("sampler_kept_frac", len(kept) / max(len(outcomes), 1))
        if rounds == 1 and not unkept:
            return traj, batch
        whole = Trajectory.cat(parts) if len(parts) > 1 else traj
        rows = torch.isin(whole.group, torch.tensor(chosen, device=whole.group.device)).nonzero().flatten()
        whole = whole.select(rows)
        return whole, self.dist.gather_batch(whole)

    @staticmethod
    def _outcomes(batch: GatheredBatch, draw: PromptDraw | None, base: int = 0) -> list[tuple[int, GroupOutcome]]:
        """(group id, outcome) of every group of the global ``batch`` whose id ``base + i`` is position i of
        ``draw`` (none for prompts given directly), in group order."""
        if draw is None:
            return []
        rewards, group = batch.rewards.detach().cpu(), batch.group.cpu()  # the sampler's bookkeeping: once, on the host
        found = []
        for gid in group.unique().tolist():
            i = gid - base
            if 0 <= i < len(draw):
                found.append((gid, GroupOutcome(draw.indices[i], draw.prompts[i], rewards[group == gid])))
        return found
