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
* **Ratio vs the baseline** (:mod:`benchmark.effects`, shared with the study): the algorithm's restricted mean cost
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
* **Across tasks** (:mod:`benchmark.aggregate`, rliable's definitions): normalized final reward
  (final - base) / (baseline final - base); IQM over all (task, seed) scores, probability of improvement over the
  baseline, performance profiles, each with stratified bootstrap CIs.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import pandas as pd
import yaml

from benchmark import effects
from benchmark.aggregate import (aggregate_iqm_ci, iqm, percentile_interval, performance_profile_ci,
                                 probability_of_improvement_ci)
from flowzoo.errors import ConfigError

COSTS = effects.COSTS
COST_LABELS = {"step": "steps", "nfe": "NFE", "wall_s": "wall-clock"}
REQUIRED_COLUMNS = ("step", "nfe", "wall_s", "eval_reward")
RUN_KEYS = ("run", "task", "algorithm", "seed", "train_steps", "finished")

DEFAULT_SMOOTH = 3
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 10_000
DEFAULT_BOOTSTRAP_SEED = 0
TARGET_TOLERANCE = effects.TARGET_TOLERANCE
LOG = logging.getLogger("flowzoo.report")


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

    ``run`` is the run directory relative to ``runs_dir`` (POSIX style), unique within a runs directory. Raises
    ``ConfigError`` naming the file for a config.yaml or metrics.csv that cannot be read or lacks what is needed.
    """
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    try:
        config = yaml.safe_load(config_path.read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ConfigError(f"{config_path}: unreadable ({type(error).__name__}: {_first_line(error)})") from None
    if not isinstance(config, Mapping):
        raise ConfigError(f"{config_path}: expected a mapping with task, seed, algorithm.name, train.steps")
    algorithm, task = config.get("algorithm"), config.get("task")
    algorithm_name = algorithm if isinstance(algorithm, str) else _config_value(config, "algorithm.name", config_path)
    task_label = _config_value(config, "task.name" if isinstance(task, Mapping) else "task", config_path)
    train_steps = _config_int(config, "train.steps", config_path)
    seed = _config_int(config, "seed", config_path)

    identity = cell_identity(config)
    check_done_matches_config(run_dir)
    metrics = read_metrics(run_dir / "metrics.csv")
    # a resumed run may log a step twice: the later row is the one that continued
    metrics = metrics.drop_duplicates("step", keep="last").sort_values("step", kind="stable").reset_index(drop=True)

    last_step = metrics["step"].max() if len(metrics) else -1
    keys = {
        "run": run_dir.relative_to(runs_dir).as_posix() if runs_dir is not None else run_dir.name,
        "task": str(task_label),
        "algorithm": str(algorithm_name),
        "seed": seed,
        "train_steps": train_steps,
        "finished": bool(last_step >= train_steps),
    }
    for position, (key, value) in enumerate(keys.items()):
        metrics.insert(position, key, [value] * len(metrics))
    metrics.attrs["identity"] = identity
    return metrics


def check_done_matches_config(run_dir: Path) -> None:
    """A finished run is bound to its config as train's skip, eval and export bind it: when ``done.json`` carries the
    digest of the config that wrote it and the run's ``config.yaml`` loads here, the two must agree, else
    ``ConfigError`` (the run is skipped with that cause: its metrics belong to another config). A done.json without
    a digest (written before digests), or a config that does not load on this machine (e.g. prompt files elsewhere),
    is not checked."""
    try:
        summary = json.loads((run_dir / "done.json").read_text())
    except (OSError, ValueError):
        return
    digest = summary.get("config_digest") if isinstance(summary, dict) else None
    if not isinstance(digest, str):
        return
    from benchmark.checkpoints import config_digest
    from benchmark.config import load_config
    from flowzoo.errors import FlowZooError

    try:
        config = load_config(run_dir / "config.yaml")
    except FlowZooError:
        return
    if config_digest(config) != digest:
        raise ConfigError(f"{run_dir / 'done.json'}: written by a run of another config than its config.yaml (edited "
                          "after the run?); its metrics are not this config's")


def cell_identity(config: Mapping) -> dict:
    """What a run computes apart from its seed (:func:`benchmark.checkpoints.run_identity` without ``seed``): runs
    of one (task, algorithm) cell must agree on it to be pooled as seeds of one experiment. ``train.steps`` is left
    to :func:`check_budgets`."""
    from benchmark.checkpoints import run_identity

    identity = run_identity(dict(config), set())
    identity.pop("seed", None)
    if isinstance(identity.get("train"), dict):  # budgets: check_budgets names them run by run
        identity["train"] = {k: v for k, v in identity["train"].items() if k != "steps"}
    return identity


def _differences(a, b, prefix: str = "") -> list[str]:
    """Dotted keys where two nested mappings differ."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return [d for key in sorted(set(a) | set(b), key=str)
                for d in _differences(a.get(key), b.get(key), f"{prefix}{key}.")]
    return [] if a == b else [prefix.rstrip(".")]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no detail"


def _config_int(config: Mapping, dotted_key: str, path: Path) -> int:
    value = _config_value(config, dotted_key, path)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{path}: {dotted_key} is {value!r}, not an integer")
    return int(value)


def read_metrics(path: Path) -> pd.DataFrame:
    """A run's metrics.csv with its required columns numeric; ``ConfigError`` naming the file otherwise (empty,
    binary, not CSV, a required column missing or holding text)."""
    try:
        metrics = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.EmptyDataError, pd.errors.ParserError, ValueError) as error:
        raise ConfigError(f"{path}: unreadable ({type(error).__name__}: {_first_line(error)})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in metrics.columns]
    if missing:
        raise ConfigError(f"{path}: missing columns {missing}; required: {list(REQUIRED_COLUMNS)}")
    for column in REQUIRED_COLUMNS:
        values = pd.to_numeric(metrics[column], errors="coerce")
        if (values.isna() & metrics[column].notna()).any():
            raise ConfigError(f"{path}: column {column!r} holds values that are not numbers")
        metrics[column] = values
    if metrics["step"].isna().any():
        raise ConfigError(f"{path}: rows without a step")
    infinite = [c for c in REQUIRED_COLUMNS if np.isinf(metrics[c].to_numpy(float)).any()]
    if infinite:
        raise ConfigError(f"{path}: infinite values in {infinite}")
    return metrics


@dataclass(frozen=True)
class SkippedRun:
    """A run directory the report could not use, and why (one line)."""

    run: str
    cause: str


def load_runs(runs_dir: str | Path, skipped: list[SkippedRun] | None = None) -> pd.DataFrame:
    """All runs under ``runs_dir`` as one tidy frame: one row per (run, step); optional columns are NaN where absent.

    A run whose config.yaml or metrics.csv cannot be used is left out with a warning naming the file; when
    ``skipped`` is a list, a :class:`SkippedRun` is appended to it for each. ``ConfigError`` when no run is usable.
    """
    run_dirs = find_run_dirs(runs_dir)
    if not run_dirs:
        raise ConfigError(
            f"no runs found in {str(runs_dir)!r}: expected directories holding config.yaml and metrics.csv"
        )
    frames, left_out = [], []
    for run_dir in run_dirs:
        try:
            frames.append(load_run(run_dir, runs_dir))
        except ConfigError as error:
            left_out.append(SkippedRun(run_dir.relative_to(runs_dir).as_posix(), str(error)))
            LOG.warning("skipped run %s", error)
    if skipped is not None:
        skipped.extend(left_out)
    if not frames:
        raise ConfigError(f"no readable runs in {str(runs_dir)!r}: all {len(left_out)} were skipped "
                          f"(first: {left_out[0].cause})")
    check_one_experiment_per_cell(frames)
    frames = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(frames, ignore_index=True, sort=False)


def check_one_experiment_per_cell(frames: list[pd.DataFrame]) -> None:
    """Refuse to pool runs that are not seeds of one experiment: two runs of one (task, algorithm, seed) (a copied run
    directory would count one seed twice), or runs of one (task, algorithm) whose configs differ in anything but the
    seed. ``ConfigError`` naming the runs and, for differing configs, the keys."""
    by_seed: dict[tuple, str] = {}
    by_cell: dict[tuple, tuple[str, dict]] = {}
    for frame in frames:
        if not len(frame):
            continue
        first = frame.iloc[0]
        run, cell = str(first["run"]), (str(first["task"]), str(first["algorithm"]))
        seed_key = (*cell, int(first["seed"]))
        if seed_key in by_seed:
            raise ConfigError(f"runs {by_seed[seed_key]} and {run} are both task {cell[0]!r}, algorithm {cell[1]!r}, "
                              f"seed {seed_key[2]}: a report counts each run once; move one out of the runs directory")
        by_seed[seed_key] = run
        identity = frame.attrs.get("identity")
        if identity is None:
            continue
        if cell in by_cell and by_cell[cell][1] != identity:
            other, keys = by_cell[cell][0], _differences(by_cell[cell][1], identity)
            raise ConfigError(f"runs {other} and {run} of task {cell[0]!r}, algorithm {cell[1]!r} differ in "
                              f"{', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}: a report pools only seeds of "
                              "one config; move the others out of the runs directory")
        by_cell.setdefault(cell, (run, identity))


def check_budgets(runs: pd.DataFrame) -> None:
    """Runs of one (task, algorithm) must share ``train.steps``: their costs and final rewards would otherwise be
    averaged over different budgets. ``ConfigError`` naming the cell and the runs of each budget."""
    cells = runs.groupby(["task", "algorithm"], sort=True)
    for (task, algorithm), group in cells:
        budgets = group.groupby("train_steps", sort=True)["run"].unique()
        if len(budgets) > 1:
            listed = "; ".join(f"train.steps {steps}: {', '.join(sorted(r))}" for steps, r in budgets.items())
            raise ConfigError(
                f"task {task!r}, algorithm {algorithm!r} mixes run budgets ({listed}); a report compares runs of one "
                "budget: move the others out of the runs directory"
            )


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


TARGET_KINDS = ("gain", "relative", "absolute")
DEFAULT_GAIN_FRACTION = 0.9
TARGET_SYNTAX = ("'0.9gain' or '90%gain' (that share of the baseline's gain over the base model), '0.9x' or '90%' "
                 "(that share of the baseline's final reward), or a reward value such as '0.8'")


@dataclass(frozen=True)
class Target:
    """How a task's target reward is set from the baseline's runs (``base`` = the baseline's step-0 eval reward, the
    base model; ``final`` = the baseline's final reward; both means over its seeds):

    * ``"gain"``: base + ``value`` x (final - base), i.e. ``value`` of the way from the base model to the baseline's
      final reward (the default, ``value`` 0.9). Undefined (NaN) where the baseline did not improve on the base.
    * ``"relative"``: ``value`` x final (assumes a positive reward where larger is better).
    * ``"absolute"``: ``value`` itself.
    """

    kind: str = "gain"
    value: float = DEFAULT_GAIN_FRACTION

    def __post_init__(self):
        if self.kind not in TARGET_KINDS:
            raise ConfigError(f"target kind {self.kind!r} is not one of {sorted(TARGET_KINDS)}")
        check_target_value(self.value, f"{self.kind} target")
        if self.kind != "absolute" and self.value <= 0:
            raise ConfigError(f"{self.kind} target fraction must be > 0, got {self.value!r}")

    def describe(self, baseline: str) -> str:
        if self.kind == "absolute":
            return f"eval reward >= {self.value:g} (absolute)"
        if self.kind == "gain":
            return (f"{100 * self.value:g}% of the way from the base model (`{baseline}`'s step-0 eval reward) to "
                    f"`{baseline}`'s final eval reward (smoothed; both means over its seeds)")
        share = "" if self.value == 1.0 else f"{100 * self.value:g}% of "
        return f"{share}`{baseline}`'s final eval reward (smoothed, mean over its seeds)"


def check_target_value(value, what: str = "target") -> float:
    """A finite number, else ``ConfigError`` naming the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} {value!r} is not a finite number; use {TARGET_SYNTAX}")
    return float(value)


def as_target(target: "Target | float | Mapping[str, float] | None") -> "Target | dict[str, float]":
    """Normalize a user target: None -> the default (90% of the baseline's gain); a number -> absolute; a mapping ->
    absolute per task."""
    if target is None:
        return Target()
    if isinstance(target, Target):
        return target
    if isinstance(target, Mapping):
        return {str(task): check_target_value(value, f"target of task {task!r}") for task, value in target.items()}
    if isinstance(target, (int, float)) and not isinstance(target, bool):
        return Target("absolute", float(target))
    raise ConfigError(f"target {target!r} is not None, a number, a {{task: value}} mapping or a Target")


def parse_target(text: str | None) -> "Target":
    """A command-line target: '' or None -> the default; '0.9gain' / '90%gain' -> that share of the baseline's gain;
    '0.9x' / '90%' -> that share of the baseline's final reward; a plain number such as '0.8' -> that eval reward.
    ``ConfigError`` (one line, naming the text and the valid forms) for anything else, NaN and infinities included."""
    if text is None or not str(text).strip():
        return Target()
    raw = str(text).strip()
    body, kind = raw.lower(), "absolute"
    for suffix, suffix_kind in (("gain", "gain"), ("x", "relative")):
        if body.endswith(suffix):
            body, kind = body[: -len(suffix)].strip(), suffix_kind
            break
    divisor = 1.0
    if body.endswith("%"):
        body, divisor = body[:-1].strip(), 100.0
        kind = "relative" if kind == "absolute" else kind
    try:
        value = float(body) / divisor
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (kind != "absolute" and value <= 0):
        raise ConfigError(f"target {raw!r} is not valid; use {TARGET_SYNTAX}")
    return Target(kind, value)


def check_baseline(runs: pd.DataFrame, baseline: str) -> None:
    algorithms = sorted(runs["algorithm"].unique())
    if baseline not in algorithms:
        raise ConfigError(f"baseline {baseline!r} has no runs; algorithms with runs: {algorithms}")


def base_rewards(curves: pd.DataFrame, baseline: str) -> dict[str, float]:
    """Per task: the baseline's step-0 eval reward (the base model before training), mean over its seeds; NaN where
    no baseline run evaluated at step 0."""
    start = curves[(curves["algorithm"] == baseline) & (curves["step"] == 0)]
    means = start.groupby("task")["eval_reward"].mean()
    return {task: float(means.get(task, math.nan)) for task in sorted(curves["task"].unique())}


def baseline_finals(finals: pd.DataFrame, baseline: str) -> dict[str, float]:
    """Per task: the baseline's final reward, mean over its seeds (NaN without baseline runs)."""
    means = finals[finals["algorithm"] == baseline].groupby("task")["final_reward"].mean()
    return {task: float(means.get(task, math.nan)) for task in sorted(finals["task"].unique())}


def task_targets(finals: pd.DataFrame, baseline: str, target=None, bases: Mapping[str, float] | None = None
                 ) -> dict[str, float]:
    """The target reward of every task (NaN where it cannot be defined: a task without baseline runs, or for a gain
    target one where the baseline's base reward is unknown or its final reward is not above it). ``bases``: the
    base reward per task (:func:`base_rewards`), needed by a gain target."""
    target = as_target(target)
    tasks = sorted(finals["task"].unique())
    if isinstance(target, dict):
        unknown = sorted(set(target) - set(tasks))
        if unknown:
            raise ConfigError(f"target names unknown tasks {unknown}; tasks: {tasks}")
        return {task: target.get(task, math.nan) for task in tasks}
    if target.kind == "absolute":
        return {task: target.value for task in tasks}
    final = baseline_finals(finals, baseline)
    if target.kind == "relative":
        return {task: target.value * final[task] for task in tasks}
    bases = bases or {}
    targets = {}
    for task in tasks:
        base = bases.get(task, math.nan)
        gain = final[task] - base
        targets[task] = base + target.value * gain if gain > 0 else math.nan
    return targets


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


def task_data(runs: pd.DataFrame, curves: pd.DataFrame) -> dict[str, effects.TaskRuns]:
    """Per task, its runs as :class:`benchmark.effects.TaskRuns` (eval curves, censoring at each run's last logged
    row) for the effects' bootstraps."""
    last_rows = runs.sort_values(["run", "step"], kind="stable").groupby("run").tail(1).set_index("run")
    return effects.task_runs(curves, last_rows)


def target_function(target, task: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The task's target as a function of the baseline's mean base and mean final reward (vectorised), so that the
    effects' bootstraps re-estimate it in every resample; a constant for absolute targets."""
    target = as_target(target)
    if isinstance(target, dict):
        value = target.get(task, math.nan)
        return lambda base, final: np.full(np.shape(base), value, dtype=float)
    if target.kind == "absolute":
        return lambda base, final: np.full(np.shape(base), target.value, dtype=float)
    if target.kind == "relative":
        return lambda base, final: target.value * np.asarray(final, dtype=float)
    return effects.gain_target(target.value)


def efficiency_table(data: Mapping[str, effects.TaskRuns], baseline: str, target=None, **bootstrap) -> pd.DataFrame:
    """Per (task, non-baseline algorithm): seeds and reached counts, and for every cost the ratio vs the baseline.

    Costs are restricted means to the target (:mod:`benchmark.effects`: a run that never reaches it is censored at
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


# -------------------------------------------------------------------------------------------- across tasks (rliable)

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


def analyze(runs_dir: str | Path, baseline: str = "flow_grpo", target=None, smooth: int = DEFAULT_SMOOTH) -> Analysis:
    """Load every run under ``runs_dir`` (skipping unreadable ones) and compute curves, final rewards, targets,
    costs, the per-task tables and the aggregates across tasks. The target is checked before any run is read."""
    target = as_target(target)
    skipped: list[SkippedRun] = []
    runs = load_runs(runs_dir, skipped)
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
    )
