"""The OP-GRPO study's analysis: paired effects vs a baseline with bootstrap CIs and the smallest detectable effect.

    python -m benchmark.study RUNS_DIR --out DIR [--baseline flow_grpo] [--fraction 0.8] [--smooth 3] [--also-vs CELL]

Reads every run under RUNS_DIR (``config.yaml`` + ``metrics.csv``, via :mod:`benchmark.stats`) and writes
``DIR/README.md`` (tables), ``DIR/runs.csv`` (one row per run), ``DIR/effects.csv`` (one row per reference, cell and
metric) and ``DIR/curves.csv`` (mean eval reward over seeds every 20 steps). A task named ``<task>@<variant>`` (a
control run with other keys, e.g. ``toy2d_sparse64@no_reuse``) is analysed as the cell ``<algorithm>@<variant>`` of
``<task>``, paired with that task's baseline. ``--also-vs CELL`` adds the paired differences of every cell against
CELL as well. Definitions, per task:

* **Eval curve**: the run's eval rewards smoothed by a trailing mean over ``smooth`` evaluations
  (:func:`benchmark.stats.eval_curves`).
* **Final reward**: the smoothed eval reward at the run's last evaluation. **AUC**: the mean raw eval reward over all
  the run's evaluations (step 0 included), a speed-and-level summary.
* **Target**: ``base + fraction * (baseline final - base)``, with ``base`` the mean step-0 eval reward and
  ``baseline final`` the baseline's mean final reward over seeds: a fraction of the baseline's gain.
* **Steps to target**: the step of the first evaluation whose smoothed reward is >= target; a run that never gets
  there counts at its last logged step and is reported as censored (its true cost is larger).
* **Steps to final**: the same with fraction 1, i.e. the steps to reach the baseline's mean final reward (the
  papers' "same final performance").
* **Steps ratio**: mean steps to target of the algorithm / the baseline's (the papers' "34.2% of the steps" form),
  with the unpaired bootstrap CI of :func:`benchmark.stats.ratio_ci`; censored runs make it a bound.
* **Paired difference** (algorithm - baseline) over the seeds both ran: seed s of both methods shares the prompt order
  of its fresh groups and the seed of its sampler. Its 95% CI is a percentile bootstrap of the mean difference over
  seeds (:func:`benchmark.stats.bootstrap_ci`).
* **Minimum detectable effect (MDE)**: the true mean paired difference a two-sided paired t-test at level 0.05 would
  detect with 80% power given the observed standard deviation ``sd`` of the differences over ``n`` seeds:
  ``(t_{0.975, n-1} + t_{0.80, n-1}) * sd / sqrt(n)``. An effect smaller than it could well have been missed.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from benchmark.stats import (DEFAULT_CONFIDENCE, DEFAULT_SMOOTH, bootstrap_ci, eval_curves, find_run_dirs, load_runs,
                             percentile_interval, ratio_bootstrap, ratio_ci)
from benchmark.study_claims import claims_table, render_claims
from flowzoo.errors import ConfigError, FlowZooError

ALPHA, POWER = 0.05, 0.80
DEFAULT_FRACTION = 0.8
METRICS = ("steps_to_target", "nfe_to_target", "steps_to_final", "final_reward", "auc")
#: training-log columns averaged over a run's steps in the run table (absent ones are skipped)
DIAGNOSTICS = ("zero_std_frac", "off_policy_frac", "clip_frac", "clip_frac_on", "clip_frac_off", "weight_ess",
               "log_weight_std")
#: per-timestep |log p_old - log p_off| of the reused transitions (OP-GRPO logs one column per reused step k)
STEP_LOG_RATIO_PREFIX = "abs_log_ratio_t"
VARIANT_SEP = "@"  # task@variant: a control cell of task
EARLY_STEPS = 10  # zero_std_frac is also reported over the first this many steps


def minimum_detectable_effect(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true mean paired difference a two-sided paired t-test detects with probability ``power``."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    df = n - 1
    return float((sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(power, df)) * sd / math.sqrt(n))


def steps_to_target(steps, smoothed, target: float, last_step: float) -> tuple[float, bool]:
    """(first step whose smoothed reward >= target, True), else (last_step, False): censored."""
    hit = np.flatnonzero(np.asarray(smoothed, dtype=float) >= target)
    return (float(np.asarray(steps)[hit[0]]), True) if hit.size else (float(last_step), False)


def run_table(runs: pd.DataFrame, smooth: int = DEFAULT_SMOOTH) -> pd.DataFrame:
    """One row per run: task, algorithm, seed, last_step, base, final_reward, auc and training diagnostics."""
    curves = eval_curves(runs, smooth)
    rows = []
    for run, frame in runs.groupby("run", sort=True):
        curve = curves[curves["run"] == run]
        if curve.empty:
            continue
        first = frame.iloc[0]
        task, _, variant = str(first["task"]).partition(VARIANT_SEP)
        algorithm = f"{first['algorithm']}{VARIANT_SEP}{variant}" if variant else first["algorithm"]
        row = {"run": run, "task": task, "algorithm": algorithm, "seed": int(first["seed"]),
               "last_step": float(frame["step"].max()), "base": float(curve["eval_reward"].iloc[0]),
               "final_reward": float(curve["eval_smoothed"].iloc[-1]), "auc": float(curve["eval_reward"].mean()),
               "last_nfe": float(frame["nfe"].max()), "wall_s": float(frame["wall_s"].max()),
               "finished": bool(first["finished"])}
        train_rows = frame[frame["step"] > 0]
        step_columns = [c for c in frame.columns if c.startswith(STEP_LOG_RATIO_PREFIX)]
        for column in (*DIAGNOSTICS, *step_columns):
            if column in frame and frame[column].notna().any():
                row[column] = float(train_rows[column].mean())
        # collapse: the run ends below the model it started from (divergence that the non-finite guard does not see)
        row["collapsed"] = row["final_reward"] < row["base"]
        if "zero_std_frac" in frame:
            row["zero_std_frac_early"] = float(train_rows.nsmallest(EARLY_STEPS, "step")["zero_std_frac"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def is_cost(metric: str) -> bool:
    """Steps/NFE to a target: lower is better, and censored runs make it a bound."""
    return "_to_" in metric


def reached_column(metric: str) -> str:
    return "reached_final" if metric.endswith("_final") else "reached"


def add_steps_to_target(table: pd.DataFrame, runs: pd.DataFrame, baseline: str, fraction: float,
                        smooth: int = DEFAULT_SMOOTH, name: str = "target") -> dict[str, float]:
    """Adds ``steps_to_<name>``, ``nfe_to_<name>`` (network evaluations logged at that evaluation; censored runs at
    their last logged NFE) and its ``reached`` column (``reached_column``) to ``table`` (in place); returns the
    target of each task."""
    curves = eval_curves(runs, smooth)
    targets = {}
    columns = [f"steps_to_{name}", f"nfe_to_{name}", reached_column(f"steps_to_{name}")]
    table[columns[0]], table[columns[1]], table[columns[2]] = math.nan, math.nan, False
    for task, rows in table.groupby("task"):
        base_rows = rows[rows["algorithm"] == baseline]
        if base_rows.empty:
            raise ConfigError(f"task {task!r} has no {baseline!r} runs; algorithms: {sorted(set(rows['algorithm']))}")
        base = float(rows["base"].mean())
        targets[task] = base + fraction * (float(base_rows["final_reward"].mean()) - base)
        for index, row in rows.iterrows():
            curve = curves[curves["run"] == row["run"]]
            step, reached = steps_to_target(curve["step"], curve["eval_smoothed"], targets[task], row["last_step"])
            nfe = float(curve.loc[curve["step"] == step, "nfe"].iloc[0]) if reached else row["last_nfe"]
            table.loc[index, columns] = step, nfe, reached
    return targets


def mean_curves(runs_dir: str | Path, every: int = 20) -> pd.DataFrame:
    """Mean raw eval reward over seeds at every ``every``-th step: one row per (task, cell), one column per step."""
    runs = load_runs(runs_dir)
    evals = runs[runs["eval_reward"].notna() & (runs["step"] % every == 0)].copy()
    split = evals["task"].astype(str).str.partition(VARIANT_SEP)
    evals["task"] = split[0]
    evals["algorithm"] = evals["algorithm"].where(split[2] == "", evals["algorithm"] + VARIANT_SEP + split[2])
    return evals.pivot_table(index=["task", "algorithm"], columns="step", values="eval_reward", aggfunc="mean")


def paired_effects(table: pd.DataFrame, baseline: str, metrics=METRICS) -> pd.DataFrame:
    """One row per (task, algorithm != baseline, metric): means, paired mean difference, its CI, sd, n and MDE.
    ``baseline`` is the reference cell of the differences (column ``reference``); tasks without it are skipped."""
    rows = []
    for task, rows_task in table.groupby("task"):
        base = rows_task[rows_task["algorithm"] == baseline].set_index("seed")
        for algorithm, rows_alg in rows_task.groupby("algorithm"):
            if algorithm == baseline or base.empty:
                continue
            alg = rows_alg.set_index("seed")
            seeds = sorted(set(alg.index) & set(base.index))
            for metric in metrics:
                diff = (alg.loc[seeds, metric] - base.loc[seeds, metric]).to_numpy(dtype=float)
                sd = float(diff.std(ddof=1)) if len(diff) > 1 else math.nan
                low, high = bootstrap_ci(diff)
                rows.append({"task": task, "reference": baseline, "algorithm": algorithm, "metric": metric,
                             "n": len(seeds),
                             "baseline_mean": float(base.loc[seeds, metric].mean()),
                             "algorithm_mean": float(alg.loc[seeds, metric].mean()),
                             "diff": float(diff.mean()), "ci_low": low, "ci_high": high, "sd_diff": sd,
                             "mde": minimum_detectable_effect(sd, len(seeds)),
                             "p_t": float(sps.ttest_1samp(diff, 0.0).pvalue) if len(diff) > 1 and sd > 0 else math.nan,
                             **(_steps_extras(alg.loc[seeds], base.loc[seeds], metric) if is_cost(metric) else {})})
    return pd.DataFrame(rows)


def wall_clock_ratios(table: pd.DataFrame, timing: pd.DataFrame, baseline: str,
                      metrics=("steps_to_target", "steps_to_final"), resamples: int = 10_000,
                      seed: int = 0) -> pd.DataFrame:
    """Estimated wall-clock-to-target ratios vs ``baseline``: steps ratio x per-step cost ratio.

    ``timing`` is :mod:`benchmark.study_timing`'s table (cells ``TASK/ALGORITHM``). The per-step cost ratio of a
    cell is, in each timing repeat, its seconds per step / the baseline's of the same task in that repeat (same
    process, same moment); its median over repeats multiplies the steps ratio (mean steps of the cell / mean steps of
    the baseline over their seeds). The 95% CI resamples seeds (each group alone, as ``ratio_ci``) and repeats
    together. One row per (task, cell, metric) that has timing for both the cell and the baseline."""
    rows = []
    rng = np.random.default_rng(seed)
    for task, rows_task in table.groupby("task"):
        base_cost = timing[timing["cell"] == f"{task}/{baseline}"].set_index("repeat")["s_per_step"]
        if base_cost.empty:
            continue
        base = rows_task[rows_task["algorithm"] == baseline]
        for algorithm, rows_alg in rows_task.groupby("algorithm"):
            if algorithm == baseline:
                continue
            name, _, variant = str(algorithm).partition(VARIANT_SEP)
            cell = f"{task}{VARIANT_SEP}{variant}/{name}" if variant else f"{task}/{name}"
            cost = timing[timing["cell"] == cell].set_index("repeat")["s_per_step"]
            repeats = sorted(set(cost.index) & set(base_cost.index))
            if not repeats:
                continue
            cost_ratios = (cost.loc[repeats] / base_cost.loc[repeats]).to_numpy(float)
            boot_cost = np.median(cost_ratios[rng.integers(0, len(cost_ratios), (resamples, len(cost_ratios)))],
                                  axis=1)
            for metric in metrics:
                a, b = rows_alg[metric].to_numpy(float), base[metric].to_numpy(float)
                steps_ratio = a.mean() / b.mean()
                low, high = percentile_interval(ratio_bootstrap(a, b, resamples, rng) * boot_cost, DEFAULT_CONFIDENCE)
                rows.append({"task": task, "algorithm": algorithm, "metric": metric.replace("steps", "wall"),
                             "steps_ratio": steps_ratio, "cost_ratio": float(np.median(cost_ratios)),
                             "cost_ratio_min": float(cost_ratios.min()), "cost_ratio_max": float(cost_ratios.max()),
                             "repeats": len(repeats), "ratio": steps_ratio * float(np.median(cost_ratios)),
                             "ratio_low": float(low), "ratio_high": float(high)})
    return pd.DataFrame(rows)


def _steps_extras(alg: pd.DataFrame, base: pd.DataFrame, metric: str) -> dict:
    ratio, low, high = ratio_ci(alg[metric].to_numpy(float), base[metric].to_numpy(float))
    reached = reached_column(metric)
    return {"censored_alg": int((~alg[reached].astype(bool)).sum()),
            "censored_base": int((~base[reached].astype(bool)).sum()),
            "ratio": ratio, "ratio_low": low, "ratio_high": high}


def verdict(row: pd.Series, higher_is_better: bool) -> str:
    """Plain words for one paired effect: which side the CI excludes 0 on, else 'no detectable difference'."""
    if not (math.isfinite(row["ci_low"]) and math.isfinite(row["ci_high"])):
        return "n<2"
    better = row["ci_low"] > 0 if higher_is_better else row["ci_high"] < 0
    worse = row["ci_high"] < 0 if higher_is_better else row["ci_low"] > 0
    if better:
        return "better"
    if worse:
        return "worse"
    return f"no detectable difference (MDE {row['mde']:.3g})"


def _seed_list(seeds) -> str:
    """Sorted seeds with runs of consecutive ones as ranges: [0, 1, 2, 5] -> '0-2, 5'."""
    seeds, parts = sorted(int(seed) for seed in seeds), []
    for seed in seeds:
        if parts and parts[-1][1] == seed - 1:
            parts[-1][1] = seed
        else:
            parts.append([seed, seed])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in parts)


def _fmt(value: float, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.{digits}g}"


def render(table: pd.DataFrame, effects: pd.DataFrame, targets: dict[str, float], baseline: str, fraction: float,
           smooth: int, curves: pd.DataFrame | None = None, claims: pd.DataFrame | None = None,
           wall: pd.DataFrame | None = None) -> str:
    lines = [f"# OP-GRPO study: paired effects vs {baseline}", "",
             f"Target per task: step-0 reward + {fraction:g} x ({baseline}'s mean final reward - step-0 reward) "
             f"(`*_to_target`); `steps_to_final`: steps to {baseline}'s mean final reward itself; "
             f"eval curves smoothed over {smooth} evaluations. Differences are algorithm - {baseline} over the "
             "seeds both ran, with 95% percentile-bootstrap CIs of the mean; MDE = smallest true difference a paired "
             "t-test (two-sided, 0.05) detects with 80% power at the observed seed spread. Regenerate with "
             "`python -m benchmark.study RUNS_DIR --out DIR` (module docstring: definitions).", ""]
    if claims is not None and len(claims):
        lines += render_claims(claims)
    if wall is not None and len(wall):
        lines += ["## Wall-clock to target (estimated)", "",
                  "Steps ratio x per-step cost ratio; the cost ratio is measured interleaved in one process "
                  "(`python -m benchmark.study_timing`, file `timing.csv`): median over repeats (range).", "",
                  "| task | algorithm | metric | steps ratio | cost ratio (range) | repeats | wall-clock ratio (95% CI) |",
                  "|---|---|---|---|---|---|---|"]
        for _, w in wall.iterrows():
            lines.append(f"| {w['task']} | {w['algorithm']} | {w['metric']} | {w['steps_ratio']:.2f} | "
                         f"{w['cost_ratio']:.2f} ({w['cost_ratio_min']:.2f}-{w['cost_ratio_max']:.2f}) | "
                         f"{int(w['repeats'])} | {w['ratio']:.2f} [{_fmt(w['ratio_low'])}, {_fmt(w['ratio_high'])}] |")
        lines.append("")
    for task, rows in table.groupby("task"):
        seeds = ", ".join(f"{cell} {_seed_list(runs['seed'])}" for cell, runs in rows.groupby("algorithm"))
        lines += [f"## {task} (target {targets[task]:.4f})", "", f"Seeds: {seeds}.", "",
                  "| algorithm | seeds | final reward | AUC | steps to target (reached) | steps to final (reached) "
                  f"| zero-std frac (first {EARLY_STEPS} / all steps) | off-policy frac | clip frac (on / off) "
                  "| log w std / ESS | unstable |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for algorithm, runs in rows.groupby("algorithm"):
            clip = (f"{_fmt(runs.get('clip_frac_on', pd.Series(dtype=float)).mean())} / "
                    f"{_fmt(runs['clip_frac_off'].mean())}"
                    if "clip_frac_off" in runs and runs["clip_frac_off"].notna().any()
                    else _fmt(runs["clip_frac"].mean()) if "clip_frac" in runs else "-")
            zero = (f"{_fmt(runs['zero_std_frac_early'].mean())} / {_fmt(runs['zero_std_frac'].mean())}"
                    if "zero_std_frac" in runs else "-")
            off = _fmt(runs["off_policy_frac"].mean()) if "off_policy_frac" in runs else "-"
            weights = (f"{_fmt(runs['log_weight_std'].mean())} / {_fmt(runs['weight_ess'].mean())}"
                       if "log_weight_std" in runs and runs["log_weight_std"].notna().any() else "-")
            unstable = int(((~runs["finished"].astype(bool)) | runs["collapsed"].astype(bool)).sum())
            lines.append(
                f"| {algorithm} | {len(runs)} | {runs['final_reward'].mean():.4f} +- {runs['final_reward'].std():.4f} "
                f"| {runs['auc'].mean():.4f} | {runs['steps_to_target'].mean():.1f} ({int(runs['reached'].sum())}/"
                f"{len(runs)}) | {runs['steps_to_final'].mean():.1f} ({int(runs['reached_final'].sum())}/{len(runs)}) "
                f"| {zero} | {off} | {clip} | {weights} | {unstable}/{len(runs)} |")
        if curves is not None and task in curves.index.get_level_values(0):
            steps = [int(step) for step in curves.columns]
            lines += ["", "Mean eval reward over seeds by step:", "",
                      "| cell | " + " | ".join(str(step) for step in steps) + " |", "|---" * (len(steps) + 1) + "|"]
            for cell, values in curves.loc[task].iterrows():
                lines.append(f"| {cell} | " + " | ".join(_fmt(float(v)) for v in values) + " |")
        for reference, cell_effects in effects[effects["task"] == task].groupby("reference", sort=False):
            lines += ["", f"Paired differences vs {reference}:", ""] + _effect_rows(cell_effects)
        unfinished = rows[~rows["finished"].astype(bool)]
        if len(unfinished):
            lines.append(f"Unfinished runs (counted at their last evaluation): {', '.join(unfinished['run'])}")
        lines.append("")
    return "\n".join(lines)


def _effect_rows(effects: pd.DataFrame) -> list[str]:
    lines = ["| algorithm | metric | n | reference | algorithm | diff | 95% CI | sd of diff | MDE (80%) | t-test p "
             "| verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, e in effects.iterrows():
        censor = (f" ({int(e['censored_alg'])}/{int(e['censored_base'])} censored)"
                  if is_cost(e["metric"]) and (e["censored_alg"] or e["censored_base"]) else "")
        ratio = (f"; ratio {e['ratio']:.2f} [{_fmt(e['ratio_low'])}, {_fmt(e['ratio_high'])}]"
                 if is_cost(e["metric"]) else "")
        lines.append(
            f"| {e['algorithm']} | {e['metric']}{censor}{ratio} | {e['n']} | {_fmt(e['baseline_mean'], 4)} "
            f"| {_fmt(e['algorithm_mean'], 4)} | {e['diff']:+.4g} | [{_fmt(e['ci_low'])}, {_fmt(e['ci_high'])}] "
            f"| {_fmt(e['sd_diff'])} | {_fmt(e['mde'])} | {_fmt(e['p_t'], 2)} "
            f"| {verdict(e, not is_cost(e['metric']))} |")
    return lines


def analyze_study(runs_dir: str | Path, baseline: str = "flow_grpo", fraction: float = DEFAULT_FRACTION,
                  smooth: int = DEFAULT_SMOOTH, also_vs: tuple[str, ...] = ()
                  ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, float]]:
    """(run table, paired effects vs ``baseline`` then vs each cell of ``also_vs``, target of each task)."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"--fraction must be in (0, 1], got {fraction}")
    runs = load_runs(runs_dir)
    if baseline not in set(runs["algorithm"]):
        raise ConfigError(f"baseline {baseline!r} has no runs in {runs_dir}; algorithms: "
                          f"{', '.join(sorted(set(runs['algorithm'])))}")
    table = run_table(runs, smooth)
    unknown = [cell for cell in also_vs if cell not in set(table["algorithm"])]
    if unknown:
        cells = ", ".join(sorted(set(table["algorithm"])))
        raise ConfigError(f"--also-vs {','.join(unknown)}: no such cell; cells: {cells}")
    targets = add_steps_to_target(table, runs, baseline, fraction, smooth)
    add_steps_to_target(table, runs, baseline, 1.0, smooth, name="final")
    effects = pd.concat([paired_effects(table, reference) for reference in (baseline, *also_vs)], ignore_index=True)
    return table, effects, targets


#: metrics.csv columns a trimmed copy keeps (``--save-metrics``): what the study reads
KEPT_COLUMNS = ("step", "nfe", "wall_s", "eval_reward", "reward_mean", "clip_frac", *DIAGNOSTICS)


def save_trimmed_metrics(runs_dir: str | Path, out_dir: str | Path, digits: int = 6) -> int:
    """Copies each run's config.yaml and its metrics.csv cut to ``KEPT_COLUMNS`` plus the per-step log-ratio columns
    (floats at ``digits`` significant digits) into ``out_dir``, keeping the relative layout; returns the run count.
    The study's tables computed from the copy match the full runs' to that precision."""
    runs_dir, out_dir = Path(runs_dir), Path(out_dir)
    count = 0
    for run in find_run_dirs(runs_dir):
        target = out_dir / run.relative_to(runs_dir)
        target.mkdir(parents=True, exist_ok=True)
        frame = pd.read_csv(run / "metrics.csv")
        keep = [c for c in frame.columns if c in KEPT_COLUMNS or c.startswith(STEP_LOG_RATIO_PREFIX)]
        tmp = target / "metrics.csv.tmp"
        frame[keep].to_csv(tmp, index=False, float_format=f"%.{digits}g")
        tmp.replace(target / "metrics.csv")
        (target / "config.yaml").write_bytes((run / "config.yaml").read_bytes())
        count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmark.study", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_dir")
    parser.add_argument("--out", required=True, help="report directory (README.md, runs.csv, effects.csv)")
    parser.add_argument("--baseline", default="flow_grpo")
    parser.add_argument("--fraction", type=float, default=DEFAULT_FRACTION, help="target = this share of the "
                        "baseline's gain over the step-0 reward")
    parser.add_argument("--smooth", type=int, default=DEFAULT_SMOOTH)
    parser.add_argument("--timing", default=None, help="per-step cost table of benchmark.study_timing (CSV) for "
                        "the wall-clock-to-target estimates; copied into --out as timing.csv")
    parser.add_argument("--claims", action="store_true", help="add the OP-GRPO paper's claims table (needs "
                        "--also-vs op_grpo)")
    parser.add_argument("--save-metrics", default=None, metavar="DIR", help="also copy every run's config.yaml "
                        "and its metrics.csv trimmed to the columns the study reads into DIR (a committable "
                        "record the report can be regenerated from)")
    parser.add_argument("--also-vs", default="", help="comma-separated cells (algorithm or algorithm@variant) to "
                        "pair the other cells with as well, e.g. op_grpo")
    args = parser.parse_args(argv)
    try:
        also_vs = tuple(c.strip() for c in args.also_vs.split(",") if c.strip())
        table, effects, targets = analyze_study(args.runs_dir, args.baseline, args.fraction, args.smooth, also_vs)
        timing = None
        if args.timing:
            try:
                timing = pd.read_csv(args.timing)
            except (OSError, ValueError) as error:
                raise ConfigError(f"--timing {args.timing}: cannot read it ({error})") from None
            missing = {"repeat", "cell", "task", "algorithm", "s_per_step"} - set(timing.columns)
            if missing:
                raise ConfigError(f"--timing {args.timing}: missing columns {sorted(missing)}")
        if args.claims and "op_grpo" not in also_vs:
            raise ConfigError("--claims needs --also-vs op_grpo (the ablations are paired with OP-GRPO)")
    except FlowZooError as error:
        print(f"study: error: {error}", file=sys.stderr)
        return 2
    claims = claims_table(table, effects) if args.claims else None
    wall = wall_clock_ratios(table, timing, args.baseline) if timing is not None else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.save_metrics:
        print(f"saved {save_trimmed_metrics(args.runs_dir, args.save_metrics)} runs' metrics to {args.save_metrics}")
    table.to_csv(out / "runs.csv", index=False)
    effects.to_csv(out / "effects.csv", index=False)
    curves = mean_curves(args.runs_dir)
    curves.to_csv(out / "curves.csv")
    if claims is not None:
        claims.to_csv(out / "claims.csv", index=False)
    if timing is not None:
        if Path(args.timing).resolve() != (out / "timing.csv").resolve():
            timing.to_csv(out / "timing.csv", index=False)
        wall.to_csv(out / "wall_clock.csv", index=False)
    (out / "README.md").write_text(render(table, effects, targets, args.baseline, args.fraction, args.smooth, curves,
                                          claims, wall))
    print(f"wrote {out / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
