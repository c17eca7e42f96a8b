"""AWM's stochastic band and noise scale against the release's SA-Solver (scxue/advantage_weighted_matching at
be51372: flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py:271-297 and sa_solver.py), on SD3.5's grid."""

from __future__ import annotations

import math

import pytest
import torch

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms.methods.awm import band_steps, sa_solver_level
from flowzoo.algorithms.engine.sde import sde_step, sigma_schedule

TAU = 0.4  # dgx_awm.py:48 (sample.noise_level)
SD3 = sigma_schedule(14, 3.0)  # the scheduler's grid at AWM's 14 steps (dgx_awm.py:37), SD3.5's shift 3


def released_grid(sigmas):
    """sd3_pipeline_with_logprob.py:273-275: the scheduler's sigmas with t[-2] = t[-3] / 2 and t[0] = 1 - 1e-3."""
    t = [float(x) for x in sigmas]
    t[-2] = t[-3] / 2
    t[0] = 1 - 1e-3
    return t


def released_noisy_steps(t):
    """SASolver.sample: step ``step`` goes from t[step - 1] to t[step] with tau(t[step]) (sa_solver.py:480,524-526,
    541; the last step denoises to zero without noise); stochasticity_control_function: tau if 0.3 <= t <= 0.9.
    Returned as the zoo's step index, step - 1."""
    return [step - 1 for step in range(1, len(t) - 1) if 0.3 <= t[step] <= 0.9]


def released_variance(t, step):
    """noise_part of the data-prediction update, squared: sigma_t^2 (1 - exp(-2 tau^2 h)), h = lambda_t - lambda_prev,
    lambda = log(alpha / sigma) with alpha = 1 - t, sigma = t (NoiseScheduleFlowMatching)."""
    lam = lambda x: math.log(1 - x) - math.log(x)  # noqa: E731
    h = lam(t[step]) - lam(t[step - 1])
    return t[step] ** 2 * (1 - math.exp(-2 * TAU**2 * h))


def kernel_variance(sigmas, steps, level):
    """What the zoo's Flow-GRPO kernel injects on ``steps`` at ``level``: its step std, squared, summed."""
    x = torch.zeros(1, 1)
    return sum(float(sde_step(x, x, sigmas[i:i + 1], sigmas[i + 1:i + 2], noise_level=level).std) ** 2 for i in steps)


def test_the_band_is_tested_at_the_steps_target_time_as_sa_solver_does():
    t = released_grid(SD3)
    band = band_steps(SD3).nonzero().flatten().tolist()
    assert band == released_noisy_steps(t) == list(range(3, 11))
    source = [i for i in range(14) if 0.3 <= float(SD3[i]) <= 0.9]
    assert source == list(range(4, 12))  # the previous rule (the step's source sigma): one step late


def test_the_level_injects_sa_solvers_variance_over_the_band():
    t = released_grid(SD3)
    steps = released_noisy_steps(t)
    released = sum(released_variance(t, s + 1) for s in steps)
    assert released == pytest.approx(0.3875, abs=1e-4)
    level = sa_solver_level(TAU, SD3, band_steps(SD3))
    assert level == pytest.approx(0.4803, abs=1e-4)
    assert kernel_variance(SD3, steps, level) == pytest.approx(released, rel=1e-5)
    # what tau used as the kernel's level injects: 0.269 on the band, 0.221 on the previous (source) band
    assert kernel_variance(SD3, steps, TAU) == pytest.approx(0.2688, abs=1e-4)
    assert kernel_variance(SD3, range(4, 12), TAU) == pytest.approx(0.2213, abs=1e-4)
    # the continuous-time match (a = sqrt(2) tau: both SDEs have diffusion a^2 t / (1 - t) dt) overshoots at 14 steps
    assert kernel_variance(SD3, steps, math.sqrt(2) * TAU) == pytest.approx(0.5376, abs=1e-4)
    assert sa_solver_level(0.0, SD3, band_steps(SD3)) == 0.0


def test_the_rollout_plan_uses_the_band_and_the_level(toy_model):
    alg = algorithms.get("awm")(toy_model, rewards.build("toy_mode"),
                                {"group_size": 4, "num_steps": 14, "shift": 3.0, "noise_level": TAU}, seed=0)
    plan = alg.step_plan(4)
    assert torch.equal(plan.sde, band_steps(alg.sigmas)) and plan.sde.any() and not plan.train.any()
    assert plan.noise_level == pytest.approx(sa_solver_level(TAU, alg.sigmas, plan.sde))
    assert plan.noise_level != TAU and alg.config.noise_level == TAU  # the config keeps the release's tau
