"""pytest-benchmark timings of the tiny tier's RL step at its default size (random weights, same cost as the shipped
ones): one rollout (4 prompts x G 8, 10 SDE steps with CFG), one update on it, and one whole step (rollout, reward,
update) as ``benchmark/configs/tiny_flow_grpo.yaml`` runs it (the rollout keeps its autograd graph for the update).

Skipped by the default ``--benchmark-skip``; run with ``pytest tests/test_bench_tiny.py --benchmark-only``.
"""

import math

import pytest
import torch

import algorithms
import models
from models.tiny_data import prompt_set
from rewards.shapes import ShapesGenEval

PROMPTS = prompt_set("shapes", 4, seed=1)


def _flow_grpo(threads: int, **config):
    torch.set_num_threads(threads)
    model = models.get("tiny")(weights=None)
    return algorithms.get("flow_grpo")(model, ShapesGenEval(), {"group_size": 8, "num_steps": 10, "kl_beta": 0.0, **config})


@pytest.fixture
def algorithm():
    return _flow_grpo(1)  # one thread: the setting of runs that share the two cores (docs/tiny.md, speed)


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


@pytest.mark.parametrize("threads", [1, 2])
def test_bench_tiny_step(benchmark, threads):
    """One whole RL step of the shipped tiny config (``reuse_rollout_graph: true``): rollout + reward + update."""
    algorithm = _flow_grpo(threads, reuse_rollout_graph=True, lr=1e-3)
    texts, metadata = [p for p, _ in PROMPTS], [m for _, m in PROMPTS]
    result = benchmark.pedantic(algorithm.step, args=(texts, metadata), rounds=3, iterations=1, warmup_rounds=1)
    assert math.isfinite(result.loss) and result.ratio_mean == pytest.approx(1.0, abs=1e-4)
    assert (result.nfe_sampling, result.nfe_training) == (32 * 10 * 2, 0)  # the update recomputes no forward
