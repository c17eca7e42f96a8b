"""Training-math knobs against their formulas on the toy tier: which CFG branch carries the gradient, the KL value and
gradient (both variances, both log-prob reductions), the released advantage normalisations, dropping zero-advantage
samples, and the zero-std group fraction every algorithm logs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms.engine.advantages import combined_advantages, group_advantages, zero_std_fraction
from flowzoo.algorithms.engine.losses import gaussian_mean_kl, kl_std
from flowzoo.errors import ConfigError
from flowzoo.models.base import FlowModel
from flowzoo.rewards.base import Reward, RewardOutput

TOY = {"clip_range": 0.2, "lr": 1e-3, "kl_beta": 0.0, "group_size": 4}


def _grads(params, loss):
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])


# ---- CFG gradient -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg_grad", ["cond", "both"])
def test_cfg_gradient_flows_through_the_chosen_branches(toy_model, cfg_grad):
    g = 3.0
    x, sigma = torch.randn(5, 2, generator=torch.Generator().manual_seed(0)), torch.full((5,), 0.6)
    cond, null = toy_model.encode([f"class {i % 3}" for i in range(5)]), toy_model.null_condition(5)
    w = torch.randn(5, 2, generator=torch.Generator().manual_seed(1))
    params = toy_model.trainable_parameters()
    toy_model.nfe = 0
    v = toy_model.velocity(x, sigma, cond, g, cfg_grad=cfg_grad)
    assert toy_model.nfe == 10
    with torch.no_grad():  # rollouts: one batched pass, the same values
        torch.testing.assert_close(v, toy_model.velocity(x, sigma, cond, g, cfg_grad=cfg_grad), rtol=0, atol=1e-6)
    d_cond = _grads(params, (toy_model.predict(x, sigma, cond) * w).sum())
    d_uncond = _grads(params, (toy_model.predict(x, sigma, null) * w).sum())
    expected = g * d_cond if cfg_grad == "cond" else g * d_cond + (1 - g) * d_uncond
    torch.testing.assert_close(_grads(params, (v * w).sum()), expected, rtol=1e-5, atol=1e-6)


def test_cfg_grad_and_adv_eps_are_checked(toy_model):
    with pytest.raises(ConfigError, match="cfg_grad.*'x'.*cond, both"):
        algorithms.get("flow_grpo")(toy_model, rewards.build("toy_mode"), {"cfg_grad": "x"})
    with pytest.raises(ConfigError, match="adv_eps must be >= 0, got -1"):
        algorithms.AlgorithmConfig(adv_eps=-1.0)
    with pytest.raises(ValueError, match="cfg_grad 'x'; known: cond, both"):
        FlowModel.velocity(SimpleNamespace(), torch.zeros(1, 2), torch.ones(1), None, 2.0, cfg_grad="x")


# ---- KL ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("variance", ["step", "release"])
def test_kl_value_and_gradient_match_the_formula(variance, reduction):
    gen = torch.Generator().manual_seed(2)
    mean = torch.randn(3, 4, 5, generator=gen).requires_grad_()
    ref = torch.randn(3, 4, 5, generator=gen)
    step_std = torch.tensor([0.05, 0.1, 0.2])
    sigma, sigma_next = torch.tensor([1.0, 0.7, 0.3]), torch.tensor([0.9, 0.5, 0.25])
    kl = gaussian_mean_kl(mean, ref, kl_std(step_std, sigma, sigma_next, variance), reduction)
    # the released std_dev_t has no sqrt(-dt): s_release^2 = s_step^2 / (sigma - sigma_next)
    var = step_std**2 if variance == "step" else step_std**2 / (sigma - sigma_next)
    dims = 20 if reduction == "mean" else 1
    sq = ((mean - ref) ** 2).flatten(1).sum(1)
    torch.testing.assert_close(kl, sq / dims / (2 * var))
    (grad,) = torch.autograd.grad(kl.sum(), mean)
    torch.testing.assert_close(grad, (mean - ref).detach() / (dims * var[:, None, None]))


def test_release_kl_is_weaker_by_minus_dt():
    """The docstring's direction: at the same beta, the released KL is (-dt) times the step-variance KL."""
    mean, ref, std = torch.ones(2, 3), torch.zeros(2, 3), torch.tensor([0.1, 0.2])
    s, sn = torch.tensor([0.9, 0.5]), torch.tensor([0.8, 0.45])
    step = gaussian_mean_kl(mean, ref, kl_std(std, s, sn, "step"))
    release = gaussian_mean_kl(mean, ref, kl_std(std, s, sn, "release"))
    torch.testing.assert_close(release / step, s - sn)
    assert bool((release < step).all())
    # the cps kernel's released std_dev_t is its step std (sigma_next sin(a pi / 2)): both forms agree
    torch.testing.assert_close(kl_std(std, s, sn, "release", kind="cps"), std)
    with pytest.raises(ValueError, match="kl_variance 'x'; known: step, release"):
        kl_std(std, s, sn, "x")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("variance", ["step", "release"])
def test_algorithm_kl_is_the_released_formula(toy_model, toy_prompts, variance, reduction):
    """The KL the update adds, on a recorded transition, against Flow-GRPO's transition mean written out
    (sd3_sde_with_logprob.py:45-50) and the KL of train_sd3.py:895 (std_dev_t; ``step``: times sqrt(-dt))."""
    config = {**TOY, "kl_beta": 0.04, "kl_variance": variance, "log_prob_reduction": reduction, "guidance": 2.0}
    alg = algorithms.get("flow_grpo")(toy_model, rewards.build("toy_mode"), config, seed=0)
    traj = alg.collect(*toy_prompts)
    with torch.no_grad():
        for p in toy_model.trainable_parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    t, rows = 4, torch.arange(len(traj))
    out, kl = alg._step_terms(traj, rows, t)

    s, sn, a = traj.sigmas[t], traj.sigmas[t + 1], traj.noise_level
    x, cond = traj.latents[:, t], traj.cond
    std_t = torch.sqrt(s / (1 - s)) * a

    def released_mean(v):
        dt = sn - s
        return x * (1 + std_t**2 / (2 * s) * dt) + v * (1 + std_t**2 * (1 - s) / (2 * s)) * dt

    mean = released_mean(toy_model.velocity(x, s.expand(len(x)), cond, 2.0))
    with torch.no_grad(), toy_model.reference():
        ref = released_mean(toy_model.velocity(x, s.expand(len(x)), cond, 2.0))
    std = std_t * torch.sqrt(s - sn) if variance == "step" else std_t
    sq = (mean - ref) ** 2
    expected = (sq.mean(1) if reduction == "mean" else sq.sum(1)) / (2 * std**2)
    assert float(expected.detach().min()) > 0
    torch.testing.assert_close(kl, expected, rtol=1e-4, atol=0)
    params = toy_model.trainable_parameters()
    torch.testing.assert_close(_grads(params, kl.sum()), _grads(params, expected.sum()), rtol=1e-4, atol=1e-9)


# ---- advantages -------------------------------------------------------------------------------------------------
REWARDS = torch.tensor([0.1, 0.5, 0.2, 0.9, 1.0, 1.0, 1.0, 1.0, 0.3, 0.8, 0.4, 0.35])
GROUPS = torch.arange(3).repeat_interleave(4)


def test_unbiased_group_std_is_dance_and_mix_grpo():
    """DanceGRPO / MixGRPO: (r - group mean) / (group r.std() + 1e-8), torch's unbiased std."""
    adv = group_advantages(REWARDS, GROUPS, "group", eps=1e-8, clip=math.inf, unbiased=True)
    for g in range(3):
        r = REWARDS[GROUPS == g]
        torch.testing.assert_close(adv[GROUPS == g], (r - r.mean()) / (r.std() + 1e-8))
    assert adv[4:8].abs().max() == 0  # a constant group: exactly 0, not nan
    batch = group_advantages(REWARDS, GROUPS, "batch", eps=1e-8, clip=math.inf, unbiased=True)
    means = torch.stack([REWARDS[GROUPS == g].mean() for g in range(3)])[GROUPS]
    torch.testing.assert_close(batch, (REWARDS - means) / (REWARDS.std() + 1e-8))


def test_population_group_std_is_flow_grpo():
    """Flow-GRPO's stat tracker: np.std (population) + 1e-4 (flow_grpo/stat_tracking.py:27-29)."""
    adv = group_advantages(REWARDS, GROUPS, "group", clip=math.inf)
    for g in range(3):
        r = REWARDS[GROUPS == g]
        torch.testing.assert_close(adv[GROUPS == g], (r - r.mean()) / (r.std(unbiased=False) + 1e-4))


def test_algorithm_advantages_use_the_config(toy_model):
    comps = {"a": REWARDS, "b": REWARDS.flip(0)}
    traj = SimpleNamespace(rewards=REWARDS, reward_components=comps, group=GROUPS)
    alg = algorithms.get("flow_grpo")(toy_model, rewards.build("toy_mode"),
                                      {**TOY, "adv_std_unbiased": True, "adv_eps": 1e-8, "adv_clip": 1.5}, seed=0)
    expected = group_advantages(REWARDS, GROUPS, "group", eps=1e-8, clip=1.5, unbiased=True)
    torch.testing.assert_close(alg.advantages(traj), expected)
    both = combined_advantages(REWARDS, comps, {"a": 1.0, "b": 0.5}, GROUPS, "advantage", eps=1e-8, clip=math.inf,
                               unbiased=True)
    parts = [group_advantages(c, GROUPS, eps=1e-8, clip=math.inf, unbiased=True) for c in comps.values()]
    torch.testing.assert_close(both, parts[0] + 0.5 * parts[1])


def test_zero_std_fraction_counts_constant_groups():
    assert zero_std_fraction(REWARDS, GROUPS) == pytest.approx(1 / 3)
    assert zero_std_fraction(torch.tensor([1.0, 1.0, 2.0, 2.0]), torch.tensor([7, 7, 3, 3])) == 1.0
    assert zero_std_fraction(torch.tensor([1.0, 2.0, 2.0]), torch.tensor([0, 0, 1])) == 0.5


class ConstantForClassZero(Reward):
    """1 for every sample of prompt 'class 0' (a degenerate group), else the sample's x coordinate."""

    name = "constant_for_class_zero"
    accepts = ("points",)

    def score(self, samples, prompts, metadata):
        constant = torch.tensor([p == "class 0" for p in prompts])
        return RewardOutput(torch.where(constant, torch.ones(len(prompts)), samples[:, 0].float()))


PROMPTS = ["class 0", "class 1", "class 2"]


@pytest.mark.parametrize("name", algorithms.names())
def test_every_algorithm_logs_zero_std_frac(toy_model, name):
    config = {**TOY, "num_steps": 6}
    if name.startswith("op_grpo"):
        config["t_off"] = 2
    alg = algorithms.get(name)(toy_model, ConstantForClassZero(), config, seed=0)
    row = alg.step(PROMPTS).row()
    assert row["zero_std_frac"] == pytest.approx(1 / 3)


def _update_gradient(alg, traj, adv):
    params = alg.model.trainable_parameters()
    seen = []
    alg.optimizer.step = lambda: seen.append(torch.cat([p.grad.flatten() for p in params]))
    stats = alg.update(traj, adv)
    return (seen[0] if seen else None), stats


def test_drop_zero_advantage_leaves_those_samples_out(toy_model, monkeypatch):
    """Flow-GRPO's train_sd3.py:796-817: samples whose advantage is 0 are not trained (no loss, no KL, not counted
    in the loss normaliser)."""
    alg = algorithms.get("flow_grpo")(toy_model, ConstantForClassZero(), {**TOY, "drop_zero_advantage": True}, seed=0)
    traj = alg.collect(PROMPTS, [{}] * 3)
    alg.score(traj)
    adv = alg.advantages(traj)
    zero = adv == 0
    assert zero.tolist() == [True] * 4 + [False] * 8
    scored = []
    plain = alg._step_terms
    monkeypatch.setattr(alg, "_step_terms", lambda traj, rows, t, live=None: scored.append(rows) or plain(
        traj, rows, t, live))
    dropped, stats = _update_gradient(alg, traj, adv)
    assert not bool(zero[torch.cat(scored)].any())
    assert alg.logged["zero_adv_dropped_frac"] == pytest.approx(1 / 3)
    alg.config.drop_zero_advantage = False
    kept, _ = _update_gradient(alg, traj, adv)
    # kl_beta 0: the dropped samples' surrogate has zero gradient, so only the normaliser changes (12 vs 8 samples)
    assert float((dropped - kept * 12 / 8).norm() / dropped.norm()) < 1e-5


def test_drop_zero_advantage_with_all_zero_advantages_skips_the_step(toy_model):
    alg = algorithms.get("flow_grpo")(toy_model, ConstantForClassZero(), {**TOY, "drop_zero_advantage": True}, seed=0)
    traj = alg.collect(["class 0"], [{}])
    grad, stats = _update_gradient(alg, traj, torch.zeros(len(traj)))
    assert grad is None and stats["loss"] == 0.0 and alg.logged["zero_adv_dropped_frac"] == 1.0
