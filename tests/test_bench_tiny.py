"""pytest-benchmark timings of the tiny tier's RL step at its default size (random weights, same cost as the shipped
ones): one rollout (4 prompts x G 8, 10 SDE steps with CFG), one update on it, and one whole step (rollout, reward,
update) as ``benchmark/configs/tiny_flow_grpo.yaml`` runs it (the rollout keeps its autograd graph for the update).

Skipped by the default ``--benchmark-skip``; run with ``pytest tests/test_bench_tiny.py --benchmark-only``.
"""

import math
import statistics
import time

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo.models.tiny_data import prompt_set
from flowzoo.rewards.shapes import ShapesGenEval

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


# ---- the no-grad fast path (model arg ``no_grad_path``, docs/tiny.md Speed) ----------------------------------------
#: the study shapes: (prompts, G, SDE steps, timestep_fraction): the old one trains 3 of 10 steps of 64 samples,
#: the new one 2 of 4 steps of 32 samples; both CFG 4.5, reuse_rollout_graph true, shipped weights, 1 thread
SHAPES = {"old-8x8-T10": (8, 8, 10, 0.3), "new-4x8-T4": (4, 8, 4, 0.5)}
FIRST: dict[tuple[str, str], object] = {}  # (shape, path) -> StepStats of the first (warm-up) step


def _shape_step(shape: str, path: str):
    torch.set_num_threads(1)
    prompts, group, steps, fraction = SHAPES[shape]
    model = models.get("tiny")(no_grad_path=path)
    algorithm = algorithms.get("flow_grpo")(model, ShapesGenEval(), {
        "group_size": group, "num_steps": steps, "timestep_fraction": fraction, "kl_beta": 0.0, "lr": 5e-4,
        "clip_range": 1e-4, "reuse_rollout_graph": True})
    pairs = prompt_set("shapes", prompts, seed=1)
    return algorithm, [p for p, _ in pairs], [m for _, m in pairs]


@pytest.mark.parametrize("path", ["peft", "merged", "compiled"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_bench_tiny_step_path(benchmark, shape, path):
    """A whole step per no-grad path at each study shape, same seeds; the first step (untimed: it compiles under
    ``compiled``) must give the peft path's reward and loss. extra_info: medians of the phases, the first step."""
    if (shape, "peft") not in FIRST:
        algorithm, texts, metadata = _shape_step(shape, "peft")
        FIRST[shape, "peft"] = algorithm.step(texts, metadata)
    algorithm, texts, metadata = _shape_step(shape, path)
    t0 = time.perf_counter()
    first = FIRST.setdefault((shape, path), algorithm.step(texts, metadata))
    first_s = time.perf_counter() - t0
    ref = FIRST[shape, "peft"]
    assert first.reward_mean == pytest.approx(ref.reward_mean, abs=1e-4)
    assert first.loss == pytest.approx(ref.loss, rel=1e-3, abs=1e-8)
    assert first.grad_norm == pytest.approx(ref.grad_norm, rel=1e-3)
    stats = []
    benchmark.group = f"tiny step {shape}"
    benchmark.pedantic(lambda: stats.append(algorithm.step(texts, metadata)), rounds=3, iterations=1)
    benchmark.extra_info.update({
        "first_step_s": round(first_s, 3),
        **{k: round(statistics.median(getattr(s, k) for s in stats), 3) for k in ("t_sampling", "t_training")}})
    print(f"\n{shape} {path}: first step {first_s:.2f} s, " + ", ".join(
        f"{k} {v}" for k, v in benchmark.extra_info.items()))
