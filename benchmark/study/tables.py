"""A study's page text (:func:`benchmark.study.verdicts.render` puts it in order): the generated answer, the runs read
and skipped, the cells at tuned recipes, the gain over the base model, the wall-clock estimates, and per task the runs,
the mean eval curves and the paired differences, every table through :func:`benchmark.render.tables.markdown_table`."""

from __future__ import annotations

import math

import pandas as pd

from flowzoo.benchmark.analysis.runs import SkippedRun, recipe_text
from flowzoo.benchmark.analysis.stats import bootstrap_ci
from flowzoo.benchmark.render.tables import markdown_table
from flowzoo.benchmark.study.claims import shown_sets
from flowzoo.benchmark.study.metrics import EARLY_STEPS, conditioning, verdict
from flowzoo.benchmark.study.seed_sets import seed_list


def fmt(value, digits: int = 3) -> str:
    """A number at ``digits`` significant digits; "-" for None, nan or inf."""
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.{digits}g}"


def skipped_lines(table: pd.DataFrame, skipped: list[SkippedRun]) -> list[str]:
    """How many runs were read and which were left out, with why (a damaged metrics.csv, another config, ...)."""
    lines = [f"Runs read: {len(table)}; skipped (unreadable): {len(skipped)}", ""]
    return lines + [f"- `{r.run}`: {r.cause}" for r in skipped] + ([""] if skipped else [])


def recipe_lines(table: pd.DataFrame, recipes: dict) -> list[str]:
    """Which cells ran at tuned recipes (their runs' config.yaml ``recipe`` notes); nothing when none did."""
    tuned = [f"`{task}` `{cell}`: {recipe_text(group['run'], recipes)}"
             for (task, cell), group in table.groupby(["task", "algorithm"], sort=True)
             if any(recipes.get(run) for run in group["run"])]
    if not tuned:
        return []
    return ["Cells at tuned recipes (their runs' config.yaml `recipe` notes; the others ran at the suite's own "
            "recipe): " + "; ".join(tuned) + ".", ""]


def answer_lines(claims: pd.DataFrame | None, gain_rows: pd.DataFrame | None, baseline: str) -> list[str]:
    """The report's opening: does the baseline learn on each seed set (its targets' conditioning), then each claim's
    verdict: those replicated as reproduced or contradicted first, then the other replicated ones, then those the
    seed sets disagree on. Empty without a gain table or claims."""
    lines = []
    if gain_rows is not None and len(gain_rows):
        for task, rows in gain_rows[gain_rows["algorithm"] == baseline].groupby("task", sort=True):
            parts = [f"{g['seed_set']} {g['gain']:+.3f} [{fmt(g['ci_low'])}, {fmt(g['ci_high'])}] "
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


def gain_lines(gain_rows: pd.DataFrame, baseline: str) -> list[str]:
    """The gain over the base model: a row per seed set, task and cell (the baseline's says whether its targets
    are well-conditioned)."""
    lines = ["## Gain over the base model", "",
             f"Final reward minus the step-0 evaluation, mean over seeds with a 95% percentile-bootstrap CI; \"gained\" "
             f"counts runs that end above their base. The cost metrics' targets are fractions of `{baseline}`'s gain, "
             "so on a seed set where its CI reaches 0 they are weak: a resample in which it does not gain has no target "
             "and counts as no difference.", ""]
    rows = [[g["seed_set"], g["task"], g["algorithm"], int(g["n"]), f"{g['base']:.4f}", f"{g['final_reward']:.4f}",
             f"{g['gain']:+.4f} [{fmt(g['ci_low'])}, {fmt(g['ci_high'])}]", f"{int(g['gained'])}/{int(g['n'])}",
             conditioning(g) if g["algorithm"] == baseline else ""] for _, g in gain_rows.iterrows()]
    return lines + markdown_table(["seeds", "task", "cell", "n", "base", "final reward", "gain (95% CI)", "gained",
                                   "targets"], rows) + [""]


def effect_lines(rows: pd.DataFrame) -> list[str]:
    """The paired differences of one reference and seed set: a row per cell and metric, with its verdict."""
    cells = []
    for _, e in rows.iterrows():
        cost = str(e["metric"]).split("_")[0] in ("steps", "nfe")
        ratio = f"{e['ratio']:.2f} [{fmt(e['ratio_low'])}, {fmt(e['ratio_high'])}]" if cost else "-"
        reached = f"{int(e['reached'])}/{int(e['n'])} / {int(e['reference_reached'])}/{int(e['n'])}" if cost else "-"
        cells.append([e["algorithm"], e["metric"], int(e["n"]), fmt(e["reference_mean"], 4),
                      fmt(e["algorithm_mean"], 4), f"{e['diff']:+.4g}", f"[{fmt(e['ci_low'])}, {fmt(e['ci_high'])}]",
                      ratio, reached, fmt(e["mde"]), fmt(e["p_t"], 2), verdict(e)])
    return markdown_table(["cell", "metric", "n", "reference", "cell", "diff", "95% CI", "ratio [95% CI]",
                           "reached (cell / ref)", "MDE (80%)", "t-test p", "verdict"], cells)


def wall_clock_lines(wall: pd.DataFrame) -> list[str]:
    """The wall-clock-to-target section: each steps ratio x the per-step cost ratio measured interleaved."""
    lines = ["## Wall-clock to target (estimated)", "",
             "Steps ratio x per-step cost ratio; the cost ratio is measured interleaved in one process "
             "(`python -m flowzoo.benchmark.perf.cell_timing`, file `timing.csv`): median over repeats (range). The runs' "
             "own wall-clock is not used: it carries the load of the shared machine. A cell whose runs did not "
             "all reach the target is marked *lower bound* (its censored runs count at the budget).", ""]
    rows = [[w["seed_set"], w["task"], w["algorithm"], w["metric"], f"{w['steps_ratio']:.2f}",
             f"{w['cost_ratio']:.2f} ({w['cost_ratio_min']:.2f}-{w['cost_ratio_max']:.2f})", int(w["repeats"]),
             f"{w['ratio']:.2f} [{fmt(w['ratio_low'])}, {fmt(w['ratio_high'])}]"
             + (f" *lower bound* ({int(w['censored'])}/{int(w['n'])} censored)" if w.get("censored", 0) else "")]
            for _, w in wall.iterrows()]
    return lines + markdown_table(["seeds", "task", "algorithm", "metric", "steps ratio", "cost ratio (range)",
                                   "repeats", "wall-clock ratio (95% CI)"], rows) + [""]


def _run_row(algorithm: str, runs: pd.DataFrame) -> list:
    """A cell's row of a task's runs table: its seeds, base, final reward with its CI, AUC, steps to the targets and
    the training diagnostics it logged ("-" for those it did not)."""
    clip = (f"{fmt(runs.get('clip_frac_on', pd.Series(dtype=float)).mean())} / {fmt(runs['clip_frac_off'].mean())}"
            if "clip_frac_off" in runs and runs["clip_frac_off"].notna().any()
            else fmt(runs["clip_frac"].mean()) if "clip_frac" in runs else "-")
    zero = (f"{fmt(runs['zero_std_frac_early'].mean())} / {fmt(runs['zero_std_frac'].mean())}"
            if "zero_std_frac" in runs else "-")
    off = fmt(runs["off_policy_frac"].mean()) if "off_policy_frac" in runs else "-"
    weights = (f"{fmt(runs['log_weight_std'].mean())} / {fmt(runs['weight_ess'].mean())}"
               if "log_weight_std" in runs and runs["log_weight_std"].notna().any() else "-")
    unstable = int(((~runs["finished"].astype(bool)) | runs["collapsed"].astype(bool)).sum())
    n = len(runs)
    final_low, final_high = bootstrap_ci(runs["final_reward"].to_numpy(float))
    return [algorithm, n, f"{runs['base'].mean():.4f}",
            f"{runs['final_reward'].mean():.4f} [{fmt(final_low, 4)}, {fmt(final_high, 4)}]",
            f"{runs['auc'].mean():.4f}",
            f"{runs['steps_to_50'].mean():.1f} ({int(runs['reached_steps_to_50'].sum())}/{n})",
            f"{runs['steps_to_80'].mean():.1f} ({int(runs['reached_steps_to_80'].sum())}/{n})",
            zero, off, clip, weights, f"{unstable}/{n}"]


def task_lines(task: str, rows: pd.DataFrame, curves: pd.DataFrame | None, task_effects: pd.DataFrame) -> list[str]:
    """A task's section: its runs table (``rows``: the run table's rows of the task), the mean eval reward by step
    (from ``curves``, when it holds the task) and the paired differences of each reference and seed set."""
    seeds = ", ".join(f"{cell} {seed_list(runs['seed'])}" for cell, runs in rows.groupby("algorithm"))
    lines = [f"## {task}", "", f"Runs: {seeds}. Columns at the all-seeds targets; base: the step-0 evaluation (mean over "
             "seeds); final reward: mean over seeds of each run's last evaluations, with a 95% percentile "
             "bootstrap CI over seeds.", ""]
    lines += markdown_table(["cell", "seeds", "base", "final reward (95% CI)", "AUC", "steps to 50% (reached)",
                             "steps to 80% (reached)", f"zero-std frac (first {EARLY_STEPS} / all steps)",
                             "off-policy frac", "clip frac (on / off)", "log w std / ESS", "unstable"],
                            [_run_row(algorithm, runs) for algorithm, runs in rows.groupby("algorithm")])
    if curves is not None and task in curves.index.get_level_values(0):
        lines += ["", "Mean eval reward over all seeds by step:", ""] + markdown_table(
            ["cell", *(int(step) for step in curves.columns)],
            [[cell, *(fmt(float(v)) for v in values)] for cell, values in curves.loc[task].iterrows()])
    for (reference, set_name), cell_effects in task_effects.groupby(["reference", "seed_set"], sort=False):
        lines += ["", f"Paired differences vs {reference}, seeds `{set_name}`:", ""] + effect_lines(cell_effects)
    unfinished = rows[~rows["finished"].astype(bool)]
    if len(unfinished):
        lines.append(f"Unfinished runs (censored at their last step): {', '.join(unfinished['run'])}")
    return lines + [""]
