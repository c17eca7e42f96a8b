"""GRPO-Guard ("GRPO-Guard: Mitigating Implicit Over-Optimization in Flow Matching via Regulated Clipping",
arXiv 2510.22319; released in yifan123/flow_grpo at 9745241, 2025-11-04: ``scripts/train_sd3_GRPO_Guard.py`` with
``config/grpo_guard.py``, run by ``scripts/multi_node/sd3_grpo_guard.sh``).

Flow-GRPO with the per-step importance ratio normalised and the steps' gradients re-weighted, which the release
switches on together with one flag (``config.rationorm``, grpo_guard.py:79; with it off the script trains as
Flow-GRPO). Per trained transition, with ``std`` the step's std (std_t sqrt(-dt)) and ``dt = sigma_next - sigma``
(train_sd3_GRPO_Guard.py:915-932, ``losses.ratio_norm_loss``):

* RatioNorm: ``r = exp((log pi_theta - log pi_old + b) std)``, where ``b = ||mu_theta - mu_old||^2 / (2 std^2)``
  (averaged over latent dims, as the log-probs) removes the ratio's mean shift and the factor ``std`` equalises its
  spread across steps; PPO's clip then acts on ``r``;
* gradient re-weighting: the step's clipped surrogate divided by ``-dt`` (the release's ``sqrt_dt ** 2``).

``mu_old`` is the behaviour policy's mean of the transition, recorded by the rollout (``Trajectory.means``) as the
release records ``prev_sample_mean`` while sampling (train_sd3_GRPO_Guard.py:645-684). The KL to the reference (0 in
the released configs) is added unscaled, as in Flow-GRPO. The release's config also sets ``train.highclip_range``,
which its script never reads: the clip is symmetric. The release writes the normalisation for the ``sde`` kernel
only (its ``sd3_sde_with_logprob``), so ``kernel`` must be ``flow_grpo``.

NFE: Flow-GRPO's (the means are recorded while sampling; no extra forward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flowzoo.algorithms import register
from flowzoo.algorithms.engine.base import AlgorithmConfig
from flowzoo.algorithms.methods.flow_grpo import FlowGRPO
from flowzoo.algorithms.engine.losses import PPOTerms, ratio_norm_loss
from flowzoo.algorithms.engine.sde import StepOutput
from flowzoo.algorithms.engine.trajectory import Trajectory
from flowzoo.errors import ConfigError


@dataclass
class GRPOGuardConfig(AlgorithmConfig):
    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kernel != "flow_grpo":
            raise ConfigError(f"algorithm.kernel must be flow_grpo for grpo_guard (its ratio normalisation is the "
                              f"release's for that SDE, train_sd3_GRPO_Guard.py:915-932), got {self.kernel}")


@register("grpo_guard")
class GRPOGuard(FlowGRPO):
    """GRPO-Guard: Flow-GRPO with normalised step ratios (RatioNorm) and 1 / dt re-weighted step losses."""

    Config = GRPOGuardConfig
    records_means = True

    def policy_terms(self, traj: Trajectory, rows: torch.Tensor, t: int | torch.Tensor, out: StepOutput,
                     old: torch.Tensor, advantages: torch.Tensor) -> PPOTerms:
        old_mean = traj.means[rows, t.to(traj.means.device) if isinstance(t, torch.Tensor) else t]
        sigma, sigma_next = self._step_sigmas(traj, t, len(rows))
        return ratio_norm_loss(out.log_prob, old, out.mean, old_mean, advantages, out.std, sigma_next - sigma,
                               self.config.clip_range, traj.reduction)
