"""The GRPO core: advantages, losses, rollout and the Flow-GRPO update on the toy tier."""

import math

import pytest
import torch

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms.engine.advantages import combined_advantages, group_advantages
from flowzoo.algorithms.engine.base import AlgorithmConfig
from flowzoo.algorithms.engine.losses import gaussian_mean_kl, kl_std, ppo_clip_loss, sequence_log_weight
from flowzoo.algorithms.engine.rollout import initial_noise, sample_generators
from flowzoo.errors import ConfigError

TOY = {"clip_range": 0.2, "lr": 1e-3, "kl_beta": 0.0, "group_size": 4}


def test_group_advantages_formula_with_group_std():
    r = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 13.0])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = group_advantages(r, g, "group", eps=1e-4, clip=100)
    for idx in ([0, 1, 2], [3, 4, 5]):
        rg = r[idx]
        expected = (rg - rg.mean()) / (rg.std(unbiased=False) + 1e-4)
        torch.testing.assert_close(adv[idx], expected)


def test_group_advantages_batch_std_and_clip():
    r = torch.tensor([0.0, 0.0, 0.0, 100.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = group_advantages(r, g, "batch", eps=1e-4, clip=1.5)
    std = r.std(unbiased=False)
    expected = torch.tensor([-25, -25, -25, 75, -0.5, 0.5]) / (std + 1e-4)
    torch.testing.assert_close(adv, expected.clamp(-1.5, 1.5))
    assert adv.abs().max() == 1.5


def test_constant_group_gives_zero_advantage():
    adv = group_advantages(torch.tensor([0.5, 0.5, 0.5]), torch.zeros(3, dtype=torch.long))
    assert torch.equal(adv, torch.zeros(3))


def test_advantage_aggregation_normalises_each_reward():
    g = torch.tensor([0, 0, 1, 1])
    comps = {"a": torch.tensor([0.0, 1.0, 0.0, 1.0]), "b": torch.tensor([0.0, 100.0, 5.0, 0.0])}
    w = {"a": 1.0, "b": 0.5}
    total = comps["a"] + 0.5 * comps["b"]
    per = combined_advantages(total, comps, w, g, aggregation="advantage", clip=100)
    expected = group_advantages(comps["a"], g, clip=100) + 0.5 * group_advantages(comps["b"], g, clip=100)
    torch.testing.assert_close(per, expected)
    summed = combined_advantages(total, comps, w, g, aggregation="sum", clip=100)
    torch.testing.assert_close(summed, group_advantages(total, g, clip=100))
    assert not torch.allclose(per, summed)


def test_ppo_clip_loss_formula():
    logp = torch.tensor([0.0, 0.5, -0.5, 0.05])
    old = torch.zeros(4)
    adv = torch.tensor([1.0, 1.0, -1.0, -2.0])
    terms = ppo_clip_loss(logp, old, adv, clip_range=0.2)
    ratio = logp.exp()
    expected = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    torch.testing.assert_close(terms.loss, expected)
    assert terms.clipped.tolist() == [False, True, True, False]
    # positive advantage above the clip: gradient is zero
    lp = torch.tensor([0.5], requires_grad=True)
    ppo_clip_loss(lp, torch.zeros(1), torch.ones(1), 0.2).loss.sum().backward()
    assert lp.grad.item() == 0.0


def test_kl_uses_step_variance_or_release_variance():
    mean, ref = torch.ones(2, 3), torch.zeros(2, 3)
    std = torch.tensor([0.1, 0.2])
    torch.testing.assert_close(gaussian_mean_kl(mean, ref, std), 1 / (2 * std**2))
    s, sn = torch.tensor([0.8, 0.8]), torch.tensor([0.6, 0.7])
    torch.testing.assert_close(kl_std(std, s, sn, "step"), std)
    torch.testing.assert_close(kl_std(std, s, sn, "release"), std / torch.sqrt(s - sn))


def test_sequence_weight_is_exp_of_summed_log_ratios():
    old = torch.tensor([[0.1, -0.2, 0.3], [0.0, 0.0, 0.0]])
    off = torch.tensor([[0.0, 0.1, 5.0], [1.0, 1.0, 1.0]])
    reused = torch.tensor([[True, True, False], [True, False, False]])
    log_w = sequence_log_weight(old, off, reused)
    torch.testing.assert_close(log_w, torch.tensor([0.1 - 0.3, -1.0]))
    torch.testing.assert_close(log_w.exp(), torch.tensor([math.exp(-0.2), math.exp(-1.0)]))


def test_sample_generators_reproducible_and_distinct():
    a = [torch.randn(3, generator=g) for g in sample_generators(0, 5, count=4)]
    b = [torch.randn(3, generator=g) for g in sample_generators(0, 5, count=4)]
    c = [torch.randn(3, generator=g) for g in sample_generators(0, 6, count=4)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert len({tuple(x.tolist()) for x in a}) == 4
    assert not torch.equal(a[0], c[0])


def test_shared_initial_noise_per_group(toy_model):
    gens = sample_generators(0, count=6)
    x = initial_noise(toy_model, gens, group_size=3, shared=True)
    assert torch.equal(x[0], x[1]) and torch.equal(x[1], x[2]) and torch.equal(x[3], x[5])
    assert not torch.equal(x[0], x[3])
    x_indep = initial_noise(toy_model, gens, group_size=3, shared=False)
    assert not torch.equal(x_indep[0], x_indep[1])


def _flow_grpo(model, **over):
    return algorithms.get("flow_grpo")(model, rewards.build("toy_mode"), {**TOY, **over}, seed=0)


@pytest.mark.parametrize("kl_beta", [0.0, 0.04])
def test_on_policy_first_update_ratio_is_one_at_every_step(toy_model, toy_prompts, kl_beta):
    alg = _flow_grpo(toy_model, kl_beta=kl_beta)
    prompts, meta = toy_prompts
    traj = alg.collect(prompts, meta)
    trained_steps = [t for t in range(traj.num_steps) if traj.train[:, t].any()]
    assert trained_steps == list(range(9))  # int(10 * 0.99): all but the last
    rows = torch.arange(len(traj))
    for t in trained_steps:
        out, kl = alg._step_terms(traj, rows, t)
        ratio = torch.exp(out.log_prob - traj.log_probs[:, t])
        torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-6, rtol=0)
        # before any update the policy is the reference: KL is 0
        assert float(kl.detach().abs().max()) < 1e-10
    stats = alg.step(prompts, meta)
    assert abs(stats.ratio_mean - 1) < 1e-6 and stats.clip_frac == 0.0


def test_second_epoch_moves_the_ratio(toy_model, toy_prompts):
    alg = _flow_grpo(toy_model, inner_epochs=2, minibatches=2, lr=1e-2)
    stats = alg.step(*toy_prompts)
    assert abs(stats.ratio_mean - 1) > 1e-5


def test_minibatch_orders_take_the_releases_rows(toy_model):
    """shuffled: a fresh permutation per epoch; grouped: whole groups in turn (DanceGRPO's FLUX trainer); interleaved:
    the same slice of every group (MixGRPO's FLUX trainer: 12 samples per GPU, a step every 3); kept rows filtered."""
    from flowzoo.algorithms.engine.base import ordered_rows

    assert ordered_rows(8, 4, "grouped").tolist() == list(range(8))
    assert ordered_rows(8, 4, "interleaved").tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    grouped = _flow_grpo(toy_model, group_size=4, minibatches=2, minibatch_order="grouped")
    assert [m.tolist() for m in grouped.minibatch_rows(16, None, 0, 16)] == [list(range(8)), list(range(8, 16))]
    mixed = _flow_grpo(toy_model, group_size=12, minibatches=4, minibatch_order="interleaved")
    parts = [m.tolist() for m in mixed.minibatch_rows(24, None, 0, 24)]
    assert parts[1] == [3, 4, 5, 15, 16, 17]  # samples 3-5 of both groups
    kept = torch.tensor([0, 2, 3, 5, 6, 7])
    assert [m.tolist() for m in grouped.minibatch_rows(8, kept, 0, 8)] == [[0, 2, 3], [5, 6, 7]]
    shuffled = _flow_grpo(toy_model, group_size=4, minibatches=2, inner_epochs=2)
    first, second = [sorted(m.tolist()) for m in shuffled.minibatch_rows(16, None, 0, 16)][::2]
    assert first != list(range(8)) or second != list(range(8))  # drawn, not in order
    with pytest.raises(ConfigError, match="minibatch_order must be one of shuffled, grouped, interleaved, got 'x'"):
        _flow_grpo(toy_model, minibatch_order="x")


def test_nfe_counts_sampling_and_training(toy_model, toy_prompts):
    prompts, meta = toy_prompts
    alg = _flow_grpo(toy_model, kl_beta=0.04, reuse_rollout_graph=False)
    stats = alg.step(prompts, meta)
    batch = len(prompts) * 4
    assert stats.nfe_sampling == batch * 10
    assert stats.nfe_training == batch * 9 * 2  # policy + reference forward per trained step
    cfg = _flow_grpo(toy_model, guidance=2.0, reuse_rollout_graph=False)
    stats = cfg.step(prompts, meta)
    assert stats.nfe_sampling == batch * 10 * 2 and stats.nfe_training == batch * 9 * 2
    # the default (reuse_rollout_graph auto: on here) back-propagates through the rollout: the reference forward only
    assert _flow_grpo(toy_model, kl_beta=0.04).step(prompts, meta).nfe_training == batch * 9


def test_calls_inside_uncounted_leave_the_nfe_as_it_was_even_when_they_raise(toy_model):
    x, sigma = torch.zeros(3, 2), torch.full((3,), 0.5)
    cond = toy_model.encode(["class 0"] * 3)
    toy_model.nfe = 5
    with toy_model.uncounted():
        toy_model.velocity(x, sigma, cond, 1.0)
    assert toy_model.nfe == 5
    with toy_model.uncounted(False):  # a real part: counted
        toy_model.velocity(x, sigma, cond, 1.0)
    assert toy_model.nfe == 8
    with pytest.raises(RuntimeError), toy_model.uncounted():
        toy_model.velocity(x, sigma, cond, 1.0)
        raise RuntimeError("a failed padding call")
    assert toy_model.nfe == 8


def test_kl_grows_after_updates(toy_model, toy_prompts):
    alg = _flow_grpo(toy_model, kl_beta=0.04, lr=1e-2)
    first = alg.step(*toy_prompts)
    later = [alg.step(*toy_prompts) for _ in range(3)][-1]
    assert first.kl == 0.0 and later.kl > 0.0


def test_flow_grpo_raises_toy_reward(toy_model, toy_prompts):
    prompts, meta = toy_prompts
    alg = _flow_grpo(toy_model)
    rewards_seen = [alg.step(prompts * 2, meta * 2).reward_mean for _ in range(20)]
    assert sum(rewards_seen[-5:]) / 5 > sum(rewards_seen[:5]) / 5 + 0.15


def test_state_dict_round_trip_continues_identically(toy_model, toy_prompts):
    from flowzoo import models

    prompts, meta = toy_prompts
    a = _flow_grpo(toy_model)
    for _ in range(2):
        a.step(prompts, meta)
    state = a.state_dict()
    b = _flow_grpo(models.get("toy2d")())
    b.load_state_dict(state)
    sa, sb = a.step(prompts, meta), b.step(prompts, meta)
    assert sa.reward_mean == sb.reward_mean and sa.loss == sb.loss


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"group_size": 0}, "group_size must be a positive integer, got 0"),
        ({"group_size": 1}, "group_size must be >= 2"),
        ({"kernel": "ddpm"}, "bad value 'ddpm'; valid: flow_grpo, dance_grpo, cps"),
        ({"clip_rnage": 0.1}, "unknown key 'clip_rnage' \\(did you mean 'clip_range'\\?\\)"),
        ({"lr": "fast"}, "expected a number, got 'fast'"),
    ],
)
def test_bad_algorithm_config_is_one_clear_error(toy_model, bad, match):
    with pytest.raises(ConfigError, match=match):
        _flow_grpo(toy_model, **bad)


def test_scientific_notation_without_a_dot_is_a_number():
    """YAML 1.1 reads ``1e-3`` as a string; ``lr=1e-3`` on the command line must still mean 0.001."""
    from flowzoo.schema import from_mapping

    assert from_mapping(AlgorithmConfig, {"lr": "1e-3", "clip_range": "2E-4"}, "algorithm").lr == 1e-3
    with pytest.raises(ConfigError, match="expected a number, got '1e-3x'"):
        from_mapping(AlgorithmConfig, {"lr": "1e-3x"}, "algorithm")


def test_unknown_algorithm_lists_choices():
    with pytest.raises(ConfigError, match="unknown algorithm 'flow_grpoo'; known: .*flow_grpo"):
        algorithms.get("flow_grpoo")


def test_sum_reduction_is_mean_times_dims_and_stays_on_policy(toy_model, toy_prompts):
    prompts, meta = toy_prompts
    mean_alg = _flow_grpo(toy_model, kl_beta=0.04)
    sum_alg = _flow_grpo(toy_model, kl_beta=0.04, log_prob_reduction="sum")
    traj_mean = mean_alg.collect(prompts, meta)
    traj_sum = sum_alg.collect(prompts, meta)
    assert traj_sum.reduction == "sum" and torch.equal(traj_sum.latents, traj_mean.latents)
    dims = traj_sum.latents[0, 0].numel()  # 2 for the toy
    torch.testing.assert_close(traj_sum.log_probs, dims * traj_mean.log_probs)
    stats = sum_alg.step(prompts, meta)
    assert abs(stats.ratio_mean - 1) < 1e-5 and stats.clip_frac == 0.0


@pytest.mark.parametrize("kl_beta", [0.0, 0.04])
def test_recompute_free_update_gives_the_same_step_with_fewer_forwards(toy_prompts, kl_beta):
    from flowzoo import models

    prompts, meta = toy_prompts
    plain = _flow_grpo(models.get("toy2d")(), kl_beta=kl_beta, reuse_rollout_graph=False)
    lean = _flow_grpo(models.get("toy2d")(), kl_beta=kl_beta, reuse_rollout_graph=True)
    s_plain, s_lean = plain.step(prompts, meta), lean.step(prompts, meta)
    assert s_lean.ratio_mean == 1.0 and s_lean.reward_mean == s_plain.reward_mean
    trained = len(prompts) * 4 * 9
    assert s_plain.nfe_training - s_lean.nfe_training == trained  # one policy forward per trained transition saved
    for p, q in zip(plain.model.trainable_parameters(), lean.model.trainable_parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
    # later iterations stay in step too
    torch.testing.assert_close(torch.tensor(lean.step(prompts, meta).loss), torch.tensor(plain.step(prompts, meta).loss),
                               atol=1e-6, rtol=1e-4)


def test_recompute_free_needs_one_optimizer_step(toy_model):
    with pytest.raises(ConfigError, match="reuse_rollout_graph needs inner_epochs 1 and minibatches 1"):
        _flow_grpo(toy_model, reuse_rollout_graph=True, minibatches=2)
