"""pytest-benchmark timings of the tiny tier's RL step at its default size (random weights, same cost as the shipped
ones): one rollout (4 prompts x G 8, 10 SDE steps with CFG) and one update on it.

Skipped by the default ``--benchmark-skip``; run with ``pytest tests/test_bench_tiny.py --benchmark-only``.
"""

import pytest
import torch

import algorithms
import models
from models.tiny_data import prompt_set
from rewards.shapes import ShapesGenEval

PROMPTS = prompt_set("shapes", 4, seed=1)


@pytest.fixture
def algorithm():
    torch.set_num_threads(1)  # the default of the tiny configs (train.threads): fastest on a shared 2-core CPU
    model = models.get("tiny")(weights=None)
    return algorithms.get("flow_grpo")(model, ShapesGenEval(), {"group_size": 8, "num_steps": 10, "kl_beta": 0.0})


def test_bench_tiny_rollout(benchmark, algorithm):
    texts, metadata = [p for p, _ in PROMPTS], [m for _, m in PROMPTS]
    traj = benchmark.pedantic(algorithm.fresh_rollout, args=(texts, metadata), rounds=3, iterations=1)
    assert traj.latents.shape == (32, 11, 3, 32, 32) and torch.isfinite(traj.latents).all()
    assert algorithm.model.nfe == 3 * 32 * 10 * 2  # three rounds of 32 samples x 10 steps x CFG


def test_bench_tiny_update(benchmark, algorithm):
    texts, metadata = [p for p, _ in PROMPTS], [m for _, m in PROMPTS]
    traj = algorithm.fresh_rollout(texts, metadata)
    algorithm.score(traj)
    advantages = torch.randn(len(traj))  # a random model scores 0 everywhere; the update's cost does not care

    def update():
        with torch.no_grad():  # restart from the same parameters, so every round is the on-policy first update
            for p, saved in zip(algorithm.model.trainable_parameters(), start):
                p.copy_(saved)
        return algorithm.update(traj, advantages)

    start = [p.detach().clone() for p in algorithm.model.trainable_parameters()]
    result = benchmark.pedantic(update, rounds=3, iterations=1)
    assert result["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and result["grad_norm"] > 0
