"""Advantage Weighted Matching (Xue et al., "Advantage Weighted Matching: Aligning RL with Pretraining in Diffusion
Models", arXiv 2509.25050). Sources: scxue/advantage_weighted_matching at be51372,
``advantage_weighted_matching/scripts/train_sd3_awm.py`` (the trainer) and ``config/dgx_awm.py`` (the SD3 recipes,
over ``config/base_awm.py``); the values are in ``benchmark/recipes/awm.yaml``.

A decoupled method: the policy gradient is the flow-matching (pretraining) loss of the policy's own clean samples,
weighted by their advantages. One iteration:

1. **collect**: G samples per prompt under the trained weights (the release's ``off_policy`` False). The release
   samples with SA-Solver (``use_sa_solver``), stochastic at tau = ``noise_level`` on the steps whose *target* time
   t lies in [0.3, 0.9] (SA-Solver evaluates tau at the time it steps to: sa_solver.py:480,524-526,541), injecting
   variance t^2 (1 - exp(-2 tau^2 h)) per step, h the step's rise in log((1 - t) / t) (its ``noise_part``). The zoo
   has no SA-Solver, so (ours) ``solver: sde_band`` runs the zoo's Flow-GRPO SDE kernel on the same steps (target
   sigma in the band; Euler elsewhere) at the level ``a`` whose step variances add up to SA-Solver's over the band
   at tau (:func:`sa_solver_level`; SD3.5 at T 14, shift 3: steps 3-10, a = 0.480 for tau 0.4, total 0.388).
   ``noise_level`` stays the release's tau. ``dpm2`` / ``euler`` are deterministic (the release's noise level 0,
   PickScore). Only the clean samples are used; nothing is recorded for training.
2. **advantages**: the template's, clipped to +-``adv_clip`` and rescaled to +-``advantage_max`` (:1293-1299).
3. **update**: per sample, ``train_timesteps`` times drawn as released (``time_type``, :1138-1207), each with fresh
   noise; at x_t = (1 - t) x0 + t eps the surrogate log-prob ``algorithms.engine.losses.awm_log_prob`` (the weighted
   flow-matching error, :210-252); the PPO-clip objective on ``ratio = exp(lp - lp_old)`` per (sample, time)
   (``exp_first``) or on the time-mean log-prob (``sum_first``) (:1301-1329), where lp_old is the same quantity
   under the weights of the rollout (the first optimizer step uses the detached current value, :1282-1284, ratio 1);
   plus ``kl_beta`` KL to the reference and ``ema_kl_beta`` KL to a slowly updated copy of the weights, both on the
   velocity (:1330-1352); the copy's KL only where ``kl_beta > 0``, as the release nests it (:1330,1341-1354). One optimizer step averages over its samples and times (``accelerator.accumulate``).
4. **the copy** for the adaptive KL: the weights at the start (:650-659); after each iteration
   ``copy <- d copy + (1 - d) theta`` with ``d = min(kl_ema_decay, 0.001 n)`` (``linear``, n = optimizer steps so
   far) or ``kl_ema_decay`` (``constant``) (:1409-1419). It is in the checkpoint.

NFE per iteration (B samples, T sampling steps, K = ``train_timesteps``, CFG factor c, B1 = samples of the first
optimizer step): sampling T * B * c; training c * K * (B (1 + [kl_beta > 0] (1 + [ema_kl_beta > 0])) + (B - B1)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

import torch

from flowzoo.algorithms import register
from flowzoo.algorithms.engine.base import Algorithm, AlgorithmConfig
from flowzoo.algorithms.methods.diffusion_nft import OldPolicy
from flowzoo.algorithms.engine.distributed import GatheredBatch
from flowzoo.algorithms.engine.advantages import StdMode
from flowzoo.algorithms.engine.losses import (
    AWMWeighting, PPOTerms, awm_advantages, awm_log_prob, awm_velocity_kl, ppo_clip_loss,
)
from flowzoo.algorithms.engine.plans import forward_draws
from flowzoo.algorithms.engine.rollout import sample_generators
from flowzoo.algorithms.engine.sde import flow_grpo_std, time_shift
from flowzoo.algorithms.engine.lockstep import UpdatePart
from flowzoo.algorithms.engine.trajectory import StepPlan, Trajectory
from flowzoo.errors import ConfigError, FlowZooError
from flowzoo.streams import AWM_FORWARD

TimeType = Literal["discrete", "discrete_wo_init", "discrete_with_init", "uniform", "logit_normal"]
TIME_TYPES = get_args(TimeType)
#: the sigma band where the release's SA-Solver is stochastic (stochasticity_control_function,
#: flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py:296), tested at each step's target time
SDE_BAND = (0.3, 0.9)


def band_steps(sigmas: torch.Tensor) -> torch.Tensor:
    """[T] the steps SA-Solver makes stochastic: those whose target sigma lies in :data:`SDE_BAND` (the release's
    ``tau(t)`` at ``t = timesteps[step]``, the time the step goes to; sa_solver.py:480,524-526,541)."""
    target = sigmas[1:]
    return (target >= SDE_BAND[0]) & (target <= SDE_BAND[1])


def sa_solver_variance(sigma: torch.Tensor, sigma_next: torch.Tensor, tau: float) -> torch.Tensor:
    """The variance SA-Solver injects on a step sigma -> sigma_next at ``tau`` (its data-prediction ``noise_part``
    = sigma_t sqrt(1 - exp(-2 tau^2 h)) noise, h = lambda(sigma_next) - lambda(sigma), lambda = log((1 - t) / t))."""
    lam = lambda t: torch.log((1 - t) / t)  # noqa: E731
    h = lam(sigma_next.double()) - lam(sigma.double())
    return sigma_next.double() ** 2 * -torch.expm1(-2 * tau**2 * h)


def sa_solver_level(tau: float, sigmas: torch.Tensor, sde: torch.Tensor) -> float:
    """The Flow-GRPO kernel's level ``a`` at which the ``sde`` steps inject, summed over them, the variance that
    SA-Solver injects at ``tau`` (ours: one level for the band, so the step profile differs: SA-Solver's falls off
    faster towards the clean end). The kernel's step variance is ``a^2 s / (1 - s) (s - s_next)``
    (:func:`algorithms.engine.sde.flow_grpo_std`), so ``a = sqrt(total_SA / total_kernel(1))``; ``tau`` if no step is noisy."""
    if not bool(sde.any()) or tau == 0:
        return float(tau)
    sigma, sigma_next = sigmas[:-1][sde].double(), sigmas[1:][sde].double()
    unit = flow_grpo_std(sigma, sigma_next, 1.0) ** 2 * (sigma - sigma_next)
    return math.sqrt(float(sa_solver_variance(sigma, sigma_next, tau).sum() / unit.sum()))


def copy_decay(step: int, decay_type: str, kl_ema_decay: float) -> float:
    """The weight the KL copy keeps of itself after ``step`` optimizer steps (train_sd3_awm.py:1410-1413)."""
    if decay_type == "constant":
        return kl_ema_decay
    if decay_type == "linear":
        return min(kl_ema_decay, 0.001 * step)
    raise ValueError(f"unknown kl_ema_decay_type {decay_type!r}; known: constant, linear")


def draw_times(time_type: str, count: int, num_steps: int, timestep_fraction: float, sigmas: torch.Tensor,
               shift: float, generator: torch.Generator) -> torch.Tensor:
    """``count`` training times t in (0, 1] of one sample, drawn as the release draws them for a micro-batch
    (train_sd3_awm.py:1138-1207): stratified indices into the sampling sigmas (``discrete*``), stratified uniform
    times in [0.2, 1] (``uniform``) or stratified logit-normal ones (``logit_normal``), shifted by ``shift``."""
    if time_type in ("discrete", "discrete_wo_init", "discrete_with_init"):
        top = int(num_steps * timestep_fraction)
        first, strata = (0, count) if time_type == "discrete" else (1, count)
        init = torch.zeros(0, dtype=torch.long)
        if time_type == "discrete_with_init":
            init, strata = torch.zeros(1, dtype=torch.long), count - 1
        if strata > 0:
            bounds = torch.linspace(first, top, strata + 1)
            lower, upper = bounds[:-1].long(), bounds[1:].long()
            rand = torch.rand(strata, generator=generator)
            indices = torch.cat([init, lower + (rand * (upper - lower)).long()])
        else:
            indices = init
        return sigmas[indices].float()
    if time_type == "uniform":
        rand = torch.rand(count, generator=generator)
        times = 0.20 + (torch.arange(count) + rand) / count * (1.0 - 0.20)
        times = times[torch.rand(count, generator=generator).argsort()]
        return time_shift(times, shift).float()
    if time_type == "logit_normal":
        base = (torch.arange(count) + torch.rand(count, generator=generator)) / count
        u = torch.distributions.Normal(0.0, 1.0).icdf(base)
        u = u[torch.randperm(count, generator=generator)]
        return torch.clamp(time_shift(torch.sigmoid(u), shift), min=0.01).float()
    raise ValueError(f"unknown time_type {time_type!r}; known: {', '.join(TIME_TYPES)}")


@dataclass
class AWMConfig(AlgorithmConfig):
    # training times per sample and how they are drawn (dgx_awm.py:56,88, time_shift :89)
    train_timesteps: int = 6
    time_type: TimeType = "discrete_wo_init"
    time_shift: float = 3.0
    timestep_fraction: float = 0.9
    # the flow-matching error's weighting (dgx_awm.py:63-64)
    weighting: AWMWeighting = "ghuber"
    ghuber_power: float = 0.25
    # advantages rescaled from +-adv_clip to +-advantage_max (dgx_awm.py:58); null keeps them
    advantage_max: float | None = 1.0
    clip_range: float = 1.0  # dgx_awm.py:86
    loss_type: Literal["exp_first", "sum_first"] = "exp_first"  # dgx_awm.py:61
    kl_beta: float = 1e-3  # dgx_awm.py:55 (train.beta)
    kl_form: Literal["uniform", "elbo"] = "uniform"  # dgx_awm.py:57 (kl_weight)
    ema_kl_beta: float = 1.0  # dgx_awm.py:67 (train.ema_beta): the KL to the slowly updated copy
    ema_kl_form: Literal["uniform", "elbo"] = "uniform"  # dgx_awm.py:65
    kl_ema_decay: float = 0.3  # dgx_awm.py:66
    kl_ema_decay_type: Literal["linear", "constant"] = "linear"  # dgx_awm.py:68
    # the rollout's sampler (ours, see the module): the Flow-GRPO SDE on the steps into the sigma band [0.3, 0.9]
    # at SA-Solver's injected variance, or an ODE solver
    solver: Literal["sde_band", "dpm2", "euler"] = "sde_band"
    noise_level: float = 0.4  # dgx_awm.py:48 (sample.noise_level: SA-Solver's tau; sde_band converts it, see above)
    adv_std: StdMode = "batch"  # dgx_awm.py:72 (sample.global_std)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.train_timesteps < 1:
            raise ConfigError(f"algorithm.train_timesteps must be >= 1, got {self.train_timesteps}")
        positive = {"ghuber_power": self.ghuber_power, "time_shift": self.time_shift, "adv_clip": self.adv_clip}
        for name, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"algorithm.{name} must be a finite number > 0, got {value}")
        if self.advantage_max is not None and not (math.isfinite(self.advantage_max) and self.advantage_max > 0):
            raise ConfigError(f"algorithm.advantage_max must be a finite number > 0 or null, got {self.advantage_max}")
        for name in ("ema_kl_beta",):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"algorithm.{name} must be a finite number >= 0, got {value}")
        if not (math.isfinite(self.kl_ema_decay) and 0 <= self.kl_ema_decay < 1):
            raise ConfigError(f"algorithm.kl_ema_decay must be in [0, 1), got {self.kl_ema_decay}")
        if self.inner_epochs != 1:
            raise ConfigError(f"algorithm.inner_epochs must be 1 for awm (the released trainer makes one pass over "
                              f"its samples), got {self.inner_epochs}")
        if self.reuse_rollout_graph is True:
            raise ConfigError("algorithm.reuse_rollout_graph cannot be true for awm: it trains on the forward "
                              "process, not on the rollout's graph (use auto or false)")

    def inert_keys(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """At ``kl_beta`` 0 the copy's KL and the KL's forms are inert: the release nests the copy's KL inside its
        ``if beta > 0`` (train_sd3_awm.py:1330,1341-1354 at be51372), as :meth:`AWM.update` does."""
        inert = super().inert_keys()
        if self.kl_beta == 0:
            why = "kl_beta is 0: the KL terms, the copy's nested in the reference's (train_sd3_awm.py:1330-1354), are off"
            for name in ("ema_kl_beta", "kl_form", "ema_kl_form", "kl_ema_decay", "kl_ema_decay_type"):
                inert[name] = (why, ("kl_beta",))
        elif self.ema_kl_beta == 0:
            why = "ema_kl_beta is 0: the KL to the slowly updated copy is off"
            for name in ("ema_kl_form", "kl_ema_decay", "kl_ema_decay_type"):
                inert[name] = (why, ("ema_kl_beta",))
        return inert

    def check_num_steps(self, num_steps: int) -> None:
        super().check_num_steps(num_steps)
        if self.time_type.startswith("discrete") and int(num_steps * self.timestep_fraction) < 1:
            raise ConfigError(f"algorithm.timestep_fraction {self.timestep_fraction} leaves no sampling step of "
                              f"{num_steps} to train at (int(T * fraction) must be >= 1)")


class AWMPartLoss(NamedTuple):
    """One update part's loss (``AWM.part_loss``) and the terms the update's sums read."""

    total: torch.Tensor  # the part's summed loss (policy + the KL terms)
    terms: PPOTerms  # the PPO-clip terms
    log_prob: torch.Tensor  # [K, n] the current log-likelihoods
    old: torch.Tensor  # [K, n] the rollout weights' (or the current ones, detached)
    kl: torch.Tensor  # [K n] the KL to the reference (zeros when off)
    kl_copy: torch.Tensor  # [K n] the KL to the slowly updated copy (zeros when off)


@register("awm")
class AWM(Algorithm):
    """Advantage Weighted Matching: the advantage-weighted flow-matching loss on the policy's own samples."""

    label, colormap = "AWM", "YlOrBr"  # the report's name and colours of this family
    Config = AWMConfig
    likelihood_free = True
    rollout_graph_auto = False
    diagnostics = {
        "kl_copy": "mean KL term to the slowly updated copy of the weights (the release's ema_kl_loss)",
        "copy_decay": "the decay of the copy's update after this iteration",
    }

    def __init__(self, model, reward, config=None, seed: int = 0, dist=None):
        super().__init__(model, reward, config, seed, dist=dist)
        self.kl_copy = OldPolicy(model.trainable_parameters())  # the release's "ema" adapter
        self.optimizer_steps = 0

    def step_plan(self, batch: int) -> StepPlan:
        steps, cfg = self.num_steps, self.config
        sde = torch.zeros(steps, dtype=torch.bool)
        dpm = None
        level = cfg.noise_level
        if cfg.solver == "sde_band":
            sde = band_steps(self.sigmas)
            if cfg.kernel == "flow_grpo":  # the kernel whose variance sa_solver_level matches
                level = sa_solver_level(cfg.noise_level, self.sigmas, sde)
        elif cfg.solver == "dpm2":
            dpm = torch.ones(steps, dtype=torch.bool)
        return StepPlan(self.sigmas, sde, torch.zeros(batch, steps, dtype=torch.bool), cfg.kernel, level,
                        dpm_solver=dpm)

    def _velocity(self, x, t, traj, rows):
        return self.model.velocity(x, t, traj.cond.index(rows), traj.guidance, cfg_grad=self.config.cfg_grad,
                                   cfg_batch=self.config.cfg_batch)

    def forward_draws(self, generators: list[torch.Generator], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sample's K training times [n, K] and noises [n, K, ...] from its own generator."""
        cfg, k = self.config, self.config.train_timesteps
        return forward_draws(generators, k, like, lambda gen: draw_times(
            cfg.time_type, k, self.num_steps, cfg.timestep_fraction, self.sigmas, cfg.time_shift, gen))

    def update(self, traj: Trajectory, advantages: torch.Tensor) -> dict[str, Any]:
        cfg = self.config
        offset, batch = self.dist.local_span(len(traj))
        # host indices, as the minibatch permutation they are drawn with
        kept = self.trained_rows(advantages)
        generators = sample_generators(self.seed, self.iteration, AWM_FORWARD, count=batch)
        k = cfg.train_timesteps
        scaled = awm_advantages(advantages, cfg.adv_clip, cfg.advantage_max)
        rollout_weights = OldPolicy(self.model.trainable_parameters()) if cfg.minibatches > 1 else None
        sums = {"loss": 0.0, "kl": 0.0, "kl_copy": 0.0, "clipped": 0.0, "ratio": 0.0, "approx_kl": 0.0, "pairs": 0}
        grad_norms = []
        # one pass (inner_epochs is 1 for AWM): minibatch ``index`` > 0 compares against the rollout's weights
        for index, minibatch in enumerate(self.minibatch_rows(batch, kept, offset, len(traj))):
            count = self.dist.sum(len(minibatch))
            if count == 0:
                continue
            parts = self.update_parts(traj, minibatch, cfg.micro_batch, self.forward_draws,
                                      [generators[offset + int(i)] for i in minibatch])
            self.optimizer.zero_grad(set_to_none=True)
            for part in parts:
                with part.counted(self.model):  # a padding part's calls train nothing: not counted
                    loss = self.part_loss(part, scaled, rollout_weights if index > 0 else None)
                    (loss.total * part.scale / (count * k)).backward()
                    if not part.padding:  # a padding part records nothing
                        self._add_sums(sums, loss)
            grad_norms.append(self.optimizer_step())
            self.optimizer_steps += 1
        sums = self.dist.sum(sums)
        pairs = max(sums["pairs"], 1)
        self.log("kl_copy", sums["kl_copy"] / pairs)
        return {"clip_frac": sums["clipped"] / pairs, "approx_kl": sums["approx_kl"] / pairs, "kl": sums["kl"] / pairs,
                "ratio_mean": sums["ratio"] / pairs, "loss": sums["loss"] / pairs,
                "grad_norm": sum(grad_norms) / max(len(grad_norms), 1)}

    def _frozen_velocities(self, x_t: torch.Tensor, t: torch.Tensor, source: Trajectory, rows: torch.Tensor,
                           old_weights: OldPolicy | None) -> tuple[torch.Tensor | None, ...]:
        """(v_old, v_ref, v_copy): the velocities of the rollout's weights (``old_weights``, None: the current ones,
        not recomputed), the reference and the slowly updated copy, each None where unused. Run before the trained
        forward: swapping weights in must not meet a live graph."""
        cfg = self.config
        v_old = v_ref = v_copy = None
        with torch.no_grad():
            if old_weights is not None:
                with old_weights.swapped_in():
                    v_old = self._velocity(x_t, t, source, rows)
            if cfg.kl_beta > 0:
                with self.model.reference():
                    v_ref = self._velocity(x_t, t, source, rows)
            if cfg.ema_kl_beta > 0 and cfg.kl_beta > 0:  # nested in `if beta > 0` (:1330,1341)
                with self.kl_copy.swapped_in():
                    v_copy = self._velocity(x_t, t, source, rows)
        return v_old, v_ref, v_copy

    def part_loss(self, part: UpdatePart, scaled: torch.Tensor, old_weights: OldPolicy | None) -> AWMPartLoss:
        """The loss of one update part (``Algorithm.update_parts``): its samples' K times stacked as one batch,
        time-major as the release repeats its batch; the PPO-clipped advantage-weighted log-likelihood against
        ``old_weights`` (None: the current weights, detached) plus the KL terms."""
        cfg, k = self.config, self.config.train_timesteps
        source, rows, (times, noise) = part.source, part.rows, part.draws
        n = len(rows)
        x0 = part.x0.repeat(k, *([1] * (part.x0.dim() - 1)))
        t = times.T.reshape(-1).to(x0.device)
        eps = noise.transpose(0, 1).reshape(-1, *x0.shape[1:])
        s = t.reshape(-1, *([1] * (x0.dim() - 1)))
        x_t = (1 - s) * x0 + s * eps
        rep = rows.repeat(k)
        v_old, v_ref, v_copy = self._frozen_velocities(x_t, t, source, rep, old_weights)
        v = self._velocity(x_t, t, source, rep)
        log_prob = awm_log_prob(v, eps, x0, t, cfg.weighting, cfg.ghuber_power).reshape(k, n)
        if v_old is None:
            old = log_prob.detach()
        else:
            old = awm_log_prob(v_old, eps, x0, t, cfg.weighting, cfg.ghuber_power).reshape(k, n)
        adv = part.take(scaled)  # a padding row has none
        if cfg.loss_type == "exp_first":
            terms = ppo_clip_loss(log_prob, old, adv.double().expand(k, n), cfg.clip_range)
            policy = terms.loss.sum()
        else:  # sum_first: the ratio of the time-mean log-probs, one term per sample
            terms = ppo_clip_loss(log_prob.mean(0), old.mean(0), adv.double(), cfg.clip_range)
            policy = terms.loss.sum() * k  # weighted as k pairs, so that the loss is a mean over samples
        none = log_prob.new_zeros(k * n)  # a KL term that is off
        kl = awm_velocity_kl(v, v_ref, t, cfg.kl_form) if v_ref is not None else none
        kl_copy = awm_velocity_kl(v, v_copy, t, cfg.ema_kl_form) if v_copy is not None else none
        total = policy + cfg.kl_beta * kl.sum() + cfg.ema_kl_beta * kl_copy.sum()
        return AWMPartLoss(total, terms, log_prob, old, kl, kl_copy)

    @torch.no_grad()
    def _add_sums(self, sums: dict[str, float], loss: AWMPartLoss) -> None:
        """Add one part's loss to the update's sums (over its K x n pairs)."""
        k, n = loss.log_prob.shape
        sums["loss"] += float(loss.total)
        sums["kl"] += float(loss.kl.sum())
        sums["kl_copy"] += float(loss.kl_copy.sum())
        weight = k if self.config.loss_type == "sum_first" else 1
        sums["clipped"] += float(loss.terms.clipped.sum()) * weight
        sums["ratio"] += float(loss.terms.ratio.sum()) * weight
        sums["approx_kl"] += float(0.5 * ((loss.log_prob - loss.old) ** 2).sum())
        sums["pairs"] += k * n

    def after_update(self, traj: Trajectory, batch: GatheredBatch) -> None:
        decay = copy_decay(self.optimizer_steps, self.config.kl_ema_decay_type, self.config.kl_ema_decay)
        self.kl_copy.blend(decay)
        self.log("copy_decay", decay)

    def extra_state(self) -> dict[str, Any]:
        return {"kl_copy": self.kl_copy.state_dict(), "optimizer_steps": self.optimizer_steps}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if "kl_copy" not in state:
            raise FlowZooError("the checkpoint holds no AWM weight copy (was it written by another algorithm?)")
        self.kl_copy.load_state_dict(state["kl_copy"])
        self.optimizer_steps = int(state["optimizer_steps"])
