"""The transition kernels against their formulas (DESIGN.md section 4), by Monte Carlo, and against diffusers."""

import math

import pytest
import torch

from flowzoo.algorithms.engine.sde import euler_step, flow_grpo_std, gaussian_log_prob, sde_step, sigma_schedule


def _inputs(b=3, shape=(2, 4, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, *shape, generator=g)
    v = torch.randn(b, *shape, generator=g)
    sigma = torch.tensor([0.9, 0.5, 0.2])[:b]
    sigma_next = sigma - torch.tensor([0.1, 0.15, 0.2])[:b]
    return x, v, sigma, sigma_next


def _b(t, like):
    return t.reshape(-1, *([1] * (like.dim() - 1)))


def test_flow_grpo_mean_and_std_match_formula():
    x, v, s, sn = _inputs()
    a = 0.7
    out = sde_step(x, v, s, sn, kind="flow_grpo", noise_level=a)
    std_t = a * torch.sqrt(s / (1 - s))
    dt = sn - s
    mean = x * (1 + _b(std_t**2 / (2 * s) * dt, x)) + v * _b((1 + std_t**2 * (1 - s) / (2 * s)) * dt, x)
    torch.testing.assert_close(out.mean, mean)
    torch.testing.assert_close(out.std, std_t * torch.sqrt(-dt))


def test_flow_grpo_std_at_sigma_one_uses_sigma_next():
    s, sn = torch.tensor([1.0]), torch.tensor([0.9])
    torch.testing.assert_close(flow_grpo_std(s, sn, 0.7), 0.7 * torch.sqrt(torch.tensor([1.0 / 0.1])))
    out = sde_step(torch.randn(1, 5), torch.randn(1, 5), s, sn, kind="flow_grpo")
    assert torch.isfinite(out.mean).all() and torch.isfinite(out.log_prob).all()


def test_dance_grpo_mean_and_std_match_formula():
    x, v, s, sn = _inputs()
    eta = 0.3
    out = sde_step(x, v, s, sn, kind="dance_grpo", noise_level=eta)
    dt = _b(sn - s, x)
    sb = _b(s, x)
    x0 = x - sb * v
    score = -(x - (1 - sb) * x0) / sb**2
    torch.testing.assert_close(out.mean, x + dt * v - 0.5 * eta**2 * score * dt)
    torch.testing.assert_close(out.std, eta * torch.sqrt(s - sn))


def test_cps_mean_std_and_log_prob_match_formula():
    x, v, s, sn = _inputs()
    a = 0.7
    out = sde_step(x, v, s, sn, kind="cps", noise_level=a)
    std = sn * math.sin(a * math.pi / 2)
    sb, snb = _b(s, x), _b(sn, x)
    x0, x1 = x - sb * v, x + (1 - sb) * v
    mean = (1 - snb) * x0 + torch.sqrt(snb**2 - _b(std, x) ** 2) * x1
    torch.testing.assert_close(out.mean, mean)
    torch.testing.assert_close(out.std, std)
    torch.testing.assert_close(out.log_prob, -((out.prev_sample - mean) ** 2).mean(dim=(1, 2, 3)))


@pytest.mark.parametrize("kind,level", [("flow_grpo", 0.7), ("dance_grpo", 0.3), ("cps", 0.7)])
def test_monte_carlo_mean_and_variance(kind, level):
    """Samples drawn by the kernel have the kernel's mean and variance."""
    n = 20000
    x = torch.full((n, 1), 0.3)
    v = torch.full((n, 1), -0.8)
    s, sn = torch.full((n,), 0.6), torch.full((n,), 0.45)
    out = sde_step(x, v, s, sn, kind=kind, noise_level=level, generator=torch.Generator().manual_seed(1))
    std = float(out.std[0])
    mean = float(out.mean[0, 0])
    assert abs(float(out.prev_sample.mean()) - mean) < 4 * std / math.sqrt(n)
    assert abs(float(out.prev_sample.var()) / std**2 - 1) < 0.05


@pytest.mark.parametrize("kind,level", [("flow_grpo", 0.7), ("dance_grpo", 0.3)])
def test_log_prob_equals_torch_normal(kind, level):
    x, v, s, sn = _inputs()
    out = sde_step(x, v, s, sn, kind=kind, noise_level=level, generator=torch.Generator().manual_seed(3))
    ref = torch.distributions.Normal(out.mean, _b(out.std, x)).log_prob(out.prev_sample)
    torch.testing.assert_close(out.log_prob, ref.mean(dim=(1, 2, 3)))
    summed = sde_step(x, v, s, sn, kind=kind, noise_level=level, prev_sample=out.prev_sample, reduction="sum")
    torch.testing.assert_close(summed.log_prob, ref.sum(dim=(1, 2, 3)))


def test_prev_sample_is_scored_not_resampled():
    x, v, s, sn = _inputs()
    prev = torch.randn_like(x)
    out = sde_step(x, v, s, sn, prev_sample=prev)
    assert torch.equal(out.prev_sample, prev)
    torch.testing.assert_close(out.log_prob, gaussian_log_prob(prev, out.mean, out.std))


def test_noise_level_zero_is_euler():
    x, v, s, sn = _inputs()
    out = sde_step(x, v, s, sn, kind="flow_grpo", noise_level=0.0, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(out.prev_sample, euler_step(x, v, s, sn))
    torch.testing.assert_close(out.prev_sample, x + v * _b(sn - s, x))
    assert torch.equal(out.log_prob, torch.zeros(3))


def test_float16_inputs_use_float32_math():
    x, v, s, sn = _inputs()
    out16 = sde_step(x.half(), v.half(), s, sn, prev_sample=x.half())
    assert out16.log_prob.dtype == torch.float32 and out16.mean.dtype == torch.float32
    assert out16.prev_sample.dtype == torch.float16
    out32 = sde_step(x.half().float(), v.half().float(), s, sn, prev_sample=x.half().float())
    torch.testing.assert_close(out16.log_prob, out32.log_prob)


def test_per_sample_generators_are_reproducible_and_distinct():
    x, v, s, sn = _inputs()
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(3)]  # noqa: E731
    a = sde_step(x, v, s, sn, generator=gens()).prev_sample
    b = sde_step(x, v, s, sn, generator=gens()).prev_sample
    assert torch.equal(a, b)
    # sample 0's noise does not depend on the rest of the batch
    c = sde_step(x[:1], v[:1], s[:1], sn[:1], generator=gens()[:1]).prev_sample
    torch.testing.assert_close(a[:1], c)


def test_unknown_kind_names_the_choices():
    x, v, s, sn = _inputs()
    with pytest.raises(ValueError, match="unknown SDE kind 'ddim'.*flow_grpo, dance_grpo, cps"):
        sde_step(x, v, s, sn, kind="ddim")


@pytest.mark.parametrize("steps,shift", [(10, 3.0), (40, 3.0), (20, 1.0), (7, 5.0)])
def test_sigma_schedule_matches_diffusers(steps, shift):
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    scheduler.set_timesteps(steps)
    torch.testing.assert_close(sigma_schedule(steps, shift), scheduler.sigmas.float(), atol=1e-6, rtol=0)
