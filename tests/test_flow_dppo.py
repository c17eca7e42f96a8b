"""Flow-DPPO against its release (Tencent-Hunyuan/UniRL at 1a7b501, unirl/algorithms/flowdppo.py): the KL score,
the mask, the loss and its gradient against a hand transcription of the released lines (and that this check fails on
planted bugs), every optimizer step of a 2-epoch x 2-minibatch update against the transcription with the old policy
frozen at the pre-update weights, the logged diagnostics, the sparse SDE plan, the advantages' normalisation and the
config's refusals. Training on the SD3, FLUX and Qwen-Image adapters: tests/test_models_sd3.py,
test_models_flux.py, test_models_qwen_image.py; on 2 processes, replicated and sharded: tests/scale_matrix.py (every
algorithm, and a multi-minibatch variant of each)."""

from __future__ import annotations

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms.engine.advantages import group_advantages
from flowzoo.algorithms.engine.losses import dppo_kl_mask_loss, dppo_score_std, gaussian_mean_kl
from flowzoo.algorithms.engine.sde import sigma_schedule
from flowzoo.benchmark.config import recipes
from flowzoo.errors import ConfigError
from flowzoo.models.toy2d import prompt_set
from tests.update_capture import capture_update, released_sde_step, set_weights


# ---- the released code, transcribed by hand ---------------------------------------------------------------------
def released_gaussian_kl_div(p, q, sigma):
    """_gaussian_kl_div, flowdppo.py:43-51."""
    return (p - q) ** 2 / (2 * sigma**2)


def released_kl_adv_loss(new_logp, old_logp, new_means, old_means, advantages, sigma_t, kl_mask_threshold):
    """_flowdppo_kl_adv_loss, flowdppo.py:54-138 ([B, S'] log-probs, [B, S', ...] means); the metrics it logs that
    the zoo logs too."""
    log_diff = new_logp - old_logp
    ratio = torch.exp(log_diff)
    adv = advantages.detach()
    unclipped_loss = -adv * ratio
    kl_per_elem = released_gaussian_kl_div(new_means, old_means, sigma_t)
    kl_per_sample = kl_per_elem.mean(dim=tuple(range(2, kl_per_elem.ndim)))
    kl_mask = kl_per_sample < kl_mask_threshold
    pos_rm_mask = (~kl_mask) & (ratio > 1.0) & (adv > 0)
    neg_rm_mask = (~kl_mask) & (ratio < 1.0) & (adv < 0)
    rm_mask = pos_rm_mask | neg_rm_mask
    keep_adv_mask = (~rm_mask).detach()
    zero = torch.zeros((), dtype=unclipped_loss.dtype, device=unclipped_loss.device)
    loss_per_elem = torch.where(keep_adv_mask, unclipped_loss, zero)
    metrics = {"kl_new_old_mean": kl_per_sample.mean().detach(), "kl_new_old_max": kl_per_sample.max().detach(),
               "masked_fraction": rm_mask.float().mean().detach()}
    return loss_per_elem, metrics


def released_sigma_t(sigmas, target_steps, eta, latent_dims):
    """FlowDPPO._compute_sigma_t, flowdppo.py:356-368 (add_kl_coefficient True), broadcast over ``latent_dims``."""
    sigmas = sigmas.to(dtype=torch.float32)
    idx = torch.tensor(target_steps, dtype=torch.long)
    s = sigmas[idx]
    s_next = sigmas[idx + 1]
    dt = s_next - s
    std_dev_t = torch.sqrt(s / (1.0 - torch.clamp(s, max=0.99))) * eta
    sigma_t = std_dev_t * torch.sqrt(-dt)
    return sigma_t.reshape(1, -1, *([1] * latent_dims))


def released_loss(new_logp, old_logp, new_means, old_means, advantages, sigmas, target_steps, eta, threshold):
    """compute_loss_and_backward, flowdppo.py:297-319: advantages broadcast over the steps, the loss's mean."""
    sigma_t = released_sigma_t(sigmas, target_steps, eta, new_means.dim() - 2)
    adv_b = advantages.detach().to(dtype=new_logp.dtype).reshape(-1, 1).expand_as(new_logp)
    loss_per_elem, metrics = released_kl_adv_loss(new_logp, old_logp, new_means, old_means, adv_b, sigma_t, threshold)
    return loss_per_elem.mean(), metrics


# ---- the loss on fixed tensors, and planted bugs ------------------------------------------------------------------
SIGMAS = sigma_schedule(10, 3.0)  # SD3's grid at T 10, shift 3: sigma_0 = 1, where the release's std differs
STEPS = [0, 2, 4]  # the trained steps of the fixed case (the release's recipe draws 3 of the first 5)
ETA = 0.7


def fixed_case(seed: int = 0):
    """[B, S'] log-probs and [B, S', 2, 3, 3] means whose KL scores straddle the threshold (one score is the
    threshold itself), ratios on both sides of 1 and advantages of both signs; the threshold."""
    gen = torch.Generator().manual_seed(seed)
    b, s = 8, len(STEPS)
    old_means = torch.randn(b, s, 2, 3, 3, generator=gen)
    shift = torch.randn(b, s, 2, 3, 3, generator=gen) * torch.logspace(-4, -1, b * s).reshape(b, s, 1, 1, 1)
    new_means = (old_means + shift).requires_grad_(True)
    old_logp = torch.randn(b, s, generator=gen)
    new_logp = (old_logp + 0.3 * torch.randn(b, s, generator=gen)).requires_grad_(True)
    advantages = torch.tensor([1.5, -0.7, 0.2, -2.0, 0.9, -0.1, 1.1, -1.3])
    sigma_t = released_sigma_t(SIGMAS, STEPS, ETA, 3)
    scores = released_gaussian_kl_div(new_means.detach(), old_means, sigma_t).mean(dim=(2, 3, 4))
    threshold = float(scores.flatten().sort().values[b * s // 2])  # exactly one score: `>=` against `>` matters
    return new_logp, old_logp, new_means, old_means, advantages, threshold


def ours_loss(new_logp, old_logp, new_means, old_means, advantages, threshold, loss_fn=dppo_kl_mask_loss,
              std_fn=dppo_score_std):
    """The zoo's loss on the fixed case as FlowDPPO.update assembles it: one chunk per trained step, the terms summed
    and divided by the number of trained (sample, step) pairs; and the logged diagnostics."""
    b, s = new_logp.shape
    total, dropped, scores = 0.0, 0, []
    for j, t in enumerate(STEPS):
        std = std_fn(SIGMAS[t].expand(b), SIGMAS[t + 1].expand(b), ETA)
        terms = loss_fn(new_logp[:, j], old_logp[:, j], new_means[:, j], old_means[:, j], advantages, std, threshold)
        total = total + terms.loss.sum()
        dropped += int(terms.clipped.sum())
        scores.append(terms.score)
    scores = torch.cat(scores)
    return total / (b * s), {"masked_fraction": dropped / (b * s), "kl_new_old_mean": float(scores.mean()),
                             "kl_new_old_max": float(scores.max())}


def assert_matches_release(loss_fn=dppo_kl_mask_loss, std_fn=dppo_score_std) -> None:
    new_logp, old_logp, new_means, old_means, advantages, threshold = fixed_case()
    ours, our_metrics = ours_loss(new_logp, old_logp, new_means, old_means, advantages, threshold, loss_fn, std_fn)
    released, metrics = released_loss(new_logp, old_logp, new_means, old_means, advantages, SIGMAS, STEPS, ETA,
                                      threshold)
    torch.testing.assert_close(ours, released, rtol=1e-6, atol=0)
    for key, value in metrics.items():
        assert our_metrics[key] == pytest.approx(float(value), rel=1e-5), key
    (g_ours,) = torch.autograd.grad(ours, new_logp)
    (g_released,) = torch.autograd.grad(released, new_logp)
    torch.testing.assert_close(g_ours, g_released, rtol=1e-6, atol=1e-9)


def test_loss_metrics_and_gradient_equal_the_released_lines():
    new_logp, old_logp, new_means, old_means, advantages, threshold = fixed_case()
    _, metrics = released_loss(new_logp, old_logp, new_means, old_means, advantages, SIGMAS, STEPS, ETA, threshold)
    assert 0.1 < float(metrics["masked_fraction"]) < 0.6  # the case exercises the mask, neither none nor all of it
    assert_matches_release()


def _drops_every_high_kl_term(log_prob, old_log_prob, mean, old_mean, advantages, std, threshold):
    terms = dppo_kl_mask_loss(log_prob, old_log_prob, mean, old_mean, advantages, std, threshold)
    high = terms.score >= threshold
    return terms._replace(loss=torch.where(high, torch.zeros_like(terms.loss), -advantages * terms.ratio), clipped=high)


def _summed_score(log_prob, old_log_prob, mean, old_mean, advantages, std, threshold):
    terms = dppo_kl_mask_loss(log_prob, old_log_prob, mean, old_mean, advantages, std, threshold)
    score = gaussian_mean_kl(mean.detach(), old_mean, std, "sum")  # the paper's KL, not divided by the dimension
    dropped = (score >= threshold) & (((terms.ratio > 1) & (advantages > 0)) | ((terms.ratio < 1) & (advantages < 0)))
    return terms._replace(loss=torch.where(dropped, torch.zeros_like(terms.loss), -advantages * terms.ratio),
                          clipped=dropped, score=score)


def _strict_threshold(log_prob, old_log_prob, mean, old_mean, advantages, std, threshold):
    return dppo_kl_mask_loss(log_prob, old_log_prob, mean, old_mean, advantages, std, threshold * (1 + 1e-6))


def _the_steps_own_std(sigma, sigma_next, noise_level):  # the flow_grpo kernel's std: differs at sigma = 1
    from flowzoo.algorithms.engine.sde import flow_grpo_std

    return flow_grpo_std(sigma, sigma_next, noise_level) * torch.sqrt(sigma - sigma_next)


def _mean_over_kept_terms(log_prob, old_log_prob, mean, old_mean, advantages, std, threshold):
    terms = dppo_kl_mask_loss(log_prob, old_log_prob, mean, old_mean, advantages, std, threshold)
    kept = (~terms.clipped).sum().clamp(min=1)
    return terms._replace(loss=terms.loss * len(terms.loss) / kept)


PLANTED = {
    "every high-KL term dropped": (_drops_every_high_kl_term, dppo_score_std),
    "the score summed over latent dims": (_summed_score, dppo_score_std),
    "a strict threshold (score > threshold)": (_strict_threshold, dppo_score_std),
    "the step's std at sigma = 1": (dppo_kl_mask_loss, _the_steps_own_std),
    "the mean over kept terms only": (_mean_over_kept_terms, dppo_score_std),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_the_parity_check_fails_on_a_planted_bug(bug):
    loss_fn, std_fn = PLANTED[bug]
    with pytest.raises(AssertionError):
        assert_matches_release(loss_fn, std_fn)


def test_a_high_kl_move_back_towards_the_old_policy_keeps_its_gradient():
    # A > 0 but ratio < 1, far from the old mean: corrective, kept (README: "a high-KL step also passes when it is
    # corrective"); the same move with ratio > 1 is dropped and carries no gradient
    old_mean, mean = torch.zeros(2, 4), torch.ones(2, 4)
    log_prob = torch.tensor([-0.5, 0.5], requires_grad=True)
    terms = dppo_kl_mask_loss(log_prob, torch.zeros(2), mean, old_mean, torch.tensor([1.0, 1.0]), torch.ones(2), 0.1)
    assert terms.clipped.tolist() == [False, True] and terms.score.tolist() == [0.5, 0.5]
    (grad,) = torch.autograd.grad(terms.loss.sum(), log_prob)
    assert grad[0] == pytest.approx(-float(torch.exp(torch.tensor(-0.5)))) and grad[1] == 0.0


def test_the_release_std_is_the_kernels_but_at_sigma_one():
    from flowzoo.algorithms.engine.sde import flow_grpo_std

    sigma, sigma_next = SIGMAS[:-1], SIGMAS[1:]
    ours = dppo_score_std(sigma, sigma_next, ETA)
    kernel = flow_grpo_std(sigma, sigma_next, ETA) * torch.sqrt(sigma - sigma_next)
    torch.testing.assert_close(ours[1:-1], kernel[1:-1])
    assert float(sigma[0]) == 1.0 and float(ours[0]) > 1.5 * float(kernel[0])  # 1 - 0.99 against 1 - sigma_1


# ---- one update against the transcription -----------------------------------------------------------------------
TOY = {"group_size": 4, "lr": 1e-2, "kl_beta": 0.0, "inner_epochs": 2, "minibatches": 2, "minibatch_order": "grouped",
       "max_grad_norm": 0.0, "kl_mask_threshold": 1e-4}


def released_update_gradients(alg, captured):
    """Each optimizer step's gradient as the release takes it: the old log-probs the rollout's, the old means replayed
    without gradients at the pre-update weights (prepare_segment, flowdppo.py:241-266), then per minibatch (the
    batch's contiguous halves, every epoch: stack.py:92-108) the loss of flowdppo.py:297-320 at that step's weights;
    and the masked fraction and KL scores over all of them (flowdppo.py:130-135)."""
    model, traj, adv = alg.model, captured.traj, captured.advantages
    params = model.trainable_parameters()
    steps = traj.train.any(0).nonzero().flatten().tolist()
    sigmas = traj.sigmas.float()

    def replay(rows):
        logps, means = [], []
        for t in steps:
            n = len(rows)
            v = model.velocity(traj.latents[rows, t], sigmas[t].expand(n), traj.cond.index(rows), traj.guidance)
            logp, mean, _, _ = released_sde_step(v, traj.latents[rows, t], traj.latents[rows, t + 1],
                                                 sigmas[t].expand(n), sigmas[t + 1].expand(n), sigmas[1],
                                                 traj.noise_level)
            logps.append(logp)
            means.append(mean)
        return torch.stack(logps, 1), torch.stack(means, 1)

    everyone = torch.arange(len(traj))
    set_weights(params, captured.before)
    with torch.no_grad():
        _, old_means = replay(everyone)
    old_logp = traj.log_probs[:, steps]
    minibatches = everyone.chunk(alg.config.minibatches) * alg.config.inner_epochs
    grads, masked, scores = [], [], []
    for (weights, _), rows in zip(captured.steps, minibatches):
        set_weights(params, weights)
        new_logp, new_means = replay(rows)
        loss, metrics = released_loss(new_logp, old_logp[rows], new_means, old_means[rows], adv[rows], sigmas, steps,
                                      traj.noise_level, alg.config.kl_mask_threshold)
        grads.append(torch.autograd.grad(loss, params))
        masked.append(float(metrics["masked_fraction"]))
        scores.append((float(metrics["kl_new_old_mean"]), float(metrics["kl_new_old_max"])))
    return grads, masked, scores


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-step"])
def test_every_optimizer_step_of_a_two_epoch_update_equals_the_release(fused):
    pairs = prompt_set()
    prompts, metadata = [p for p, _ in pairs], [m for _, m in pairs]
    model = models.get("toy2d")(hidden=32, pretrain_steps=50)
    model.fused_update = fused
    alg = algorithms.get("flow_dppo")(model, rewards.build("toy_mode"), TOY, seed=0)
    alg.step(prompts, metadata)  # a first iteration: the weights move off the pretrained ones
    captured = capture_update(alg, prompts, metadata)
    assert len(captured.steps) == 4  # 2 epochs x 2 minibatches
    grads, masked, scores = released_update_gradients(alg, captured)
    for (_, ours), released in zip(captured.steps, grads):
        flat_ours, flat_released = torch.cat([g.flatten() for g in ours]), torch.cat([g.flatten() for g in released])
        assert float(flat_released.norm()) > 1e-6
        torch.testing.assert_close(flat_ours, flat_released, rtol=1e-4, atol=1e-5 * float(flat_released.abs().max()))
    assert masked[0] == 0.0 and scores[0][1] < 1e-9  # the first step is on-policy: nothing masked
    extra = captured.stats.extra
    assert 0 < extra["dppo_masked_frac"] < 1
    # minibatches of equal size: the update's fraction and mean are the steps' means, its max their max
    assert extra["dppo_masked_frac"] == pytest.approx(sum(masked) / len(masked), abs=1e-9)
    assert captured.stats.clip_frac == pytest.approx(extra["dppo_masked_frac"])
    assert extra["dppo_kl_score_mean"] == pytest.approx(sum(s[0] for s in scores) / len(scores), rel=1e-3)
    assert extra["dppo_kl_score_max"] == pytest.approx(max(s[1] for s in scores), rel=1e-3)


def test_the_rollout_records_the_means_the_update_anchors_on(toy_model, toy_prompts):
    alg = algorithms.get("flow_dppo")(toy_model, rewards.build("toy_mode"), {"group_size": 4}, seed=0)
    traj = alg.collect(*toy_prompts)
    t, rows = 3, torch.arange(len(traj))
    with torch.no_grad():
        out = alg.score_transition(traj, rows, t)
    torch.testing.assert_close(traj.means[:, t], out.mean, rtol=1e-5, atol=1e-6)
    head = traj.select([0, 2])
    torch.testing.assert_close(head.means, traj.means[[0, 2]])
    assert algorithms.get("flow_grpo")(toy_model, rewards.build("toy_mode"), {"group_size": 4}).collect(
        *toy_prompts).means is None  # only the algorithms that need it pay for it


def test_a_chunked_rollout_records_the_same_means(toy_model, toy_prompts):
    trajs = [algorithms.get(name)(toy_model, rewards.build("toy_mode"), {"group_size": 4, "rollout_batch": chunk},
                                  seed=0).collect(*toy_prompts)
             for name, chunk in (("flow_dppo", None), ("flow_dppo", 5), ("grpo_guard", 3))]
    assert trajs[0].means.abs().sum() > 0
    for other in trajs[1:]:
        torch.testing.assert_close(other.means, trajs[0].means, rtol=1e-5, atol=1e-6)


# ---- plan, advantages, recipe, config ---------------------------------------------------------------------------
def test_sparse_sde_steps_are_drawn_from_the_first_steps_and_are_the_only_trained_ones(toy_model):
    alg = algorithms.get("flow_dppo")(toy_model, rewards.build("toy_mode"),
                                      {"group_size": 2, "sde_steps": 3, "timestep_fraction": 0.5}, seed=0)
    drawn = set()
    for iteration in range(30):
        alg.iteration = iteration
        plan = alg.step_plan(4)
        steps = plan.sde.nonzero().flatten().tolist()
        assert len(steps) == 3 and max(steps) < 5  # 3 of the first int(10 * 0.5) = 5, Euler elsewhere
        assert torch.equal(plan.train, plan.sde.expand(4, -1))  # every sample trains the same drawn steps
        assert torch.equal(alg.step_plan(4).sde, plan.sde)  # a pure function of (seed, iteration): resumes agree
        drawn.add(tuple(steps))
    assert len(drawn) > 5
    assert torch.equal(algorithms.get("flow_dppo")(toy_model, rewards.build("toy_mode"), {"group_size": 2}).step_plan(
        2).sde, torch.ones(10, dtype=torch.bool))  # sde_steps null: Flow-GRPO's plan


def released_advantages(rewards_, branch, eps=1e-8):
    """RolloutTrack.compute_advantages(normalize=True, use_global_std=True), rollout_resp.py:314-330."""
    rewards_ = rewards_.to(torch.float32)
    reshaped = rewards_.view(-1, branch)
    mean = reshaped.mean(dim=1, keepdim=True)
    std = rewards_.std() + eps
    return ((reshaped - mean) / std).flatten()


def test_the_recipe_gives_the_released_advantages_and_keys():
    keys = recipes.recipe("flow_dppo", "sd3_pickscore", "sd3")
    gen = torch.Generator().manual_seed(3)
    scores = torch.rand(48 * 16, generator=gen)
    group = torch.arange(48).repeat_interleave(16)
    ours = group_advantages(scores, group, keys["adv_std"], eps=keys["adv_eps"], clip=keys["adv_clip"],
                            unbiased=keys["adv_std_unbiased"])
    torch.testing.assert_close(ours, released_advantages(scores, 16), rtol=1e-5, atol=1e-6)
    assert (keys["kl_mask_threshold"], keys["sde_steps"], keys["timestep_fraction"], keys["minibatches"]) == (
        1e-5, 3, 0.5, 2)
    config = algorithms.get("flow_dppo").typed_config(keys)  # the recipe is a valid config at T 10
    config.check_num_steps(10)


@pytest.mark.parametrize("override, message", [
    ({"kl_mask_threshold": -1.0}, "kl_mask_threshold must be a finite number >= 0"),
    ({"kl_mask_threshold": float("nan")}, "algorithm.kl_mask_threshold"),
    ({"sde_steps": 0}, "sde_steps must be a positive integer"),
    ({"kernel": "cps"}, "kl_score_std release is the flow_grpo kernel's std"),
    ({"kl_score_std": "paper"}, "kl_score_std"),
])
def test_bad_values_are_one_line_config_errors(override, message):
    with pytest.raises(ConfigError, match=message) as error:
        algorithms.get("flow_dppo").typed_config(override)
    assert "\n" not in str(error.value)


def test_more_sde_steps_than_the_steps_they_are_drawn_from_are_refused():
    config = algorithms.get("flow_dppo").typed_config({"sde_steps": 6, "timestep_fraction": 0.5})
    with pytest.raises(ConfigError, match="sde_steps 6 exceeds the first 5 of 10 steps"):
        config.check_num_steps(10)


def test_the_step_std_option_scores_any_kernel(toy_model, toy_prompts):
    alg = algorithms.get("flow_dppo")(toy_model, rewards.build("toy_mode"),
                                      {"group_size": 4, "kernel": "cps", "kl_score_std": "step", "minibatches": 2,
                                       "lr": 1e-2, "kl_mask_threshold": 0.0}, seed=0)
    stats = alg.step(*toy_prompts)
    assert stats.extra["dppo_kl_score_max"] > 0  # the second minibatch moved off the anchor
    assert 0 < stats.extra["dppo_masked_frac"] < 1


# ---- NFE and learning on the toy tier ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", [{}, {"sde_steps": 2, "timestep_fraction": 0.5},
                                     {"guidance": 2.5, "kl_beta": 0.04, "inner_epochs": 2, "sde_steps": 3}])
def test_measured_nfe_matches_the_documented_formula(toy_model, toy_prompts, variant):
    alg = algorithms.get("flow_dppo")(toy_model, rewards.build("toy_mode"), {"group_size": 3, **variant}, seed=0)
    cfg, T, samples = alg.config, alg.num_steps, 4 * 3
    c = toy_model.cfg_factor(cfg.guidance)
    k = (2 if cfg.kl_beta > 0 else 1) - alg.keeps_rollout_graph()
    w = cfg.sde_steps or max(1, int(T * cfg.timestep_fraction))
    for _ in range(2):
        stats = alg.step(*toy_prompts)
        assert (stats.nfe_sampling, stats.nfe_training) == (T * samples * c, cfg.inner_epochs * k * c * samples * w)


def test_raises_the_toy_reward_over_several_epochs_per_batch(toy_model, toy_prompts):
    prompts, meta = toy_prompts
    alg = algorithms.get("flow_dppo")(toy_model, rewards.build("toy_mode"),
                                      {"lr": 1e-3, "kl_beta": 0.0, "inner_epochs": 2, "minibatches": 2}, seed=0)
    seen = [alg.step(prompts * 2, meta * 2) for _ in range(20)]
    first, last = sum(s.reward_mean for s in seen[:3]) / 3, sum(s.reward_mean for s in seen[-3:]) / 3
    assert last > first + 0.15, f"batch reward {first:.3f} -> {last:.3f}"
    assert max(s.extra["dppo_masked_frac"] for s in seen) > 0  # the mask acted somewhere
