"""The Algorithm base class: one GRPO training iteration as a template.

``step(prompts)`` = plan -> rollout (``collect``) -> decode + reward -> group-relative advantages -> PPO-clip update,
returning a :class:`StepStats`. Subclasses override only what differs:

* ``step_plan(batch)``: which steps are SDE / trained, the kernel and sigmas (MixGRPO's window, ...);
* ``collect(...)``: how the batch of trajectories is produced (OP-GRPO mixes in replayed trajectories);
* ``after_update(traj, batch)``: bookkeeping after the optimizer step (replay buffer insertion, window advance);
* ``extra_state()`` / ``load_extra_state()``: whatever else a bit-identical resume needs.

Which prompts an iteration trains on is the algorithm's prompt sampler's choice (``algorithms/prompt_samplers``):
``use_prompts(pool, groups, sampler)`` gives the algorithm its training pool, ``train_step(step)`` draws and trains;
``step(prompts)`` trains on prompts given directly (tests, tools). ``default_prompt_sampler`` says which sampler a
config without ``train.prompt_sampler`` gets.

The class is assembled from the engine's modules: its hyper-parameters (``AlgorithmConfig``, ``config.py``), what a
step reports (``StepStats``, ``stats.py``), the update's bookkeeping (``tally.py``), the prompt iteration
(``PromptIteration``, ``prompt_iteration.py``), the checkpoint state (``CheckpointState``, ``checkpoint_state.py``) and
the lockstep padding of a sharded run (``LockstepPadding``, ``lockstep.py``); every name is importable from here.

Hooks report per-iteration diagnostics with ``self.log(key, value)`` (Stable-Baselines3's ``logger.record``): the
values land in ``StepStats.extra`` and the runner writes them as metrics.csv columns. A class declares what the report
needs to know about it: ``family`` (colours and panels), ``ablation_of`` (the ablation table) and ``diagnostics``
(the logged columns the report shows, each with a one-line description).

Under several processes (``dist``, set by the runner; see ``algorithms/engine/distributed.py``) each rank rolls out its slice
of the global batch, rewards are gathered before the advantages, and gradients and statistics are summed over ranks,
so a run gives the same numbers whatever the number of processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Any, ClassVar, Iterator, Sequence

import torch

from flowzoo.algorithms.engine.advantages import combined_advantages, zero_std_fraction
from flowzoo.algorithms.engine.checkpoint_state import CheckpointState
from flowzoo.algorithms.engine.config import MINIBATCH_ORDERS, AlgorithmConfig, ordered_rows
from flowzoo.algorithms.engine.distributed import SINGLE_PROCESS, GatheredBatch, SingleProcess
from flowzoo.algorithms.engine.ema import WeightEMA
from flowzoo.algorithms.engine.lockstep import CallLedger, LockstepPadding, requested as lockstep_requested
from flowzoo.algorithms.engine.losses import PPOTerms, gaussian_mean_kl, kl_std, ppo_clip_loss
from flowzoo.algorithms.engine.prompt_iteration import PromptIteration
from flowzoo.algorithms.engine.rollout import chunk_spans, initial_noise, rollout, sample_generators
from flowzoo.algorithms.engine.sde import SigmaGrid, StepOutput, sde_step, sigma_schedule
from flowzoo.algorithms.engine.stats import (
    CLIP_FRAC_OFF, CLIP_FRAC_ON, FSDP_PADDING, ONPOLICY_DRIFT, RESERVED_COLUMNS, StepStats,
)
from flowzoo.algorithms.engine.tally import UpdateTally, rows_on_device
from flowzoo.algorithms.engine.trajectory import RolloutInputs, StepPlan, Trajectory
from flowzoo.algorithms.prompt_samplers import PromptDraw
from flowzoo.errors import FlowZooError
from flowzoo.schema import from_mapping
from flowzoo.streams import UPDATE_ORDER_OFFSET
from flowzoo.models.base import FlowModel
from flowzoo.models.sharding import full_tensor, is_sharded
from flowzoo.rewards.base import Reward
from flowzoo.rewards.errors import RewardError
from flowzoo.rewards.multi import MultiReward

#: the names other modules import from here (the config, the step's report and the update's bookkeeping live in
#: modules of their own: ``config``, ``stats``, ``tally``)
__all__ = ["Algorithm", "AlgorithmConfig", "StepStats", "MINIBATCH_ORDERS", "ordered_rows", "ONPOLICY_DRIFT",
           "FSDP_PADDING", "CLIP_FRAC_ON", "CLIP_FRAC_OFF", "RESERVED_COLUMNS", "UpdateTally", "rows_on_device"]


class Algorithm(PromptIteration, CheckpointState, LockstepPadding):
    """A GRPO-style algorithm; see the module docstring for the template and the hooks."""

    name: ClassVar[str | None] = None  # set by @register (algorithms/__init__.py): the name is stated once
    Config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    #: the method family it belongs to (its colour map and panel in the report); @register defaults it to the nearest
    #: registered base class's family, or the algorithm's own name (a family's own method)
    family: ClassVar[str | None] = None
    #: a family's own method declares its display name and the matplotlib colour map of its family (the report's
    #: titles and colours; read from the class's own attributes only, so a subclass does not inherit them); a family
    #: without a colour map is drawn in greys
    label: ClassVar[str | None] = None
    colormap: ClassVar[str | None] = None
    #: the algorithm this one ablates (its row goes to that method's ablation table); register_preset sets the base's
    #: name unless told otherwise; None for methods and variants
    ablation_of: ClassVar[str | None] = None
    #: {metrics.csv column: one-line description} of what the report shows for this algorithm, logged with
    #: :meth:`log`; ``{k}`` in a column stands for a denoising-step index (``abs_log_ratio_t{k}``)
    diagnostics: ClassVar[dict[str, str]] = {}
    #: config overrides that define a named preset of a class (e.g. an ablation), applied under the user's config
    preset: ClassVar[dict[str, Any]] = {}
    #: whether ``reuse_rollout_graph: auto`` may turn the recompute-free update on for this algorithm
    rollout_graph_auto: ClassVar[bool] = True
    #: whether fresh rollouts record each SDE transition's Gaussian mean (``Trajectory.means``): the old policy's
    #: anchor of a loss that compares means (Flow-DPPO's KL mask, GRPO-Guard's ratio normalisation)
    records_means: ClassVar[bool] = False
    #: whether the algorithm trains without the sampler's log-probabilities, on the forward (noising) process of its
    #: clean samples (the decoupled methods, DiffusionNFT): its trajectories record no transitions to train, so the
    #: PPO ratio checks do not apply to it
    likelihood_free: ClassVar[bool] = False
    #: whether the update logs where its PPO clip binds by advantage sign (``clip_frac_pos_adv``,
    #: ``clip_frac_neg_adv``: ``losses.binding_clips``): Flow-GRPO and GRPO-Guard, whose ``clipped`` is PPO's clip
    logs_clip_sides: ClassVar[bool] = False
    #: the data-parallel context (the runner sets it under a launcher); the default is the single-process no-op
    dist: SingleProcess = SINGLE_PROCESS
    # (the prompt iteration's attributes, ``prompt_sampler``, ``current_draw`` and ``group_base``: PromptIteration)

    def __init__(self, model: FlowModel, reward: Reward, config: AlgorithmConfig | dict | None = None, seed: int = 0,
                 dist: SingleProcess | None = None):
        if dist is not None:  # the runner's data-parallel context: known here, so __init__ may depend on it
            self.dist = dist
        self.config = config if isinstance(config, AlgorithmConfig) else self.typed_config(config)
        self.model = model
        self.reward = reward
        self.seed = seed
        self.iteration = 0
        self.optimizer = torch.optim.AdamW(
            model.trainable_parameters(),
            lr=self.config.lr,
            weight_decay=self.config.weight_decay,
            eps=self.config.adam_eps,
            # a fused tier's optimizer step is one kernel over all tensors (3.5x faster on the toy MLP, the same
            # update to float rounding); elsewhere torch's default
            fused=True if model.fused_update else None,
        )
        self.num_steps = self.config.num_steps or model.default_num_steps
        self.config.check_num_steps(self.num_steps)  # the knobs bounded by T, once T is known (the model's default)
        self.shift = model.default_shift if self.config.shift is None else self.config.shift  # sigma-schedule shift
        grid = self.sigma_grid()
        # the model's own scheduler stretches its grid to a terminal sigma (Qwen-Image); another grid is left alone
        terminal = model.shift_terminal if grid == model.default_sigma_grid else None
        self.sigmas = sigma_schedule(self.num_steps, self.shift, grid=grid, terminal=terminal)
        self.update_generator = torch.Generator().manual_seed(seed + UPDATE_ORDER_OFFSET)
        #: the moving average of the trainable weights the run evaluates with (``ema``), or None
        self.ema = (WeightEMA(model.trainable_parameters(), self.config.ema_decay, self.config.ema_every)
                    if self.config.ema else None)
        #: the transformer calls of each phase, compared over processes after every step (algorithms/engine/lockstep.py):
        #: a sharded model under FLOWZOO_CHECK_LOCKSTEP=1, else None
        self.lockstep = CallLedger.attach(model) if model.sharded and lockstep_requested() else None
        #: one row of this step's first rollout: the input of a padding call on a process left with no rows
        self._padding_source: Trajectory | None = None

    def evaluation_weights(self) -> contextlib.AbstractContextManager:
        """The weights evaluation samples with: within this context the trainable parameters hold the moving average
        when ``ema`` is on (restored after); otherwise the trained weights, unchanged."""
        return self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext()

    # ---- hooks ----------------------------------------------------------------------------------------------
    def sigma_grid(self) -> SigmaGrid:
        """The grid of the training sigmas (``algorithms.engine.sde.sigma_schedule``): the model's pipeline's
        (``default_sigma_grid``: SD3's scheduler for sd3 / tiny, Wan2.1's UniPC flow sigmas for wan, FluxPipeline's
        for flux and qwen_image);
        DanceGRPO and MixGRPO read theirs from their config."""
        return self.model.default_sigma_grid

    def step_plan(self, batch: int) -> StepPlan:
        """Flow-GRPO's plan: SDE at every step, train the first int(T * timestep_fraction) steps of every sample."""
        trained = max(1, int(self.num_steps * self.config.timestep_fraction))
        train = torch.zeros(batch, self.num_steps, dtype=torch.bool)
        train[:, :trained] = True
        return StepPlan(
            self.sigmas, torch.ones(self.num_steps, dtype=torch.bool), train, self.config.kernel, self.config.noise_level
        )

    def collect(self, prompts: Sequence[str], metadata: Sequence[dict]) -> Trajectory:
        """Roll out G fresh samples for each prompt."""
        return self.fresh_rollout(prompts, metadata)

    def after_update(self, traj: Trajectory, batch: GatheredBatch) -> None:
        """Called after the optimizer step of each iteration; ``batch``: the rewards, groups and off-policy flags of
        the global batch (``traj`` itself in one process)."""

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    @classmethod
    def typed_config(cls, params: dict[str, Any] | None = None) -> AlgorithmConfig:
        """The class's typed config: its preset under ``params`` (the one place a preset is applied; unknown keys and
        bad values are one-line ConfigErrors naming ``algorithm.<key>``)."""
        return from_mapping(cls.Config, {**cls.preset, **(params or {})}, where="algorithm")

    # ---- diagnostics ----------------------------------------------------------------------------------------
    def log(self, key: str, value: float) -> None:
        """Record a scalar of the current iteration (Stable-Baselines3's ``logger.record``): ``step`` returns it in
        ``StepStats.extra`` and the runner writes it as column ``key`` of metrics.csv. Logging a key again in the
        same iteration keeps the last value. Declare the columns the report should show in ``diagnostics``."""
        if not isinstance(key, str) or not key or key in RESERVED_COLUMNS:
            raise ValueError(f"Algorithm.log: key {key!r} must be a non-empty string other than the columns the "
                             f"template writes ({', '.join(sorted(RESERVED_COLUMNS))})")
        self.logged[key] = float(value)

    @property
    def logged(self) -> dict[str, float]:
        """The values recorded with :meth:`log` since the current iteration began."""
        return self.__dict__.setdefault("_logged", {})

    # ---- the template ---------------------------------------------------------------------------------------
    def step(self, prompts: Sequence[str], metadata: Sequence[dict] | None = None, *, draw: PromptDraw | None = None,
             at_step: int | None = None) -> StepStats:
        """One training iteration on ``prompts`` (one group of G samples per prompt). ``draw``/``at_step``: the
        sampler's draw these prompts are and the training step it was drawn for (``train_step``); the sampler then
        sees every group's outcome, and a filtering sampler may roll out more prompts."""
        metadata = list(metadata) if metadata is not None else [{} for _ in prompts]
        self._logged: dict[str, float] = {}
        self.current_draw = draw
        self.model.nfe = 0
        t0 = time.perf_counter()
        with self.lockstep_phase("rollout"):
            traj = self.collect(list(prompts), metadata)
        if self.model.sharded and len(traj):
            self._padding_source = traj.select([0])
        t1 = time.perf_counter()
        if traj.rewards is None:
            self.score(traj)
        batch = self.dist.gather_batch(traj)  # the global batch's rewards and groups (traj itself in one process)
        outcomes = self._outcomes(batch, draw)
        if draw is not None and self.prompt_sampler is not None and self.prompt_sampler.filters:
            t_fill = time.perf_counter()
            with self.lockstep_phase("rollout"):
                traj, batch = self._filled_batch(traj, batch, draw, at_step if at_step is not None else 0, outcomes)
            t1 += time.perf_counter() - t_fill  # the extra rounds are sampling time (their scoring included)
        nfe_sampling = self.model.nfe
        advantages = self.advantages(batch)[batch.local]
        t2 = time.perf_counter()
        self.model.nfe = 0
        with self.lockstep_phase("update"):
            update = self.update(traj, advantages)
        t3 = time.perf_counter()
        stats = StepStats(
            reward_mean=float(batch.rewards.mean()),
            reward_std=float(batch.rewards.std(unbiased=False)),
            nfe_sampling=self.dist.sum(nfe_sampling),
            nfe_training=self.dist.sum(self.model.nfe),
            t_sampling=t1 - t0,
            t_reward=t2 - t1,
            t_training=t3 - t2,
            **update,
        )
        self.log("zero_std_frac", zero_std_fraction(batch.rewards, batch.group))
        for name, values in batch.reward_components.items():
            self.log(f"reward/{name}", float(values.mean()))
        self.after_update(traj, batch)
        if draw is not None and self.prompt_sampler is not None:
            self.prompt_sampler.observe([outcome for _, outcome in outcomes])
        self.current_draw = None
        stats.extra = self.logged
        self.iteration += 1
        self.check_lockstep(f"training step {at_step if at_step is not None else self.iteration}")
        return stats

    def fresh_rollout(
        self, prompts: Sequence[str], metadata: Sequence[dict], group_offset: int = 0, group_size: int | None = None,
        rows: range | None = None,
    ) -> Trajectory:
        """G on-policy samples for each prompt, sample j of prompt i seeded by (seed, iteration, i, j).

        ``group_size`` overrides G (OP-GRPO rolls out G - k fresh samples for groups that get k replayed ones).
        ``rows`` restricts the rollout to these indices of the ``len(prompts) * G`` samples (default: this process's
        shard, i.e. all of them in a single process); their noise, plan and groups are those of the full batch."""
        inputs = self.fresh_inputs(prompts, metadata, group_offset, group_size, rows)
        live = {} if self.keeps_rollout_graph() else None
        prediction: dict[str, torch.Tensor] = {}  # the last step's data prediction, where the plan decodes it
        means = None
        if self.records_means:
            x = inputs.x
            means = torch.zeros((x.shape[0], inputs.plan.num_steps, *x.shape[1:]), dtype=torch.float32, device=x.device)
        latents, log_probs = rollout(self.model, inputs.cond, inputs.plan, inputs.x, inputs.generators,
                                     self.config.guidance, live=live, cfg_grad=self.config.cfg_grad,
                                     cfg_batch=self.config.cfg_batch, prediction=prediction,
                                     chunk=self.rollout_chunk(), means=means)
        return Trajectory.from_rollout(inputs.plan, inputs.prompts, inputs.metadata, inputs.cond, latents, log_probs,
                                       inputs.group, self.config.guidance, live=live,
                                       prediction=prediction.get("x0"), means=means)

    def fresh_inputs(
        self, prompts: Sequence[str], metadata: Sequence[dict], group_offset: int = 0, group_size: int | None = None,
        rows: range | None = None, shared_noise: bool | None = None,
    ) -> RolloutInputs:
        """What :meth:`fresh_rollout` (same arguments) samples from: its rows' condition, initial noise, generators,
        plan and groups (OP-GRPO rolls several such parts out as one batch; Flow-GRPO-Fast branches them from one
        prefix per group). ``shared_noise``: one initial noise per group (default: the config's ``shared_noise``)."""
        g = self.config.group_size if group_size is None else group_size
        batch = len(prompts) * g
        rows = self.dist.shard(batch) if rows is None else rows
        first, last = rows.start // g, (rows.stop - 1) // g + 1  # the prompts these rows belong to
        local = slice(rows.start - first * g, rows.stop - first * g)
        cond = self.model.encode(list(prompts[first:last]), list(metadata[first:last]))
        cond = cond.repeat_interleave(g).index(local)
        group_offset += self.group_base
        gens = sample_generators(self.seed, self.iteration, group_offset, count=batch)
        shared = self.config.shared_noise if shared_noise is None else shared_noise
        x1 = initial_noise(self.model, gens[first * g: last * g], g, shared)[local]
        plan = self.make_plan(batch)
        return RolloutInputs(
            prompts=[prompts[i // g] for i in rows],
            metadata=[metadata[i // g] for i in rows],
            cond=cond,
            x=x1,
            generators=gens[rows.start: rows.stop],
            plan=dataclasses.replace(plan, train=plan.train[rows.start: rows.stop], graph_steps=plan.train.any(0)),
            group=torch.arange(group_offset, group_offset + len(prompts)).repeat_interleave(g)[rows.start: rows.stop],
        )

    def rollout_chunk(self) -> int | None:
        """Samples per network call of a training rollout and per decode and reward call (``rollout_batch``, else
        the model's ``default_rollout_batch``); None: all of a process's samples at once."""
        chunk = self.config.rollout_batch
        return self.model.default_rollout_batch if chunk is None else chunk

    def keeps_rollout_graph(self) -> bool:
        """``reuse_rollout_graph`` resolved (``auto``: see ``AlgorithmConfig``)."""
        cfg = self.config
        if cfg.reuse_rollout_graph != "auto":
            return bool(cfg.reuse_rollout_graph)
        return self.rollout_graph_auto and (cfg.inner_epochs, cfg.minibatches) == (1, 1) and cfg.micro_batch is None

    def make_plan(self, batch: int) -> StepPlan:
        """The algorithm's ``step_plan`` with the settings every algorithm shares (the log-prob reduction)."""
        return dataclasses.replace(self.step_plan(batch), reduction=self.config.log_prob_reduction)

    @torch.no_grad()
    def score(self, traj: Trajectory) -> None:
        """Decode the rewarded latents (``traj.rewarded``: the final sample, or the last step's data prediction where
        the plan says so) and score them; fills ``samples``, ``rewards`` and ``reward_components``. Decoded and
        scored in chunks of :meth:`rollout_chunk` samples (one decode call and one reward call each)."""
        rewarded = traj.rewarded
        samples, scores, components = [], [], []
        for span in chunk_spans(len(rewarded), self.rollout_chunk()):
            samples.append(self.model.decode(rewarded[span]))
            try:
                out = self.reward(samples[-1], traj.prompts[span], traj.metadata[span])
            except FlowZooError:  # already one line (a RewardError, non-finite samples, a bad prompt, ...)
                raise
            except Exception as error:  # as the evaluation's reward pool says it: one line naming the reward
                name = self.reward.name
                raise RewardError(f"reward {name!r} failed in training: {type(error).__name__}: {error}") from error
            scores.append(out.score)
            components.append(dict(out.components))
        if len(samples) == 1:  # the one call's tensors as they are
            traj.samples, traj.rewards, traj.reward_components = samples[0], scores[0], components[0]
            return
        traj.samples = torch.cat(samples)
        traj.rewards = torch.cat(scores)
        traj.reward_components = {name: torch.cat([part[name] for part in components]) for name in components[0]}

    def advantages(self, traj: Trajectory) -> torch.Tensor:
        weights = self.reward.weights if isinstance(self.reward, MultiReward) else None
        return combined_advantages(
            traj.rewards,
            traj.reward_components,
            weights,
            traj.group,
            aggregation=self.config.reward_aggregation,
            std_mode=self.config.adv_std,
            clip=self.config.adv_clip,
            eps=self.config.adv_eps,
            unbiased=self.config.adv_std_unbiased,
        )

    def score_transition(self, traj: Trajectory, rows: torch.Tensor, t: int | torch.Tensor) -> StepOutput:
        """The recorded transition t -> t+1 of samples ``rows`` scored under the model's current policy (gradients
        flow unless the caller disables them). ``t``: one step for every row, or a tensor of one step per row."""
        x = traj.latents[rows, t]
        sigma, sigma_next = self._step_sigmas(traj, t, len(rows))
        quiet = traj.quiet_steps()[t]  # host-side: whether the step has zero noise, without reading the device
        v = self.model.velocity(x, sigma, traj.cond.index(rows), traj.guidance, cfg_grad=self.config.cfg_grad,
                                cfg_batch=self.config.cfg_batch)
        return sde_step(x, v, sigma, sigma_next, kind=traj.kind, noise_level=traj.noise_level,
                        prev_sample=traj.latents[rows, t + 1], reduction=traj.reduction,
                        deterministic=bool(quiet.all()))

    @staticmethod
    def _step_sigmas(traj: Trajectory, t: int | torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(sigma, sigma_next) [n] of transition ``t`` (one step, or a host tensor of one step per row) from the
        trajectory's grid on its device: a view for one step, no host-to-device copy per call."""
        sigmas = traj.device_sigmas()
        if isinstance(t, torch.Tensor):  # the fused update's per-row steps (a host tensor)
            t = t.to(sigmas.device)
        return sigmas[t].expand(n), sigmas[t + 1].expand(n)

    def _step_terms(
        self, traj: Trajectory, rows: torch.Tensor, t: int, live: dict | None = None
    ) -> tuple[StepOutput, torch.Tensor]:
        """The current log-prob of transition t for samples ``rows`` (with grad) and the KL to the reference policy;
        from the rollout's kept graph (``live[t]``) when there is one, else recomputed."""
        if live and isinstance(t, int) and t in live:
            out = StepOutput(*(field[rows] for field in live[t]))
        else:
            out = self.score_transition(traj, rows, t)
        kl = out.log_prob.new_zeros(len(rows))  # the log-prob's device and dtype (float32: algorithms/engine/sde.py)
        if self.config.kl_beta > 0:
            with torch.no_grad(), self.model.reference():
                ref = self.score_transition(traj, rows, t)
            sigma, sigma_next = self._step_sigmas(traj, t, len(rows))
            std = kl_std(out.std, sigma, sigma_next, self.config.kl_variance, traj.kind)
            kl = gaussian_mean_kl(out.mean, ref.mean, std, traj.reduction)
        return out, kl

    def policy_terms(self, traj: Trajectory, rows: torch.Tensor, t: int | torch.Tensor, out: StepOutput,
                     old: torch.Tensor, advantages: torch.Tensor) -> PPOTerms:
        """The policy loss of one chunk of trained transitions (``rows`` at step ``t``; ``out`` their current
        StepOutput, ``old`` the behaviour log-probs, ``advantages`` the rows'): Flow-GRPO's PPO-clip surrogate. Its
        ``clipped`` mask is what the update counts as ``clip_frac``. Flow-DPPO and GRPO-Guard override it."""
        return ppo_clip_loss(out.log_prob, old, advantages, self.config.clip_range)

    def minibatch_rows(self, batch: int, kept: torch.Tensor | None, offset: int, local: int) -> Iterator[torch.Tensor]:
        """This rank's rows of each minibatch of an update, epoch after epoch: every inner epoch draws a fresh
        permutation of the global batch (or of the ``kept`` rows) from the update generator (``minibatch_order``
        grouped or interleaved: takes them in that fixed order, :func:`ordered_rows`) and splits it into
        ``minibatches`` parts; each part is sorted and cut to the rows ``[offset, offset + local)`` this rank holds,
        returned as local indices (possibly none: the caller skips a minibatch that is empty on every rank)."""
        for _ in range(self.config.inner_epochs):
            if self.config.minibatch_order != "shuffled":  # in order (rows are group-major), or slice by slice
                perm = ordered_rows(batch, self.config.group_size, self.config.minibatch_order)
                perm = perm if kept is None else perm[torch.isin(perm, kept)]
            elif kept is None:
                perm = torch.randperm(batch, generator=self.update_generator)
            else:
                perm = kept[torch.randperm(len(kept), generator=self.update_generator)]
            for minibatch in perm.chunk(self.config.minibatches):
                minibatch = minibatch.sort().values
                yield minibatch[(minibatch >= offset) & (minibatch < offset + local)] - offset

    def optimizer_step(self) -> float:
        """One optimizer step on the accumulated gradients: summed over ranks, clipped to ``max_grad_norm`` (0: no
        clipping), applied, then the weight EMA updated; returns the gradient norm before clipping."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        # a sharded parameter's gradient was already summed over ranks by FSDP's reduce-scatter (models/sharding.py)
        self.dist.all_reduce_gradients([p for p in params if not is_sharded(p)])
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm or math.inf)
        grad_norm = float(full_tensor(grad_norm))  # over every shard: a DTensor when the parameters are sharded
        self.optimizer.step()
        if self.ema is not None:
            self.ema.update()
        return grad_norm

    def clip_subsets(self, traj: Trajectory) -> dict[str, torch.Tensor]:
        """{metrics.csv column: bool mask over ``traj``'s samples}: subsets whose PPO clip fraction the update logs
        apart (all of them, when each holds trained pairs over all processes). None here; OP-GRPO splits its
        on- and off-policy samples."""
        return {}

    def trained_rows(self, advantages: torch.Tensor) -> torch.Tensor | None:
        """Global indices of the samples the update trains (None: all): with ``drop_zero_advantage``, those whose
        advantage is not exactly 0 (over all processes)."""
        if not self.config.drop_zero_advantage:
            return None
        kept = torch.nonzero(self.dist.cat(advantages) != 0).squeeze(1).cpu()  # host indices, as the permutation
        self.log("zero_adv_dropped_frac", 1.0 - len(kept) / max(self.dist.local_span(len(advantages))[1], 1))
        return kept

    def transition_chunks(
        self, traj: Trajectory, minibatch: torch.Tensor
    ) -> Iterator[tuple[torch.Tensor, int | torch.Tensor]]:
        """(rows, t): the minibatch's trained transitions, step by step, in chunks of ``micro_batch`` samples (a kept
        rollout graph is back-propagated whole: its forward already ran on the batch).

        Where the model's tier fuses its update (``FlowModel.fused_update``) and no rollout graph is kept, the
        transitions of every trained step come as one chunk (of at most ``micro_batch`` pairs) with ``t`` a tensor of
        one step per row, in the same step-major order."""
        if self.model.fused_update and not traj.live:
            steps, local = torch.nonzero(traj.train[minibatch].T, as_tuple=True)  # step-major, as below
            rows = minibatch[local]
            for part in torch.arange(len(rows), device=rows.device).split(max(self.config.micro_batch or len(rows), 1)):
                if len(part):
                    yield rows[part], steps[part]
            return
        for t in range(traj.num_steps):
            rows_t = minibatch[traj.train[minibatch, t]]
            chunk = len(rows_t) if traj.live and t in traj.live else self.config.micro_batch or len(rows_t)
            for rows in rows_t.split(max(chunk, 1)):
                if len(rows):
                    yield rows, t

    def update(self, traj: Trajectory, advantages: torch.Tensor) -> dict[str, Any]:
        """PPO-clip epochs over the rollout batch (Flow-GRPO's loss): per trained transition, the clipped surrogate of
        the ratio pi_theta / pi_old plus beta x KL to the reference, each sample scaled by exp(traj.log_weight),
        summed and normalised by the minibatch's number of trained (sample, step) pairs over all processes."""
        cfg = self.config
        offset, batch = self.dist.local_span(len(traj))  # minibatches are drawn over the global batch
        device = traj.log_probs.device
        weight = torch.exp(traj.log_weight).float()
        tally = UpdateTally(self.clip_subsets(traj), device, cfg.clip_range if self.logs_clip_sides else None)
        on_policy = ~traj.off_policy.to(device)  # once: the drift check reads it at every chunk
        first_drift = None  # max |log pi_theta - log pi_old| of the first optimizer step's on-policy pairs
        padded = 0  # network calls this process made only to keep a sharded model's processes in lockstep
        for minibatch in self.minibatch_rows(batch, self.trained_rows(advantages), offset, len(traj)):
            pairs = self.dist.sum(int(traj.train[minibatch].sum()))
            if pairs == 0:
                continue
            drift = [] if first_drift is None else None
            self.optimizer.zero_grad(set_to_none=True)
            fused = []  # a fused update's chunk losses, back-propagated once (a kept graph's steps included)
            for rows, t in rows_on_device(self.padded_chunks(traj, minibatch), device):
                if rows is None:
                    self._padding_call(traj, fused, t)
                    padded += 1
                    continue
                out, kl = self._step_terms(traj, rows, t, traj.live)
                old = traj.log_probs[rows, t.to(device) if isinstance(t, torch.Tensor) else t]
                terms = self.policy_terms(traj, rows, t, out, old, advantages[rows])
                per_sample = (terms.loss + cfg.kl_beta * kl) * weight[rows]
                loss = per_sample.sum() / pairs
                if self.model.fused_update:
                    fused.append(loss)
                else:
                    loss.backward()
                tally.add(rows, terms, out.log_prob, old, kl, per_sample, advantages[rows])
                if drift is not None:  # before any optimizer step: 0 unless sampling and training disagree
                    gap = (out.log_prob.detach() - old).abs()
                    drift.append(torch.where(on_policy[rows], gap, torch.zeros_like(gap)).amax().reshape(1))
            if fused:
                torch.stack(fused).sum().backward()
            if drift is not None:  # every process sets it at the same minibatch (this rank may hold none of it)
                first_drift = float(torch.cat(drift).max()) if drift else 0.0
            tally.grad_norms.append(self.optimizer_step())
        traj.live = None  # graphs are spent (and a second epoch would need fresh ones)
        if self.model.sharded:  # the calls made only to keep the processes in lockstep, summed over processes
            self.log(FSDP_PADDING, self.dist.sum(padded))
        result, subsets = tally.finish(self.dist)
        for column, value in subsets.items():
            self.log(column, value)
        if first_drift is not None:  # the largest over processes
            self.log(ONPOLICY_DRIFT, max(self.dist.all_gather_object(first_drift)))
        return result
