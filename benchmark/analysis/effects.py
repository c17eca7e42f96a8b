"""Effects between cells of runs, with intervals that carry the target's uncertainty and censoring.

The one place where costs to a target and the differences and ratios between cells are estimated; the report
(:mod:`benchmark.analysis.stats`), the study (:mod:`benchmark.study.verdicts`) and its claims table (:mod:`benchmark.study.claims`) all
read their numbers from here. Definitions:

* **Runs of a task** (:class:`TaskRuns`): per run its cell (algorithm, or ``algorithm@variant`` for a control), seed,
  step-0 eval reward (``base``), final reward (smoothed, :mod:`benchmark.analysis.stats`), AUC (mean raw eval reward over the
  run's evaluations), and its smoothed eval curve with the cost (steps, NFE, wall-clock) logged at each evaluation.
* **Target** of a task: computed from the baseline's runs by a :class:`benchmark.analysis.targets.Target` (e.g. ``gain`` 0.5:
  base + 0.5 x (final - base), with base and final the baseline's means over its seeds). It is an estimate, so
  every bootstrap resample re-estimates it from the baseline runs that resample drew.
* **Time to target** of a run: its cost at its first evaluation whose smoothed reward reaches the target (a relative
  float tolerance of 1e-9, :data:`benchmark.analysis.stats.TARGET_TOLERANCE`). The running maximum of the smoothed curve is
  non-decreasing, so the first crossing of any number of targets is one ``searchsorted``. A run that never reaches
  the target is **censored** at its last logged cost: it is known to need more than that, never counted as reaching.
* **Restricted mean time to target** (RMST) of a cell: the area under the Kaplan-Meier survival curve of its times to
  target, from 0 to the largest observed time (for finished runs, the budget): the expected cost to reach the
  target or to spend the budget, whichever comes first (Royston & Parmar 2013, "Restricted mean survival time").
  When every censored run is censored at the budget it equals the mean of min(time, budget); a run stopped early is
  censored at its own last step, which Kaplan-Meier handles. Its companion is the share of runs that reach the
  target within the budget.
* **Paired effect** of a cell against a reference cell over the seeds both ran (and the baseline ran, for the
  target): the difference and the ratio of the two cells' RMSTs (or of their mean final rewards / AUCs). Seed s of
  every cell shares its prompt order and sampler seed, so the bootstrap draws seeds, and each drawn seed brings its
  run of every cell and of the baseline.
* **Unpaired effect** (the report: seeds need not match): the cell's and the baseline's seeds are drawn apart.
* **Intervals**: 95% percentile bootstrap (``resamples`` from a fixed seed, so the same runs give the same numbers),
  the target re-estimated inside each resample. Checked by simulation in ``tests/test_effects_coverage.py``:
  synthetic studies with a known effect are covered at the nominal rate.
* **Minimum detectable effect** (MDE): the true mean paired difference a two-sided paired t-test at level 0.05
  detects with 80% power given the standard deviation of the per-seed differences (of restricted times for costs):
  ``(t_{0.975, n-1} + t_{0.80, n-1}) sd / sqrt(n)``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from flowzoo.benchmark.analysis.aggregate import percentile_interval

COSTS = ("step", "nfe", "wall_s")
TARGET_TOLERANCE = 1e-9
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 10_000
DEFAULT_BOOTSTRAP_SEED = 0
ALPHA, POWER = 0.05, 0.80


# ------------------------------------------------------------------------------------------------------ task runs


@dataclass(frozen=True)
class TaskRuns:
    """The runs of one task as arrays (one entry per run, in ``runs`` order) for fast resampling."""

    task: str
    runs: tuple[str, ...]
    cells: np.ndarray
    seeds: np.ndarray
    base: np.ndarray
    final: np.ndarray
    auc: np.ndarray
    running_max: tuple[np.ndarray, ...]
    costs: Mapping[str, tuple[np.ndarray, ...]]  # cost name -> the cost at each evaluation of each run
    censored_at: Mapping[str, np.ndarray] = field(default_factory=dict)  # cost name -> each run's last logged cost

    def index(self, cell: str) -> dict[int, int]:
        """seed -> position of that cell's run (one run per seed and cell)."""
        return {int(seed): i for i, (c, seed) in enumerate(zip(self.cells, self.seeds)) if c == cell}

    def cell_names(self) -> list[str]:
        return sorted(set(self.cells.tolist()))


def task_runs(curves: pd.DataFrame, last_rows: pd.DataFrame, cell_column: str = "algorithm") -> dict[str, TaskRuns]:
    """Per task, its runs from the eval curves (:func:`benchmark.analysis.stats.eval_curves`: rows of ``run``, ``task``,
    ``seed``, ``step``, the costs, ``eval_reward``, ``eval_smoothed``) and each run's last logged row (indexed by run:
    the censoring costs). Raises ``ValueError`` when a cell holds two runs of one seed."""
    out = {}
    for task, rows in curves.groupby("task", sort=True):
        names, cells, seeds, base, final, auc, running_max = [], [], [], [], [], [], []
        costs = {cost: [] for cost in COSTS}
        for run, curve in rows.groupby("run", sort=True):
            names.append(run)
            cells.append(str(curve[cell_column].iloc[0]))
            seeds.append(int(curve["seed"].iloc[0]))
            base.append(float(curve["eval_reward"].iloc[0]))
            final.append(float(curve["eval_smoothed"].iloc[-1]))
            auc.append(float(curve["eval_reward"].mean()))
            running_max.append(np.maximum.accumulate(curve["eval_smoothed"].to_numpy(float)))
            for cost in COSTS:
                costs[cost].append(curve[cost].to_numpy(float))
        pairs = list(zip(cells, seeds))
        if len(set(pairs)) != len(pairs):
            twice = sorted({p for p in pairs if pairs.count(p) > 1})
            raise ValueError(f"task {task!r}: cell and seed {twice[0]} hold more than one run")
        last = last_rows.loc[names]
        out[task] = TaskRuns(task, tuple(names), np.array(cells, dtype=object), np.array(seeds), np.array(base),
                             np.array(final), np.array(auc), tuple(running_max),
                             {c: tuple(v) for c, v in costs.items()},
                             {c: last[c].to_numpy(float) for c in COSTS})
    return out


# ----------------------------------------------------------------------------------------------- time to target


def crossing(running_max: np.ndarray, costs: np.ndarray, censored_at: float, targets) -> tuple[np.ndarray, np.ndarray]:
    """(cost, reached) of one run for each target: its cost at its first evaluation whose smoothed reward reaches
    the target; else (its last logged cost, False). A NaN target is never reached."""
    targets = np.asarray(targets, dtype=float)
    threshold = targets - TARGET_TOLERANCE * np.maximum(1.0, np.abs(targets))
    position = np.searchsorted(running_max, np.where(np.isfinite(threshold), threshold, np.inf), side="left")
    reached = position < len(running_max)
    return np.where(reached, costs[np.minimum(position, len(costs) - 1)], censored_at), reached


def crossings(data: TaskRuns, rows: np.ndarray, cost: str, targets) -> tuple[np.ndarray, np.ndarray]:
    """Costs and reached flags, shape [len(rows), len(targets)], of the given runs for each target."""
    out = [crossing(data.running_max[i], data.costs[cost][i], data.censored_at[cost][i], targets) for i in rows]
    return np.array([c for c, _ in out]).reshape(len(rows), -1), np.array([r for _, r in out]).reshape(len(rows), -1)


def restricted_mean(times, reached) -> np.ndarray:
    """Kaplan-Meier restricted mean of each row of ``times`` [R, n] (events where ``reached``), integrated from 0 to
    the row's largest time. Ties: events before censorings. Rows of no run give NaN."""
    times, reached = np.atleast_2d(np.asarray(times, float)), np.atleast_2d(np.asarray(reached, bool))
    rows, n = times.shape
    if n == 0:
        return np.full(rows, np.nan)
    order = np.argsort(~reached, axis=1, kind="stable")  # events first ...
    times, reached = np.take_along_axis(times, order, 1), np.take_along_axis(reached, order, 1)
    order = np.argsort(times, axis=1, kind="stable")  # ... then by time, keeping events before tied censorings
    times, reached = np.take_along_axis(times, order, 1), np.take_along_axis(reached, order, 1)
    at_risk = n - np.arange(n)
    survival_after = np.cumprod(1.0 - reached / at_risk, axis=1)
    survival_before = np.concatenate([np.ones((rows, 1)), survival_after[:, :-1]], axis=1)
    widths = np.diff(np.concatenate([np.zeros((rows, 1)), times], axis=1), axis=1)
    return (survival_before * widths).sum(axis=1)


# ------------------------------------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    """What is compared: a cost to a target (``cost`` and ``target``: a function of the baseline's mean base and mean
    final reward, vectorised) or a per-run value (``value``: 'final' or 'auc')."""

    name: str
    cost: str | None = None
    target: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
    value: str | None = None
    higher_is_better: bool = False

    @property
    def is_cost(self) -> bool:
        return self.cost is not None


def gain_target(fraction: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """base + fraction x (final - base), NaN where the baseline's final is not above its base."""
    def target(base, final):
        base, final = np.asarray(base, float), np.asarray(final, float)
        with np.errstate(invalid="ignore"):
            return np.where(final > base, base + fraction * (final - base), np.nan)
    return target


def cost_metric(name: str, cost: str, target) -> Metric:
    return Metric(name, cost=cost, target=target)


def value_metric(name: str, value: str) -> Metric:
    return Metric(name, value=value, higher_is_better=True)


def baseline_target(data: TaskRuns, metric: Metric, baseline_rows: np.ndarray) -> np.ndarray:
    """The target estimated from the baseline runs of ``baseline_rows`` ([R, m] draws, or [m] for one estimate)."""
    rows = np.atleast_2d(baseline_rows)
    return metric.target(data.base[rows].mean(axis=1), data.final[rows].mean(axis=1))


# ------------------------------------------------------------------------------------------------------- effects


def _cell_statistic(data: TaskRuns, metric: Metric, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per draw r (``rows`` [R, n] run positions, ``targets`` [R]): the cell's RMST to ``targets[r]`` or its mean
    value over the drawn runs."""
    if not metric.is_cost:
        return getattr(data, metric.value)[rows].mean(axis=1)
    unique, inverse = np.unique(rows, return_inverse=True)
    costs, reached = crossings(data, unique, metric.cost, targets)  # [len(unique), R]
    inverse = inverse.reshape(rows.shape)
    draw = np.arange(rows.shape[0])[:, None]
    return restricted_mean(costs[inverse, draw], reached[inverse, draw])


def _per_run(data: TaskRuns, metric: Metric, rows, target: float) -> tuple[np.ndarray, np.ndarray]:
    """(value, reached) of each run at one target: its restricted time (cost) or its value."""
    rows = np.asarray(rows, dtype=int)
    if not metric.is_cost:
        return getattr(data, metric.value)[rows], np.ones(len(rows), bool)
    costs, reached = crossings(data, rows, metric.cost, [target])
    return costs[:, 0], reached[:, 0]


def minimum_detectable_effect(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true mean paired difference a two-sided paired t-test detects with probability ``power``."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return float((sps.t.ppf(1 - alpha / 2, n - 1) + sps.t.ppf(power, n - 1)) * sd / math.sqrt(n))


def _ratio(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / b, np.nan)


def _interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return math.nan, math.nan
    return percentile_interval(values, confidence)


def effect(data: TaskRuns, cell: str, reference: str, metric: Metric, baseline: str, paired: bool = True,
           seeds: Sequence[int] | None = None, confidence: float = DEFAULT_CONFIDENCE,
           resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_BOOTSTRAP_SEED) -> dict:
    """``cell`` against ``reference`` on ``metric``: means, difference and ratio with bootstrap CIs (the target
    re-estimated from the baseline's drawn runs in each resample), censoring counts, and for paired effects the sd of
    the per-seed differences, the MDE and a paired t-test p-value. ``seeds`` restricts the seeds used (e.g. a seed
    set). Fewer than 2 seeds: NaN intervals."""
    at = {name: data.index(name) for name in {cell, reference, baseline}}
    keep = (lambda s: True) if seeds is None else set(int(s) for s in seeds).__contains__
    if paired:
        common = sorted(s for s in set(at[cell]) & set(at[reference]) & set(at[baseline]) if keep(s))
        groups = {name: np.array([at[name][s] for s in common], dtype=int) for name in at}
    else:
        groups = {name: np.array([i for s, i in sorted(at[name].items()) if keep(s)], dtype=int) for name in at}
    a, b, base = groups[cell], groups[reference], groups[baseline]
    row = {"task": data.task, "reference": reference, "algorithm": cell, "metric": metric.name, "paired": paired,
           "n": len(a), "reference_n": len(b)}
    if len(a) == 0 or len(b) == 0 or len(base) == 0:
        return {**row, **{k: math.nan for k in ("target", "algorithm_mean", "reference_mean", "diff", "ci_low",
                                                   "ci_high", "ratio", "ratio_low", "ratio_high", "sd_diff", "mde",
                                                   "p_t")}, "reached": 0, "reference_reached": 0}
    target = float(baseline_target(data, metric, base)[0]) if metric.is_cost else math.nan
    value_a, reached_a = _per_run(data, metric, a, target)
    value_b, reached_b = _per_run(data, metric, b, target)
    mean_a = float(_cell_statistic(data, metric, a[None], np.array([target]))[0])
    mean_b = float(_cell_statistic(data, metric, b[None], np.array([target]))[0])
    row.update(target=target, algorithm_mean=mean_a, reference_mean=mean_b, diff=mean_a - mean_b,
               ratio=float(_ratio(mean_a, mean_b)), reached=int(reached_a.sum()),
               reference_reached=int(reached_b.sum()))
    if paired:
        diffs = value_a - value_b
        sd = float(diffs.std(ddof=1)) if len(diffs) > 1 else math.nan
        with warnings.catch_warnings():  # nearly identical differences: scipy warns of precision loss, p is still right
            warnings.simplefilter("ignore", RuntimeWarning)
            p_t = float(sps.ttest_1samp(diffs, 0.0).pvalue) if len(diffs) > 1 and sd > 0 else math.nan
        row.update(sd_diff=sd, mde=minimum_detectable_effect(sd, len(diffs)), p_t=p_t)
    else:
        row.update(sd_diff=math.nan, mde=math.nan, p_t=math.nan)
    if min(len(a), len(b), len(base)) < 2:
        return {**row, "ci_low": math.nan, "ci_high": math.nan, "ratio_low": math.nan, "ratio_high": math.nan}
    rng = np.random.default_rng(seed)
    if paired:
        draw = rng.integers(0, len(a), size=(resamples, len(a)))
        rows_a, rows_b, rows_base = a[draw], b[draw], base[draw]
    else:
        rows_base = base[rng.integers(0, len(base), size=(resamples, len(base)))]
        rows_a = a[rng.integers(0, len(a), size=(resamples, len(a)))] if cell != baseline else rows_base
        rows_b = rows_base if reference == baseline else b[rng.integers(0, len(b), size=(resamples, len(b)))]
    targets = baseline_target(data, metric, rows_base) if metric.is_cost else np.full(resamples, np.nan)
    boot_a = _cell_statistic(data, metric, rows_a, targets)
    boot_b = _cell_statistic(data, metric, rows_b, targets)
    row["ci_low"], row["ci_high"] = _interval(boot_a - boot_b, confidence)
    row["ratio_low"], row["ratio_high"] = _interval(_ratio(boot_a, boot_b), confidence)
    return row


#: the verdict of a cost whose target is undefined: the baseline's mean final reward does not exceed its base
NO_TARGET = "no target (the baseline did not improve on the base model)"


def verdict(row: Mapping, higher_is_better: bool, is_cost: bool = False) -> str:
    """Plain words for one effect: which side its CI excludes 0 on, else 'no detectable difference (MDE ...)'; for a
    cost to a target that is undefined in these seeds (:func:`gain_target`), :data:`NO_TARGET`: every run is then
    censored at the budget, and the ratio of 1 that results compares nothing."""
    if is_cost and not math.isfinite(float(row.get("target", math.nan))):
        return NO_TARGET
    low, high = row["ci_low"], row["ci_high"]
    if not (math.isfinite(low) and math.isfinite(high)):
        return "n<2"
    if (low > 0) if higher_is_better else (high < 0):
        return "better"
    if (high < 0) if higher_is_better else (low > 0):
        return "worse"
    mde = row.get("mde", math.nan)
    return f"no detectable difference (MDE {mde:.3g})" if math.isfinite(mde) else "no detectable difference"
