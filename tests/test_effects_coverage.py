"""The effects' bootstrap intervals cover a known effect at their nominal rate (benchmark/analysis/effects.py).

Synthetic studies: each seed's learning curve rises from the base reward towards a plateau with a seed-specific time
constant, evaluated every 10 steps with evaluation noise, in a 200-step budget; the algorithm's time constant is a
fixed multiple of the baseline's at the same seed (paired). The target (a share of the baseline's gain) is estimated
from the study's own baseline runs, so it is uncertain, and some runs never reach it (censored at the budget). The
true restricted-mean ratio and difference come from a population of 20,000 seeds with the population target.
"""

from __future__ import annotations

import numpy as np
import pytest

from flowzoo.benchmark.analysis.effects import TaskRuns, cost_metric, effect, gain_target, restricted_mean
from flowzoo.benchmark.analysis.stats import smooth_trailing

STEPS = np.arange(0, 201, 10, dtype=float)
BASE, GAIN, EVAL_NOISE, SPEEDUP = 0.05, 0.5, 0.03, 0.6


def curves(rng: np.random.Generator, seeds: int, scale: float, tau: np.ndarray | None = None):
    """(curves [seeds, evals], tau): plateau and time constant vary by seed; ``scale`` multiplies the time constant."""
    tau = 60.0 * np.exp(0.5 * rng.standard_normal(seeds)) if tau is None else tau
    plateau = GAIN * np.exp(0.1 * rng.standard_normal(seeds))
    mean = BASE + plateau[:, None] * (1 - np.exp(-STEPS[None] / (scale * tau[:, None])))
    return mean + EVAL_NOISE * rng.standard_normal(mean.shape), tau


def study(rng: np.random.Generator, seeds: int) -> TaskRuns:
    baseline, tau = curves(rng, seeds, 1.0)
    algorithm, _ = curves(rng, seeds, SPEEDUP, tau * np.exp(0.2 * rng.standard_normal(seeds)))
    rows = np.concatenate([baseline, algorithm])
    smoothed = np.array([smooth_trailing(r, 3) for r in rows])
    n = len(rows)
    return TaskRuns(
        task="synthetic", runs=tuple(f"r{i}" for i in range(n)),
        cells=np.array(["baseline"] * seeds + ["algorithm"] * seeds, dtype=object),
        seeds=np.concatenate([np.arange(seeds), np.arange(seeds)]),
        base=rows[:, 0], final=smoothed[:, -1], auc=rows.mean(axis=1),
        running_max=tuple(np.maximum.accumulate(s) for s in smoothed),
        costs={"step": tuple(STEPS for _ in range(n)), "nfe": tuple(STEPS * 80 for _ in range(n)),
               "wall_s": tuple(STEPS for _ in range(n))},
        censored_at={"step": np.full(n, STEPS[-1]), "nfe": np.full(n, STEPS[-1] * 80), "wall_s": np.full(n, STEPS[-1])})


def truth(fraction: float) -> tuple[float, float, float]:
    """(ratio, difference, share of baseline runs censored) of restricted means, population of 20,000 seeds."""
    data = study(np.random.default_rng(12345), 20_000)
    metric = cost_metric("steps", "step", gain_target(fraction))
    base = np.flatnonzero(data.cells == "baseline")
    alg = np.flatnonzero(data.cells == "algorithm")
    target = float(metric.target(data.base[base].mean(), data.final[base].mean()))
    from flowzoo.benchmark.analysis.effects import crossings
    means = []
    for rows in (alg, base):
        cost, reached = crossings(data, rows, "step", [target])
        means.append(float(restricted_mean(cost.T, reached.T)[0]))
        censored = 1 - reached.mean()
    return means[0] / means[1], means[0] - means[1], float(censored)


@pytest.mark.parametrize("fraction", [0.5, 0.8])
def test_paired_intervals_cover_the_true_effect(fraction):
    ratio, diff, censored = truth(fraction)
    assert 0.4 < ratio < 0.9  # a real effect
    if fraction == 0.8:
        assert censored > 0.05  # censoring is part of what the intervals must carry
    rng = np.random.default_rng(7)
    metric = cost_metric("steps", "step", gain_target(fraction))
    hits_ratio = hits_diff = 0
    studies = 250
    for k in range(studies):
        row = effect(study(rng, 10), "algorithm", "baseline", metric, "baseline", paired=True, resamples=1000, seed=k)
        hits_ratio += row["ratio_low"] <= ratio <= row["ratio_high"]
        hits_diff += row["ci_low"] <= diff <= row["ci_high"]
    print(f"fraction {fraction}: true ratio {ratio:.3f}, difference {diff:.1f} steps, baseline censored "
          f"{censored:.3f}; coverage of {studies} studies: ratio {hits_ratio / studies:.3f}, difference "
          f"{hits_diff / studies:.3f}")
    assert hits_ratio / studies >= 0.90, (hits_ratio, studies)
    assert hits_diff / studies >= 0.90, (hits_diff, studies)

