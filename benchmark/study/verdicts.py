"""A study's analysis: paired effects vs a baseline on fixed metrics, verdicts on every seed set.

    flowzoo study RUNS_DIR --suite SUITE [--out DIR] [--claims SET] [--timing timing.csv] [--vs op_grpo] ...

(``python -m flowzoo.benchmark.study.verdicts RUNS_DIR --out DIR [--suite S] [--also-vs C] [--claims] ...`` is its older
spelling, kept as an alias: :func:`main`.) :func:`write_study` does the work.

Reads every run under RUNS_DIR (``config.yaml`` + ``metrics.csv``, :mod:`benchmark.analysis.stats`) and writes the
page ``DIR/README.md`` and ``DIR/index.html`` (figures, then tables: :mod:`benchmark.study.page`),
``DIR/runs.csv`` (one row per run), ``DIR/effects.csv`` (one row per seed set, reference, cell and metric),
``DIR/curves.csv`` (mean eval reward over seeds every 20 steps) and ``DIR/gains.csv`` (each cell's gain over the base
model per seed set, :func:`gains`: whether the baseline learns, so whether its targets are well-conditioned). A task
named ``<task>@<variant>`` (a control run with other keys, e.g. ``toy2d_sep64_sparse@no_reuse``) is the cell
``<algorithm>@<variant>`` of ``<task>`` (:func:`split_variants`, the one place that reads the form). Every number
comes from :mod:`benchmark.analysis.effects`, the report's statistics path:

* **Metrics**, fixed before a study's runs are looked at (:data:`METRICS`): steps and NFE to 50% and to 80% of the
  baseline's gain over the base model (restricted means over the budget, Kaplan-Meier for censored runs), final
  reward (mean of the last ``smooth`` evaluations) and AUC (mean eval reward over the run). ``steps_to_final``
  (fraction 1: the baseline's own final reward, the papers' form) is shown but is ill-conditioned: the target sits on
  the baseline's noisy plateau, so no verdict uses it.
* **Paired effects** (cell - reference over the seeds both ran) with 95% bootstrap CIs that re-estimate the target
  inside every resample, ratios of restricted means with theirs, and the smallest detectable effect (MDE).
* **Seed sets** (:mod:`benchmark.study.seed_sets`): with ``--suite``, each of the suite's ``seed_sets`` that ran
  (e.g. ``exploration`` and ``replication``) and the seeds that ran outside them (``other``), or the sets named with
  ``--seed-sets``, are analysed apart, each with its own target from its own baseline runs, and together (``all``);
  without, all seeds form one set. The claims (:mod:`benchmark.study.claims`) are judged on each.
* **Wall-clock** (``--timing``): steps ratio x the per-step cost ratio measured interleaved in one process
  (:mod:`benchmark.perf.cell_timing`), never the runs' own ``wall_s`` (which carries the shared machine's load).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from flowzoo.benchmark.analysis import costs, effects
from flowzoo.benchmark.study import answer as study_answer, page as study_page
from flowzoo.benchmark.analysis.runs import (
    SkippedRun,
    machine_line,
    protocol_line,
    find_run_dirs,
    load_runs,
    read_metrics,
    read_run_keys,
    recipe_text,
    run_machine,
)
from flowzoo.benchmark.analysis.stats import DEFAULT_SMOOTH, bootstrap_ci, eval_curves
from flowzoo.benchmark.study.claims import (
    CLAIMS_AUTO,
    NO_CLAIMS,
    ClaimSet,
    claim_set,
    claim_sets,
    judge,
    match_claim_set,
    render_claims,
    shown_sets,
)
from flowzoo.benchmark.study.seed_sets import (
    REPLICATION_SETS,
    parse_seed_sets,
    replication_pair,
    seed_sets_of,
)
from flowzoo.benchmark.study.seed_sets import seed_list as _seed_list
from flowzoo.cells import VARIANT_SEP, base_task, split_task, with_variant  # noqa: F401  (VARIANT_SEP: re-exported)
from flowzoo.errors import ConfigError, RunError, one_line_errors
from flowzoo.io import atomic_write, check_out_dir, staged_directory
from flowzoo.models.shipped import refuse_shipped

#: the study's metrics, in report order: (name, effects.Metric)
METRICS = (
    effects.cost_metric("steps_to_50", "step", effects.gain_target(0.5)),
    effects.cost_metric("steps_to_80", "step", effects.gain_target(0.8)),
    effects.cost_metric("nfe_to_50", "nfe", effects.gain_target(0.5)),
    effects.cost_metric("nfe_to_80", "nfe", effects.gain_target(0.8)),
    effects.value_metric("final_reward", "final"),
    effects.value_metric("auc", "auc"),
    effects.cost_metric("steps_to_final", "step", effects.gain_target(1.0)),
)
PRIMARY = "steps_to_80"
#: training-log columns averaged over a run's steps in the run table (absent ones are skipped)
DIAGNOSTICS = ("zero_std_frac", "off_policy_frac", "clip_frac", "clip_frac_on", "clip_frac_off", "weight_ess",
               "log_weight_std", "approx_kl", "clip_frac_pos_adv", "clip_frac_neg_adv", "dppo_masked_frac",
               "dppo_kl_score_mean")
#: per-timestep |log p_old - log p_off| of the reused transitions (OP-GRPO logs one column per reused step k)
STEP_LOG_RATIO_PREFIX = "abs_log_ratio_t"
EARLY_STEPS = 10  # zero_std_frac is also reported over the first this many steps


def split_variants(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with every ``task@variant`` run moved to the cell ``algorithm@variant`` of ``task``."""
    out = runs.copy()
    split = [split_task(task) for task in out["task"]]
    out["task"] = [task for task, _ in split]
    out["algorithm"] = [with_variant(algorithm, variant)
                        for algorithm, (_, variant) in zip(out["algorithm"].astype(str), split)]
    return out


def run_table(runs: pd.DataFrame, data: dict[str, effects.TaskRuns], baseline: str,
              smooth: int = DEFAULT_SMOOTH) -> pd.DataFrame:
    """One row per run: task, cell (``algorithm``), seed, base, final reward, AUC, the cost metrics at the task's
    all-seeds target with ``reached_<metric>``, ``finished``, ``collapsed`` and the training diagnostics."""
    rows = []
    for task, task_data in data.items():
        base_rows = np.flatnonzero(task_data.cells == baseline)
        metrics = {m.name: (m, float(effects.baseline_target(task_data, m, base_rows)[0]) if m.is_cost else math.nan)
                   for m in METRICS if m.is_cost}
        for i, run in enumerate(task_data.runs):
            row = {"run": run, "task": task, "algorithm": task_data.cells[i], "seed": int(task_data.seeds[i]),
                   "base": task_data.base[i], "final_reward": task_data.final[i], "auc": task_data.auc[i]}
            for name, (metric, target) in metrics.items():
                cost, reached = effects.crossing(task_data.running_max[i], task_data.costs[metric.cost][i],
                                                 task_data.censored_at[metric.cost][i], [target])
                row[name], row[f"reached_{name}"] = float(cost[0]), bool(reached[0])
            rows.append(row)
    table = pd.DataFrame(rows)
    per_run = runs.groupby("run", sort=True)
    table["finished"] = table["run"].map(per_run["finished"].first()).astype(bool)
    table["last_step"] = table["run"].map(per_run["step"].max()).astype(float)
    table["collapsed"] = table["final_reward"] < table["base"]
    train_rows = runs[runs["step"] > 0]
    step_columns = sorted((c for c in runs.columns if c.startswith(STEP_LOG_RATIO_PREFIX)),
                          key=lambda c: int(c[len(STEP_LOG_RATIO_PREFIX):]))
    for column in (*DIAGNOSTICS, *step_columns):
        if column in runs and runs[column].notna().any():
            table[column] = table["run"].map(train_rows.groupby("run")[column].mean())
    run_cost = costs.run_costs(runs, smooth)  # what the gain cost: spread kept, gold and unseen-prompt gains
    for column in run_cost.columns:
        if run_cost[column].notna().any():
            table[column] = table["run"].map(run_cost[column])
    if "zero_std_frac" in runs:
        early = train_rows.sort_values("step").groupby("run").head(EARLY_STEPS).groupby("run")["zero_std_frac"].mean()
        table["zero_std_frac_early"] = table["run"].map(early)
    return table.sort_values(["task", "algorithm", "seed"], kind="stable").reset_index(drop=True)


def study_effects(data: dict[str, effects.TaskRuns], baseline: str, references: tuple[str, ...],
                  seed_sets: dict[str, list[int]], resamples: int = effects.DEFAULT_RESAMPLES,
                  keep_ratio_draws: bool = False) -> pd.DataFrame:
    """One row per (seed set, task, reference, cell, metric): paired effects of :func:`benchmark.analysis.effects.effect`."""
    rows = []
    for set_name, seeds in seed_sets.items():
        for task, task_data in data.items():
            cells = task_data.cell_names()
            if baseline not in cells:
                continue
            for reference in (baseline, *references):
                if reference not in cells:
                    continue
                for cell in cells:
                    if cell == reference:
                        continue
                    for metric in METRICS:
                        row = effects.effect(task_data, cell, reference, metric, baseline, paired=True, seeds=seeds,
                                             resamples=resamples)
                        rows.append({"seed_set": set_name, **row})
    return pd.DataFrame(rows)


def verdict(row: pd.Series) -> str:
    metric = next((m for m in METRICS if m.name == row["metric"]), None)
    return effects.verdict(row, metric.higher_is_better if metric else False, bool(metric and metric.is_cost))


def wall_clock_ratios(effect_rows: pd.DataFrame, timing: pd.DataFrame, baseline: str,
                      metrics=("steps_to_50", "steps_to_80"), resamples: int = 10_000, seed: int = 0) -> pd.DataFrame:
    """Wall-clock-to-target ratios vs ``baseline``: the steps ratio (and its CI) x the per-step cost ratio.

    ``timing`` is :mod:`benchmark.perf.cell_timing`'s table (cells ``TASK/ALGORITHM``): in each timing repeat a cell's
    seconds per step / the baseline's of the same task in that repeat (same process, same moment). The interval
    combines the steps ratio's bootstrap CI with the spread of the cost ratio over repeats: the product's 95%
    interval is the steps CI times the [2.5%, 97.5%] bootstrap interval of the median cost ratio (a conservative
    union of the two sources)."""
    rows = []
    rng = np.random.default_rng(seed)
    vs_baseline = effect_rows[(effect_rows["reference"] == baseline) & effect_rows["metric"].isin(metrics)]
    for _, e in vs_baseline.iterrows():
        if "target" in e and not math.isfinite(float(e["target"])):  # no target in this seed set: nothing to scale
            continue
        base_cost = timing[timing["cell"] == f"{e['task']}/{baseline}"].set_index("repeat")["s_per_step"]
        name, variant = split_task(e["algorithm"])  # the cell algorithm@variant ran as task@variant
        cell = f"{with_variant(e['task'], variant)}/{name}"
        cost = timing[timing["cell"] == cell].set_index("repeat")["s_per_step"]
        repeats = sorted(set(cost.index) & set(base_cost.index))
        if not repeats:
            continue
        cost_ratios = (cost.loc[repeats] / base_cost.loc[repeats]).to_numpy(float)
        boot = np.median(cost_ratios[rng.integers(0, len(cost_ratios), (resamples, len(cost_ratios)))], axis=1)
        low_cost, high_cost = np.percentile(boot, [2.5, 97.5])
        median = float(np.median(cost_ratios))
        rows.append({"seed_set": e["seed_set"], "task": e["task"], "algorithm": e["algorithm"],
                     "metric": e["metric"].replace("steps", "wall"), "steps_ratio": e["ratio"],
                     "cost_ratio": median, "cost_ratio_min": float(cost_ratios.min()),
                     "cost_ratio_max": float(cost_ratios.max()), "repeats": len(repeats),
                     "ratio": e["ratio"] * median, "ratio_low": e["ratio_low"] * low_cost,
                     "ratio_high": e["ratio_high"] * high_cost,
                     "censored": int(e["n"] - e["reached"]) if "reached" in e else 0,
                     "n": int(e["n"]) if "n" in e else 0})
    return pd.DataFrame(rows)


def gains(table: pd.DataFrame, seed_sets: dict[str, list[int]]) -> pd.DataFrame:
    """One row per (seed set, task, cell): the mean gain of the final reward over the base model (the step-0
    evaluation) with its 95% percentile-bootstrap CI over seeds (:func:`benchmark.analysis.stats.bootstrap_ci`), and
    how many runs end above their base. The baseline's row says whether a seed set's cost targets (fractions of
    its gain) are well-conditioned: only when its CI lies above 0 (:func:`conditioning`)."""
    rows = []
    for set_name, seeds in seed_sets.items():
        chosen = table[table["seed"].isin(seeds)]
        for (task, algorithm), runs in chosen.groupby(["task", "algorithm"], sort=True):
            gain = (runs["final_reward"] - runs["base"]).to_numpy(float)
            low, high = bootstrap_ci(gain) if len(gain) > 1 else (math.nan, math.nan)
            rows.append({"seed_set": set_name, "task": task, "algorithm": algorithm, "n": len(gain),
                         "base": float(runs["base"].mean()), "final_reward": float(runs["final_reward"].mean()),
                         "gain": float(gain.mean()), "ci_low": low, "ci_high": high,
                         "gained": int((gain > 0).sum())})
    return pd.DataFrame(rows, columns=["seed_set", "task", "algorithm", "n", "base", "final_reward", "gain", "ci_low",
                                       "ci_high", "gained"])


def conditioning(row: pd.Series) -> str:
    """Plain words for a baseline's gain row: whether the targets built on its gain are well-conditioned."""
    if not (math.isfinite(row["ci_low"]) and math.isfinite(row["ci_high"])):
        return "n<2"
    if row["ci_low"] > 0:
        return "learns: targets well-conditioned"
    if row["gain"] > 0:
        return "gain CI reaches 0: targets weak"
    return "no gain: no target"


def mean_curves(runs: pd.DataFrame, every: int = 20) -> pd.DataFrame:
    """Mean raw eval reward over seeds at every ``every``-th step: one row per (task, cell), one column per step."""
    evals = runs[runs["eval_reward"].notna() & (runs["step"] % every == 0)]
    return evals.pivot_table(index=["task", "algorithm"], columns="step", values="eval_reward", aggfunc="mean")


def _fmt(value, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.{digits}g}"


def render(table: pd.DataFrame, effect_rows: pd.DataFrame, seed_sets: dict[str, list[int]], baseline: str,
           smooth: int, curves: pd.DataFrame | None = None, claims: pd.DataFrame | None = None,
           wall: pd.DataFrame | None = None, gain_rows: pd.DataFrame | None = None,
           skipped: list[SkippedRun] | None = None, lead: list[str] | None = None,
           figure_lines: list[str] | None = None, pair: tuple[str, str] = REPLICATION_SETS,
           recipes: dict | None = None, claims_of: ClaimSet | None = None,
           title: str = "Study", protocol: str = "", cost_section: list[str] | None = None) -> str:
    """The study's README: ``title``, ``lead`` (a hand-written answer, the answer table, the claims' figures), the
    generated answer, ``figure_lines`` (the curves), then the definitions and every table (``claims`` judged by
    ``claims_of``)."""
    sets = ", ".join(f"`{name}` (seeds {_seed_list(seeds)})" for name, seeds in seed_sets.items())
    lines = [f"# {title}", "", *(lead or []), *_answer_lines(claims, gain_rows, baseline),
             *(figure_lines or []),
             f"Paired effects vs `{baseline}`.{' ' + protocol if protocol else ''} Metrics fixed before the runs: steps and NFE to 50% and 80% of `{baseline}`'s gain over the base "
             "model (restricted means over the budget; a run that never reaches a target is censored there, "
             "Kaplan-Meier), final reward and AUC; primary: `steps_to_80`. `steps_to_final` (the baseline's own final "
             "reward) is shown for the papers' form but is ill-conditioned and decides nothing. Differences are "
             f"cell - reference over the seeds both ran, eval curves smoothed over {smooth} evaluations; 95% "
             "percentile-bootstrap CIs over seeds that re-estimate the target in every resample; MDE = smallest true "
             "difference a paired t-test (two-sided, 0.05) detects with 80% power. Seed sets, each analysed with its "
             f"own target: {sets}. Definitions: `benchmark/analysis/effects.py`, `benchmark/study/verdicts.py`.", "",
             *_skipped_lines(table, skipped or []), *_recipe_lines(table, recipes or {})]
    if claims is not None and len(claims):
        lines += render_claims(claims, pair, claims_of)
    if gain_rows is not None and len(gain_rows):
        lines += _gain_lines(gain_rows, baseline)
    lines += cost_section or []
    if wall is not None and len(wall):
        lines += ["## Wall-clock to target (estimated)", "",
                  "Steps ratio x per-step cost ratio; the cost ratio is measured interleaved in one process "
                  "(`python -m flowzoo.benchmark.perf.cell_timing`, file `timing.csv`): median over repeats (range). The runs' "
                  "own wall-clock is not used: it carries the load of the shared machine. A cell whose runs did not "
                  "all reach the target is marked *lower bound* (its censored runs count at the budget).", "",
                  "| seeds | task | algorithm | metric | steps ratio | cost ratio (range) | repeats "
                  "| wall-clock ratio (95% CI) |", "|---|---|---|---|---|---|---|---|"]
        for _, w in wall.iterrows():
            lines.append(f"| {w['seed_set']} | {w['task']} | {w['algorithm']} | {w['metric']} | "
                         f"{w['steps_ratio']:.2f} | {w['cost_ratio']:.2f} ({w['cost_ratio_min']:.2f}-"
                         f"{w['cost_ratio_max']:.2f}) | {int(w['repeats'])} | {w['ratio']:.2f} "
                         f"[{_fmt(w['ratio_low'])}, {_fmt(w['ratio_high'])}]"
                         + (f" *lower bound* ({int(w['censored'])}/{int(w['n'])} censored)"
                            if w.get("censored", 0) else "") + " |")
        lines.append("")
    for task, rows in table.groupby("task"):
        seeds = ", ".join(f"{cell} {_seed_list(runs['seed'])}" for cell, runs in rows.groupby("algorithm"))
        lines += [f"## {task}", "", f"Runs: {seeds}. Columns at the all-seeds targets; base: the step-0 evaluation (mean over "
                  "seeds); final reward: mean over seeds of each run's last evaluations, with a 95% percentile "
                  "bootstrap CI over seeds.", "",
                  "| cell | seeds | base | final reward (95% CI) | AUC | steps to 50% (reached) | steps to 80% (reached) "
                  f"| zero-std frac (first {EARLY_STEPS} / all steps) | off-policy frac | clip frac (on / off) "
                  "| log w std / ESS | unstable |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
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
            n = len(runs)
            final_low, final_high = bootstrap_ci(runs["final_reward"].to_numpy(float))
            lines.append(
                f"| {algorithm} | {n} | {runs['base'].mean():.4f} | {runs['final_reward'].mean():.4f} "
                f"[{_fmt(final_low, 4)}, {_fmt(final_high, 4)}] | {runs['auc'].mean():.4f} | {runs['steps_to_50'].mean():.1f} "
                f"({int(runs['reached_steps_to_50'].sum())}/{n}) | {runs['steps_to_80'].mean():.1f} "
                f"({int(runs['reached_steps_to_80'].sum())}/{n}) | {zero} | {off} | {clip} | {weights} "
                f"| {unstable}/{n} |")
        if curves is not None and task in curves.index.get_level_values(0):
            steps = [int(step) for step in curves.columns]
            lines += ["", "Mean eval reward over all seeds by step:", "",
                      "| cell | " + " | ".join(str(step) for step in steps) + " |", "|---" * (len(steps) + 1) + "|"]
            for cell, values in curves.loc[task].iterrows():
                lines.append(f"| {cell} | " + " | ".join(_fmt(float(v)) for v in values) + " |")
        task_effects = effect_rows[effect_rows["task"] == task]
        for (reference, set_name), cell_effects in task_effects.groupby(["reference", "seed_set"], sort=False):
            lines += ["", f"Paired differences vs {reference}, seeds `{set_name}`:", ""] + _effect_rows(cell_effects)
        unfinished = rows[~rows["finished"].astype(bool)]
        if len(unfinished):
            lines.append(f"Unfinished runs (censored at their last step): {', '.join(unfinished['run'])}")
        lines.append("")
    return "\n".join(lines)


def _skipped_lines(table: pd.DataFrame, skipped: list[SkippedRun]) -> list[str]:
    """How many runs were read and which were left out, with why (a damaged metrics.csv, another config, ...)."""
    lines = [f"Runs read: {len(table)}; skipped (unreadable): {len(skipped)}", ""]
    return lines + [f"- `{r.run}`: {r.cause}" for r in skipped] + ([""] if skipped else [])


def _recipe_lines(table: pd.DataFrame, recipes: dict) -> list[str]:
    """Which cells ran at tuned recipes (their runs' config.yaml ``recipe`` notes); nothing when none did."""
    tuned = [f"`{task}` `{cell}`: {recipe_text(group['run'], recipes)}"
             for (task, cell), group in table.groupby(["task", "algorithm"], sort=True)
             if any(recipes.get(run) for run in group["run"])]
    if not tuned:
        return []
    return ["Cells at tuned recipes (their runs' config.yaml `recipe` notes; the others ran at the suite's own "
            "recipe): " + "; ".join(tuned) + ".", ""]


def _answer_lines(claims: pd.DataFrame | None, gain_rows: pd.DataFrame | None, baseline: str) -> list[str]:
    """The report's opening: does the baseline learn on each seed set (its targets' conditioning), then each claim's
    verdict: those replicated as reproduced or contradicted first, then the other replicated ones, then those the
    seed sets disagree on. Empty without a gain table or claims."""
    lines = []
    if gain_rows is not None and len(gain_rows):
        for task, rows in gain_rows[gain_rows["algorithm"] == baseline].groupby("task", sort=True):
            parts = [f"{g['seed_set']} {g['gain']:+.3f} [{_fmt(g['ci_low'])}, {_fmt(g['ci_high'])}] "
                     f"({conditioning(g)})" for _, g in rows.iterrows()]
            lines.append(f"* `{baseline}` gain over the base on `{task}`: " + "; ".join(parts) + ".")
    if claims is not None and len(claims):
        shown = shown_sets(claims)
        if "replication" in claims:
            rank = claims["replication"].map(lambda r: 0 if r in ("replicated: reproduced", "replicated: contradicted")
                                             else 1 if r.startswith("replicated") else 2)
            ordered = claims.assign(_rank=rank).sort_values("_rank", kind="stable")
            for _, row in ordered.iterrows():
                figures = "; ".join(f"{s}: {row[f'verdict {s}']}" for s in shown)
                lines.append(f"* **{row['replication']}**: {row['claim']} ({figures}).")
        elif "verdict" in claims:
            lines += [f"* **{row['verdict']}**: {row['claim']}." for _, row in claims.iterrows()]
        elif len(shown) == 1:
            lines += [f"* **{row[f'verdict {shown[0]}']}**: {row['claim']} (seeds `{shown[0]}`)."
                      for _, row in claims.iterrows()]
        else:  # several sets, none of them compared for replication
            lines += [f"* {row['claim']}: " + "; ".join(f"{s}: **{row[f'verdict {s}']}**" for s in shown) + "."
                      for _, row in claims.iterrows()]
    if not lines:
        return []
    return ["## Answer", "", "The baseline's gain decides whether the cost targets mean anything; each claim's "
            "verdict follows its rule, and its figures are in the claims table below.", "", *lines, ""]


def _gain_lines(gain_rows: pd.DataFrame, baseline: str) -> list[str]:
    lines = ["## Gain over the base model", "",
             f"Final reward minus the step-0 evaluation, mean over seeds with a 95% percentile-bootstrap CI; \"gained\" "
             f"counts runs that end above their base. The cost metrics' targets are fractions of `{baseline}`'s gain, "
             "so on a seed set where its CI reaches 0 they are weak: a resample in which it does not gain has no target "
             "and counts as no difference.", "",
             "| seeds | task | cell | n | base | final reward | gain (95% CI) | gained | targets |",
             "|---|---|---|---|---|---|---|---|---|"]
    for _, g in gain_rows.iterrows():
        note = conditioning(g) if g["algorithm"] == baseline else ""
        lines.append(f"| {g['seed_set']} | {g['task']} | {g['algorithm']} | {int(g['n'])} | {g['base']:.4f} "
                     f"| {g['final_reward']:.4f} | {g['gain']:+.4f} [{_fmt(g['ci_low'])}, {_fmt(g['ci_high'])}] "
                     f"| {int(g['gained'])}/{int(g['n'])} | {note} |")
    return lines + [""]


def _effect_rows(rows: pd.DataFrame) -> list[str]:
    lines = ["| cell | metric | n | reference | cell | diff | 95% CI | ratio [95% CI] | reached (cell / ref) "
             "| MDE (80%) | t-test p | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, e in rows.iterrows():
        cost = str(e["metric"]).split("_")[0] in ("steps", "nfe")
        ratio = f"{e['ratio']:.2f} [{_fmt(e['ratio_low'])}, {_fmt(e['ratio_high'])}]" if cost else "-"
        reached = f"{int(e['reached'])}/{int(e['n'])} / {int(e['reference_reached'])}/{int(e['n'])}" if cost else "-"
        lines.append(
            f"| {e['algorithm']} | {e['metric']} | {int(e['n'])} | {_fmt(e['reference_mean'], 4)} "
            f"| {_fmt(e['algorithm_mean'], 4)} | {e['diff']:+.4g} | [{_fmt(e['ci_low'])}, {_fmt(e['ci_high'])}] "
            f"| {ratio} | {reached} | {_fmt(e['mde'])} | {_fmt(e['p_t'], 2)} | {verdict(e)} |")
    return lines


def analyze_study(runs_dir: str | Path, baseline: str = "flow_grpo", also_vs: tuple[str, ...] = (),
                  suite: str | None = None, smooth: int = DEFAULT_SMOOTH, resamples: int = effects.DEFAULT_RESAMPLES,
                  skipped: list[SkippedRun] | None = None, seed_sets: dict[str, list[int] | None] | None = None,
                  optional_vs: tuple[str, ...] = (), recipes: dict | None = None, vs_option: str = "--vs",
                  protocols: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, list[int]], pd.DataFrame]:
    """(run table, paired effects vs ``baseline`` and each cell of ``also_vs`` per seed set, the seed sets, runs);
    the runs left out as unusable are appended to ``skipped`` (``load_runs``). ``seed_sets``: the sets to analyse
    (:func:`seed_sets_of`'s ``chosen``); ``optional_vs``: references added when they ran (a claim set's)."""
    runs = split_variants(load_runs(runs_dir, skipped, recipes, protocols))
    if baseline not in set(runs["algorithm"]):
        raise ConfigError(f"baseline {baseline!r} has no runs in {runs_dir}; algorithms: "
                          f"{', '.join(sorted(set(runs['algorithm'])))}")
    if set(runs["algorithm"]) == {baseline}:
        raise ConfigError(f"only the baseline {baseline!r} has runs in {runs_dir}; a study pairs other cells with it "
                          f"(give the runs of the algorithms to compare, or another --baseline)")
    unknown = [cell for cell in also_vs if cell not in set(runs["algorithm"])]
    if unknown:
        cells = ", ".join(sorted(set(runs["algorithm"])))
        raise ConfigError(f"{vs_option} {','.join(unknown)}: no such cell; cells: {cells}")
    curves = eval_curves(runs, smooth)
    last_rows = runs.sort_values(["run", "step"], kind="stable").groupby("run").tail(1).set_index("run")
    try:
        data = effects.task_runs(curves, last_rows)
    except ValueError as error:
        raise ConfigError(f"{runs_dir}: {error}; a study counts each run once") from None
    seed_sets = seed_sets_of(suite, runs["seed"], seed_sets)
    also_vs = (*also_vs, *(c for c in optional_vs
                           if c in set(runs["algorithm"]) and c not in also_vs and c != baseline))
    table = run_table(runs, data, baseline, smooth)
    effect_rows = study_effects(data, baseline, also_vs, seed_sets, resamples)
    return table, effect_rows, seed_sets, runs


#: metrics.csv columns a trimmed copy keeps (``--save-metrics``): what the study reads
KEPT_COLUMNS = ("step", "nfe", "wall_s", "eval_reward", "reward_mean", "clip_frac", *DIAGNOSTICS, *costs.COLUMNS)


def portable_config(text: str, relative: Path) -> str:
    """A run's config.yaml text with its ``run_dir`` (this machine's absolute path) replaced by the run's place in the
    copied tree (``relative``, POSIX): no part of the run's identity, so the copy is still the same run."""
    return re.sub(r"^run_dir: .*$", f"run_dir: {relative.as_posix()}", text, count=1, flags=re.M)


def save_trimmed_metrics(runs_dir: str | Path, out_dir: str | Path, digits: int = 6,
                         merged_into: str | Path | None = None) -> int:
    """Copies each run's config.yaml, its done.json (as is: the machine it names is on the page) and its metrics.csv
    cut to ``KEPT_COLUMNS`` plus the per-step log-ratio columns (floats at ``digits`` significant digits) into
    ``out_dir``, keeping the relative layout; returns the run count.
    The study's tables computed from the copy match the full runs' to that precision.

    ``merged_into``: the folder the copies will be moved into (``out_dir`` is its stage). A run directory there at a
    copy's place that is not an earlier copy of the same run (another config.yaml, or a metrics.csv without one) is a
    one-line ConfigError: the copy would replace another run's files."""
    runs_dir, out_dir = Path(runs_dir), Path(out_dir)
    count = 0
    for run in find_run_dirs(runs_dir):
        try:
            read_run_keys(run)
            frame = read_metrics(run / "metrics.csv")
        except (ConfigError, RunError):  # a damaged file is no record (the study's README lists it as skipped)
            continue
        config = portable_config((run / "config.yaml").read_text(), run.relative_to(runs_dir)).encode()
        if merged_into is not None:
            prior = Path(merged_into) / run.relative_to(runs_dir)
            foreign = ((prior / "config.yaml").is_file() and (prior / "config.yaml").read_bytes() != config) or (
                (prior / "metrics.csv").exists() and not (prior / "config.yaml").is_file())
            if foreign:
                raise ConfigError(f"--save-metrics {merged_into}: {prior} holds another run (not a copy of {run}); "
                                  "saving would replace its config.yaml and cut its metrics.csv: give another directory")
        target = out_dir / run.relative_to(runs_dir)
        target.mkdir(parents=True, exist_ok=True)
        keep = [c for c in frame.columns if c in KEPT_COLUMNS or c.startswith(STEP_LOG_RATIO_PREFIX)]
        atomic_write(target / "metrics.csv", lambda f: frame[keep].to_csv(f, index=False, float_format=f"%.{digits}g"))
        atomic_write(target / "config.yaml", lambda f: f.write(config), mode="wb")
        if (run / "done.json").is_file():  # the run's summary: its steps, config digest and machine (run_machine)
            atomic_write(target / "done.json", lambda f: f.write((run / "done.json").read_bytes()), mode="wb")
        count += 1
    return count


def read_timing(path: str) -> pd.DataFrame:
    try:
        timing = pd.read_csv(path)
    except (OSError, ValueError) as error:
        raise ConfigError(f"--timing {path}: cannot read it ({error})") from None
    missing = {"repeat", "cell", "task", "algorithm", "s_per_step"} - set(timing.columns)
    if missing:
        raise ConfigError(f"--timing {path}: missing columns {sorted(missing)}")
    if not len(timing):
        raise ConfigError(f"--timing {path}: no rows (python -m flowzoo.benchmark.perf.cell_timing writes one per repeat "
                          "and cell)")
    cost = pd.to_numeric(timing["s_per_step"], errors="coerce")
    bad = ~(np.isfinite(cost) & (cost > 0))  # a cost ratio of nan, 0 or < 0 would print as a wall-clock estimate
    if bad.any():
        row = timing[bad].iloc[0]
        raise ConfigError(f"--timing {path}: s_per_step of {row['cell']} (repeat {row['repeat']}) is "
                          f"{row['s_per_step']}; every per-step cost must be a positive number of seconds")
    timing["s_per_step"] = cost
    twice = timing[timing.duplicated(["repeat", "cell"], keep=False)]
    if len(twice):  # a copied row would count as a second repeat of the same measurement
        row = twice.iloc[0]
        raise ConfigError(f"--timing {path}: cell {row['cell']} has repeat {row['repeat']} "
                          f"{int(((timing['repeat'] == row['repeat']) & (timing['cell'] == row['cell'])).sum())} "
                          f"times; each repeat measures each cell once")
    return timing


@dataclass
class StudyRequest:
    """What ``flowzoo study`` is asked (its options, with their defaults)."""

    runs_dir: str
    out: str
    suite: str | None = None
    baseline: str = "flow_grpo"
    vs: tuple[str, ...] = ()
    claims: str = CLAIMS_AUTO  # a claim set's name, "none", or CLAIMS_AUTO (the suite's claims: key, else the set
    # whose first task the suite or the runs hold)
    timing: str | None = None
    seed_sets: list[str] | None = None  # --seed-sets values (:func:`parse_seed_sets`)
    replicate_on: str | None = None
    smooth: int = DEFAULT_SMOOTH
    resamples: int = effects.DEFAULT_RESAMPLES
    save_metrics: str | None = None
    vs_option: str = "--vs"  # the option that named ``vs`` (the older module's is --also-vs), for its errors


def _claim_set(request: StudyRequest, suite) -> ClaimSet | None:
    """The claim set to judge before the runs are read: named, the suite's own, or (CLAIMS_AUTO with a suite) the one
    whose task the suite holds; None when there is none or it is to be matched on the runs' tasks."""
    if request.claims == NO_CLAIMS:
        return None
    if request.claims != CLAIMS_AUTO:
        return claim_set(request.claims)
    if suite is None:
        return None
    if suite.claims:
        return claim_set(suite.claims, f"suite {suite.name}: claims:")
    return match_claim_set(base_task(task) for task in suite.tasks)


def write_study(request: StudyRequest) -> Path:
    """The study of ``request.runs_dir`` written into ``request.out`` (all or nothing): README.md and index.html (the
    page: :mod:`benchmark.study.page`), figures/, runs.csv, effects.csv, gains.csv, curves.csv and, with
    claims, claims.csv and claim_estimates.csv, with timing, wall_clock.csv; returns README.md's path. FlowZooError
    (before anything is written) for bad options or runs; an OS error while writing names its path."""
    if request.resamples < 100:
        raise ConfigError(f"--resamples must be >= 100, got {request.resamples}")
    if request.smooth < 1:
        raise ConfigError(f"--smooth must be >= 1, got {request.smooth}")
    out = check_out_dir(request.out)
    refuse_shipped(out, "--out")  # as every other output
    answer = study_answer.hand_written_answer(out)  # a too-long ANSWER.md is refused before anything is written
    if request.save_metrics:
        refuse_shipped(check_out_dir(request.save_metrics, "--save-metrics"), "--save-metrics")
        saved, runs_dir = Path(request.save_metrics).resolve(), Path(request.runs_dir).resolve()
        if saved == runs_dir or runs_dir in saved.parents:  # the copies are run directories: config.yaml, metrics.csv
            where = "the runs directory" if saved == runs_dir else "inside the runs directory"
            raise ConfigError(f"--save-metrics {request.save_metrics} is {where} {request.runs_dir}: the trimmed copies "
                              "would replace the runs' own metrics.csv (their other columns lost) or be read as more "
                              "runs; give a directory outside it")
    timing = read_timing(request.timing) if request.timing else None
    suite = None
    if request.suite:
        from flowzoo.benchmark.run.suite import load_suite

        suite = load_suite(request.suite)
    claims_of = _claim_set(request, suite)
    matched = request.claims == CLAIMS_AUTO and suite is None  # match the runs' tasks once they are read
    optional = claims_of.references if claims_of else (
        tuple(dict.fromkeys(r for cs in claim_sets() for r in cs.references)) if matched else ())
    skipped: list[SkippedRun] = []
    recipes: dict = {}  # run -> the tuned: directory of its recipe note (loading.tuned_recipe)
    protocols: dict = {}  # run -> its evaluation protocol (loading.evaluation_protocol)
    table, effect_rows, seed_sets, runs = analyze_study(
        request.runs_dir, request.baseline, tuple(request.vs), request.suite, request.smooth, request.resamples,
        skipped, parse_seed_sets(request.seed_sets), optional, recipes, request.vs_option, protocols)
    if matched:
        claims_of = match_claim_set(table["task"])
    pair = replication_pair(seed_sets, request.replicate_on)
    claims, estimates = (judge(table, effect_rows, seed_sets, claims_of.claims, pair) if claims_of
                         else (None, None))
    wall = wall_clock_ratios(effect_rows, timing, request.baseline) if timing is not None else None
    if timing is not None and wall.empty:  # before anything is written: a timing file of other cells measures none
        ran = sorted({f"{task}/{algorithm}" for task, algorithm in runs[["task", "algorithm"]].drop_duplicates()
                      .itertuples(index=False)})
        raise ConfigError(f"--timing {request.timing}: none of its cells ({', '.join(sorted(set(timing['cell'])))}) "
                          f"pairs with a cell of these runs and its baseline, so no wall-clock ratio can be made; "
                          f"the runs' cells: {', '.join(ran[:8])}{' ...' if len(ran) > 8 else ''}")
    gain_rows = gains(table, seed_sets)
    cost_rows = costs.cost_table(table, seed_sets)
    curves = mean_curves(runs)
    machines = {run: run_machine(Path(request.runs_dir) / run) for run in table["run"]}
    named = table.assign(machine=table["run"].map(machines)) if any(machines.values()) else table
    frames = {"runs.csv": named, "effects.csv": effect_rows, "gains.csv": gain_rows}
    if not cost_rows.empty:
        frames["costs.csv"] = cost_rows
    if claims is not None:
        frames["claims.csv"] = claims
        frames["claim_estimates.csv"] = estimates
    if timing is not None:
        if Path(request.timing).resolve() != (out / "timing.csv").resolve():
            frames["timing.csv"] = timing
        frames["wall_clock.csv"] = wall
    if request.save_metrics:
        with staged_directory(request.save_metrics, "--save-metrics") as stage:
            saved = save_trimmed_metrics(request.runs_dir, stage, merged_into=request.save_metrics)
        print(f"saved {saved} runs' metrics to {request.save_metrics}")
    with staged_directory(out) as stage:
        for name, frame in frames.items():
            atomic_write(stage / name, lambda f, frame=frame: frame.to_csv(f, index=False))
        atomic_write(stage / "curves.csv", curves.to_csv)
        lead = answer + study_answer.answer_table(claims, estimates) + study_page.claim_figures(estimates, stage)
        figure_lines = study_page.curve_figures(runs, effect_rows, request.baseline, stage)
        cost_section = study_page.cost_section(cost_rows, runs, stage)
        title = study_answer.page_title(suite.name if suite else None, suite.question if suite else "", out.name)
        markdown = render(table, effect_rows, seed_sets, request.baseline, request.smooth, curves, claims, wall,
                          gain_rows, skipped, lead, figure_lines, pair, recipes, claims_of, title,
                          " ".join(filter(None, (protocol_line(protocols), machine_line(machines)))),
                          cost_section)
        study_page.write_page(stage, markdown, title=title)
    return out / "README.md"


def main(argv: list[str] | None = None) -> int:
    """``python -m flowzoo.benchmark.study.verdicts``: the options before ``flowzoo study`` (``--also-vs``, ``--claims`` as a
    switch), kept as an alias of the same analysis."""
    parser = argparse.ArgumentParser(prog="python -m flowzoo.benchmark.study.verdicts", description=__doc__.split("\n\n")[0]
                                     + " An alias of `flowzoo study` (flowzoo study --help).")
    parser.add_argument("runs_dir")
    parser.add_argument("--out", required=True, help="report directory (README.md, runs.csv, effects.csv)")
    parser.add_argument("--baseline", default="flow_grpo")
    parser.add_argument("--suite", default=None, help="suite name or YAML whose seed_sets (e.g. exploration, "
                        "replication) are analysed apart")
    parser.add_argument("--smooth", type=int, default=DEFAULT_SMOOTH)
    parser.add_argument("--resamples", type=int, default=effects.DEFAULT_RESAMPLES)
    parser.add_argument("--timing", default=None, help="per-step cost table of benchmark.perf.cell_timing (CSV) for "
                        "the wall-clock-to-target estimates; copied into --out as timing.csv")
    parser.add_argument("--claims", action="store_true", help="add the claims table of the --suite's claim set "
                        "(its claims: key; without --suite, the claim set whose task ran; needs --also-vs op_grpo)")
    parser.add_argument("--save-metrics", default=None, metavar="DIR", help="also copy every run's config.yaml "
                        "and its metrics.csv trimmed to the columns the study reads into DIR (a committable "
                        "record the report can be regenerated from)")
    parser.add_argument("--also-vs", default="", help="comma-separated cells (algorithm or algorithm@variant) to "
                        "pair the other cells with as well, e.g. op_grpo")
    args = parser.parse_args(argv)
    also_vs = tuple(c.strip() for c in args.also_vs.split(",") if c.strip())
    request = StudyRequest(args.runs_dir, args.out, args.suite, args.baseline, also_vs,
                           CLAIMS_AUTO if args.claims else NO_CLAIMS, args.timing, smooth=args.smooth,
                           resamples=args.resamples, save_metrics=args.save_metrics, vs_option="--also-vs")
    def run() -> int:
        if args.claims and "op_grpo" not in also_vs:
            raise ConfigError("--claims needs --also-vs op_grpo (the ablations are paired with OP-GRPO)")
        print(f"wrote {write_study(request)}")
        return 0

    return one_line_errors(run)  # an error is one line, as flowzoo study's


if __name__ == "__main__":
    sys.exit(main())
