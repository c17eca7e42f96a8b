"""benchmark/analysis/effects.py: crossings, Kaplan-Meier restricted means, and effects whose CIs carry the target's
uncertainty (coverage by simulation: tests/test_effects_coverage.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowzoo.benchmark.analysis.effects import (TaskRuns, cost_metric, crossing, effect, gain_target, restricted_mean, value_metric,
                               verdict)

STEPS = np.arange(0, 60, 10, dtype=float)


def runs_of(curves: dict[str, list[list[float]]], steps: np.ndarray = STEPS) -> TaskRuns:
    """A task from raw eval curves (no smoothing) at STEPS: {cell: [curve of seed 0, curve of seed 1, ...]}."""
    cells, seeds, rows = [], [], []
    for cell, per_seed in curves.items():
        for seed, curve in enumerate(per_seed):
            cells.append(cell), seeds.append(seed), rows.append(np.asarray(curve, float))
    n = len(rows)
    return TaskRuns("t", tuple(map(str, range(n))), np.array(cells, dtype=object), np.array(seeds),
                    np.array([r[0] for r in rows]), np.array([r[-1] for r in rows]), np.array([r.mean() for r in rows]),
                    tuple(np.maximum.accumulate(r) for r in rows),
                    {c: tuple(steps * (2 if c == "nfe" else 1) for _ in range(n)) for c in ("step", "nfe", "wall_s")},
                    {c: np.full(n, steps[-1] * (2 if c == "nfe" else 1)) for c in ("step", "nfe", "wall_s")})


def test_crossing_first_reach_and_censoring():
    running = np.maximum.accumulate(np.array([0.0, 0.3, 0.2, 0.6, 0.5, 0.9]))
    cost, reached = crossing(running, STEPS, 50.0, [0.25, 0.6, 0.95, math.nan])
    assert cost.tolist() == [10.0, 30.0, 50.0, 50.0]
    assert reached.tolist() == [True, True, False, False]  # a dip after the crossing does not undo it


def test_restricted_mean_is_kaplan_meier_area():
    # all reach: the plain mean
    assert restricted_mean([[10.0, 20.0, 30.0]], [[True, True, True]])[0] == pytest.approx(20.0)
    # censored at the budget (50): counts as the budget, i.e. mean of min(T, budget)
    assert restricted_mean([[10.0, 50.0]], [[True, False]])[0] == pytest.approx(30.0)
    # censored early (a run stopped at 20, others reach at 10 and 40): KM
    # S = 1 on [0,10), 2/3 on [10,40) (the censoring at 20 leaves 1 at risk), 0 after 40: area 10 + 2/3 * 30 = 30
    assert restricted_mean([[10.0, 20.0, 40.0]], [[True, False, True]])[0] == pytest.approx(30.0)
    # ties: an event and a censoring at the same time, the event first
    assert restricted_mean([[10.0, 10.0]], [[False, True]])[0] == pytest.approx(10.0)


def test_effect_paired_diff_ratio_and_censoring():
    base = [[0.0, 0.2, 0.4, 0.6, 0.8, 1.0], [0.0, 0.1, 0.3, 0.5, 0.9, 1.0], [0.0, 0.3, 0.5, 0.7, 0.9, 1.0]]
    fast = [[0.0, 0.6, 1.0, 1.0, 1.0, 1.0], [0.0, 0.5, 0.9, 1.0, 1.0, 1.0], [0.0, 0.7, 1.0, 1.0, 1.0, 1.0]]
    never = [[0.0, 0.1, 0.1, 0.1, 0.1, 0.1]] * 3
    data = runs_of({"base": base, "fast": fast, "never": never})
    metric = cost_metric("steps_to_50", "step", gain_target(0.5))  # target 0.5
    row = effect(data, "fast", "base", metric, "base", resamples=2000)
    assert row["target"] == pytest.approx(0.5)
    assert row["algorithm_mean"] == pytest.approx(10.0) and row["reference_mean"] == pytest.approx(80 / 3)
    assert row["ratio"] == pytest.approx(10 / (80 / 3)) and row["ci_high"] < 0 and verdict(row, False) == "better"
    censored = effect(data, "never", "base", metric, "base", resamples=2000)
    assert censored["reached"] == 0 and censored["algorithm_mean"] == pytest.approx(50.0)
    nfe = effect(data, "fast", "base", cost_metric("nfe", "nfe", gain_target(0.5)), "base", resamples=200)
    assert nfe["algorithm_mean"] == pytest.approx(20.0)
    final = effect(data, "never", "base", value_metric("final_reward", "final"), "base", resamples=200)
    assert final["diff"] == pytest.approx(-0.9) and verdict(final, True) == "worse"


def test_effect_interval_carries_the_target_uncertainty():
    """Two cells whose runs are the same ramp at every seed, compared with the target set by a baseline whose final
    reward varies by seed: with the target held at its point estimate every resample gives the same difference (a
    zero-width CI); re-estimating the target from the drawn baseline runs moves both crossings, and the CI opens."""
    steps = np.arange(0, 400, 2, dtype=float)
    ramp = lambda slope: list(np.minimum(1.0, steps * slope))  # noqa: E731
    base = [list(p * np.minimum(1.0, steps / 300)) for p in np.linspace(0.5, 1.0, 8)]
    data = runs_of({"base": base, "a": [ramp(1 / 100)] * 8, "b": [ramp(1 / 200)] * 8}, steps)
    estimated = effect(data, "a", "b", cost_metric("s", "step", gain_target(0.8)), "base", resamples=2000)
    point = estimated["target"]
    fixed = effect(data, "a", "b", cost_metric("s", "step", lambda b, f: np.full(np.shape(b), point)), "base",
                   resamples=2000)
    assert fixed["diff"] == estimated["diff"] == pytest.approx(-100 * point, abs=2)
    assert fixed["ci_low"] == fixed["ci_high"] == fixed["diff"]
    assert estimated["ci_low"] < estimated["diff"] - 5 and estimated["ci_high"] > estimated["diff"] + 5


def test_effect_restricts_to_seeds_and_needs_two():
    data = runs_of({"base": [[0, 0.5, 1, 1, 1, 1]] * 3, "a": [[0, 1, 1, 1, 1, 1]] * 3})
    metric = cost_metric("s", "step", gain_target(0.5))
    one = effect(data, "a", "base", metric, "base", seeds=[1])
    assert one["n"] == 1 and math.isnan(one["ci_low"]) and verdict(one, False) == "n<2"
    assert effect(data, "a", "base", metric, "base", seeds=[0, 2])["n"] == 2
