"""Flow-DPPO ("FlowDPPO: Divergence Proximal Policy Optimization for Flow Matching Models", arXiv 2606.11025;
released in Tencent-Hunyuan/UniRL at 1a7b501: ``unirl/algorithms/flowdppo.py``, ``FlowDPPO/README.md``,
``examples/diffusion/sd3_flowdppo.yaml``).

Flow-GRPO's SDE rollout and group-relative advantages, with PPO's ratio clip replaced by a trust region on the exact
KL between the old and new Gaussian step policies (equal std, so the KL is ``||mu_theta - mu_old||^2 / (2 std^2)``).
Per trained transition (``losses.dppo_kl_mask_loss``):

* the KL score: that KL averaged over the latent dims, i.e. the paper's KL divided by the dimension, as the release
  reduces it (flowdppo.py:92-93); the std is the release's (``kl_score_std: release``, ``losses.dppo_score_std``,
  flowdppo.py:358-368) or the step's own (``step``: the exact KL for any kernel);
* the term is dropped only when the score is at or above ``kl_mask_threshold`` (release default 1e-5,
  flowdppo.py:32) *and* the move is over-aggressive: ratio > 1 with A > 0, or ratio < 1 with A < 0 (flowdppo.py:96-107);
  a high-KL move back towards the old policy keeps its gradient;
* the loss is the mean of ``-A ratio`` over all trained transitions, the dropped ones counted as 0 (flowdppo.py:111,
  319), plus ``kl_beta`` times the KL to the reference as in Flow-GRPO (0 in the release's recipe).

The old policy's log-prob and Gaussian mean of each trained transition stay frozen over all minibatches and epochs of
an update: the log-probs are the rollout's (the release's default ``old_logp_source: rollout``), and so are the means
(``Trajectory.means``, recorded by the rollout). The release instead replays the trained steps once without gradients
at the pre-update weights before the first optimizer step (``prepare_segment``, flowdppo.py:219-266): the same values
to float rounding, without that replay's forward per trained transition (ours).

The release's recipe samples the SDE at only ``num_sde_steps`` 3 steps drawn among the first half of T = 10 (its
``AllSDEScheduler``, unirl/utils/scheduler_utils.py:86-124), Euler elsewhere, and trains those: ``sde_steps: k`` does
that here, k distinct steps drawn among the first ``int(T * timestep_fraction)`` each iteration, the same for every
sample (from a stream of (seed, iteration); the release seeds its draw with the rollout index alone). ``sde_steps``
null (the default) keeps Flow-GRPO's plan: every step stochastic, the first ``int(T * timestep_fraction)`` trained.

Logged per iteration: ``dppo_masked_frac`` (the fraction of trained transitions the mask dropped, over every
minibatch and epoch of the update; it is also the update's ``clip_frac``), ``dppo_kl_score_mean`` and
``dppo_kl_score_max`` (the KL score over the same transitions; the release's ``kl_new_old_mean/max``).

NFE per iteration (B samples, CFG factor c, E inner epochs, k = 2 if kl_beta > 0 else 1, w trained steps: the
``sde_steps`` drawn, else int(T * timestep_fraction)): sampling T * B * c, training E * k * c * B * w, as Flow-GRPO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import math

import torch

from flowzoo.algorithms import register
from flowzoo.algorithms.engine.base import Algorithm, AlgorithmConfig
from flowzoo.algorithms.engine.losses import DPPOTerms, dppo_kl_mask_loss, dppo_score_std
from flowzoo.algorithms.engine.plans import iteration_generator, random_steps_plan
from flowzoo.algorithms.engine.sde import StepOutput
from flowzoo.algorithms.engine.trajectory import StepPlan, Trajectory
from flowzoo.errors import ConfigError
from flowzoo.streams import PURPOSE_SDE_STEPS

#: the stds the KL score divides by (FlowDPPOConfig.kl_score_std)
SCORE_STDS = ("release", "step")


@dataclass
class FlowDPPOConfig(AlgorithmConfig):
    # a transition whose KL score is at or above it is dropped when its move is over-aggressive (flowdppo.py:32)
    kl_mask_threshold: float = 1e-5
    # the KL score's std: "release", sqrt(s / (1 - min(s, 0.99))) a sqrt(-dt) (flowdppo.py:358-368, the flow_grpo
    # kernel's std but at s = 1), or "step", the step's own std (the exact KL, any kernel)
    kl_score_std: Literal["release", "step"] = "release"
    # k: an SDE at k distinct steps drawn among the first int(T * timestep_fraction) per iteration, Euler elsewhere,
    # and only those trained (the release's recipe: 3 of the first 5); null: Flow-GRPO's plan
    sde_steps: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not math.isfinite(self.kl_mask_threshold) or self.kl_mask_threshold < 0:
            raise ConfigError(f"algorithm.kl_mask_threshold must be a finite number >= 0, got {self.kl_mask_threshold}")
        if self.kl_score_std not in SCORE_STDS:
            raise ConfigError(f"algorithm.kl_score_std must be one of {', '.join(SCORE_STDS)}, got "
                              f"{self.kl_score_std!r}")
        if self.kl_score_std == "release" and self.kernel != "flow_grpo":
            raise ConfigError(f"algorithm.kl_score_std release is the flow_grpo kernel's std (flowdppo.py:358-368); "
                              f"with kernel {self.kernel} use kl_score_std step")
        if self.sde_steps is not None and self.sde_steps < 1:
            raise ConfigError(f"algorithm.sde_steps must be a positive integer or null (every step), got "
                              f"{self.sde_steps}")

    def check_num_steps(self, num_steps: int) -> None:
        super().check_num_steps(num_steps)
        pool = max(1, int(num_steps * self.timestep_fraction))
        if self.sde_steps is not None and self.sde_steps > pool:
            raise ConfigError(f"algorithm.sde_steps {self.sde_steps} exceeds the first {pool} of {num_steps} steps it "
                              f"is drawn from (int(T * timestep_fraction {self.timestep_fraction}))")

    def inert_keys(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        inert = super().inert_keys()
        inert["clip_range"] = ("flow_dppo masks terms by the KL score; it clips no ratio", ())
        return inert


@register("flow_dppo")
class FlowDPPO(Algorithm):
    """Flow-DPPO: Flow-GRPO's rollout, the ratio clip replaced by a KL mask on over-aggressive moves."""

    Config = FlowDPPOConfig
    label, colormap = "Flow-DPPO", "BuGn"  # the report's name and colours of this family
    records_means = True
    diagnostics = {
        "dppo_masked_frac": "fraction of trained transitions the KL mask dropped (score >= threshold, over-aggressive)",
        "dppo_kl_score_mean": "mean KL score (old vs new step mean, over latent dims) of the trained transitions",
        "dppo_kl_score_max": "largest KL score of the update's trained transitions",
    }

    def step_plan(self, batch: int) -> StepPlan:
        """Flow-GRPO's plan, or with ``sde_steps`` an SDE only at that many steps drawn among the first
        int(T * timestep_fraction) (the same for every sample), each trained."""
        cfg = self.config
        if cfg.sde_steps is None:
            return super().step_plan(batch)
        pool = max(1, int(self.num_steps * cfg.timestep_fraction))
        gen = iteration_generator(self.seed, self.iteration, PURPOSE_SDE_STEPS)
        return random_steps_plan(self.sigmas, pool, cfg.sde_steps, batch, cfg.kernel, cfg.noise_level, gen)

    def score_std(self, traj: Trajectory, t: int | torch.Tensor, out: StepOutput) -> torch.Tensor:
        """[n] the std the KL score divides by (``kl_score_std``)."""
        if self.config.kl_score_std == "step":
            return out.std
        sigma, sigma_next = self._step_sigmas(traj, t, len(out.std))
        return dppo_score_std(sigma, sigma_next, traj.noise_level)

    def policy_terms(self, traj: Trajectory, rows: torch.Tensor, t: int | torch.Tensor, out: StepOutput,
                     old: torch.Tensor, advantages: torch.Tensor) -> DPPOTerms:
        old_mean = traj.means[rows, t.to(traj.means.device) if isinstance(t, torch.Tensor) else t]
        terms = dppo_kl_mask_loss(out.log_prob, old, out.mean, old_mean, advantages, self.score_std(traj, t, out),
                                  self.config.kl_mask_threshold)
        acc = self._mask_tally
        acc[0] += terms.clipped.sum()
        acc[1] += terms.score.double().sum()
        acc[2] = torch.maximum(acc[2], terms.score.double().max())
        acc[3] += len(rows)
        return terms

    def update(self, traj: Trajectory, advantages: torch.Tensor) -> dict[str, Any]:
        # [dropped, score sum, score max, transitions] on the device: read once, after the update
        self._mask_tally = torch.zeros(4, dtype=torch.float64, device=traj.log_probs.device)
        result = super().update(traj, advantages)
        dropped, score_sum, score_max, count = self._mask_tally.tolist()
        sums = self.dist.sum({"dropped": dropped, "score": score_sum, "count": count})
        n = max(sums["count"], 1)
        self.log("dppo_masked_frac", sums["dropped"] / n)
        self.log("dppo_kl_score_mean", sums["score"] / n)
        self.log("dppo_kl_score_max", max(self.dist.all_gather_object(score_max)))
        return result
