"""OP-GRPO: off-policy GRPO for flow-matching models (Zhang et al., "OP-GRPO: Efficient Off-Policy GRPO for
Flow-Matching Models", arXiv 2604.04142).

On top of Flow-GRPO's template (``algorithms/engine/base.py``) this overrides two hooks:

* ``collect`` -- **hybrid rollout** (the paper's replay buffer): some groups get ``G - k`` fresh samples and ``k``
  samples built from stored trajectories. Which groups (``replay_prompts``): ``batch`` (the papers' wording: prompts
  come from the dataset) -- a fraction ``off_policy_groups`` of the batch's groups whose prompt has buffer entries;
  ``buffer`` -- a share ``off_policy_groups`` of the batch's groups takes its prompt from the buffer's prompts instead
  of the dataset (the ``replay_buffer`` prompt sampler draws them: ``algorithms/prompt_samplers``), so the off-policy
  proportion ``off_policy_groups * k / G`` is reached whatever the size of the prompt list (in ``batch`` mode a group
  is eligible only if its prompt is both drawn and stored: ~4% of groups on a 25k-prompt list with 1024 entries).
  A stored trajectory is reused for its first ``t_off`` transitions (its recorded latents 0..t_off are kept
  bit-identical); **truncation** (the paper's trajectory truncation): the current policy regenerates transitions
  ``t_off .. T-1`` from the stored latent at ``t_off`` and the new final sample is rewarded afresh, so it enters the
  group's advantages.
  For the reused transitions pi_old (the parameters at this rollout) is recomputed without gradient, and
  **sequence-level correction** (the paper's importance sampling correction) sets the sample's log-weight
  ``log w = sum over reused SDE steps of (log p_old(z_{t+1}|z_t) - log p_off(z_{t+1}|z_t))``
  (``losses.sequence_log_weight``); the PPO ratio of every trained step stays pi_theta / pi_old, and the base
  ``update`` multiplies the sample's loss by ``w`` (a constant: no gradient). Regenerated steps are on-policy and add
  0 to log w; fresh samples have w = 1.
* ``after_update`` -- offers each group's best *fresh* trajectory to the buffer (after ageing the stored scores by
  one step) if it passes the admission gate (``buffer_admission``, ``buffer_min_reward``; ``replay.admits``), and
  logs the batch and buffer diagnostics (``self.log``; ``collect`` logs the importance-weight ones).

Correction modes (``correction``): ``sequence`` (the paper), ``none`` (w = 1: the "no correction" ablation),
``naive`` (the per-step ratio pi_theta / pi_off: the stored pi_off log-probs are the PPO "old" log-probs of the
reused steps, no sequence weight; pi_old is then not recomputed, which saves its NFE).

Several processes (``algorithms/engine/distributed.py``): the buffer is **replicated**, identical on every rank. The group
choice and the entries come from the buffer and a (seed, iteration) stream, so every rank makes the same choice; the
global batch is laid out as in one process (fresh parts by replay count, then the replayed samples) and each rank
rolls out its contiguous slice of it, so replayed samples are assigned to ranks by their index in that layout. After
the update each rank proposes the best fresh trajectory of each group it holds; the proposals are all-gathered and
every rank offers the same winners, in group order, to its copy of the buffer. Weight normalisation and diagnostics
use the global batch.

Cost: a hybrid batch is sampled as one batch (``_hybrid_rollout``): the fresh samples alone over steps 0..t_off-1,
then fresh and replayed samples together from t_off (each sample's noise is its own generator's, so the samples are
those of separate rollouts); pi_old of all reused transitions is one batched evaluation (``_recompute_old``). A
replayed sample thus costs T model evaluations inside the same batched calls as a fresh one, not calls of its own.

Sample dropping: a replayed sample whose log-weight, or whose "old" log-prob of a reused step, is not finite is
removed from the batch before advantages are computed, and counted (``replay_dropped``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import torch

from flowzoo.algorithms import register, register_preset
from flowzoo.algorithms.engine.base import CLIP_FRAC_OFF, CLIP_FRAC_ON, Algorithm, AlgorithmConfig
from flowzoo.algorithms.engine.distributed import GatheredBatch
from flowzoo.algorithms.engine.losses import sequence_log_weight
from flowzoo.algorithms.engine.replay import Admission, ReplayBuffer, ReplayEntry, admits
from flowzoo.algorithms.engine.plans import iteration_generator
from flowzoo.algorithms.engine.rollout import chunk_spans, rollout, sample_generators
from flowzoo.algorithms.engine.trajectory import RolloutInputs, StepPlan, Trajectory
from flowzoo.errors import ConfigError
from flowzoo.source_images import condition_key
from flowzoo.streams import OP_GRPO_GROUP_CHOICE, OP_GRPO_REGENERATION


@dataclass
class OPGRPOConfig(AlgorithmConfig):
    """OP-GRPO's knobs on top of the GRPO core. Defaults the papers leave open are ours (docs/op_grpo.md)."""

    buffer_capacity: int = 1024  # entries; with unique=True at most one per prompt
    buffer_decay: float = 0.95  # multiplicative decay of stored scores per training step; 1.0 = no decay
    buffer_unique: bool = True  # at most one entry per prompt (False: the uniqueness ablation)
    # "batch": replay in groups whose dataset prompt has entries; "buffer": a share of the groups takes a buffer prompt
    replay_prompts: Literal["batch", "buffer"] = "batch"
    # batch mode: fraction of the groups whose prompt has entries that get buffer samples;
    # buffer mode: share of all the batch's groups whose prompt is drawn from the buffer (< 1)
    off_policy_groups: float = 1.0
    replay_k: int = 1  # buffer samples per such group (G - k fresh); repeated copies only when truncating
    t_off: int | None = 5  # transitions 0..t_off-1 are reused, the rest regenerated; None = reuse all (no truncation)
    buffer_admission: Admission = "above_group_mean"  # a group's best fresh sample is offered only if above its mean
    buffer_min_reward: float | None = None  # and (if set) only if its reward >= this
    correction: Literal["sequence", "none", "naive"] = "sequence"
    weight_cap: float | None = None  # cap w <= weight_cap (truncated IS); None = off
    weight_self_normalize: bool = False  # rescale the off-policy weights of a batch to mean 1 (after the cap)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.buffer_capacity < 1:
            raise ConfigError(f"algorithm.buffer_capacity must be >= 1, got {self.buffer_capacity}")
        if not 0 < self.buffer_decay <= 1:
            raise ConfigError(f"algorithm.buffer_decay must be in (0, 1], got {self.buffer_decay}")
        if not 0 <= self.off_policy_groups <= 1:
            raise ConfigError(f"algorithm.off_policy_groups must be in [0, 1], got {self.off_policy_groups}")
        if self.replay_prompts == "buffer" and self.off_policy_groups >= 1:
            raise ConfigError(
                "algorithm.off_policy_groups must be in [0, 1) with replay_prompts: buffer (the other groups take "
                f"dataset prompts, which feed the buffer), got {self.off_policy_groups}"
            )
        if not 0 <= self.replay_k < self.group_size:
            raise ConfigError(
                f"algorithm.replay_k must be in [0, group_size - 1] = [0, {self.group_size - 1}], got {self.replay_k}"
            )
        if self.weight_cap is not None and self.weight_cap <= 0:
            raise ConfigError(f"algorithm.weight_cap must be > 0 or null, got {self.weight_cap}")

    def inert_keys(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """With no group replaying (``off_policy_groups`` or ``replay_k`` 0) the replay's knobs are inert: no buffer
        sample enters a batch, so how many, how far reused and how weighted cannot change the run."""
        inert = super().inert_keys()
        for switch in ("off_policy_groups", "replay_k"):
            if getattr(self, switch) == 0:
                why = f"{switch} is 0: no group replays a buffer sample"
                others = ("off_policy_groups", "replay_k", "t_off", "weight_cap", "weight_self_normalize")
                for name in others:
                    if name != switch:
                        inert.setdefault(name, (why, (switch,)))
        return inert

    def check_num_steps(self, num_steps: int) -> None:
        """``t_off`` counts transitions of a T-step rollout: 0 <= t_off <= T (T: no truncation, as null)."""
        if self.t_off is not None and not 0 <= self.t_off <= num_steps:
            raise ConfigError(f"algorithm.t_off must be in [0, T] = [0, {num_steps}] (T = the rollout's sampling "
                              f"steps) or null, got {self.t_off}")


@register("op_grpo")
class OPGRPO(Algorithm):
    """OP-GRPO (see the module docstring)."""

    label, colormap = "OP-GRPO", "Purples"  # the report's name and colours of this family
    Config = OPGRPOConfig
    rollout_graph_auto = False  # a hybrid batch is sampled in two phases (_hybrid_rollout) that keep no graphs
    diagnostics = {
        CLIP_FRAC_ON: "PPO clip fraction of the on-policy (fresh) samples' trained steps",
        CLIP_FRAC_OFF: "PPO clip fraction of the replayed samples' trained steps (paper: 11.8% corrected, >40% naive)",
        "abs_log_ratio_t{k}": "mean abs(log pi_old - log pi_off) of reused SDE step k over the replayed samples",
    }

    def __init__(self, model, reward, config=None, seed: int = 0, dist=None):
        super().__init__(model, reward, config, seed, dist=dist)
        cfg = self.config
        if cfg.t_off == self.num_steps:  # "reuse all T transitions": one spelling inside, null (no truncation)
            cfg.t_off = None
        self.buffer = ReplayBuffer(cfg.buffer_capacity, cfg.buffer_decay, cfg.buffer_unique)
        self.dropped_total = 0

    # ---- helpers --------------------------------------------------------------------------------------------
    @property
    def t_off(self) -> int:
        """Number of reused transitions (= index of the first regenerated one); T when not truncating."""
        t = self.config.t_off
        return self.num_steps if t is None else int(t)

    @property
    def truncating(self) -> bool:
        return self.t_off < self.num_steps

    def _compatible(self, entry: ReplayEntry, plan: StepPlan) -> bool:
        """Whether an entry was sampled on the current plan's grid and kernel, under the same CFG guidance and
        log-prob reduction (its stored pi_off and the recomputed pi_old must be the same quantity, or log w mixes
        definitions: e.g. a resume with another guidance or reduction), with the states a reuse up to t_off needs
        (else it cannot be replayed). Guidance None is the model's default, for the entry as for the config."""
        scale = lambda g: float(self.model.default_guidance if g is None else g)  # noqa: E731
        same_density = (entry.plan is not None and entry.plan.reduction == plan.reduction
                        and scale(entry.guidance) == scale(self.config.guidance))
        return same_density and entry.plan.same_grid(plan) and entry.latents.shape[0] >= self.t_off + 1

    def _entries_for(self, prompt: str, metadata: dict, plan: StepPlan) -> list[ReplayEntry]:
        """The entries a group of ``prompt`` replays (with its source image, for an edit prompt: its condition key):
        up to k distinct compatible ones, repeated up to k when truncating (the copies get different regenerated
        tails)."""
        k = self.config.replay_k
        entries = [e for e in self.buffer.lookup(condition_key(prompt, metadata), k) if self._compatible(e, plan)]
        if entries and self.truncating:
            entries = [entries[j % len(entries)] for j in range(k)]
        return entries

    def clip_subsets(self, traj: Trajectory) -> dict[str, torch.Tensor]:
        """The on- and off-policy samples' PPO clip fractions, apart (the paper's 11.8% vs > 40% is about the
        off-policy ones); logged for the iterations whose batch holds replayed samples."""
        return {CLIP_FRAC_OFF: traj.off_policy, CLIP_FRAC_ON: ~traj.off_policy}

    # ---- prompts: buffer mode is the replay_buffer sampler ---------------------------------------------------
    @classmethod
    def default_prompt_sampler(cls, config: OPGRPOConfig) -> dict[str, Any]:
        """``replay_prompts: buffer``: the ``replay_buffer`` sampler (its share: ``off_policy_groups``)."""
        return {"name": "replay_buffer"} if config.replay_prompts == "buffer" else {"name": "uniform"}

    @classmethod
    def check_prompt_sampler(cls, config: OPGRPOConfig, spec: dict[str, Any]) -> None:
        if config.replay_prompts == "buffer" and spec["name"] != "replay_buffer":
            raise ConfigError(f"algorithm.replay_prompts: buffer takes its buffer groups' prompts from the "
                              f"replay_buffer prompt sampler, but train.prompt_sampler is {spec['name']!r}; drop "
                              f"train.prompt_sampler or use replay_prompts: batch")

    def replayable_prompts(self) -> list[tuple[str, dict]]:
        """The prompts with an entry compatible with the current plan, each once, in buffer order (none when
        ``replay_k`` or ``off_policy_groups`` is 0: nothing would be replayed)."""
        if self.config.replay_k == 0 or self.config.off_policy_groups == 0:
            return []
        plan = self._cpu_plan()
        stored: dict[str, ReplayEntry] = {}
        for e in self.buffer.entries:
            if e.key not in stored and self._compatible(e, plan):
                stored[e.key] = e
        return [(e.prompt, dict(e.metadata)) for e in stored.values()]

    def _cpu_plan(self) -> StepPlan:
        plan = self.make_plan(1)  # with the shared settings (the log-prob reduction) the stored entries carry
        return dataclasses.replace(plan, sigmas=plan.sigmas.cpu(), sde=plan.sde.cpu(), train=plan.train.cpu())

    def _choose_groups(
        self, prompts: list[str], metadata: list[dict]
    ) -> tuple[list[str], list[dict], dict[int, list[ReplayEntry]]]:
        """The batch's prompts and metadata, and which groups get buffer samples with which entries: in buffer
        mode the groups whose prompt the sampler took from the buffer (``current_draw.from_buffer``); in batch mode
        a share of the groups whose prompt has entries. Every draw comes from a stream of (seed, iteration) and the
        buffer, which is identical on every process. A filtering sampler's extra rounds replay nothing."""
        cfg = self.config
        if cfg.replay_k == 0 or cfg.off_policy_groups == 0 or len(self.buffer) == 0 or self.group_base:
            return prompts, metadata, {}
        plan = self._cpu_plan()
        if cfg.replay_prompts == "buffer":
            chosen = sorted(self.current_draw.from_buffer) if self.current_draw is not None else []
            return prompts, metadata, {i: self._entries_for(prompts[i], metadata[i], plan) for i in chosen}
        gen = iteration_generator(self.seed, self.iteration, OP_GRPO_GROUP_CHOICE)
        eligible: dict[int, list[ReplayEntry]] = {}
        for i, p in enumerate(prompts):
            entries = self._entries_for(p, metadata[i], plan)
            if entries:
                eligible[i] = entries
        if not eligible:
            return prompts, metadata, {}
        u = float(torch.rand((), generator=gen))
        count = min(len(eligible), int(math.floor(cfg.off_policy_groups * len(eligible) + u)))
        order = torch.randperm(len(eligible), generator=gen)[:count].sort().values.tolist()
        keys = sorted(eligible)
        return prompts, metadata, {keys[j]: eligible[keys[j]] for j in order}

    @torch.no_grad()
    def _recompute_old(self, traj: Trajectory, reused: torch.Tensor, first: int) -> torch.Tensor:
        """log pi_old [n, T] of the recorded transitions of rows ``first .. first + n - 1`` of ``traj`` marked
        ``reused`` [n, T], under the current parameters (0 elsewhere). They are scored together in chunks of at most
        as many transitions as the rollout's calls hold (:meth:`recompute_chunk`, so the peak memory stays the
        rollout's), not one model call per step."""
        old = traj.log_probs.new_zeros(reused.shape)
        rows, steps = reused.nonzero(as_tuple=True)  # sample by sample, step by step
        size = self.recompute_chunk(len(traj))
        for lo in range(0, len(rows), size):
            r, t = rows[lo: lo + size], steps[lo: lo + size]
            old[r, t] = self.score_transition(traj, first + r, t).log_prob
        return old

    def recompute_chunk(self, rows: int) -> int:
        """Transitions per call of ``_recompute_old`` on a batch of ``rows`` samples: as many as a rollout call of
        that batch holds (``rows``, at most the rollout chunk)."""
        chunk = self.rollout_chunk()
        return max(1, rows if chunk is None else min(rows, chunk))

    def _uneven_calls(self, n_fresh: int, n_replayed: int) -> int:
        """The transformer calls of ``_hybrid_rollout`` and ``_recompute_old`` that depend on this process's rows:
        one per step before t_off for the fresh rows' head, and the chunks of the replayed rows' recomputed pi_old."""
        head = self.t_off * len(chunk_spans(n_fresh, self.rollout_chunk())) if n_fresh and self.t_off > 0 else 0
        if not n_replayed or self.config.correction == "naive":
            return head
        reused_steps = int(self.step_plan(1).sde[: self.t_off].sum())
        return head + -(-n_replayed * reused_steps // self.recompute_chunk(n_fresh + n_replayed))

    def _replay_inputs(self, groups: dict[int, list[ReplayEntry]], prompts, metadata, rows: range
                       ) -> tuple[RolloutInputs, torch.Tensor, torch.Tensor]:
        """The buffer samples ``rows`` (of all the chosen groups' samples) as rollout inputs whose ``x`` is the stored
        latent at ``t_off`` (the regeneration's start), with their stored latents 0..t_off and pi_off [n, T]."""
        order = [(i, e) for i, entries in groups.items() for e in entries]
        gens = sample_generators(self.seed, self.iteration, OP_GRPO_REGENERATION, count=len(order))
        gens = gens[rows.start: rows.stop]
        order = order[rows.start: rows.stop]
        n, t_off, device = len(order), self.t_off, self.model.device
        rep_prompts = [prompts[i] for i, _ in order]
        rep_meta = [metadata[i] for i, _ in order]
        # the buffer's host copies go onto the device once, here (as the latents the rollout continues from)
        stored = torch.stack([e.latents[: t_off + 1] for _, e in order]).to(device)
        pi_off = torch.stack([e.log_probs for _, e in order]).to(device=device, dtype=torch.float32)
        inputs = RolloutInputs(rep_prompts, rep_meta, self.model.encode(rep_prompts, rep_meta), stored[:, t_off], gens,
                               self.make_plan(n), torch.tensor([i for i, _ in order]))
        return inputs, stored, pi_off

    def _hybrid_rollout(self, fresh: RolloutInputs | None, replay: RolloutInputs | None, stored: torch.Tensor | None
                        ) -> Trajectory:
        """Fresh samples and replayed ones (stored latents 0..t_off, regenerated from t_off) sampled as one batch:
        the fresh rows alone over steps 0..t_off-1, then every row together, so a replayed sample costs its
        regenerated steps' model calls in the same batched passes as the fresh ones (not a rollout of its own).
        Each row's noise is its own generator's, so the samples are those of separate rollouts."""
        guidance, t_off = self.config.guidance, self.t_off
        rollout_args = dict(cfg_grad=self.config.cfg_grad, cfg_batch=self.config.cfg_batch, chunk=self.rollout_chunk())
        head = None
        if fresh is not None and t_off > 0:
            head = rollout(self.model, fresh.cond, fresh.plan, fresh.x, fresh.generators, guidance, stop_step=t_off,
                           **rollout_args)
            fresh = fresh._replace(x=head[0][:, t_off])
        everyone = RolloutInputs.cat([p for p in (fresh, replay) if p is not None])
        latents, log_probs = rollout(self.model, everyone.cond, everyone.plan, everyone.x, everyone.generators,
                                     guidance, start_step=t_off, **rollout_args)
        n_fresh = 0 if fresh is None else len(fresh.prompts)
        if head is not None:
            latents[:n_fresh, :t_off] = head[0][:, :t_off]
            log_probs[:n_fresh, :t_off] = head[1][:, :t_off]
        if replay is not None:
            latents[n_fresh:, : t_off + 1] = stored
        off_policy = torch.arange(len(everyone.prompts)) >= n_fresh
        return Trajectory.from_rollout(everyone.plan, everyone.prompts, everyone.metadata, everyone.cond, latents,
                                       log_probs, everyone.group, guidance, off_policy=off_policy)

    def _weigh_replayed(self, traj: Trajectory, pi_off: torch.Tensor, n_fresh: int
                        ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """For the replayed rows ``n_fresh:`` of ``traj``: sets their reused steps' "old" log-probs (pi_old, or pi_off
        under the naive correction) and returns their log w, with the per-step sums and counts of
        |log pi_old - log pi_off| over their finite samples."""
        cfg = self.config
        device = self.model.device
        n = pi_off.shape[0]
        log_probs = traj.log_probs[n_fresh:]
        steps = torch.arange(traj.num_steps, device=traj.sde.device)
        reused = (traj.sde & (steps < self.t_off)).unsqueeze(0).expand(n, -1).to(device)
        log_w = traj.log_weight.new_zeros(n)
        abs_log_ratio = (torch.zeros(traj.num_steps), torch.zeros(traj.num_steps))  # logged (host), see below
        if cfg.correction == "naive":
            traj.log_probs[n_fresh:] = torch.where(reused, pi_off, log_probs)
        else:
            pi_old = self._recompute_old(traj, reused, n_fresh)
            traj.log_probs[n_fresh:] = torch.where(reused, pi_old, log_probs)
            # only reused steps may enter w (a non-finite value elsewhere must not poison it through 0 * inf)
            zero = pi_old.new_zeros(())
            old_r, off_r = torch.where(reused, pi_old, zero), torch.where(reused, pi_off, zero)
            if cfg.correction == "sequence":
                log_w = sequence_log_weight(old_r, off_r, reused).float()
            ok = torch.isfinite(old_r - off_r).all(dim=1, keepdim=True) & reused  # diagnostics over finite samples
            # per-step sums and counts, for logging only (moved to the host once, here); collect() reduces them over
            # processes into the mean |log ratio|
            abs_log_ratio = (torch.where(ok, (old_r - off_r).abs(), zero).sum(0).cpu(), ok.sum(0).float().cpu())
        return log_w, abs_log_ratio

    def _log_abs_log_ratio(self, total: torch.Tensor, count: torch.Tensor) -> None:
        """Mean |log pi_old - log pi_off| per reused SDE step over the (global) finite replayed samples, from this
        process's per-step sums and counts."""
        if self.config.correction == "naive":
            return
        total, count = self.dist.sum(total), self.dist.sum(count)
        diff = total / count.clamp(min=1)
        sde = self.step_plan(1).sde
        for t in range(self.t_off):
            if sde[t]:
                self.log(f"abs_log_ratio_t{t}", float(diff[t]))

    def _transform_weights(self, log_w: torch.Tensor) -> torch.Tensor:
        """Cap, then (optionally) self-normalise over the replayed samples of the global batch."""
        cfg = self.config
        if cfg.weight_cap is not None:
            log_w = log_w.clamp(max=math.log(cfg.weight_cap))
        if cfg.weight_self_normalize:
            everyone = self.dist.cat(log_w)
            if len(everyone) > 0:
                log_w = log_w - (torch.logsumexp(everyone, 0) - math.log(len(everyone)))
        return log_w

    # ---- hooks ----------------------------------------------------------------------------------------------
    def collect(self, prompts: Sequence[str], metadata: Sequence[dict]) -> Trajectory:
        prompts, metadata, groups = self._choose_groups(list(prompts), list(metadata))
        dropped = 0
        if groups:
            traj, dropped = self._hybrid_batch(prompts, metadata, groups)
        else:
            traj = self.fresh_rollout(prompts, metadata)
        self.log("replay_dropped", dropped)
        self.dropped_total += dropped
        return traj

    def _hybrid_batch(self, prompts: list[str], metadata: list[dict], groups: dict[int, list[ReplayEntry]]
                      ) -> tuple[Trajectory, int]:
        """This process's slice of the batch with replayed samples in ``groups``, and the number of replayed
        samples dropped (over all processes) for non-finite weights; logs the importance-weight diagnostics."""
        g = self.config.group_size
        parts = []
        plain = [i for i in range(len(prompts)) if i not in groups]
        by_count: dict[int, list[int]] = {0: plain} if plain else {}
        for i, entries in groups.items():
            by_count.setdefault(len(entries), []).append(i)
        # the global layout: one fresh part per replay count, then the replayed samples; this process's slice of each
        num_replayed = sum(len(entries) for entries in groups.values())
        spans = self.dist.shard_parts([len(idx) * (g - count) for count, idx in sorted(by_count.items())]
                                      + [num_replayed])
        for (count, idx), span in zip(sorted(by_count.items()), spans):
            if len(span) == 0:
                continue
            part = self.fresh_inputs([prompts[i] for i in idx], [metadata[i] for i in idx],
                                     group_offset=count * len(prompts), group_size=g - count, rows=span)
            parts.append(part._replace(group=torch.tensor(idx).repeat_interleave(g - count)[span.start: span.stop]))
        fresh = RolloutInputs.cat(parts) if parts else None
        n_fresh = 0 if fresh is None else len(fresh.prompts)
        replay = stored = pi_off = None
        if len(spans[-1]):
            replay, stored, pi_off = self._replay_inputs(groups, prompts, metadata, spans[-1])
        # the calls only some processes make, the fresh rows' head rollout (steps before t_off) and the recomputed
        # pi_old of the replayed rows: a process that makes fewer pads with as many no-grad calls, counted here,
        # before any of them (algorithms/engine/lockstep.py)
        padding = self.lockstep_padding(self._uneven_calls(n_fresh, 0 if replay is None else len(replay.prompts)))
        traj = self._hybrid_rollout(fresh, replay, stored)
        abs_log_ratio = (torch.zeros(self.num_steps), torch.zeros(self.num_steps))
        if replay is not None:
            traj.log_weight[n_fresh:], abs_log_ratio = self._weigh_replayed(traj, pi_off, n_fresh)
        self.padding_forwards(padding, traj)
        self._log_abs_log_ratio(*abs_log_ratio)
        versions = [e.version for entries in groups.values() for e in entries]
        self.log("versions_age", self.iteration - sum(versions) / len(versions))
        # drop replayed samples whose weight or reused "old" log-probs are not finite
        replayed_log_w = traj.log_weight[n_fresh:]
        finite = torch.isfinite(replayed_log_w) & torch.isfinite(traj.log_probs[n_fresh:]).all(dim=1)
        local_raw = replayed_log_w[finite]
        dropped = self.dist.sum(int((~finite).sum()))
        raw = self.dist.cat(local_raw)
        if len(raw):
            stats = {"mean": raw.mean(), "std": raw.std(unbiased=False), "min": raw.min(), "max": raw.max()}
            for name, value in stats.items():
                self.log(f"log_weight_{name}", float(value))
            lw = raw.double()  # normalised effective sample size (sum w)^2 / (n sum w^2), in log space
            self.log("weight_ess", float(torch.exp(2 * torch.logsumexp(lw, 0) - torch.logsumexp(2 * lw, 0)) / len(lw)))
        if not finite.all():
            kept = n_fresh + finite.nonzero().flatten()
            traj = traj.select(torch.cat([torch.arange(n_fresh, device=kept.device), kept]))
        traj.log_weight[n_fresh:] = self._transform_weights(traj.log_weight[n_fresh:])
        return traj, dropped

    def after_update(self, traj: Trajectory, batch: GatheredBatch) -> None:
        cfg = self.config
        before = dict(self.buffer.counts)
        self.buffer.step()
        gated = 0
        rewards = batch.rewards.detach().to("cpu")  # the admission's and the logs' one read of the batch's rewards
        for gid, entry in self._best_fresh(traj):
            if admits(entry.reward, rewards[batch.group == gid], cfg.buffer_admission, cfg.buffer_min_reward):
                self.buffer.offer(entry)
            else:
                gated += 1
        self.log("off_policy_frac", float(batch.off_policy.float().mean()))  # the realised fraction
        self.log("replay_groups", batch.group[batch.off_policy].unique().numel())
        self.log("buffer_gated", gated)
        if batch.off_policy.any():
            self.log("reward_off", float(rewards[batch.off_policy].mean()))
            self.log("reward_on", float(rewards[~batch.off_policy].mean()))
        self.log("replay_dropped_total", self.dropped_total)
        self.log("buffer_size", len(self.buffer))
        self.log("buffer_bytes", self.buffer.nbytes())
        self.log("buffer_mean_age", self.buffer.mean_age())
        self.log("buffer_mean_score", self.buffer.mean_score())
        for key in ("inserted", "replaced"):
            self.log(f"buffer_{key}", self.buffer.counts[key] - before[key])

    def _best_fresh(self, traj: Trajectory) -> list[tuple[int, ReplayEntry]]:
        """(group, its highest-reward fresh trajectory) for each group, in group order, over all processes (the first
        of equal rewards in batch order wins, and a NaN reward wins, as torch's argmax in one process)."""
        candidates = [c for part in self.dist.all_gather_object(self._local_best_fresh(traj)) for c in part]
        best: dict[int, ReplayEntry] = {}
        for gid, entry in candidates:
            held = best.get(gid)
            beats = math.isnan(entry.reward) or (held is not None and entry.reward > held.reward)
            if held is None or (not math.isnan(held.reward) and beats):
                best[gid] = entry
        return [(gid, best[gid]) for gid in sorted(best)]

    def _local_best_fresh(self, traj: Trajectory) -> list[tuple[int, ReplayEntry]]:
        keep = self.t_off + 1
        fresh = ~traj.off_policy
        # the rewards read once, the winners' latents and log-probs copied to the host in one copy each (the buffer
        # keeps host copies: accelerator memory stays the batch's; _replay_inputs moves them back)
        rewards = traj.rewards.detach().to("cpu")
        chosen = []
        for gid in traj.group[fresh].unique().tolist():
            rows = (fresh & (traj.group == gid)).nonzero().flatten()
            chosen.append((gid, int(rows[rewards[rows].argmax()])))
        if not chosen:
            return []
        index = torch.tensor([best for _, best in chosen], dtype=torch.long)
        latents = traj.latents[index.to(traj.latents.device), :keep].detach().to("cpu", copy=True)
        log_probs = traj.log_probs[index.to(traj.log_probs.device)].detach().to("cpu", copy=True)
        found = []
        for i, (gid, best) in enumerate(chosen):
            found.append((gid, ReplayEntry(
                prompt=traj.prompts[best],
                metadata=dict(traj.metadata[best]),
                latents=latents[i].clone(),
                log_probs=log_probs[i].clone(),
                reward=float(rewards[best]),
                version=self.iteration,
                plan=dataclasses.replace(traj.plan, sigmas=traj.sigmas.detach().to("cpu", copy=True),
                                         sde=traj.sde.detach().to("cpu", copy=True),
                                         train=traj.train[best: best + 1].detach().to("cpu", copy=True)),
                guidance=traj.guidance,
            )))
        return found

    def extra_state(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict(), "dropped_total": self.dropped_total}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])
        self.dropped_total = int(state.get("dropped_total", 0))


register_preset("op_grpo_no_correction", OPGRPO, {"correction": "none"},
                "OP-GRPO ablation: no sequence-level correction (w = 1 for replayed samples).")
register_preset("op_grpo_naive_is", OPGRPO, {"correction": "naive"},
                "OP-GRPO ablation: naive per-step importance ratio pi_theta / pi_off (stored log-probs as PPO old "
                "log-probs), clipped, no sequence weight.")
register_preset("op_grpo_no_truncation", OPGRPO, {"t_off": None},
                "OP-GRPO ablation: no truncation (the whole stored trajectory is reused and weighted).")
register_preset("op_grpo_no_decay", OPGRPO, {"buffer_decay": 1.0},
                "OP-GRPO ablation: stored scores never decay.")
