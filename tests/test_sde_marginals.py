"""The property the SDE kernels exist for: run with the exact velocity field, the stochastic sampler keeps the
probability-flow ODE's marginals (Flow-GRPO eq. (9)-(12); DanceGRPO's score-corrected step is the same SDE family).

Data: a 2-D Gaussian N(m, diag(s^2)). Then x_sigma = (1 - sigma) x0 + sigma eps is N((1 - sigma) m, (1 - sigma)^2 s^2 +
sigma^2) and the exact velocity E[eps - x0 | x_sigma = x] is, with a = 1 - sigma and V = a^2 s^2 + sigma^2,
    v(x, sigma) = (sigma - a s^2) (x - a m) / V - m.
Starting from samples of the exact marginal at sigma 0.8, T small steps of a kernel must leave the sample mean and
variance at each checked sigma within 4 Monte-Carlo standard errors of the exact ones. (The run starts below 1
because std_t = a sqrt(sigma / (1 - sigma)) diverges at sigma -> 1: there the released kernel's first step, which
uses 1 - sigma_next instead, is not a small step whatever T, and inflates the variance by about a^4 / 4.)
The discretisation bias at T = 200 (about 1% of the variance) is below the standard error of N = 10,000 samples.
"""

from __future__ import annotations

import math

import pytest
import torch

from flowzoo.algorithms.engine.sde import sde_step

MEAN = torch.tensor([1.5, -0.5], dtype=torch.float64)
STD = torch.tensor([0.3, 0.6], dtype=torch.float64)
N, STEPS, START = 10_000, 200, 0.8
CHECK_EVERY = 50  # sigma 0.6, 0.4, 0.2, 0.0


def marginal(sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    a = 1 - sigma
    return a * MEAN, a * a * STD**2 + sigma**2


def exact_velocity(x: torch.Tensor, sigma: float) -> torch.Tensor:
    a = 1 - sigma
    var = a * a * STD**2 + sigma**2
    return ((sigma - a * STD**2) * (x.double() - a * MEAN) / var - MEAN).float()


def worst_z(kind: str, noise_level: float, seed: int = 0, step=sde_step) -> float:
    """The largest |z| of the sample mean and variance (each dim) against the exact marginal at the checked sigmas,
    stepping with ``step`` (the kernel under test unless a test swaps it)."""
    gen = torch.Generator().manual_seed(seed)
    sigmas = torch.linspace(START, 0.0, STEPS + 1, dtype=torch.float64)
    mean, var = marginal(START)
    z = torch.randn(N, 2, generator=gen, dtype=torch.float64)
    z = (z - z.mean(0)) / z.std(0)  # the start has the exact moments: the check sees only what the steps do
    x = (mean + var.sqrt() * z).float()
    worst = 0.0
    for t in range(STEPS):
        s, s_next = float(sigmas[t]), float(sigmas[t + 1])
        x = step(x, exact_velocity(x, s), torch.full((N,), s), torch.full((N,), s_next), kind=kind,
                     noise_level=noise_level, generator=gen).prev_sample
        if (t + 1) % CHECK_EVERY == 0:
            mean, var = marginal(s_next)
            xd = x.double()
            z_mean = (xd.mean(0) - mean) / (var / N).sqrt()
            z_var = (xd.var(0) - var) / (var * math.sqrt(2 / (N - 1)))
            worst = max(worst, float(z_mean.abs().max()), float(z_var.abs().max()))
    return worst


@pytest.mark.parametrize("kind, noise_level", [("flow_grpo", 0.0), ("flow_grpo", 0.7), ("flow_grpo", 1.0),
                                               ("dance_grpo", 0.7)])
def test_sde_keeps_the_ode_marginals(kind, noise_level):
    assert worst_z(kind, noise_level) < 4.0


def test_a_wrong_drift_is_detected():
    """The same check on a kernel without the score correction (the plain Euler drift plus the SDE's noise): the
    injected variance is not removed, and the final variance is far off."""

    def euler_plus_noise(x, v, sigma, sigma_next, *, kind, noise_level, generator):
        out = sde_step(x, v, sigma, sigma_next, kind=kind, noise_level=noise_level, generator=generator)
        mean = x + v * (sigma_next - sigma)[:, None]
        return out._replace(prev_sample=mean + out.std[:, None] * (out.prev_sample - out.mean) / out.std[:, None])

    assert worst_z("flow_grpo", 0.7, step=euler_plus_noise) > 20.0
