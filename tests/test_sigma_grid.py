"""DanceGRPO's and MixGRPO's sigma grid, MixGRPO's released window bound and its merged multi-reward advantage."""

import math

import numpy as np
import pytest
import torch

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms.engine.advantages import combined_advantages, group_advantages
from flowzoo.algorithms.engine.sde import sigma_schedule
from flowzoo.errors import ConfigError

TOY = {"clip_range": 0.2, "lr": 1e-3, "kl_beta": 0.0}


def build(name, model, config=None, seed=0):
    return algorithms.get(name)(model, rewards.build("toy_mode"), {**TOY, **(config or {})}, seed=seed)


# ---- the grid ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("steps, shift", [(10, 1.0), (10, 3.0), (16, 3.0), (25, 3.0)])
def test_linspace_grid_is_the_shifted_uniform_grid(steps, shift):
    t = 1 - np.arange(steps + 1) / steps
    expected = shift * t / (1 + (shift - 1) * t)
    got = sigma_schedule(steps, shift, grid="linspace")
    np.testing.assert_allclose(got.numpy(), expected, atol=4e-7, rtol=0)  # computed in float32, as the releases
    assert got[0] == 1 and got[-1] == 0
    # diffusers' grid differs: its last nonzero sigma is 1/1000 shifted twice (its sigma_min is already shifted)
    diffusers = sigma_schedule(steps, shift)
    once = shift * 1e-3 / (1 + (shift - 1) * 1e-3)
    assert diffusers[-2] == pytest.approx(shift * once / (1 + (shift - 1) * once), abs=1e-7)
    assert not torch.allclose(got, diffusers, atol=1e-4)


def released_linspace_grid(steps, shift):
    """The DanceGRPO / MixGRPO release's grid, as its trainers build it: a float32 torch.linspace and sd3_time_shift
    (XueZeyue/DanceGRPO fastvideo/train_grpo_flux.py:127-128,311-313 at 15cc71d)."""
    t = torch.linspace(1, 0, steps + 1)
    return (shift * t) / (1 + (shift - 1) * t)


@pytest.mark.parametrize("steps", [10, 12, 20, 25])
def test_linspace_grid_is_the_releases_float32_grid_to_the_bit(steps):
    """Its integer timesteps int(1000 sigma) are the release's at every step (a float64 grid cast to float32 fed
    600 where the release feeds 599 at T 12, shift 3, step 8)."""
    ours, released = sigma_schedule(steps, 3.0, grid="linspace"), released_linspace_grid(steps, 3.0)
    assert ours.dtype == torch.float32 and torch.equal(ours, released)
    assert [int(s * 1000) for s in ours] == [int(s * 1000) for s in released]
    if steps == 12:
        assert int(ours[8] * 1000) == 599


def test_example_values_at_t4_shift3():
    # t = 1, .75, .5, .25, 0 -> 3t / (1 + 2t)
    torch.testing.assert_close(sigma_schedule(4, 3.0, grid="linspace"), torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0]))


@pytest.mark.parametrize("name", ["dance_grpo", "mix_grpo", "mix_grpo_flash", "mix_grpo_flash_star"])
def test_dance_and_mix_sample_on_the_linspace_grid_by_default(toy_model, toy_prompts, name):
    alg = build(name, toy_model, {"num_steps": 8, "shift": 3.0, "group_size": 2})
    torch.testing.assert_close(alg.sigmas, sigma_schedule(8, 3.0, grid="linspace"))
    traj = alg.collect(*toy_prompts)
    if name == "dance_grpo" or name == "mix_grpo":
        torch.testing.assert_close(traj.sigmas, sigma_schedule(8, 3.0, grid="linspace"))
    other = build(name, toy_model, {"num_steps": 8, "shift": 3.0, "sigma_grid": "diffusers"})
    torch.testing.assert_close(other.sigmas, sigma_schedule(8, 3.0))


def test_flow_grpo_keeps_the_diffusers_grid(toy_model):
    for name in ("flow_grpo", "flow_grpo_fast"):
        torch.testing.assert_close(build(name, toy_model, {"num_steps": 8, "shift": 3.0}).sigmas, sigma_schedule(8, 3.0))


def test_bad_grid_is_one_clear_error(toy_model):
    with pytest.raises(ConfigError, match="sigma_grid.*'uniform'.*diffusers, linspace, flux, unipc_flow"):
        build("dance_grpo", toy_model, {"sigma_grid": "uniform"})
    with pytest.raises(ValueError, match="unknown sigma grid 'uniform'; known: diffusers, linspace, flux, unipc_flow"):
        sigma_schedule(4, grid="uniform")


# ---- MixGRPO's released window bound ------------------------------------------------------------------------------
def positions(alg, iterations):
    return [(alg.sde_window_start(i), alg.window_steps(i)) for i in iterations]


def test_released_progressive_window_stops_at_t_minus_3_and_rolls_back(toy_model):
    alg = build("mix_grpo", toy_model)  # T = 10, w = 4, tau = 25: starts 0 .. T - 2 = 8, steps < T - 2
    iters = [25 * k for k in range(10)]
    assert positions(alg, iters) == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4), (5, 3), (6, 2), (7, 1), (8, 0), (0, 4)]
    assert positions(alg, [24, 224, 225]) == [(0, 4), (8, 0), (0, 4)]
    trained = set()
    for it in range(0, 250, 5):
        alg.iteration = it
        plan = alg.step_plan(3)
        start, size = positions(alg, [it])[0]
        assert plan.sde.nonzero().flatten().tolist() == list(range(start, start + size))
        assert torch.equal(plan.train, plan.sde.expand_as(plan.train))
        trained |= set(plan.sde.nonzero().flatten().tolist())
    assert trained == set(range(8)) and max(trained) == 10 - 3


def test_released_window_at_paper_scale(toy_model):
    alg = build("mix_grpo", toy_model, {"num_steps": 25, "shift": 3.0})  # T = 25: the last trained step is 22
    assert alg.last_window_start == 23
    assert positions(alg, [25 * 19, 25 * 20, 25 * 22, 25 * 23, 25 * 24]) == [(19, 4), (20, 3), (22, 1), (23, 0), (0, 4)]
    whole = build("mix_grpo", toy_model, {"num_steps": 25, "shift": 3.0, "window_bound": "whole"})
    assert whole.last_window_start == 20 and whole.window_steps(25 * 20) == 4


def test_released_without_rollback_stays_empty_at_t_minus_2(toy_model):
    alg = build("mix_grpo", toy_model, {"window_rollback": False, "window_tau": 1})
    assert positions(alg, [7, 8, 9, 100]) == [(7, 1), (8, 0), (8, 0), (8, 0)]


def test_released_random_and_fixed_windows_stay_whole(toy_model):
    alg = build("mix_grpo", toy_model, {"window_strategy": "random"}, seed=4)
    got = positions(alg, range(300))
    assert {s for s, _ in got} == set(range(10 - 2 - 4 + 1)) and {n for _, n in got} == {4}
    with pytest.raises(ConfigError, match="window_start 5 is past the last start 4"):
        build("mix_grpo", toy_model, {"window_strategy": "fixed", "window_start": 5})


def test_empty_window_iteration_samples_ode_and_leaves_the_weights(toy_model, toy_prompts):
    alg = build("mix_grpo", toy_model, {"window_tau": 1, "group_size": 2})
    alg.iteration = 8  # start T - 2: no step left before T - 2
    before = [p.detach().clone() for p in toy_model.trainable_parameters()]
    stats = alg.step(*toy_prompts)
    assert stats.nfe_training == 0 and stats.nfe_sampling == 10 * 8 * toy_model.cfg_factor()
    assert all(torch.equal(a, b) for a, b in zip(before, toy_model.trainable_parameters()))
    flash = build("mix_grpo_flash", toy_model, {"window_tau": 1, "group_size": 2})
    flash.iteration = 8
    plan = flash.step_plan(4)
    assert not plan.sde.any() and plan.dpm_solver[:8].tolist() == [False] * 8 and plan.dpm_solver[8:].all()


@pytest.mark.parametrize("iteration, size", [(4, 4), (5, 3), (7, 1)])
def test_training_nfe_counts_the_cut_window(toy_model, toy_prompts, iteration, size):
    alg = build("mix_grpo", toy_model, {"window_tau": 1, "group_size": 2})
    alg.iteration = iteration
    stats = alg.step(*toy_prompts)
    c = toy_model.cfg_factor()
    recomputed = 0 if alg.keeps_rollout_graph() else 8 * size * c  # no KL: only the policy forward, if recomputed
    assert (stats.nfe_sampling, stats.nfe_training) == (10 * 8 * c, recomputed)


@pytest.mark.parametrize("start, released, remaining", [(0, 8, 8), (2, 8, 7), (7, 6, 5), (15, 2, 2), (18, 2, 2)])
def test_flash_tail_counts_t_minus_last_as_released(toy_model, start, released, remaining):
    # T = 25, r = 0.4, a whole window of 4 (fixed starts stay whole), last = start + 3; a floor of 2 points
    config = {"num_steps": 25, "shift": 3.0, "window_strategy": "fixed", "window_start": start}
    last = start + 3
    for count, points in (("released", released), ("remaining", remaining)):
        plan = build("mix_grpo_flash", toy_model, {**config, "compress_count": count}).step_plan(2)
        assert plan.num_steps == last + points and plan.sigmas[-1] == 0
    assert released == max(int((25 - last) * 0.4), 2) and remaining == max(int((24 - last) * 0.4), 2)


def test_flash_tau_is_20(toy_model):
    assert build("mix_grpo_flash", toy_model).config.window_tau == 20
    assert build("mix_grpo", toy_model).config.window_tau == 25


# ---- MixGRPO's multi-reward advantage ---------------------------------------------------------------------------
def test_mix_grpo_merges_advantages_then_clamps(toy_model):
    assert build("mix_grpo", toy_model).config.reward_aggregation == "advantage"
    g = torch.arange(2).repeat_interleave(36)
    outlier = torch.zeros(72)
    outlier[0] = outlier[36] = 1.0  # one high sample per group of 36: its advantage is sqrt(35) ~ 5.9 > 5
    flat = torch.linspace(0, 1, 72)
    comps = {"a": outlier, "b": flat}
    per = {k: group_advantages(v, g, clip=math.inf) for k, v in comps.items()}
    assert per["a"].max() > 5.5
    for weights in ({"a": 0.5, "b": 0.5}, {"a": 1.0, "b": 1.0}):
        got = combined_advantages(outlier + flat, comps, weights, g, aggregation="advantage", clip=5.0)
        merged = sum(w * per[k] for k, w in weights.items())
        torch.testing.assert_close(got, merged.clamp(-5, 5))
    # at weights 1/2 the merged outlier stays below 5 unclipped: clipping each reward first would lower it
    half = combined_advantages(outlier + flat, comps, {"a": 0.5, "b": 0.5}, g, aggregation="advantage", clip=5.0)
    assert half[0] == pytest.approx(0.5 * float(per["a"][0] + per["b"][0]), rel=1e-6) and half[0] < 5
    assert half[0] > 0.5 * (5.0 + float(per["b"][0])) + 0.1
