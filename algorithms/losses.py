"""The loss math of GRPO-style training, as pure functions.

PPO-clip (Schulman et al. 2017) per (sample, step): ``max(-A r, -A clip(r, 1 - eps, 1 + eps))`` with
``r = exp(log pi_theta - log pi_old)``. KL to the frozen reference between two Gaussians of equal std:
``||mu_theta - mu_ref||^2 / (2 std^2)`` (averaged over latent dims, as Flow-GRPO does). OP-GRPO's sequence-level
importance weight ``w = prod_t p_old / p_off = exp(sum_t (log p_old - log p_off))`` over the reused steps.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from algorithms.sde import reduce_latent_dims

KL_VARIANCES = ("step", "release")


class PPOTerms(NamedTuple):
    loss: torch.Tensor  # [N] per-element clipped surrogate loss (to minimise)
    ratio: torch.Tensor  # [N] pi_theta / pi_old
    clipped: torch.Tensor  # [N] bool: |ratio - 1| > clip_range


def ppo_clip_loss(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, clip_range: float
) -> PPOTerms:
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return PPOTerms(torch.maximum(unclipped, clipped), ratio, (ratio - 1.0).abs().detach() > clip_range)


def approx_kl(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """0.5 E[(log pi_theta - log pi_old)^2], the k2 estimator logged by Flow-GRPO."""
    return 0.5 * ((log_prob - old_log_prob) ** 2).mean()


def kl_std(
    step_std: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor, variance: str, kind: str = "flow_grpo"
) -> torch.Tensor:
    """The std used in the KL term.

    ``step``: the step's own std (std_t sqrt(-dt) for the ``flow_grpo`` kernel), so the KL is the true KL between
    the two Gaussian transitions. ``release``: the std the released Flow-GRPO code divides by, its ``std_dev_t``
    (yifan123/flow_grpo flow_grpo/diffusers_patch/sd3_sde_with_logprob.py:47, used at scripts/train_sd3.py:895).
    For the ``flow_grpo`` kernel that is std_t without the sqrt(-dt) factor of the step; since dividing by std^2
    makes the KL inversely proportional to the variance, the ``release`` KL is then (-dt) times the ``step`` KL
    (smaller, -dt < 1): the ``step`` form is 1/(-dt) times stronger at the same beta (4-25x over the trained steps
    at T = 10, shift 3). For the ``cps`` kernel the released ``std_dev_t`` is the step's std itself
    (sigma_next sin(a pi / 2), the ``cps`` branch of that file), so both forms agree; for ``dance_grpo`` (whose
    released code has no KL) ``release`` is eta, the step std without sqrt(-dt), by analogy with ``flow_grpo``."""
    if variance not in KL_VARIANCES:
        raise ValueError(f"unknown kl_variance {variance!r}; known: {', '.join(KL_VARIANCES)}")
    if variance == "step" or kind == "cps":
        return step_std
    return step_std / torch.sqrt(sigma - sigma_next)


def gaussian_mean_kl(
    mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """KL(N(mean, std^2) || N(ref_mean, std^2)) per sample [B], averaged (or summed) over the non-batch dims."""
    return reduce_latent_dims((mean - ref_mean) ** 2, reduction) / (2 * std**2)


def sequence_log_weight(log_p_old: torch.Tensor, log_p_off: torch.Tensor, reused: torch.Tensor) -> torch.Tensor:
    """log w = sum over reused steps of (log p_old - log p_off), per sample [B] (OP-GRPO, arXiv 2604.04142)."""
    return ((log_p_old - log_p_off) * reused.to(log_p_old.dtype)).sum(dim=1)
