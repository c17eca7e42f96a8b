"""The loss math of GRPO-style training, as pure functions.

PPO-clip (Schulman et al. 2017) per (sample, step): ``max(-A r, -A clip(r, 1 - eps, 1 + eps))`` with
``r = exp(log pi_theta - log pi_old)``. KL to the frozen reference between two Gaussians of equal std:
``||mu_theta - mu_ref||^2 / (2 std^2)`` (averaged over latent dims, as Flow-GRPO does). OP-GRPO's sequence-level
importance weight ``w = prod_t p_old / p_off = exp(sum_t (log p_old - log p_off))`` over the reused steps.
Flow-DPPO's KL-masked surrogate (``dppo_kl_mask_loss``) and GRPO-Guard's normalised ratio (``ratio_norm_loss``).
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

import torch

from flowzoo.algorithms.engine.sde import reduce_latent_dims

KLVariance = Literal["step", "release"]
KL_VARIANCES = get_args(KLVariance)


class PPOTerms(NamedTuple):
    loss: torch.Tensor  # [N] per-element clipped surrogate loss (to minimise)
    ratio: torch.Tensor  # [N] pi_theta / pi_old
    clipped: torch.Tensor  # [N] bool: |ratio - 1| > clip_range


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip_range: float) -> PPOTerms:
    """PPO's ``max(-A r, -A clip(r, 1 - eps, 1 + eps))`` of a given ratio ``r``, per element."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return PPOTerms(torch.maximum(unclipped, clipped), ratio, (ratio - 1.0).abs().detach() > clip_range)


def binding_clips(ratio: torch.Tensor, advantages: torch.Tensor, clip_range: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Where PPO's clip binds (the clipped branch of :func:`clipped_surrogate` is the larger loss, so the term has no
    gradient), by the advantage's sign: (A > 0 and r > 1 + eps, A < 0 and r < 1 - eps), bool per element. GRPO-Guard
    (arXiv 2510.22319) argues that Flow-GRPO's ratio drifts below 1, so the clip binds on negative advantages and
    rarely on positive ones; the update logs the two fractions (``clip_frac_pos_adv``, ``clip_frac_neg_adv``)."""
    ratio, advantages = ratio.detach(), advantages.detach()
    return (advantages > 0) & (ratio > 1.0 + clip_range), (advantages < 0) & (ratio < 1.0 - clip_range)


def ppo_clip_loss(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, clip_range: float
) -> PPOTerms:
    return clipped_surrogate(torch.exp(log_prob - old_log_prob), advantages, clip_range)


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
    # the plan's sigmas live on the host (StepPlan); the KL is computed on the step's device
    return step_std / torch.sqrt(sigma.to(step_std.device) - sigma_next.to(step_std.device))


def gaussian_mean_kl(
    mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """KL(N(mean, std^2) || N(ref_mean, std^2)) per sample [B], averaged (or summed) over the non-batch dims."""
    return reduce_latent_dims((mean - ref_mean) ** 2, reduction) / (2 * std**2)


class DPPOTerms(NamedTuple):
    loss: torch.Tensor  # [N] -A r, 0 where the KL mask drops the term (to minimise)
    ratio: torch.Tensor  # [N] pi_theta / pi_old
    clipped: torch.Tensor  # [N] bool: dropped by the KL mask (the update counts it as its clip fraction)
    score: torch.Tensor  # [N] the KL score, detached


def dppo_score_std(sigma: torch.Tensor, sigma_next: torch.Tensor, noise_level: float) -> torch.Tensor:
    """The std Flow-DPPO's release divides its KL score by: ``sqrt(s / (1 - min(s, 0.99))) a sqrt(-dt)``
    (Tencent-Hunyuan/UniRL unirl/algorithms/flowdppo.py:358-368 at 1a7b501). It is the ``flow_grpo`` kernel's step
    std but at s = 1, where the kernel divides by 1 - sigma_1 (algorithms/engine/sde.py flow_grpo_std, as UniRL's own
    sampler, unirl/models/sd3/diffusion.py:363) and the score by 1 - 0.99."""
    sigma, sigma_next = sigma.float(), sigma_next.float()
    return torch.sqrt(sigma / (1.0 - torch.clamp(sigma, max=0.99))) * noise_level * torch.sqrt(sigma - sigma_next)


def dppo_kl_mask_loss(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, mean: torch.Tensor, old_mean: torch.Tensor,
    advantages: torch.Tensor, std: torch.Tensor, threshold: float,
) -> DPPOTerms:
    """Flow-DPPO's KL-masked surrogate per transition (arXiv 2606.11025 Eq. 14, 18; flowdppo.py:43-138 at 1a7b501).

    ``score = mean over latent dims of (mean - old_mean)^2 / (2 std^2)``: the KL between the new and old Gaussian
    steps of equal std, divided by the latent dimension (the release's mean reduction, flowdppo.py:92-93). A term is
    dropped when ``score >= threshold`` and the move is over-aggressive: ``r > 1`` with ``A > 0`` or ``r < 1`` with
    ``A < 0``; otherwise it is the unclipped ``-A r``. The mask carries no gradient."""
    ratio = torch.exp(log_prob - old_log_prob)
    advantages = advantages.detach()
    score = gaussian_mean_kl(mean.detach(), old_mean, std, "mean").detach()
    aggressive = ((ratio > 1.0) & (advantages > 0)) | ((ratio < 1.0) & (advantages < 0))
    dropped = ((score >= threshold) & aggressive).detach()
    loss = torch.where(dropped, torch.zeros_like(ratio), -advantages * ratio)
    return DPPOTerms(loss, ratio, dropped, score)


def ratio_norm_loss(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, mean: torch.Tensor, old_mean: torch.Tensor,
    advantages: torch.Tensor, std: torch.Tensor, dt: torch.Tensor, clip_range: float, reduction: str = "mean",
) -> PPOTerms:
    """GRPO-Guard's per-transition loss (arXiv 2510.22319; yifan123/flow_grpo scripts/train_sd3_GRPO_Guard.py:915-932
    at 9745241): RatioNorm, ``r = exp((log pi_theta - log pi_old + b) std)`` with the mean-shift correction
    ``b = ||mean - old_mean||^2 / (2 std^2)`` reduced over latent dims as the log-probs are (the release: mean), then
    PPO's clipped surrogate of ``r``, re-weighted by ``1 / (-dt)`` (the release divides the step's loss by
    ``sqrt(-dt)^2``). ``std`` is the step's std (std_t sqrt(-dt)), ``dt = sigma_next - sigma`` (negative)."""
    bias = gaussian_mean_kl(mean, old_mean, std, reduction)
    terms = clipped_surrogate(torch.exp((log_prob - old_log_prob + bias) * std), advantages, clip_range)
    return terms._replace(loss=terms.loss / (-dt))


def sequence_log_weight(log_p_old: torch.Tensor, log_p_off: torch.Tensor, reused: torch.Tensor) -> torch.Tensor:
    """log w = sum over reused steps of (log p_old - log p_off), per sample [B] (OP-GRPO, arXiv 2604.04142)."""
    return ((log_p_old - log_p_off) * reused.to(log_p_old.dtype)).sum(dim=1)


class NFTTerms(NamedTuple):
    loss: torch.Tensor  # [B] adv_clip_max * policy + kl_beta * kl, the per-sample loss (to minimise; float64)
    policy: torch.Tensor  # [B] r L+ / beta + (1 - r) L- / beta (the release's ``ori_policy_loss``)
    kl: torch.Tensor  # [B] mean over latent dims of (v_theta - v_ref)^2
    r: torch.Tensor  # [B] the optimality weight


def nft_optimality(advantages: torch.Tensor, adv_clip_max: float) -> torch.Tensor:
    """DiffusionNFT's r = clamp(clamp(A, -m, m) / m / 2 + 1/2, 0, 1) with m = ``adv_clip_max``: 1 for the best samples,
    0 for the worst, 1/2 for an advantage of 0 (NVlabs/DiffusionNFT scripts/train_nft_sd3.py:910-929)."""
    clipped = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    return torch.clamp(clipped / adv_clip_max / 2.0 + 0.5, 0, 1)


def _adaptive_x0_loss(x0_prediction: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """mean((x0_hat - x0)^2) / sg(mean|x0_hat - x0|) per sample (the weight in float64, floored at 1e-5)."""
    dims = tuple(range(1, x0.dim()))
    with torch.no_grad():
        weight = (x0_prediction.double() - x0.double()).abs().mean(dim=dims, keepdim=True).clip(min=0.00001)
    return ((x0_prediction - x0) ** 2 / weight).mean(dim=dims)


def nft_loss(
    v: torch.Tensor, v_old: torch.Tensor, v_ref: torch.Tensor | None, x_t: torch.Tensor, x0: torch.Tensor,
    sigma: torch.Tensor, advantages: torch.Tensor, beta: float, adv_clip_max: float, kl_beta: float,
) -> NFTTerms:
    """DiffusionNFT's per-sample loss on the forward-noised ``x_t = (1 - sigma) x0 + sigma eps`` (Zheng et al.,
    arXiv 2509.16117; NVlabs/DiffusionNFT scripts/train_nft_sd3.py:927-970 at 24af555).

    The implicit positive policy ``v+ = beta v + (1 - beta) v_old`` and negative ``v- = (1 + beta) v_old - beta v``
    (``v_old`` the old policy's velocity, no gradient) give data predictions ``x_t - sigma v+-``; each is scored by
    its squared error to x0 divided by the (gradient-free) mean absolute error, the adaptive weighting. With
    ``r = nft_optimality(A)``: policy = r L+ / beta + (1 - r) L- / beta; loss = adv_clip_max policy + kl_beta KL,
    KL = mean (v - v_ref)^2 (``v_ref`` the frozen reference; None with ``kl_beta`` 0, KL reported as 0)."""
    dims = tuple(range(1, x0.dim()))
    sigma = sigma.reshape(-1, *([1] * (x0.dim() - 1))).to(x_t.dtype)
    v_old = v_old.detach()
    positive = beta * v + (1 - beta) * v_old
    negative = (1.0 + beta) * v_old - beta * v
    positive_loss = _adaptive_x0_loss(x_t - sigma * positive, x0)
    negative_loss = _adaptive_x0_loss(x_t - sigma * negative, x0)
    r = nft_optimality(advantages, adv_clip_max).to(positive_loss.dtype)
    policy = r * positive_loss / beta + (1.0 - r) * negative_loss / beta
    if v_ref is None:
        kl = v.new_zeros(len(v))
    else:
        kl = ((v - v_ref.detach()) ** 2).mean(dim=dims)
    return NFTTerms(policy * adv_clip_max + kl_beta * kl, policy, kl, r)


#: AWM's per-timestep weightings of the flow-matching error (the release's ``train.weighting``)
AWMWeighting = Literal["uniform", "t", "t_squared", "huber", "ghuber"]
AWM_WEIGHTINGS = get_args(AWMWeighting)


def awm_log_prob(
    v: torch.Tensor, noise: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, weighting: str = "ghuber",
    ghuber_power: float = 0.25,
) -> torch.Tensor:
    """AWM's surrogate log-likelihood of a clean sample at time t (Xue et al., arXiv 2509.25050;
    scxue/advantage_weighted_matching scripts/train_sd3_awm.py:234-252 at be51372), per sample [B], float64.

    ``e = mean((v - (eps - x0))^2)`` is the flow-matching error of the velocity at x_t = (1 - t) x0 + t eps; the
    log-prob is ``-e`` (``uniform``), ``-e t``, ``-e t^2``, ``-(sqrt(e + 1e-10) - 1e-5) t`` (``huber``) or
    ``-((e + 1e-10)^p - (1e-10)^p) t / p`` (``ghuber``, p = ``ghuber_power``)."""
    if weighting not in AWM_WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; known: {', '.join(AWM_WEIGHTINGS)}")
    dims = tuple(range(1, v.dim()))
    log_prob = (-((v.double() - (noise.double() - x0.double())) ** 2)).mean(dim=dims)
    t = t.reshape(-1)
    if weighting == "t":
        return log_prob * t
    if weighting == "t_squared":
        return log_prob * t**2
    if weighting == "huber":
        return -(torch.sqrt(-log_prob + 1e-10) - 1e-5) * t
    if weighting == "ghuber":
        floor = torch.pow(torch.tensor(1e-10, dtype=log_prob.dtype, device=log_prob.device), ghuber_power)
        return -(torch.pow(-log_prob + 1e-10, ghuber_power) - floor) * t / ghuber_power
    return log_prob


def awm_advantages(advantages: torch.Tensor, adv_clip_max: float, advantage_max: float | None) -> torch.Tensor:
    """clamp(A, -m, m), rescaled to +-``advantage_max`` when it is set (train_sd3_awm.py:1293-1299)."""
    clipped = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    return clipped if advantage_max is None else clipped / adv_clip_max * advantage_max


def awm_velocity_kl(v: torch.Tensor, v_other: torch.Tensor, t: torch.Tensor, form: str = "uniform") -> torch.Tensor:
    """mean over latent dims of (v - v_other)^2, or divided by 2 std_t^2 with std_t = 0.7 sqrt(t / (1 - min(t, .99)))
    (``elbo``), per sample [B] (train_sd3_awm.py:236,1334-1348)."""
    dims = tuple(range(1, v.dim()))
    kl = ((v.double() - v_other.double()) ** 2).mean(dim=dims)
    if form == "elbo":
        std = torch.sqrt(t.reshape(-1) / (1 - torch.clamp(t.reshape(-1), 0, 0.99))) * 0.7
        return kl / (2 * std**2)
    if form != "uniform":
        raise ValueError(f"unknown KL form {form!r}; known: uniform, elbo")
    return kl
