"""Statistics over run directories: eval curves, cost-to-target, ratios vs a baseline, IQM, bootstrap CIs.

Everything here is a pure function of the run directories (``config.yaml`` + ``metrics.csv``, found recursively),
so the report is reproducible from the runs alone. The definitions, in one place:

* **Smoothing.** The eval curve of a run is smoothed with a trailing mean over its last ``smooth`` evaluations
  (fewer at the start of the curve; ``smooth=1`` is no smoothing). The step-0 evaluation (before training) counts.
* **Final reward** of a run: its smoothed eval reward at its last evaluation, i.e. the mean of its last ``smooth``
  evaluations. An unfinished run contributes its last evaluation so far and is flagged.
* **Target.** Either absolute (a reward value, optionally one per task) or relative: ``fraction`` times the
  baseline's final reward averaged over its seeds (default: fraction 1.0, "the baseline's final reward"). A relative
  target assumes a reward where larger is better and which is positive; use an absolute target otherwise.
* **Cost to target** of a run: its ``step``, ``nfe`` and ``wall_s`` at its first evaluation whose smoothed eval reward
  is >= target (with a relative tolerance of 1e-9 so that float rounding of the seed average cannot make a run miss
  a target it sits on). A run that never reaches the target is **censored**: it counts at the cost of its last
  logged step (its true cost is larger) and is flagged ``reached=False``; it is never dropped.
* **Ratio vs the baseline**: mean over seeds of the algorithm's cost / mean over seeds of the baseline's cost, with a
  95% percentile bootstrap CI that resamples the seeds of the two groups independently (unpaired: seeds are
  independent runs). Censored seeds of the algorithm make the ratio a lower bound; censored seeds of the baseline
  make it an upper bound; both: the direction is unknown. :func:`ratio_bound` names which.
* **IQM** (interquartile mean, Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice"): the mean of
  the middle 50% of the sorted values, dropping floor(n/4) values at each end (the same as
  ``scipy.stats.trim_mean(x, 0.25)``).
* **CIs across seeds**: percentile bootstrap with ``DEFAULT_RESAMPLES`` resamples from a fixed seed, so the same runs
  give the same report. With fewer than 2 seeds a CI is NaN (shown as "n<2").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import pandas as pd
import yaml

from flowzoo.errors import ConfigError

COSTS = ("step", "nfe", "wall_s")
COST_LABELS = {"step": "steps", "nfe": "NFE", "wall_s": "wall-clock"}
REQUIRED_COLUMNS = ("step", "nfe", "wall_s", "eval_reward")
RUN_KEYS = ("run", "task", "algorithm", "seed", "train_steps", "finished")

DEFAULT_SMOOTH = 3
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 10_000
DEFAULT_BOOTSTRAP_SEED = 0
TARGET_TOLERANCE = 1e-9


# ----------------------------------------------------------------------------------------------------------- loading


def find_run_dirs(runs_dir: str | Path) -> list[Path]:
    """Every directory under ``runs_dir`` (itself included, any depth) holding both config.yaml and metrics.csv."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise ConfigError(f"runs directory {str(runs_dir)!r} does not exist or is not a directory")
    found = {p.parent for p in runs_dir.rglob("config.yaml") if (p.parent / "metrics.csv").is_file()}
    return sorted(found)


def _config_value(config: Mapping, dotted_key: str, path: Path):
    value = config
    for key in dotted_key.split("."):
        if not isinstance(value, Mapping) or key not in value:
            raise ConfigError(f"{path}: missing key {dotted_key!r} (need task, seed, algorithm.name, train.steps)")
        value = value[key]
    return value


def load_run(run_dir: str | Path, runs_dir: str | Path | None = None) -> pd.DataFrame:
    """One run as tidy rows: the run keys (``RUN_KEYS``) repeated on every row of its metrics.csv.

    ``run`` is the run directory relative to ``runs_dir`` (POSIX style), unique within a runs directory.
    """
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) or {}
    if not isinstance(config, Mapping):
        raise ConfigError(f"{config_path}: expected a mapping with task, seed, algorithm.name, train.steps")
    algorithm, task = config.get("algorithm"), config.get("task")
    algorithm_name = algorithm if isinstance(algorithm, str) else _config_value(config, "algorithm.name", config_path)
    task_label = _config_value(config, "task.name" if isinstance(task, Mapping) else "task", config_path)
    train_steps = int(_config_value(config, "train.steps", config_path))

    metrics = pd.read_csv(run_dir / "metrics.csv")
    missing = [c for c in REQUIRED_COLUMNS if c not in metrics.columns]
    if missing:
        raise ConfigError(f"{run_dir / 'metrics.csv'}: missing columns {missing}; required: {list(REQUIRED_COLUMNS)}")
    # a resumed run may log a step twice: the later row is the one that continued
    metrics = metrics.drop_duplicates("step", keep="last").sort_values("step", kind="stable").reset_index(drop=True)

    last_step = metrics["step"].max() if len(metrics) else -1
    keys = {
        "run": run_dir.relative_to(runs_dir).as_posix() if runs_dir is not None else run_dir.name,
        "task": str(task_label),
        "algorithm": str(algorithm_name),
        "seed": int(_config_value(config, "seed", config_path)),
        "train_steps": train_steps,
        "finished": bool(last_step >= train_steps),
    }
    for position, (key, value) in enumerate(keys.items()):
        metrics.insert(position, key, [value] * len(metrics))
    return metrics


def load_runs(runs_dir: str | Path) -> pd.DataFrame:
    """All runs under ``runs_dir`` as one tidy frame: one row per (run, step); optional columns are NaN where absent."""
    run_dirs = find_run_dirs(runs_dir)
    if not run_dirs:
        raise ConfigError(
            f"no runs found in {str(runs_dir)!r}: expected directories holding config.yaml and metrics.csv"
        )
    frames = [load_run(d, runs_dir) for d in run_dirs]
    frames = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(frames, ignore_index=True, sort=False)


def run_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: the run keys, ``last_step`` (largest logged step) and ``n_evals``."""
    grouped = runs.groupby("run", sort=True)
    summary = grouped[list(RUN_KEYS[1:])].first()
    summary["last_step"] = grouped["step"].max()
    summary["n_evals"] = grouped["eval_reward"].count()
    return summary.reset_index()


# ------------------------------------------------------------------------------------------------------ eval curves


def smooth_trailing(values, window: int = DEFAULT_SMOOTH) -> np.ndarray:
    """Trailing mean over the last ``window`` values (fewer at the start): out[i] = mean(values[max(0, i-w+1):i+1])."""
    if window < 1:
        raise ConfigError(f"smoothing window must be >= 1, got {window}")
    return pd.Series(np.asarray(values, dtype=float)).rolling(window, min_periods=1).mean().to_numpy()


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


# ----------------------------------------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """``kind="relative"``: ``value`` times the baseline's final reward (mean over seeds); ``"absolute"``: ``value``."""

    kind: str = "relative"
    value: float = 1.0

    def __post_init__(self):
        if self.kind not in ("relative", "absolute"):
            raise ConfigError(f"target kind {self.kind!r} is not one of ['absolute', 'relative']")

    def describe(self, baseline: str) -> str:
        if self.kind == "absolute":
            return f"eval reward >= {self.value:g} (absolute)"
        share = "" if self.value == 1.0 else f"{100 * self.value:g}% of "
        return f"{share}`{baseline}`'s final eval reward (smoothed, mean over its seeds)"


def as_target(target: "Target | float | Mapping[str, float] | None") -> "Target | dict[str, float]":
    """Normalize a user target: None -> relative 1.0; a number -> absolute; a mapping -> absolute per task."""
    if target is None:
        return Target()
    if isinstance(target, Target):
        return target
    if isinstance(target, Mapping):
        return {str(task): float(value) for task, value in target.items()}
    if isinstance(target, (int, float)) and not isinstance(target, bool):
        return Target("absolute", float(target))
    raise ConfigError(f"target {target!r} is not None, a number, a {{task: value}} mapping or a Target")


def parse_target(text: str | None) -> "Target":
    """A command-line target: '' or None -> the baseline's final reward; '0.9x' or '90%' -> that fraction of it;
    a plain number such as '0.8' -> that absolute eval reward."""
    if text is None or not str(text).strip():
        return Target()
    text = str(text).strip()
    try:
        if text.endswith("x"):
            return Target("relative", float(text[:-1]))
        if text.endswith("%"):
            return Target("relative", float(text[:-1]) / 100.0)
        return Target("absolute", float(text))
    except ValueError:
        raise ConfigError(
            f"target {text!r} is not valid; use a reward value (0.8), a fraction of the baseline (0.9x) "
            "or a share (90%)"
        ) from None


def check_baseline(runs: pd.DataFrame, baseline: str) -> None:
    algorithms = sorted(runs["algorithm"].unique())
    if baseline not in algorithms:
        raise ConfigError(f"baseline {baseline!r} has no runs; algorithms with runs: {algorithms}")


def task_targets(finals: pd.DataFrame, baseline: str, target=None) -> dict[str, float]:
    """The target reward of every task (NaN where it cannot be defined, e.g. a task without baseline runs)."""
    target = as_target(target)
    tasks = sorted(finals["task"].unique())
    if isinstance(target, dict):
        unknown = sorted(set(target) - set(tasks))
        if unknown:
            raise ConfigError(f"target names unknown tasks {unknown}; tasks: {tasks}")
        return {task: target.get(task, math.nan) for task in tasks}
    if target.kind == "absolute":
        return {task: target.value for task in tasks}
    base = finals[finals["algorithm"] == baseline].groupby("task")["final_reward"].mean()
    return {task: target.value * base.get(task, math.nan) for task in tasks}


def describe_target(baseline: str, target=None) -> str:
    target = as_target(target)
    if isinstance(target, dict):
        return "absolute per task: " + ", ".join(f"`{t}` >= {v:g}" for t, v in sorted(target.items()))
    return target.describe(baseline)


def reaches(values, target: float) -> np.ndarray:
    """Elementwise ``values >= target`` up to a relative float tolerance (so a seed at the seed-mean counts)."""
    return np.asarray(values, dtype=float) >= target - TARGET_TOLERANCE * max(1.0, abs(target))


# ----------------------------------------------------------------------------------------------------------- costs


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


# ------------------------------------------------------------------------------------------------------- aggregates


def iqm(values, axis: int = -1) -> np.ndarray | float:
    """Interquartile mean along ``axis``: sort, drop floor(n/4) values at each end, average the rest."""
    values = np.sort(np.asarray(values, dtype=float), axis=axis)
    n = values.shape[axis]
    if n == 0:
        return math.nan
    cut = n // 4
    return np.take(values, np.arange(cut, n - cut), axis=axis).mean(axis=axis)


def _bootstrap_indices(n: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, n, size=(resamples, n))


def _percentile_interval(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2.0
    samples = samples[~np.isnan(samples)]
    if samples.size == 0:
        return math.nan, math.nan
    lo, hi = np.percentile(samples, [100 * alpha, 100 * (1 - alpha)])
    return float(lo), float(hi)


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
    return _percentile_interval(np.asarray(stats, dtype=float), confidence)


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
    rng = np.random.default_rng(seed)
    numerators = values[_bootstrap_indices(values.size, resamples, rng)].mean(axis=1)
    denominators = baseline_values[_bootstrap_indices(baseline_values.size, resamples, rng)].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(denominators != 0, numerators / denominators, np.nan)
    return (ratio, *_percentile_interval(ratios, confidence))


def ratio_bound(algorithm_censored: int, baseline_censored: int) -> str:
    """What censoring makes of a ratio of mean costs: 'exact', 'lower bound', 'upper bound' or 'unknown direction'."""
    if algorithm_censored and baseline_censored:
        return "unknown direction"
    if algorithm_censored:
        return "lower bound"
    if baseline_censored:
        return "upper bound"
    return "exact"


# ------------------------------------------------------------------------------------------------------------ tables


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


def efficiency_table(costs: pd.DataFrame, baseline: str, **bootstrap) -> pd.DataFrame:
    """Per (task, non-baseline algorithm): seeds and reached counts, and for every cost the ratio vs the baseline.

    Columns: task, algorithm, target, n, reached, baseline_n, baseline_reached, bound, and for each cost in
    ``COSTS``: ``<cost>_mean`` (the algorithm's mean cost), ``<cost>_baseline_mean``, ``<cost>_ratio``,
    ``<cost>_lo``, ``<cost>_hi``.
    """
    rows = []
    for task, task_costs in costs.groupby("task", sort=True):
        base = task_costs[task_costs["algorithm"] == baseline]
        for algorithm, group in task_costs[task_costs["algorithm"] != baseline].groupby("algorithm", sort=True):
            row = {
                "task": task,
                "algorithm": algorithm,
                "target": float(group["target"].iloc[0]),
                "n": len(group),
                "reached": int(group["reached"].sum()),
                "baseline_n": len(base),
                "baseline_reached": int(base["reached"].sum()),
            }
            row["bound"] = ratio_bound(row["n"] - row["reached"], row["baseline_n"] - row["baseline_reached"])
            for cost in COSTS:
                ratio, lo, hi = ratio_ci(group[cost].to_numpy(float), base[cost].to_numpy(float), **bootstrap)
                row.update({
                    f"{cost}_mean": float(group[cost].mean()),
                    f"{cost}_baseline_mean": float(base[cost].mean()) if len(base) else math.nan,
                    f"{cost}_ratio": ratio,
                    f"{cost}_lo": lo,
                    f"{cost}_hi": hi,
                })
            rows.append(row)
    return pd.DataFrame(rows)


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
    target_description: str
    smooth: int


def analyze(runs_dir: str | Path, baseline: str = "flow_grpo", target=None, smooth: int = DEFAULT_SMOOTH) -> Analysis:
    """Load every run under ``runs_dir`` and compute curves, final rewards, targets, costs and both tables."""
    runs = load_runs(runs_dir)
    check_baseline(runs, baseline)
    curves = eval_curves(runs, smooth)
    if curves.empty:
        raise ConfigError(f"no evaluation rows (eval_reward) in any run under {str(runs_dir)!r}")
    finals = final_rewards(curves)
    targets = task_targets(finals, baseline, target)
    costs = costs_to_target(runs, curves, targets)
    return Analysis(
        runs=runs,
        summary=run_summary(runs),
        curves=curves,
        finals=finals,
        targets=targets,
        costs=costs,
        final_table=final_reward_table(finals),
        efficiency=efficiency_table(costs, baseline),
        baseline=baseline,
        target_description=describe_target(baseline, target),
        smooth=smooth,
    )
