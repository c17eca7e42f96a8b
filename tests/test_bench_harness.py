"""pytest-benchmark: the harness's own overhead against the network's cost on the tiny tier.

* rollout bookkeeping: a full 10-step CFG rollout of 32 samples with a network that costs nothing (kernels, noise,
  latents and log-prob bookkeeping);
* loss math: advantages + PPO-clip + KL + statistics for one update's 9 trained steps of 32 samples;
* logging: one metrics.csv rewrite of a 200-step run (what the runner does after every step);
* the network: one tiny-tier transformer forward + backward on 32 samples with CFG (the update does 9 of these
  per iteration, the rollout 10 forwards).

Skipped by the default ``--benchmark-skip``; run with ``pytest tests/test_bench_harness.py --benchmark-only``.
"""

import pytest
import torch

from flowzoo.algorithms.engine.advantages import group_advantages
from flowzoo.algorithms.engine.losses import approx_kl, gaussian_mean_kl, ppo_clip_loss
from flowzoo.algorithms.engine.rollout import rollout, sample_generators
from flowzoo.algorithms.engine.sde import sigma_schedule
from flowzoo.algorithms.engine.trajectory import StepPlan
from flowzoo.benchmark.run.runner import metrics_frame
from flowzoo.io import atomic_write
from flowzoo.models.base import Condition, FlowModel

BATCH, STEPS, SHAPE = 32, 10, (3, 32, 32)


class FreeNetwork(FlowModel):
    """A FlowModel whose network costs nothing: what remains of a rollout is the harness's bookkeeping."""

    default_guidance = 4.5
    latent_shape = SHAPE

    def null_condition(self, n):
        return Condition({"id": torch.zeros(n)})

    def predict(self, x, sigma, cond):
        return torch.zeros_like(x)


def _plan():
    sde = torch.ones(STEPS, dtype=torch.bool)
    train = sde.expand(BATCH, -1).clone()
    train[:, -1] = False
    return StepPlan(sigma_schedule(STEPS, 3.0), sde, train)


def test_bench_rollout_bookkeeping(benchmark):
    model, plan = FreeNetwork(), _plan()
    cond = Condition({"id": torch.ones(BATCH)})
    gens = sample_generators(0, count=BATCH)
    x = model.initial_noise(gens)
    latents, log_probs = benchmark(rollout, model, cond, plan, x, gens)
    assert latents.shape == (BATCH, STEPS + 1, *SHAPE) and torch.isfinite(log_probs).all()


def test_bench_loss_math(benchmark):
    g = torch.Generator().manual_seed(0)
    rewards, groups = torch.rand(BATCH, generator=g), torch.arange(BATCH) // 8
    logp, old = torch.randn(STEPS - 1, BATCH, generator=g), torch.randn(STEPS - 1, BATCH, generator=g)
    mean, ref = torch.randn(BATCH, *SHAPE, generator=g), torch.randn(BATCH, *SHAPE, generator=g)
    std = torch.full((BATCH,), 0.1)

    def loss_math():
        adv = group_advantages(rewards, groups)
        total = 0.0
        for t in range(STEPS - 1):
            terms = ppo_clip_loss(logp[t], old[t], adv, 1e-4)
            total += float((terms.loss + 0.04 * gaussian_mean_kl(mean, ref, std)).sum())
            total += float(approx_kl(logp[t], old[t])) + float(terms.clipped.sum())
        return total

    assert torch.isfinite(torch.tensor(benchmark(loss_math)))


def test_bench_metrics_logging(benchmark, tmp_path):
    rows = [{"step": i, "nfe": i * 100, "wall_s": i * 1.0, "reward_mean": 0.5, "clip_frac": 0.1, "t_sampling": 0.2,
             "abs_log_ratio_t3": 0.01} for i in range(200)]

    def log():
        frame = metrics_frame(rows)
        atomic_write(tmp_path / "metrics.csv", lambda f: frame.to_csv(f, index=False))

    benchmark(log)
    assert (tmp_path / "metrics.csv").read_text().count("\n") == 201


def test_bench_tiny_network_forward_backward(benchmark):
    models = pytest.importorskip("models")
    if "tiny" not in models.names():
        pytest.skip("the tiny tier is not installed")
    torch.set_num_threads(1)
    model = models.get("tiny")(weights=None)
    cond = model.encode(["a red circle"] * BATCH)
    x = torch.randn(BATCH, *model.latent_shape)
    sigma = torch.full((BATCH,), 0.5)

    def forward_backward():
        v = model.velocity(x, sigma, cond, 4.5)
        v.square().mean().backward()

    benchmark.pedantic(forward_backward, rounds=5, iterations=1)
    assert any(p.grad is not None for p in model.trainable_parameters())
