"""Statistics over run directories: eval curves, cost-to-target, ratios vs a baseline, IQM, bootstrap CIs.

Everything here is a pure function of the run directories (``config.yaml`` + ``metrics.csv``, found recursively),
so the report is reproducible from the runs alone. A run directory whose files cannot be used is skipped with a
warning (``SkippedRun``: the run and the cause); runs of different ``train.steps`` in one (task, algorithm) cell are
an error. The definitions, in one place:

* **Smoothing.** The eval curve of a run is smoothed with a trailing mean over its last ``smooth`` evaluations
  (fewer at the start of the curve; ``smooth=1`` is no smoothing). The step-0 evaluation (before training) counts.
* **Final reward** of a run: its smoothed eval reward at its last evaluation, i.e. the mean of its last ``smooth``
  evaluations. An unfinished run contributes its last evaluation so far and is flagged.
* **Base reward** of a task: the baseline's step-0 eval reward (the base model before training), mean over its seeds.
* **Target** (:class:`Target`). ``gain`` (the default, fraction 0.9): base + fraction x (baseline final - base), the
  given share of the way from the base model to the baseline's mean final reward; undefined (NaN) where the baseline
  does not improve on the base. ``relative``: fraction x the baseline's mean final reward (assumes a positive reward
  where larger is better). ``absolute``: a reward value, optionally one per task. Non-finite values are refused.
* **Cost to target** of a run: its ``step``, ``nfe`` and ``wall_s`` at its first evaluation whose smoothed eval reward
  is >= target (with a relative tolerance of 1e-9 so that float rounding of the seed average cannot make a run miss
  a target it sits on). A run that never reaches the target is **censored** at its last logged cost and flagged
  ``reached=False``; it is never dropped, and never counted as reaching the target.
* **Ratio vs the baseline** (:mod:`benchmark.analysis.effects`, shared with the study): the algorithm's restricted mean cost
  to target over the budget (Kaplan-Meier) / the baseline's, with a 95% percentile bootstrap CI that draws the seeds
  of the two groups apart (unpaired) and re-estimates the target from the baseline's drawn runs in every resample.
  As an estimate of the unrestricted mean cost, censored seeds of the algorithm make the ratio a lower bound,
  censored seeds of the baseline an upper bound, both: direction unknown; :func:`ratio_bound` names which.
* **Wall-clock** costs are those logged by the runs; on a machine whose load varied they carry that load, so the
  report shows them but states no verdict on them (the study measures per-step cost interleaved instead).
* **IQM** (interquartile mean, Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice"): the mean of
  the middle 50% of the sorted values, dropping floor(n/4) values at each end (the same as
  ``scipy.stats.trim_mean(x, 0.25)``).
* **CIs across seeds**: percentile bootstrap with ``DEFAULT_RESAMPLES`` resamples from a fixed seed, so the same runs
  give the same report. With fewer than 2 seeds a CI is NaN (shown as "n<2").
* **Across tasks** (:mod:`benchmark.analysis.aggregate`, rliable's definitions): normalized final reward
  (final - base) / (baseline final - base); IQM over all (task, seed) scores, probability of improvement over the
  baseline, performance profiles, each with stratified bootstrap CIs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from flowzoo.benchmark.analysis import effects
from flowzoo.benchmark.analysis.aggregate import (aggregate_iqm_ci, iqm, percentile_interval, performance_profile_ci,
                                 probability_of_improvement_ci)
from flowzoo.benchmark.analysis.runs import RUN_KEYS, SkippedRun, check_budgets, load_runs, run_summary
from flowzoo.benchmark.analysis.targets import (Target, as_target, base_rewards, baseline_finals, check_baseline,
                                        describe_target, target_function, task_targets)
from flowzoo.curves import DEFAULT_SMOOTH, smooth_trailing  # noqa: F401 (re-exported: one definition)
from flowzoo.errors import ConfigError



COSTS = effects.COSTS


COST_LABELS = {"step": "steps", "nfe": "NFE", "wall_s": "wall-clock"}



DEFAULT_CONFIDENCE = 0.95


DEFAULT_RESAMPLES = 10_000


DEFAULT_BOOTSTRAP_SEED = 0


TARGET_TOLERANCE = effects.TARGET_TOLERANCE


def eval_curves(runs: pd.DataFrame, smooth: int = DEFAULT_SMOOTH) -> pd.DataFrame:
    """The evaluation rows of every run, sorted by step, with the smoothed curve in ``eval_smoothed``."""
    curves = runs[runs["eval_reward"].notna()].sort_values(["run", "step"], kind="stable").copy()
    curves["eval_smoothed"] = np.nan
    for _, index in curves.groupby("run", sort=True).groups.items():
        curves.loc[index, "eval_smoothed"] = smooth_trailing(curves.loc[index, "eval_reward"], smooth)
    return curves.reset_index(drop=True)


def final_rewards(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per run: run keys and ``final_reward`` = the smoothed eval reward at the run's last evaluation."""
    last = curves.groupby("run", sort=True).tail(1)
    return last[list(RUN_KEYS) + ["step"]].assign(final_reward=last["eval_smoothed"]).reset_index(drop=True)


def reaches(values, target: float) -> np.ndarray:
    """Elementwise ``values >= target`` up to a relative float tolerance (so a seed at the seed-mean counts)."""
    return np.asarray(values, dtype=float) >= target - TARGET_TOLERANCE * max(1.0, abs(target))


def cost_to_target(curve: pd.DataFrame, last_row: pd.Series, target: float) -> dict:
    """Cost of one run: step/nfe/wall_s at its first eval with smoothed reward >= target, else censored at last_row."""
    hit = curve[reaches(curve["eval_smoothed"], target)] if not math.isnan(target) else curve.iloc[:0]
    reached = len(hit) > 0
    row = hit.iloc[0] if reached else last_row
    return {**{cost: float(row[cost]) for cost in COSTS}, "reached": reached}


def costs_to_target(runs: pd.DataFrame, curves: pd.DataFrame, targets: Mapping[str, float]) -> pd.DataFrame:
    """One row per run with an eval: run keys, ``target``, ``step``/``nfe``/``wall_s`` to target and ``reached``."""
    last_rows = runs.sort_values(["run", "step"], kind="stable").groupby("run").tail(1).set_index("run")
    rows = []
    for run, curve in curves.groupby("run", sort=True):
        keys = curve.iloc[0][list(RUN_KEYS)].to_dict()
        target = targets.get(keys["task"], math.nan)
        rows.append({**keys, "target": target, **cost_to_target(curve, last_rows.loc[run], target)})
    return pd.DataFrame(rows, columns=list(RUN_KEYS) + ["target", *COSTS, "reached"])


def _bootstrap_indices(n: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, n, size=(resamples, n))


def bootstrap_ci(
    values,
    statistic: Callable[..., np.ndarray] = np.mean,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile bootstrap CI of ``statistic(values, axis=-1)`` over resampled seeds; (NaN, NaN) when n < 2."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    stats = statistic(values[_bootstrap_indices(values.size, resamples, rng)], axis=-1)
    return percentile_interval(np.asarray(stats, dtype=float), confidence)


def ratio_of_means(values, baseline_values) -> float:
    numerator, denominator = float(np.mean(values)), float(np.mean(baseline_values))
    return numerator / denominator if denominator != 0 else math.nan


def ratio_ci(
    values,
    baseline_values,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """(mean(values) / mean(baseline_values), lo, hi): unpaired percentile bootstrap, each group resampled alone.

    The CI is NaN when either group has fewer than 2 seeds or the ratio is undefined (baseline mean 0).
    """
    values, baseline_values = np.asarray(values, float), np.asarray(baseline_values, float)
    if values.size == 0 or baseline_values.size == 0:
        return math.nan, math.nan, math.nan
    ratio = ratio_of_means(values, baseline_values)
    if values.size < 2 or baseline_values.size < 2 or math.isnan(ratio):
        return ratio, math.nan, math.nan
    ratios = ratio_bootstrap(values, baseline_values, resamples, np.random.default_rng(seed))
    return (ratio, *percentile_interval(ratios, confidence))


def ratio_bootstrap(values, baseline_values, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``resamples`` bootstrap replicates of mean(values) / mean(baseline_values), each group resampled alone
    (NaN where a resampled baseline mean is 0)."""
    values, baseline_values = np.asarray(values, float), np.asarray(baseline_values, float)
    numerators = values[_bootstrap_indices(values.size, resamples, rng)].mean(axis=1)
    denominators = baseline_values[_bootstrap_indices(baseline_values.size, resamples, rng)].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denominators != 0, numerators / denominators, np.nan)


def ratio_bound(algorithm_censored: int, baseline_censored: int) -> str:
    """What censoring makes of a ratio of mean costs: 'exact', 'lower bound', 'upper bound' or 'unknown direction'."""
    if algorithm_censored and baseline_censored:
        return "unknown direction"
    if algorithm_censored:
        return "lower bound"
    if baseline_censored:
        return "upper bound"
    return "exact"


def final_reward_table(finals: pd.DataFrame, **bootstrap) -> pd.DataFrame:
    """Per (task, algorithm): n seeds, unfinished runs, mean final reward with bootstrap CI, IQM with bootstrap CI."""
    rows = []
    for (task, algorithm), group in finals.groupby(["task", "algorithm"], sort=True):
        values = group["final_reward"].to_numpy(float)
        rows.append({
            "task": task,
            "algorithm": algorithm,
            "n": len(values),
            "unfinished": int((~group["finished"].astype(bool)).sum()),
            "mean": float(values.mean()),
            "mean_lo": (ci := bootstrap_ci(values, np.mean, **bootstrap))[0],
            "mean_hi": ci[1],
            "iqm": float(iqm(values)),
            "iqm_lo": (ci := bootstrap_ci(values, iqm, **bootstrap))[0],
            "iqm_hi": ci[1],
        })
    return pd.DataFrame(rows)


def task_data(runs: pd.DataFrame, curves: pd.DataFrame) -> dict[str, effects.TaskRuns]:
    """Per task, its runs as :class:`benchmark.analysis.effects.TaskRuns` (eval curves, censoring at each run's last logged
    row) for the effects' bootstraps."""
    last_rows = runs.sort_values(["run", "step"], kind="stable").groupby("run").tail(1).set_index("run")
    return effects.task_runs(curves, last_rows)


def efficiency_table(data: Mapping[str, effects.TaskRuns], baseline: str, target=None, **bootstrap) -> pd.DataFrame:
    """Per (task, non-baseline algorithm): seeds and reached counts, and for every cost the ratio vs the baseline.

    Costs are restricted means to the target (:mod:`benchmark.analysis.effects`: a run that never reaches it is censored at
    its last logged cost); the ratio's 95% CI is an unpaired bootstrap (each algorithm's seeds drawn apart) that
    re-estimates the target from the baseline's drawn runs. Columns: task, algorithm, target, n, reached,
    baseline_n, baseline_reached, bound, and for each cost in ``COSTS``: ``<cost>_mean`` (the algorithm's restricted
    mean cost), ``<cost>_baseline_mean``, ``<cost>_ratio``, ``<cost>_lo``, ``<cost>_hi``.
    """
    rows = []
    for task, runs in sorted(data.items()):
        if baseline not in set(runs.cells):
            continue
        function = target_function(target, task)
        for algorithm in runs.cell_names():
            if algorithm == baseline:
                continue
            row = {"task": task, "algorithm": algorithm}
            for cost in COSTS:
                metric = effects.cost_metric(f"{cost}_to_target", cost, function)
                e = effects.effect(runs, algorithm, baseline, metric, baseline, paired=False, **bootstrap)
                row.update({
                    "target": e["target"], "n": e["n"], "reached": e["reached"], "baseline_n": e["reference_n"],
                    "baseline_reached": e["reference_reached"],
                    f"{cost}_mean": e["algorithm_mean"], f"{cost}_baseline_mean": e["reference_mean"],
                    f"{cost}_ratio": e["ratio"], f"{cost}_lo": e["ratio_low"], f"{cost}_hi": e["ratio_high"],
                })
            row["bound"] = ratio_bound(row["n"] - row["reached"], row["baseline_n"] - row["baseline_reached"])
            rows.append(row)
    columns = ["task", "algorithm", "target", "n", "reached", "baseline_n", "baseline_reached", "bound"] + [
        f"{cost}_{part}" for cost in COSTS for part in ("mean", "baseline_mean", "ratio", "lo", "hi")]
    return pd.DataFrame(rows, columns=columns)


PROFILE_POINTS = 81


def normalized_finals(finals: pd.DataFrame, bases: Mapping[str, float], tops: Mapping[str, float]) -> pd.DataFrame:
    """``finals`` with ``normalized`` = (final - base) / (top - base): 0 is the base model, 1 the baseline's mean
    final reward (``tops``). NaN on a task where the baseline's gain (top - base) is not positive."""
    out = finals.copy()
    base = out["task"].map(lambda t: bases.get(t, math.nan)).astype(float)
    gain = out["task"].map(lambda t: tops.get(t, math.nan)).astype(float) - base
    out["normalized"] = np.where(gain > 0, (out["final_reward"] - base) / gain.where(gain > 0), np.nan)
    return out


def _task_scores(finals: pd.DataFrame, algorithm: str, tasks: list[str], column: str) -> list[np.ndarray]:
    rows = finals[finals["algorithm"] == algorithm]
    return [rows.loc[rows["task"] == task, column].to_numpy(float) for task in tasks]


def comparable_tasks(normalized: pd.DataFrame, algorithm: str, baseline: str) -> list[str]:
    """Tasks where both ``algorithm`` and ``baseline`` have runs and the normalized score is defined."""
    defined = normalized[normalized["normalized"].notna()]
    have = [set(defined.loc[defined["algorithm"] == a, "task"]) for a in (algorithm, baseline)]
    return sorted(have[0] & have[1])


def aggregate_table(normalized: pd.DataFrame, baseline: str, confidence: float = DEFAULT_CONFIDENCE,
                    resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_BOOTSTRAP_SEED) -> pd.DataFrame:
    """Per algorithm, over the tasks it shares with the baseline (where the baseline gains): the IQM of normalized
    final rewards with a stratified bootstrap CI, and the probability of improvement over the baseline on raw final
    rewards (``poi``; NaN for the baseline itself) with its CI."""
    rows = []
    for algorithm in sorted(normalized["algorithm"].unique(), key=lambda a: (a != baseline, a)):
        tasks = comparable_tasks(normalized, algorithm, baseline)
        row = {"algorithm": algorithm, "tasks": tasks, "n": 0, "iqm": math.nan, "iqm_lo": math.nan,
               "iqm_hi": math.nan, "poi": math.nan, "poi_lo": math.nan, "poi_hi": math.nan}
        if tasks:
            scores = _task_scores(normalized, algorithm, tasks, "normalized")
            row["n"] = int(sum(len(s) for s in scores))
            row["iqm"], row["iqm_lo"], row["iqm_hi"] = aggregate_iqm_ci(scores, confidence, resamples, seed)
            if algorithm != baseline:
                x = _task_scores(normalized, algorithm, tasks, "final_reward")
                y = _task_scores(normalized, baseline, tasks, "final_reward")
                row["poi"], row["poi_lo"], row["poi_hi"] = probability_of_improvement_ci(
                    x, y, confidence, resamples, seed)
        rows.append(row)
    return pd.DataFrame(rows)


def profile_taus(normalized: pd.DataFrame, points: int = PROFILE_POINTS) -> np.ndarray:
    """Thresholds of the performance profiles: from min(0, lowest score) to max(1.2, highest score)."""
    values = normalized["normalized"].dropna().to_numpy(float)
    lo = min(0.0, float(values.min())) if values.size else 0.0
    hi = max(1.2, float(values.max())) if values.size else 1.2
    return np.linspace(lo, hi, points)


def performance_profiles(normalized: pd.DataFrame, baseline: str, resamples: int = 2000,
                         confidence: float = DEFAULT_CONFIDENCE, seed: int = DEFAULT_BOOTSTRAP_SEED) -> pd.DataFrame:
    """Tidy (algorithm, tau, share, lo, hi): the share of an algorithm's (task, seed) normalized final rewards above
    tau, over the tasks it shares with the baseline, with stratified bootstrap bands (rliable's 2000 resamples)."""
    taus = profile_taus(normalized)
    frames = []
    for algorithm in sorted(normalized["algorithm"].unique()):
        tasks = comparable_tasks(normalized, algorithm, baseline)
        if not tasks:
            continue
        share, lo, hi = performance_profile_ci(_task_scores(normalized, algorithm, tasks, "normalized"), taus,
                                               confidence, resamples, seed)
        frames.append(pd.DataFrame({"algorithm": algorithm, "tau": taus, "share": share, "lo": lo, "hi": hi}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["algorithm", "tau", "share", "lo", "hi"])


@dataclass
class Analysis:
    """Everything the report needs, computed once from a runs directory."""

    runs: pd.DataFrame
    summary: pd.DataFrame
    curves: pd.DataFrame
    finals: pd.DataFrame
    targets: dict[str, float]
    costs: pd.DataFrame
    final_table: pd.DataFrame
    efficiency: pd.DataFrame
    baseline: str
    target: "Target | dict[str, float]"  # as given, normalised once (:func:`as_target`)
    target_description: str
    smooth: int
    bases: dict[str, float]
    baseline_finals: dict[str, float]
    normalized: pd.DataFrame
    aggregate: pd.DataFrame
    profiles: pd.DataFrame
    skipped: list[SkippedRun]
    #: run -> the ``tuned:`` directory its recipe came from (None: the suite's own recipe; loading.tuned_recipe)
    recipes: dict = field(default_factory=dict)
    #: run -> its evaluation protocol in words (loading.evaluation_protocol)
    protocols: dict = field(default_factory=dict)


def analyze(runs_dir: str | Path, baseline: str = "flow_grpo", target=None, smooth: int = DEFAULT_SMOOTH) -> Analysis:
    """Load every run under ``runs_dir`` (skipping unreadable ones) and compute curves, final rewards, targets,
    costs, the per-task tables and the aggregates across tasks. The target is checked before any run is read."""
    target = as_target(target)
    skipped: list[SkippedRun] = []
    recipes: dict[str, str | None] = {}
    protocols: dict[str, str] = {}
    runs = load_runs(runs_dir, skipped, recipes, protocols)
    check_baseline(runs, baseline)
    check_budgets(runs)
    curves = eval_curves(runs, smooth)
    if curves.empty:
        raise ConfigError(f"no evaluation rows (eval_reward) in any run under {str(runs_dir)!r}")
    finals = final_rewards(curves)
    bases, tops = base_rewards(curves, baseline), baseline_finals(finals, baseline)
    targets = task_targets(finals, baseline, target, bases)
    costs = costs_to_target(runs, curves, targets)
    normalized = normalized_finals(finals, bases, tops)
    return Analysis(
        runs=runs,
        summary=run_summary(runs),
        curves=curves,
        finals=finals,
        targets=targets,
        costs=costs,
        final_table=final_reward_table(finals),
        efficiency=efficiency_table(task_data(runs, curves), baseline, target),
        baseline=baseline,
        target=target,
        target_description=describe_target(baseline, target),
        smooth=smooth,
        bases=bases,
        baseline_finals=tops,
        normalized=normalized,
        aggregate=aggregate_table(normalized, baseline),
        profiles=performance_profiles(normalized, baseline),
        skipped=skipped,
        recipes=recipes,
        protocols=protocols,
    )
