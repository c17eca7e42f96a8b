"""Aggregates across tasks in the manner of rliable (Agarwal et al. 2021, "Deep RL at the edge of the statistical
precipice"; github.com/google-research/rliable): pure numpy on per-task arrays of per-seed scores.

Scores of one algorithm are a list with one 1-D array per task (the seeds' scores on that task; tasks may have
different numbers of seeds). The definitions follow rliable's (rliable/metrics.py and library.py at 72fc16c):

* **IQM** (``aggregate_iqm``): the 25%-trimmed mean of all (task, seed) scores pooled, i.e. sort, drop floor(n/4)
  at each end, average the rest (rliable: ``scipy.stats.trim_mean(scores, 0.25, axis=None)``).
* **Probability of improvement** P(X > Y) (``probability_of_improvement``): per task, the share of (seed of X, seed
  of Y) pairs where X scores higher, ties counting one half (the Mann-Whitney U statistic over nx * ny); then the
  mean over tasks.
* **Performance profile** (``performance_profile``): for each threshold tau, the share of all (task, seed) scores
  above tau (rliable's run-score distribution).
* **Stratified bootstrap CI**: each resample draws, within every task separately, as many seeds with replacement as
  the task has; two algorithms (probability of improvement) are resampled independently. The interval is the
  percentile interval of the statistic over the resamples (rliable's default method, 'percentile').

rliable itself is not a dependency: it pulls in arch and statsmodels and bootstraps in a Python loop; these few lines
give the same statistics, checked against hand computations in tests/test_stats.py.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

Scores = Sequence[np.ndarray]  # one array of per-seed scores per task


def iqm(values, axis: int = -1) -> np.ndarray | float:
    """Interquartile mean along ``axis``: sort, drop floor(n/4) values at each end, average the rest."""
    values = np.sort(np.asarray(values, dtype=float), axis=axis)
    n = values.shape[axis]
    if n == 0:
        return math.nan
    cut = n // 4
    return np.take(values, np.arange(cut, n - cut), axis=axis).mean(axis=axis)


def percentile_interval(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central ``confidence`` percentile interval of the non-NaN samples; (NaN, NaN) if there are none."""
    alpha = (1.0 - confidence) / 2.0
    samples = np.asarray(samples, dtype=float)
    samples = samples[~np.isnan(samples)]
    if samples.size == 0:
        return math.nan, math.nan
    lo, hi = np.percentile(samples, [100 * alpha, 100 * (1 - alpha)])
    return float(lo), float(hi)


def _as_tasks(scores: Scores) -> list[np.ndarray]:
    tasks = [np.asarray(s, dtype=float).ravel() for s in scores]
    if not tasks or any(t.size == 0 for t in tasks):
        raise ValueError("scores need at least one task and at least one seed on every task")
    return tasks


def stratified_resample(scores: Scores, resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per task an array (resamples, n_task): each row the task's seeds drawn with replacement."""
    return [t[rng.integers(0, t.size, size=(resamples, t.size))] for t in _as_tasks(scores)]


def aggregate_iqm(scores: Scores) -> float:
    """IQM of all (task, seed) scores pooled."""
    return float(iqm(np.concatenate(_as_tasks(scores))))


def _pooled_iqm(resampled: list[np.ndarray]) -> np.ndarray:
    return iqm(np.concatenate(resampled, axis=1), axis=-1)


def _task_improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(x > y) + P(x == y) / 2 over all pairs, along the last two axes of x[..., :, None] vs y[..., None, :]."""
    diff = x[..., :, None] - y[..., None, :]
    return ((diff > 0) + 0.5 * (diff == 0)).mean(axis=(-2, -1))


def probability_of_improvement(scores_x: Scores, scores_y: Scores) -> float:
    """P(X > Y): per task over all seed pairs (ties 1/2), then averaged over tasks."""
    xs, ys = _as_tasks(scores_x), _as_tasks(scores_y)
    if len(xs) != len(ys):
        raise ValueError(f"X has {len(xs)} tasks, Y {len(ys)}: both need the same tasks")
    return float(np.mean([_task_improvement(x, y) for x, y in zip(xs, ys)]))


def performance_profile(scores: Scores, taus) -> np.ndarray:
    """For each tau: the share of all (task, seed) scores > tau."""
    pooled = np.concatenate(_as_tasks(scores))
    return (pooled[None, :] > np.asarray(taus, dtype=float)[:, None]).mean(axis=1)


def _ci(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    return percentile_interval(samples, confidence)


def aggregate_iqm_ci(scores: Scores, confidence: float, resamples: int, seed: int) -> tuple[float, float, float]:
    """(IQM, lo, hi) with a stratified bootstrap percentile CI; the CI is NaN when no task has 2 seeds."""
    tasks = _as_tasks(scores)
    point = aggregate_iqm(tasks)
    if max(t.size for t in tasks) < 2:
        return point, math.nan, math.nan
    rng = np.random.default_rng(seed)
    return (point, *_ci(_pooled_iqm(stratified_resample(tasks, resamples, rng)), confidence))


def probability_of_improvement_ci(scores_x: Scores, scores_y: Scores, confidence: float, resamples: int,
                                  seed: int) -> tuple[float, float, float]:
    """(P(X > Y), lo, hi): X and Y each resampled within every task, independently of each other."""
    xs, ys = _as_tasks(scores_x), _as_tasks(scores_y)
    point = probability_of_improvement(xs, ys)
    if max(t.size for t in xs + ys) < 2:
        return point, math.nan, math.nan
    rng = np.random.default_rng(seed)
    rx, ry = stratified_resample(xs, resamples, rng), stratified_resample(ys, resamples, rng)
    per_task = np.stack([_task_improvement(x, y) for x, y in zip(rx, ry)], axis=0)
    return (point, *_ci(per_task.mean(axis=0), confidence))


def performance_profile_ci(scores: Scores, taus, confidence: float, resamples: int, seed: int
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(profile, lo, hi) arrays over ``taus``, stratified bootstrap percentile bands."""
    tasks = _as_tasks(scores)
    taus = np.asarray(taus, dtype=float)
    profile = performance_profile(tasks, taus)
    if max(t.size for t in tasks) < 2:
        nan = np.full(taus.shape, math.nan)
        return profile, nan, nan.copy()
    rng = np.random.default_rng(seed)
    pooled = np.concatenate(stratified_resample(tasks, resamples, rng), axis=1)  # (resamples, n)
    shares = (pooled[:, None, :] > taus[None, :, None]).mean(axis=2)  # (resamples, taus)
    bands = np.array([_ci(shares[:, i], confidence) for i in range(taus.size)]).reshape(taus.size, 2)
    return profile, bands[:, 0], bands[:, 1]

