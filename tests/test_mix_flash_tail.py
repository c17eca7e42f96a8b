"""MixGRPO-Flash's compressed tail as a training run sees it: its logged length and first sigma, and the toy tier's
one-step tail (docs/algorithms.md, "Flash on the toy tier")."""

import pytest
import torch

from flowzoo import algorithms
from flowzoo import rewards

TOY = {"clip_range": 0.2, "lr": 1e-3, "kl_beta": 0.0, "group_size": 2}


def build(name, model, config=None):
    return algorithms.get(name)(model, rewards.build("toy_mode"), {**TOY, **(config or {})}, seed=0)


@pytest.mark.parametrize(
    "name, config, tail_steps, tail_sigma",
    [
        # T = 10, shift 1 (the toy's defaults), window 0..3: sigma_4 = 1 - 4/10; P = max(int(7 * 0.4), 2) = 2 points
        ("mix_grpo_flash", {}, 1, 0.6),
        ("mix_grpo_flash_star", {}, 1, 0.6),
        # T = 25, shift 3: t_4 = 1 - 4/25 = 0.84, sigma = 3 t / (1 + 2 t); P = int(22 * r): 8 (Flash), 4 (Flash*)
        ("mix_grpo_flash", {"num_steps": 25, "shift": 3.0}, 7, 3 * 0.84 / (1 + 2 * 0.84)),
        ("mix_grpo_flash_star", {"num_steps": 25, "shift": 3.0}, 3, 3 * 0.84 / (1 + 2 * 0.84)),
    ],
)
def test_flash_logs_its_tail(toy_model, toy_prompts, name, config, tail_steps, tail_sigma):
    stats = build(name, toy_model, config).step(*toy_prompts)
    assert stats.extra["tail_steps"] == tail_steps
    assert stats.extra["tail_sigma"] == pytest.approx(tail_sigma, abs=1e-6)
    assert stats.extra["window_start"] == 0


@pytest.mark.parametrize("start", [0, 4, 6, 8])  # whole, last whole, cut to 2 steps, empty (released bound)
def test_toy_flash_sample_is_the_one_step_data_prediction(toy_model, toy_prompts, start):
    # At T = 10 every window position leaves a single tail step (sigma_{last+1} -> 0), so the rewarded sample is the
    # data prediction x - sigma v at the window's end, not an ODE solution (the cause of the toy-tier collapse)
    alg = build("mix_grpo_flash", toy_model, {"window_tau": 1})
    alg.iteration = start
    assert alg.sde_window_start() == start
    traj = alg.collect(*toy_prompts)
    last = start + alg.window_steps() - 1
    assert traj.sigmas.shape[0] == last + 3  # the window's sigmas, then sigma_{last+1} and 0
    sigma = 1 - (last + 1) / 10
    assert float(traj.sigmas[last + 1]) == pytest.approx(sigma) and float(traj.sigmas[-1]) == 0
    x = traj.latents[:, last + 1]
    with torch.no_grad():
        v = toy_model.velocity(x, torch.full((x.shape[0],), sigma), traj.cond, alg.config.guidance)
    torch.testing.assert_close(traj.final, x - sigma * v, atol=1e-5, rtol=1e-5)
