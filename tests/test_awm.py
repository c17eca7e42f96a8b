"""Advantage Weighted Matching against its release (scxue/advantage_weighted_matching at be51372,
advantage_weighted_matching/scripts/train_sd3_awm.py): the weighted log-probs, the loss and one update's gradient
against a hand transcription of the released lines, the time draws, the KL copy's schedule, NFE, resume, learning on
the toy tier and the sd3 gradient (training on the sd3 / wan adapters: tests/test_models_sd3.py and test_models_wan.py,
parametrized over algorithms)."""

from __future__ import annotations

import io
import math

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms.methods.awm import copy_decay, draw_times
from flowzoo.algorithms.methods.diffusion_nft import OldPolicy
from flowzoo.algorithms.engine.losses import awm_advantages, awm_log_prob, awm_velocity_kl, ppo_clip_loss
from flowzoo.algorithms.engine.rollout import sample_generators
from flowzoo.errors import ConfigError, FlowZooError
from flowzoo.streams import AWM_FORWARD
from tests.adapter_training import needs_diffusers, random_lora_sd3

TOY = {"group_size": 4, "lr": 1e-3, "kl_beta": 0.0}
RELEASED_WEIGHTING = {"uniform": "Uniform", "t": "t", "t_squared": "t**2", "huber": "huber", "ghuber": "ghuber"}


def build(model, config=None, seed=0):
    return algorithms.get("awm")(model, rewards.build("toy_mode"), {**TOY, **(config or {})}, seed=seed)


# ---- the released code, transcribed by hand ---------------------------------------------------------------------
def released_log_prob(noise_pred, timestep, clean_latents, random_noise, weighting, ghuber_power=0.25):
    """compute_log_prob_awm, train_sd3_awm.py:234-252 (after the transformer call)."""
    model_output = noise_pred.double()
    log_prob = -(model_output - (random_noise.double() - clean_latents.double())) ** 2
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
    if weighting == "t":
        log_prob = log_prob * timestep.view(-1)
    elif weighting == "t**2":
        log_prob = log_prob * timestep.view(-1) ** 2
    elif weighting == "Uniform":
        log_prob = log_prob
    elif weighting == "huber":
        log_prob = -(torch.sqrt(-log_prob + 1e-10) - 1e-5) * timestep.view(-1)
    elif weighting == "ghuber":
        log_prob = -(torch.pow(-log_prob + 1e-10, ghuber_power) - torch.pow(
            torch.tensor(1e-10, device=log_prob.device, dtype=log_prob.dtype), ghuber_power)
        ) * timestep.view(-1) / ghuber_power
    return log_prob, model_output


def released_loss(log_probs, old_log_probs, advantages, model_output, model_output_ref, model_output_ema, timesteps,
                  cfg, k, b):
    """train_sd3_awm.py:1285-1352 on one micro-batch of b samples at k times ([k * b] rows, time-major)."""
    sample = {
        "log_probs": log_probs.reshape(k, b), "old_log_probs": old_log_probs.reshape(k, b),
        "model_output": model_output.reshape(k, b, *model_output.shape[1:]),
        "model_output_ref": model_output_ref.reshape(k, b, *model_output.shape[1:]),
        "model_output_ema": model_output_ema.reshape(k, b, *model_output.shape[1:]),
    }
    dims = tuple(range(2, model_output.dim() + 1))  # the release's (2, 3, 4): every latent dim of [k, b, ...]
    std_dev_t = (torch.sqrt(timesteps / (1 - torch.clamp(timesteps, 0, 0.99))) * 0.7).reshape(k, b, *([1] * len(dims)))
    advantages = torch.clamp(advantages, -cfg.adv_clip, cfg.adv_clip)
    if cfg.advantage_max is not None:
        advantages = advantages / cfg.adv_clip * cfg.advantage_max
    if cfg.loss_type == "sum_first":
        ratio = torch.exp(sample["log_probs"].mean(dim=0) - sample["old_log_probs"].mean(dim=0).detach())
    else:
        ratio = torch.exp(sample["log_probs"].view(-1) - sample["old_log_probs"].view(-1).detach())
        advantages = advantages.unsqueeze(0).repeat(k, 1).view(-1)
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - cfg.clip_range, 1.0 + cfg.clip_range)
    policy_loss = torch.mean(torch.maximum(unclipped_loss, clipped_loss))
    mo, ref, ema = sample["model_output"], sample["model_output_ref"], sample["model_output_ema"]
    if cfg.kl_form == "elbo":
        kl_loss = ((mo - ref) ** 2).mean(dim=dims, keepdim=True) / (2 * std_dev_t**2)
    else:
        kl_loss = ((mo - ref) ** 2).mean(dim=dims, keepdim=True)
    kl_loss = kl_loss.mean(dim=0).mean()
    if cfg.ema_kl_form == "elbo":
        ema_kl_loss = ((mo - ema) ** 2).mean(dim=dims, keepdim=True) / (2 * std_dev_t**2)
    else:
        ema_kl_loss = ((mo - ema) ** 2).mean(dim=dims, keepdim=True)
    ema_kl_loss = ema_kl_loss.mean(dim=0).mean()
    if cfg.kl_beta <= 0:  # :1330-1354: both KL terms sit inside `if config.train.beta > 0`
        return policy_loss
    return policy_loss + cfg.kl_beta * kl_loss + cfg.ema_kl_beta * ema_kl_loss


def released_discrete_wo_init(sigmas, num_steps, fraction, count, generator):
    """train_sd3_awm.py:1197-1205 (the release's rand drawn from ``generator``)."""
    boundaries = torch.linspace(1, int(num_steps * fraction), steps=count + 1)
    lower_bounds = boundaries[:-1].long()
    upper_bounds = boundaries[1:].long()
    rand_u = torch.rand(count, generator=generator)
    t_indices = lower_bounds + (rand_u * (upper_bounds - lower_bounds)).long()
    return (sigmas * 1000)[t_indices] / 1000


# ---- pieces on fixed tensors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("weighting", list(RELEASED_WEIGHTING))
def test_log_prob_weightings_equal_the_released_ones(weighting):
    gen = torch.Generator().manual_seed(1)
    v, x0, eps = (torch.randn(5, 3, 4, 4, generator=gen) for _ in range(3))
    t = torch.tensor([0.1, 0.3, 0.5, 0.8, 1.0])
    ours = awm_log_prob(v, eps, x0, t, weighting, 0.25)
    released, _ = released_log_prob(v, t, x0, eps, RELEASED_WEIGHTING[weighting])
    torch.testing.assert_close(ours, released, rtol=1e-12, atol=0)


@pytest.mark.parametrize("loss_type, kl_form", [("exp_first", "uniform"), ("sum_first", "elbo")])
def test_loss_value_and_gradient_equal_the_released_formula(loss_type, kl_form):
    cfg = algorithms.get("awm").Config(loss_type=loss_type, kl_form=kl_form, ema_kl_form=kl_form, clip_range=0.05,
                                        kl_beta=0.01, ema_kl_beta=0.5)
    k, b = 3, 4
    gen = torch.Generator().manual_seed(2)
    x0 = torch.randn(b, 2, 3, 3, generator=gen).repeat(k, 1, 1, 1)
    eps = torch.randn(k * b, 2, 3, 3, generator=gen)
    t = torch.rand(k * b, generator=gen) * 0.8 + 0.1
    v = (eps - x0 + 0.3 * torch.randn(eps.shape, generator=gen)).requires_grad_(True)
    v_old = v.detach() + 0.05 * torch.randn(eps.shape, generator=gen)
    v_ref, v_ema = (v.detach() + 0.2 * torch.randn(eps.shape, generator=gen) for _ in range(2))
    adv = torch.tensor([-7.0, -1.0, 0.5, 6.0])
    # ours, as AWM.update assembles it
    lp = awm_log_prob(v, eps, x0, t, cfg.weighting, cfg.ghuber_power).reshape(k, b)
    old = awm_log_prob(v_old, eps, x0, t, cfg.weighting, cfg.ghuber_power).reshape(k, b)
    scaled = awm_advantages(adv, cfg.adv_clip, cfg.advantage_max).double()
    if loss_type == "exp_first":
        policy = ppo_clip_loss(lp, old, scaled.expand(k, b), cfg.clip_range).loss.sum()
    else:
        policy = ppo_clip_loss(lp.mean(0), old.mean(0), scaled, cfg.clip_range).loss.sum() * k
    ours = (policy + cfg.kl_beta * awm_velocity_kl(v, v_ref, t, kl_form).sum()
            + cfg.ema_kl_beta * awm_velocity_kl(v, v_ema, t, kl_form).sum()) / (k * b)
    released_lp, model_output = released_log_prob(v, t, x0, eps, "ghuber")
    released_old, _ = released_log_prob(v_old, t, x0, eps, "ghuber")
    released = released_loss(released_lp, released_old, adv, model_output, v_ref.double(), v_ema.double(), t, cfg,
                             k, b)
    torch.testing.assert_close(ours, released, rtol=1e-10, atol=0)
    (g_ours,) = torch.autograd.grad(ours, v)
    (g_released,) = torch.autograd.grad(released, v)
    torch.testing.assert_close(g_ours, g_released, rtol=1e-6, atol=1e-9)


def test_advantages_are_clipped_then_rescaled():
    adv = torch.tensor([-9.0, -2.5, 0.0, 5.0, 8.0])
    assert awm_advantages(adv, 5.0, 1.0).tolist() == [-1.0, -0.5, 0.0, 1.0, 1.0]
    assert awm_advantages(adv, 5.0, None).tolist() == [-5.0, -2.5, 0.0, 5.0, 5.0]


def test_discrete_times_are_the_released_strata():
    sigmas = algorithms.get("awm")(models.get("toy2d")(), rewards.build("toy_mode"), {"num_steps": 14}).sigmas
    for seed in range(20):
        ours = draw_times("discrete_wo_init", 6, 14, 0.9, sigmas, 3.0, torch.Generator().manual_seed(seed))
        released = released_discrete_wo_init(sigmas, 14, 0.9, 6, torch.Generator().manual_seed(seed))
        torch.testing.assert_close(ours, released.float())
    # the strata of discrete_wo_init at T 14, fraction 0.9: indices 1 .. 11, one per stratum of linspace(1, 12, 7)
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([draw_times("discrete_wo_init", 6, 14, 0.9, sigmas, 3.0, gen) for _ in range(200)])
    index = (draws.unsqueeze(-1) == sigmas[:-1]).float().argmax(-1)
    assert int(index.min()) == 1 and int(index.max()) == 11
    assert bool((index[:, 1:] >= index[:, :-1]).all())  # one per increasing stratum
    with_init = draw_times("discrete_with_init", 4, 14, 0.9, sigmas, 3.0, gen)
    assert float(with_init[0]) == float(sigmas[0])


@pytest.mark.parametrize("time_type", ["uniform", "logit_normal"])
def test_continuous_times_lie_in_their_released_ranges(time_type):
    gen = torch.Generator().manual_seed(0)
    times = torch.stack([draw_times(time_type, 6, 10, 0.9, torch.linspace(1, 0, 11), 3.0, gen) for _ in range(100)])
    low = 3 * 0.2 / (1 + 2 * 0.2) if time_type == "uniform" else 0.01  # shift(0.2) / the 0.01 clamp
    assert float(times.min()) >= low - 1e-6 and float(times.max()) <= 1.0
    # stratified: each sample's 6 times hold one of each sixth of the (unshifted) unit interval
    assert times.shape == (100, 6)


def test_copy_decay_is_the_released_schedule():
    for step in range(0, 500):
        assert copy_decay(step, "linear", 0.3) == min(0.3, 0.001 * step)
        assert copy_decay(step, "constant", 0.3) == 0.3


def test_copy_follows_the_released_update_over_50_iterations(toy_model, toy_prompts):
    alg = build(toy_model, {"group_size": 2, "minibatches": 2, "kl_ema_decay": 0.05})
    prompts = (toy_prompts[0][:2], toy_prompts[1][:2])
    params = toy_model.trainable_parameters()
    expected = [p.detach().clone() for p in params]
    for i in range(50):
        alg.step(*prompts)
        decay = min(0.05, 0.001 * 2 * (i + 1))
        expected = [e * decay + p.detach().clone() * (1.0 - decay) for e, p in zip(expected, params)]
        assert alg.logged["copy_decay"] == decay
        for old, e in zip(alg.kl_copy.weights, expected):
            torch.testing.assert_close(old, e, rtol=0, atol=0)


# ---- one update against the transcription -------------------------------------------------------------------------
def _set(params, values):
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)


def released_gradient(model, traj, advantages, cfg, copy_weights, sigmas, num_steps, seed, iteration):
    """One optimizer step over the whole batch (one micro-batch: old log-probs = the detached current ones,
    :1282-1284), with the zoo's per-sample draws (times, then noise)."""
    params = model.trainable_parameters()
    trained = [p.detach().clone() for p in params]
    k, b = cfg.train_timesteps, len(traj)
    gens = sample_generators(seed, iteration, AWM_FORWARD, count=b)
    times, noises = [], []
    for g in gens:
        times.append(released_discrete_wo_init(sigmas, num_steps, cfg.timestep_fraction, k, g))
        noises.append(torch.randn((k, *traj.final.shape[1:]), generator=g))
    timesteps = torch.stack(times).T.reshape(-1)  # time-major, as the release repeats its batch
    noise = torch.stack(noises).transpose(0, 1).reshape(-1, *traj.final.shape[1:])
    clean = traj.final.float().repeat(k, *([1] * (traj.final.dim() - 1)))
    rows = torch.arange(b).repeat(k)
    cond = traj.cond.index(rows)
    ts = timesteps.view(-1, *([1] * (clean.dim() - 1)))
    noised = (1 - ts) * clean + ts * noise
    for p in params:
        p.grad = None
    with torch.no_grad(), model.reference():
        ref = model.predict(noised, timesteps, cond)
    _set(params, copy_weights)  # the "ema" adapter
    with torch.no_grad():
        ema = model.predict(noised, timesteps, cond)
    _set(params, trained)
    out = model.predict(noised, timesteps, cond)
    log_prob, model_output = released_log_prob(out, timesteps, clean, noise, RELEASED_WEIGHTING[cfg.weighting],
                                               cfg.ghuber_power)
    loss = released_loss(log_prob, log_prob.detach(), advantages, model_output, ref.double(), ema.double(), timesteps,
                         cfg, k, b)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in params])
    for p in params:
        p.grad = None
    return grad


def rewards_for(model):
    if model.sample_kind == "points":
        return rewards.build("toy_mode")
    from tests.adapter_training import MeanBrightness

    return MeanBrightness()


def _ours_and_released(model, prompts, config, metadata=None):
    alg = algorithms.get("awm")(model, rewards_for(model), {"max_grad_norm": 0.0, **config}, seed=0)
    gen = torch.Generator().manual_seed(4)
    alg.kl_copy.weights = [w + 0.02 * torch.randn(w.shape, generator=gen) for w in alg.kl_copy.weights]
    params = model.trainable_parameters()
    seen = {}
    plain_update = alg.update

    def update(traj, advantages):
        seen["released"] = released_gradient(model, traj, advantages, alg.config, alg.kl_copy.weights, alg.sigmas,
                                             alg.num_steps, alg.seed, alg.iteration)
        alg.optimizer.step = lambda: seen.setdefault("ours", torch.cat([p.grad.flatten() for p in params]))
        return plain_update(traj, advantages)

    alg.update = update
    stats = alg.step(prompts, metadata)
    return seen["ours"], seen["released"], stats


def test_toy_update_gradient_is_the_released_gradient(toy_model, toy_prompts):
    ours, released, stats = _ours_and_released(toy_model, toy_prompts[0], {"kl_beta": 0.01, "ema_kl_beta": 1.0},
                                               toy_prompts[1])
    assert float(released.norm()) > 0 and stats.ratio_mean == 1.0 and stats.clip_frac == 0.0
    assert float((ours - released).norm() / released.norm()) < 1e-5


def test_no_copy_kl_without_the_reference_kl_as_released(toy_model, toy_prompts):
    """train_sd3_awm.py:1330-1354 adds the copy's KL only inside `if config.train.beta > 0`: at kl_beta 0 the loss
    is the policy loss alone whatever ema_kl_beta (the copy is perturbed, so an added copy-KL would show)."""
    ours, released, stats = _ours_and_released(toy_model, toy_prompts[0], {"kl_beta": 0.0, "ema_kl_beta": 1.0},
                                               toy_prompts[1])
    assert float(released.norm()) > 0 and stats.extra["kl_copy"] == 0.0
    assert float((ours - released).norm() / released.norm()) < 1e-5


# ---- NFE, learning, resume, config ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", [{}, {"guidance": 2.5, "kl_beta": 0.04, "minibatches": 2, "solver": "dpm2"}])
def test_nfe_counts_sampling_and_every_training_forward(toy_model, toy_prompts, variant):
    alg = build(toy_model, variant)
    stats = alg.step(*toy_prompts)
    cfg, b, t = alg.config, len(toy_prompts[0]) * alg.config.group_size, alg.num_steps
    c, k = toy_model.cfg_factor(cfg.guidance), cfg.train_timesteps
    first = len(torch.arange(b).chunk(cfg.minibatches)[0])
    assert stats.nfe_sampling == t * b * c
    frozen = (cfg.kl_beta > 0) * (1 + (cfg.ema_kl_beta > 0))  # the copy's KL only with beta > 0, as released
    assert stats.nfe_training == c * k * (b * (1 + frozen) + (b - first))


def test_later_minibatches_use_the_rollout_weights_as_old_policy(toy_model, toy_prompts):
    stats = build(toy_model, {"minibatches": 4, "lr": 5e-2}).step(*toy_prompts)
    assert stats.ratio_mean != 1.0  # the second optimizer step sees a moved policy


def test_the_sde_band_rollout_is_stochastic_only_in_the_band(toy_model, toy_prompts):
    alg = build(toy_model)
    plan = alg.step_plan(4)
    target = alg.sigmas[1:]  # SA-Solver's tau(t) at the time a step goes to (tests/test_awm_band.py)
    assert torch.equal(plan.sde, (target >= 0.3) & (target <= 0.9)) and plan.sde.any() and not plan.train.any()
    assert build(toy_model, {"solver": "dpm2"}).step_plan(4).dpm_solver.all()


def test_a_few_steps_raise_the_toy_reward(toy_model, toy_prompts):
    alg = build(toy_model, {"group_size": 8})
    means = [alg.step(*toy_prompts).reward_mean for _ in range(12)]
    assert sum(means[-3:]) / 3 > sum(means[:3]) / 3 + 0.05, means


def test_resume_is_bit_identical(toy_prompts):
    config = {"minibatches": 2, "kl_beta": 0.01, "ema": True, "ema_every": 1, "kl_ema_decay_type": "linear"}
    straight = build(models.get("toy2d")(), config)
    rows = [straight.step(*toy_prompts).row() for _ in range(4)]
    first = build(models.get("toy2d")(), config)
    for _ in range(2):
        first.step(*toy_prompts)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = build(models.get("toy2d")(), config)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    later = [resumed.step(*toy_prompts).row() for _ in range(2)]
    timing = ("t_sampling", "t_reward", "t_training")
    for a, b in zip(rows[2:], later):
        assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
    for x, y in zip(straight.model.trainable_parameters(), resumed.model.trainable_parameters()):
        assert torch.equal(x, y)
    for x, y in zip(straight.kl_copy.weights, resumed.kl_copy.weights):
        assert torch.equal(x, y)


def test_a_checkpoint_without_the_copy_is_refused(toy_model):
    other = algorithms.get("flow_grpo")(toy_model, rewards.build("toy_mode"), TOY, seed=0)
    with pytest.raises(FlowZooError, match="weight copy"):
        build(toy_model).load_state_dict(other.state_dict())


@pytest.mark.parametrize("bad, message", [
    ({"train_timesteps": 0}, "train_timesteps"),
    ({"ghuber_power": 0.0}, "ghuber_power"),
    ({"advantage_max": -1.0}, "advantage_max"),
    ({"adv_clip": 0.0}, "adv_clip"),
    ({"kl_ema_decay": 1.0}, "kl_ema_decay"),
    ({"ema_kl_beta": math.nan}, "ema_kl_beta"),
    ({"inner_epochs": 2}, "inner_epochs must be 1"),
    ({"time_type": "beta"}, "time_type"),
    ({"weighting": "l1"}, "weighting"),
    ({"reuse_rollout_graph": True}, "reuse_rollout_graph"),
    ({"timestep_fraction": 0.05}, "leaves no sampling step"),
])
def test_bad_values_are_one_line_config_errors(toy_model, bad, message):
    with pytest.raises(ConfigError, match=message) as error:
        build(toy_model, bad)
    assert "\n" not in str(error.value)


def test_old_policy_class_is_shared_with_diffusion_nft():
    assert isinstance(build(models.get("toy2d")()).kl_copy, OldPolicy)


# ---- the diffusers adapters ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sd3_model(tmp_path_factory):
    return random_lora_sd3(tmp_path_factory, "awm")


@needs_diffusers
def test_sd3_update_gradient_is_the_released_gradient(sd3_model):
    state = sd3_model.trainable_state_dict()
    try:
        ours, released, stats = _ours_and_released(
            sd3_model, ["a photo of a cat", "two red dogs"],
            {"group_size": 2, "num_steps": 6, "guidance": 1.0, "train_timesteps": 3, "lr": 1e-4})
    finally:
        sd3_model.load_trainable_state_dict(state)
    assert float(released.norm()) > 0
    assert float((ours - released).norm() / released.norm()) < 1e-5
    assert stats.nfe_training == 3 * 4 * 3  # current, reference and copy at 3 times, 4 samples
