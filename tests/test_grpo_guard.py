"""GRPO-Guard against its release (yifan123/flow_grpo at 9745241, scripts/train_sd3_GRPO_Guard.py): the normalised
ratio, the re-weighted loss and its gradient against a hand transcription of the released lines (and that this check
fails on planted bugs), every optimizer step of a 2-minibatch update against the transcription, the recipe and the
config's refusal. Training on the SD3, FLUX and Qwen-Image adapters: tests/test_models_sd3.py,
test_models_flux.py, test_models_qwen_image.py; on 2 processes, replicated and sharded: tests/scale_matrix.py (every
algorithm, and a multi-minibatch variant of each)."""

from __future__ import annotations

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms.engine.losses import clipped_surrogate, gaussian_mean_kl, ratio_norm_loss
from flowzoo.algorithms.engine.sde import sigma_schedule
from flowzoo.benchmark.config import recipes
from flowzoo.errors import ConfigError
from flowzoo.models.toy2d import prompt_set
from tests.update_capture import capture_update, released_sde_step, set_weights


# ---- the released code, transcribed by hand ---------------------------------------------------------------------
def released_step_loss(log_prob, old_log_prob, prev_sample_mean, old_prev_sample_mean, advantages, std_dev_t, sqrt_dt,
                       clip_range, adv_clip_max=5.0):
    """One trained step j of one minibatch, train_sd3_GRPO_Guard.py:909-932 (config.rationorm True, beta 0):
    ``std_dev_t`` and ``sqrt_dt`` as sde_step_with_logprob returns them ([B, 1, ...], one value: every row at step j);
    the metrics it logs that the zoo logs too (:945-950)."""
    advantages = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    sigma_t = std_dev_t.mean()
    ratio_mean_bias = (prev_sample_mean - old_prev_sample_mean).pow(2).mean(dim=tuple(range(1, prev_sample_mean.ndim)))
    ratio_mean_bias = ratio_mean_bias / (2 * (sqrt_dt.mean() * sigma_t) ** 2)
    ratio = torch.exp((log_prob - old_log_prob + ratio_mean_bias) * (sqrt_dt.mean() * sigma_t))
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    policy_loss = torch.mean(torch.maximum(unclipped_loss, clipped_loss))
    policy_loss = policy_loss / (sqrt_dt.mean() ** 2)
    clipfrac = torch.mean((torch.abs(ratio - 1.0) > clip_range).float())
    return policy_loss, clipfrac


# ---- the loss on fixed tensors, and planted bugs ------------------------------------------------------------------
SIGMAS = sigma_schedule(10, 3.0)
STEPS = [0, 3, 8]
NOISE = 0.7
CLIP = 0.005


def fixed_case(seed: int = 0):
    """Per step j of STEPS: a batch of 6 transitions scored under an old and a moved policy (the same recorded
    samples), both through the released SDE step; the advantages."""
    gen = torch.Generator().manual_seed(seed)
    b = 6
    cases = []
    for t in STEPS:
        sigma, sigma_next = SIGMAS[t].expand(b), SIGMAS[t + 1].expand(b)
        x = torch.randn(b, 2, 3, 3, generator=gen)
        v_old = torch.randn(b, 2, 3, 3, generator=gen)
        v = (v_old + 0.3 * torch.randn(b, 2, 3, 3, generator=gen)).requires_grad_(True)
        _, old_mean, std_dev_t, sqrt_dt = released_sde_step(v_old, x, x, sigma, sigma_next, SIGMAS[1], NOISE)
        prev = old_mean + std_dev_t * sqrt_dt * torch.randn(b, 2, 3, 3, generator=gen)
        old_logp, old_mean, _, _ = released_sde_step(v_old, x, prev, sigma, sigma_next, SIGMAS[1], NOISE)
        cases.append((t, x, prev, v, old_logp, old_mean))
    advantages = torch.tensor([1.5, -0.7, 0.2, -2.0, 6.0, -0.1])
    return cases, advantages


def assert_matches_release(loss_fn=ratio_norm_loss) -> float:
    """The zoo's loss (one chunk per step, summed over the transitions and divided by their number, as
    Algorithm.update) and its gradient against the release's: accelerate averages the steps' accumulated losses
    (train_sd3_GRPO_Guard.py:357-363,901), so the minibatch's loss is the mean of the per-step losses."""
    cases, advantages = fixed_case()
    ours, released, pairs, clipped, released_clip = 0.0, 0.0, 0, 0, []
    velocities = [v for _, _, _, v, _, _ in cases]
    for t, x, prev, v, old_logp, old_mean in cases:
        b = len(x)
        sigma, sigma_next = SIGMAS[t].expand(b), SIGMAS[t + 1].expand(b)
        logp, mean, std_dev_t, sqrt_dt = released_sde_step(v, x, prev, sigma, sigma_next, SIGMAS[1], NOISE)
        step_std = (std_dev_t * sqrt_dt).reshape(-1)
        terms = loss_fn(logp, old_logp, mean, old_mean, advantages.clamp(-5, 5), step_std, sigma_next - sigma, CLIP)
        ours = ours + terms.loss.sum()
        pairs += b
        clipped += int(terms.clipped.sum())
        loss, clipfrac = released_step_loss(logp, old_logp, mean, old_mean, advantages, std_dev_t, sqrt_dt, CLIP)
        released = released + loss / len(cases)
        released_clip.append(float(clipfrac))
    ours = ours / pairs
    torch.testing.assert_close(ours, released, rtol=1e-5, atol=0)
    assert clipped / pairs == pytest.approx(sum(released_clip) / len(released_clip))
    g_ours = torch.autograd.grad(ours, velocities, retain_graph=True)
    g_released = torch.autograd.grad(released, velocities)
    for a, b in zip(g_ours, g_released):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7 * float(b.abs().max()))
    return clipped / pairs


def test_loss_clip_fraction_and_gradient_equal_the_released_lines():
    assert 0.2 < assert_matches_release() < 0.8  # the case exercises the clip, neither none nor all of it


def _no_mean_shift_correction(log_prob, old, mean, old_mean, adv, std, dt, clip_range, reduction="mean"):
    terms = clipped_surrogate(torch.exp((log_prob - old) * std), adv, clip_range)
    return terms._replace(loss=terms.loss / (-dt))


def _unscaled_log_ratio(log_prob, old, mean, old_mean, adv, std, dt, clip_range, reduction="mean"):
    bias = gaussian_mean_kl(mean, old_mean, std, reduction)
    terms = clipped_surrogate(torch.exp(log_prob - old + bias), adv, clip_range)
    return terms._replace(loss=terms.loss / (-dt))


def _reweighted_by_sqrt_dt(log_prob, old, mean, old_mean, adv, std, dt, clip_range, reduction="mean"):
    terms = ratio_norm_loss(log_prob, old, mean, old_mean, adv, std, dt, clip_range, reduction)
    return terms._replace(loss=terms.loss * (-dt) / torch.sqrt(-dt))


def _no_reweighting(log_prob, old, mean, old_mean, adv, std, dt, clip_range, reduction="mean"):
    terms = ratio_norm_loss(log_prob, old, mean, old_mean, adv, std, dt, clip_range, reduction)
    return terms._replace(loss=terms.loss * (-dt))


def _bias_with_a_detached_mean(log_prob, old, mean, old_mean, adv, std, dt, clip_range, reduction="mean"):
    return ratio_norm_loss(log_prob, old, mean.detach(), old_mean, adv, std, dt, clip_range, reduction)


PLANTED = {
    "no mean-shift correction": _no_mean_shift_correction,
    "the log-ratio not scaled by the step's std": _unscaled_log_ratio,
    "re-weighted by 1 / sqrt(-dt)": _reweighted_by_sqrt_dt,
    "no gradient re-weighting": _no_reweighting,
    "the correction without its gradient": _bias_with_a_detached_mean,
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_the_parity_check_fails_on_a_planted_bug(bug):
    with pytest.raises(AssertionError):
        assert_matches_release(PLANTED[bug])


def test_the_normalised_ratio_is_one_on_policy():
    cases, advantages = fixed_case()
    t, x, prev, v, old_logp, old_mean = cases[1]
    terms = ratio_norm_loss(old_logp, old_logp, old_mean, old_mean, advantages, torch.full((6,), 0.3),
                            torch.full((6,), -0.1), CLIP)
    assert terms.ratio.tolist() == [1.0] * 6 and not terms.clipped.any()
    torch.testing.assert_close(terms.loss, -advantages / 0.1)


# ---- one update against the transcription -----------------------------------------------------------------------
TOY = {"group_size": 4, "lr": 1e-2, "kl_beta": 0.0, "minibatches": 2, "minibatch_order": "grouped", "max_grad_norm": 0.0,
       "clip_range": 0.05}


def released_update_gradients(alg, captured):
    """Each optimizer step's gradient as the release takes it: the old log-probs and means recorded while sampling
    (train_sd3_GRPO_Guard.py:645-684, the pre-update weights: replayed here without gradients), then per minibatch
    the mean of the per-step losses of :909-932 at that step's weights."""
    model, traj, adv = alg.model, captured.traj, captured.advantages
    params = model.trainable_parameters()
    steps = traj.train.any(0).nonzero().flatten().tolist()
    sigmas = traj.sigmas.float()

    def step(rows, t):
        n = len(rows)
        v = model.velocity(traj.latents[rows, t], sigmas[t].expand(n), traj.cond.index(rows), traj.guidance)
        return released_sde_step(v, traj.latents[rows, t], traj.latents[rows, t + 1], sigmas[t].expand(n),
                                 sigmas[t + 1].expand(n), sigmas[1], traj.noise_level)

    everyone = torch.arange(len(traj))
    set_weights(params, captured.before)
    with torch.no_grad():
        old = {t: step(everyone, t)[1] for t in steps}
    grads, clipfracs = [], []
    for (weights, _), rows in zip(captured.steps, everyone.chunk(alg.config.minibatches)):
        set_weights(params, weights)
        loss = 0.0
        for t in steps:
            logp, mean, std_dev_t, sqrt_dt = step(rows, t)
            part, clipfrac = released_step_loss(logp, traj.log_probs[rows, t], mean, old[t][rows], adv[rows],
                                                std_dev_t, sqrt_dt, alg.config.clip_range, alg.config.adv_clip)
            loss = loss + part / len(steps)
            clipfracs.append(float(clipfrac))
        grads.append(torch.autograd.grad(loss, params))
    return grads, clipfracs


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-step"])
def test_every_optimizer_step_of_an_update_equals_the_release(fused):
    pairs = prompt_set()
    prompts, metadata = [p for p, _ in pairs], [m for _, m in pairs]
    model = models.get("toy2d")(hidden=32, pretrain_steps=50)
    model.fused_update = fused
    alg = algorithms.get("grpo_guard")(model, rewards.build("toy_mode"), TOY, seed=0)
    alg.step(prompts, metadata)
    captured = capture_update(alg, prompts, metadata)
    assert len(captured.steps) == 2
    grads, clipfracs = released_update_gradients(alg, captured)
    for (_, ours), released in zip(captured.steps, grads):
        flat_ours, flat_released = torch.cat([g.flatten() for g in ours]), torch.cat([g.flatten() for g in released])
        assert float(flat_released.norm()) > 1e-6
        torch.testing.assert_close(flat_ours, flat_released, rtol=1e-4, atol=1e-5 * float(flat_released.abs().max()))
    assert captured.stats.clip_frac == pytest.approx(sum(clipfracs) / len(clipfracs), abs=1e-9)
    assert captured.stats.clip_frac > 0  # the second minibatch moved off the anchor past the clip


def test_the_flow_grpo_gradient_differs():
    # the same iteration under Flow-GRPO: GRPO-Guard is not Flow-GRPO under another name
    pairs = prompt_set()
    prompts, metadata = [p for p, _ in pairs], [m for _, m in pairs]
    grads = []
    for name in ("flow_grpo", "grpo_guard"):
        model = models.get("toy2d")(hidden=32, pretrain_steps=50)
        alg = algorithms.get(name)(model, rewards.build("toy_mode"), TOY, seed=0)
        captured = capture_update(alg, prompts, metadata)
        grads.append(torch.cat([g.flatten() for g in captured.steps[0][1]]))
    assert float((grads[0] - grads[1]).norm()) > 0.1 * float(grads[0].norm())


def test_the_recipe_is_the_released_config():
    ocr, pickscore = recipes.recipe("grpo_guard", "sd3_ocr", "sd3"), recipes.recipe("grpo_guard", "sd3_pickscore", "sd3")
    assert (ocr["clip_range"], pickscore["clip_range"], ocr["lr"], ocr["kl_beta"]) == (2e-6, 4e-6, 1e-4, 0.0)
    assert (ocr["adv_std"], ocr["group_size"], ocr["minibatches"], ocr["cfg_grad"]) == ("group", 24, 2, "both")
    algorithms.get("grpo_guard").typed_config(ocr).check_num_steps(10)


def test_another_kernel_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match="algorithm.kernel must be flow_grpo for grpo_guard") as error:
        algorithms.get("grpo_guard").typed_config({"kernel": "cps"})
    assert "\n" not in str(error.value)


# ---- NFE and learning on the toy tier ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", [{}, {"guidance": 2.5, "kl_beta": 0.04, "inner_epochs": 2}])
def test_measured_nfe_is_flow_grpos(toy_model, toy_prompts, variant):
    config = {"group_size": 3, **variant}
    measured = []
    for name in ("flow_grpo", "grpo_guard"):
        alg = algorithms.get(name)(toy_model, rewards.build("toy_mode"), config, seed=0)
        measured.append([(s.nfe_sampling, s.nfe_training) for s in (alg.step(*toy_prompts) for _ in range(2))])
    assert measured[0] == measured[1] and measured[0][0][1] > 0


def test_raises_the_toy_reward(toy_model, toy_prompts):
    prompts, meta = toy_prompts
    alg = algorithms.get("grpo_guard")(toy_model, rewards.build("toy_mode"),
                                       {"lr": 1e-3, "kl_beta": 0.0, "clip_range": 0.2, "minibatches": 2}, seed=0)
    seen = [alg.step(prompts * 2, meta * 2).reward_mean for _ in range(20)]
    first, last = sum(seen[:3]) / 3, sum(seen[-3:]) / 3
    assert last > first + 0.15, f"batch reward {first:.3f} -> {last:.3f}"
