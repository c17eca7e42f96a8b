"""The report writer: runs directory in, ``index.md`` + ``index.html`` + tables + figures out.

``write_report(runs_dir, out_dir)`` is a pure function of the run directories: no timestamps, sorted iteration,
fixed bootstrap seeds and SVG hash salt, so the same runs give the same bytes (PNG/SVG up to the matplotlib
version). Every file is written atomically (temporary sibling, then ``os.replace``). All numbers come from
:mod:`benchmark.analysis.stats` (and :mod:`benchmark.analysis.aggregate`); this module only formats them, :mod:`benchmark.render.figures`
plots them.

Layout of ``out_dir``::

    index.md, index.html          the report (the HTML is the markdown rendered by markdown-it-py: no network, no JS)
    fingerprint.json              each cell's first rows and config, rerun by benchmark.render.freshness
    tables/<task>_final.tex       booktabs final-reward table per task
    tables/<task>_ablation.tex    booktabs ablation table per task (when runs of ablations or of the methods they
                                  ablate exist)
    figures/performance_profiles.{png,svg}   rliable-style profiles of normalized final reward across tasks
    figures/<task>_reward_vs_{step,nfe,wall_s}.{png,svg}
    figures/<task>_diagnostics.{png,svg}          the declared scalar diagnostics over training (when logged)
    figures/<task>_<stem>.{png,svg}               each declared per-denoising-step diagnostic (``abs_log_ratio_t{k}``
                                                  -> ``<task>_abs_log_ratio``)
    figures/<task>_forest.{png,svg}               the steps and NFE ratios to the baseline with their CIs
    figures/<task>_samples_step_<N>.png           the toy tier's samples at step N redrawn (rewards, regions)

Which algorithms are ablations (and of what), their families and their diagnostic columns come from the algorithm
classes' declarations (``family``, ``ablation_of``, ``diagnostics``; see :mod:`benchmark.render.figures`), never from names.
    samples/<task>/<algorithm>_seed<S>_step_<N>.png   copies of the runs' sample grids at matched steps (image tiers,
                                                      and toy runs without the grids' JSON sidecars)
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from flowzoo.benchmark.analysis import costs, stats, targets
from flowzoo.benchmark.render import figures, gain_costs
from flowzoo.benchmark.render.freshness import write_fingerprint
from flowzoo.benchmark.analysis.runs import protocol_line, recipe_text
from flowzoo.benchmark.render.markdown_html import markdown_to_html
from flowzoo.benchmark.render.tables import indistinct_note, latex_table, markdown_table, plain
from flowzoo.io import atomic_write, atomic_write_text, staged_directory

X_AXES = figures.X_AXES
MAX_SAMPLE_STEPS = 4
CENSORING_NOTE = (
    "Costs are restricted means over the budget (Kaplan-Meier): a run that never reaches the target is censored at "
    "its last logged step, known to need more, never counted as reaching it. As estimates of the unrestricted cost, a "
    "ratio with censored seeds of the algorithm is a lower bound, one with censored seeds of the baseline an upper "
    "bound, and with both its direction is unknown (column *bound*)."
)
#: costs a verdict may rest on; wall-clock logged by runs that shared the CPU carries the machine's load of the moment
#: (two measurements of the same 110 quick-suite runs gave non-overlapping wall-clock intervals), so it is shown only
VERDICT_COSTS = ("step", "nfe")
HEADLINE = "Headline: cost to reach the target, relative to the baseline"
WALL_CLOCK_NOTE = (
    "Wall-clock ratios are as logged by the runs; runs that share a CPU with a varying load carry that load, so no "
    "verdict rests on them (the OP-GRPO study measures per-step cost interleaved in one process instead: "
    "docs/op_grpo.md)."
)


CURVES_NOTE = (
    "mean over seeds with 95% bootstrap bands (raw, unsmoothed eval reward); colours by family (Flow-GRPO blue, "
    "DanceGRPO green, MixGRPO orange, OP-GRPO purple, DiffusionNFT red, AWM yellow-brown; a family's variants in "
    "lighter shades with their own line style and marker), main methods, variants and ablations in separate panels, "
    "each with the baseline. Dashed: the target; on it, each algorithm's mean cost to reach it, i.e. where its "
    "smoothed curve first reaches it, averaged over seeds (filled: every seed reached it; hollow: some seeds never "
    "did and count at their last step, so the mark is a lower bound); dots of one panel are stacked a few points "
    "apart so that equal costs do not hide each other. On the NFE and wall-clock axes seeds evaluated at different "
    "x are interpolated onto a shared grid."
)
COST_DETAILS = "Cost to the target: every algorithm"
DEFINITIONS = "Methods and definitions"
#: toy-tier sample panels a row
SAMPLE_PANELS_PER_ROW = 5


# -------------------------------------------------------------------------------------------------------- formatting


def anchor(title: str) -> str:
    """The fragment id of a heading, as GitHub makes it (lower case, punctuation dropped, spaces to hyphens) and as
    :mod:`benchmark.render.markdown_html` sets it."""
    from flowzoo.benchmark.render.markdown_html import heading_id

    return heading_id(title)


def slug(name: str) -> str:
    """A file-name-safe version of a task or algorithm label."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("_") or "unnamed"


def fmt_number(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def fmt_pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}%"


def fmt_ci(lo: float, hi: float, fmt=fmt_number, n: int | None = None) -> str:
    if n is not None and n < 2:
        return "n<2"
    return "n/a" if math.isnan(lo) or math.isnan(hi) else f"[{fmt(lo)}, {fmt(hi)}]"


def _hue_order(algorithms, baseline: str) -> list[str]:
    return sorted(set(algorithms), key=lambda a: (a != baseline, a))


def step_columns(runs: pd.DataFrame, pattern: str) -> dict[int, str]:
    """{k: column} of the columns a per-denoising-step pattern (``abs_log_ratio_t{k}``) names, ordered by k."""
    regex = re.compile(re.escape(pattern).replace(re.escape("{k}"), r"(\d+)"))
    found = {int(m[1]): c for c in runs.columns if (m := regex.fullmatch(c))}
    return dict(sorted(found.items()))


def declared_diagnostics(runs: pd.DataFrame) -> dict[str, tuple[str, list[str]]]:
    """{declared column or ``{k}`` pattern: (description, the algorithms that declare it and logged a value)} for
    the algorithms of ``runs``, in algorithm then declaration order; columns nobody logged are left out."""
    found: dict[str, tuple[str, list[str]]] = {}
    for algorithm, own in runs.groupby("algorithm", sort=True):
        for pattern, description in figures.diagnostics(algorithm).items():
            columns = list(step_columns(own, pattern).values()) if "{k}" in pattern else [pattern]
            if any(c in own.columns and own[c].notna().any() for c in columns):
                found.setdefault(pattern, (description, []))[1].append(algorithm)
    return found


# ----------------------------------------------------------------------------------------------------------- sections


def _seeds_text(seeds) -> str:
    return ", ".join(str(s) for s in sorted(seeds))


def header_section(analysis: stats.Analysis) -> list[str]:
    """The title, what was compared, and where the parts of the page are: the answer (per task, the cost ratios to
    the baseline with their CIs, then the curves) comes first; methods, definitions and the runs table last."""
    summary = analysis.summary
    unfinished = summary[~summary["finished"].astype(bool)]
    sections = [HEADLINE,
                "Across tasks: IQM, probability of improvement, performance profiles", "Final reward",
                ablations_heading(analysis), "Diagnostics", "Samples at matched steps", COST_DETAILS,
                DEFINITIONS, "Runs"]
    return [
        "# FlowZoo benchmark report",
        "",
        f"- Runs: {len(summary)} ({summary['task'].nunique()} tasks, {summary['algorithm'].nunique()} algorithms); "
        f"unfinished: {len(unfinished)}; skipped (unreadable): {len(analysis.skipped)}",
        f"- Baseline: `{analysis.baseline}`",
        f"- Target: {analysis.target_description}",
        f"- {protocol_line(analysis.protocols)}",
        "- Contents: " + ", ".join(f"[{title}](#{anchor(title)})" for title in sections),
        "",
    ]


def definitions_section(analysis: stats.Analysis) -> list[str]:
    return [
        f"## {DEFINITIONS}",
        "",
        f"- Smoothing: trailing mean over the last {analysis.smooth} evaluations; a run's final reward is its smoothed "
        "eval reward at its last evaluation.",
        f"- Cost to target: steps, NFE and training wall-clock at the first evaluation whose smoothed eval reward is "
        f">= the target. {WALL_CLOCK_NOTE}",
        f"- Confidence intervals: {int(100 * stats.DEFAULT_CONFIDENCE)}% percentile bootstrap over seeds "
        f"({stats.DEFAULT_RESAMPLES} resamples, seed {stats.DEFAULT_BOOTSTRAP_SEED}; ratios resample algorithm and "
        "baseline seeds independently and re-estimate the target from the resampled baseline runs, so its "
        "uncertainty is in the interval); 'n<2' where fewer than 2 seeds. IQM: mean of the middle 50% of seeds.",
        "- Across tasks (rliable's definitions): a run's normalized score is (final - base) / (baseline final - base), "
        "0 for the base model and 1 for the baseline's mean; IQM over all (task, seed) scores and the probability "
        "of improvement over the baseline with stratified bootstrap CIs (seeds resampled within each task).",
        f"- Censoring: {CENSORING_NOTE}",
        "- Cost plots (forest plots, as rliable draws interval estimates): per algorithm its steps and NFE to the "
        "target relative to the baseline's, the mark the ratio and the bar its 95% CI, on a log axis with the "
        "baseline (100%) dashed; the mark's shape says what censoring makes of the ratio (circle exact, > a lower "
        "bound, < an upper bound, hollow diamond unknown direction); (k/n): seeds reaching the target.",
        f"- Eval reward curves: {CURVES_NOTE}",
        "- Methods: the algorithms' definitions, defaults and sources are in docs/algorithms.md and docs/op_grpo.md; "
        "their recipes in docs/recipes.md; the statistics in benchmark/analysis/effects.py, benchmark/analysis/stats.py and "
        "benchmark/analysis/aggregate.py.",
        "",
    ]


def runs_section(analysis: stats.Analysis) -> list[str]:
    summary = analysis.summary
    noted = any(analysis.recipes.values())  # a column only where some run ran at a tuned recipe
    rows = []
    for (task, algorithm), group in summary.groupby(["task", "algorithm"], sort=True):
        done = group["finished"].astype(bool)
        rows.append([f"`{task}`", f"`{algorithm}`", len(group), _seeds_text(group["seed"]),
                     f"{int(done.sum())}/{len(group)}", int(group["train_steps"].max())]
                    + ([recipe_text(group["run"], analysis.recipes)] if noted else []))
    lines = ["## Runs", ""] + markdown_table(
        ["task", "algorithm", "seeds", "seed values", "finished", "train steps"] + (["recipe"] if noted else []),
        rows) + [""]
    if noted:
        lines += ["recipe: `tuned: DIR` where the runs' config.yaml records the tuned configurations they ran at "
                  "(`flowzoo bench --tuned DIR`, a suite's `tuned:`; each run's `recipe` note names the file and the "
                  "values); — the suite's own recipe (or runs made before runs recorded theirs).", ""]
    unfinished = summary[~summary["finished"].astype(bool)]
    if len(unfinished):
        lines += ["Unfinished runs (fewer logged steps than `train.steps`; marked † in the tables):", ""]
        lines += [f"- `{r.run}` (`{r.task}`, `{r.algorithm}`, seed {r.seed}): {int(r.last_step)}/{r.train_steps} steps"
                  for r in unfinished.itertuples()]
        lines.append("")
    lines += ["### Skipped runs", ""]
    if analysis.skipped:
        lines += ["Run directories left out of every table and figure, with the cause:", ""]
        lines += [f"- `{r.run}`: {r.cause}" for r in analysis.skipped]
    else:
        lines += ["None: every run directory was readable."]
    return lines + [""]


def target_phrase(analysis: stats.Analysis, task: str) -> str:
    """How a headline sentence names the target: "`flow_grpo`'s final reward", "90% of ...", "the reward 0.8"."""
    target = analysis.target
    if isinstance(target, targets.Target) and target.kind == "relative":
        share = "" if target.value == 1.0 else f"{100 * target.value:g}% of "
        return f"{share}`{analysis.baseline}`'s final reward"
    if isinstance(target, targets.Target) and target.kind == "gain":
        return f"{100 * target.value:g}% of `{analysis.baseline}`'s gain"
    return f"the target reward {analysis.targets[task]:g}"


def target_line(analysis: stats.Analysis, task: str) -> str:
    """The task's target value and where it comes from; for an undefined target, why."""
    base, top, value = analysis.bases.get(task, math.nan), analysis.baseline_finals.get(task, math.nan), \
        analysis.targets[task]
    origin = (f"base model (`{analysis.baseline}` at step 0) {fmt_number(base)}, `{analysis.baseline}`'s final "
              f"reward {fmt_number(top)}")
    if not math.isnan(value):
        return f"Target: eval reward >= {fmt_number(value)} ({origin})."
    target = analysis.target
    if isinstance(target, targets.Target) and target.kind == "gain" and not math.isnan(top):
        return (f"No target on this task: {origin}; `{analysis.baseline}` did not improve on the base model, so a "
                "share of its gain is undefined (pass an absolute `--target` to compare costs here).")
    return f"No target on this task ({origin})."


def _excludes_one(row: pd.Series, cost: str) -> str | None:
    """'faster' / 'slower' when the ratio's CI lies below / above 100% and censoring allows that reading."""
    lo, hi, bound = row[f"{cost}_lo"], row[f"{cost}_hi"], row["bound"]
    if hi < 1.0 and bound in ("exact", "upper bound"):
        return "below"
    if lo > 1.0 and bound in ("exact", "lower bound"):
        return "above"
    return None


def task_verdict(table: pd.DataFrame, baseline: str) -> str:
    """One sentence: does the baseline reach the target in every seed, and which ratios' CIs exclude 100%."""
    first = table.iloc[0]
    reached, n = int(first["baseline_reached"]), int(first["baseline_n"])
    found = []
    for _, row in table.iterrows():
        sides = {cost: _excludes_one(row, cost) for cost in VERDICT_COSTS}
        named = [", ".join(stats.COST_LABELS[c] for c, s in sides.items() if s == side) + f" {side} 100%"
                 for side in ("below", "above") if side in sides.values()]
        if named:
            found.append(f"`{row['algorithm']}` ({'; '.join(named)})")
    reach = (f"`{baseline}` reaches the target in all {n} seeds" if reached == n else
             f"`{baseline}` reaches the target in only {reached} of {n} seeds (its censored seeds bound the ratios)")
    if found:
        return f"{reach}; steps or NFE ratios whose 95% CI excludes 100%: {'; '.join(found)}."
    return (f"{reach}; no steps or NFE ratio's 95% CI excludes 100%: with these seeds no algorithm's cost to the "
            "target can be told apart from the baseline's.")


def ratio_cell(row: pd.Series, cost: str) -> str:
    """'34.2% [28.1%, 40.0%]' for one cost of an efficiency-table row ('n<2' for the CI with a single seed)."""
    n = min(int(row["n"]), int(row["baseline_n"]))
    return f"{fmt_pct(row[f'{cost}_ratio'])} {fmt_ci(row[f'{cost}_lo'], row[f'{cost}_hi'], fmt_pct, n=n)}"


def _ratios_text(row: pd.Series) -> str:
    return " / ".join(f"{ratio_cell(row, c)} of its {stats.COST_LABELS[c]}" for c in VERDICT_COSTS)


def headline_sentence(row: pd.Series, baseline: str, phrase: str) -> str:
    """One honest sentence per algorithm: reaches / reaches in only some seeds / does not reach, with bound notes."""
    algorithm, n, reached = f"`{row['algorithm']}`", int(row["n"]), int(row["reached"])
    if row["baseline_n"] == 0:
        return f"{algorithm}: no comparison possible on this task: it has no `{baseline}` runs."
    if math.isnan(row["step_ratio"]):
        return (f"{algorithm}: no efficiency comparison possible on this task: `{baseline}` meets the target "
                f"({row['target']:.3f}) before any training (it did not improve on its step-0 evaluation), so "
                "its cost to the target is zero.")
    if reached == n:
        sentence = f"{algorithm} reaches {phrase} in {_ratios_text(row)} ({n}/{n} seeds)."
    elif reached == 0:
        sentence = (f"{algorithm} does not reach {phrase} (target {row['target']:.3f}) in any of its {n} seeds; "
                    f"counted at its last step, it used at least {_ratios_text(row)} without reaching it.")
    else:
        sentence = (f"{algorithm} reaches {phrase} in only {reached} of {n} seeds; counting the others at their last "
                    f"step (censored), it needs at least {_ratios_text(row)}.")
    base_censored = int(row["baseline_n"] - row["baseline_reached"])
    if base_censored:
        effect = {"upper bound": "make this ratio an upper bound",
                  "unknown direction": "leave the direction of this ratio's error unknown"}[row["bound"]]
        sentence += (f" (`{baseline}` itself reaches the target in {int(row['baseline_reached'])} of "
                     f"{int(row['baseline_n'])} seeds; its censored seeds {effect}.)")
    return sentence


def _efficiency(analysis: stats.Analysis, task: str) -> pd.DataFrame:
    return analysis.efficiency[analysis.efficiency["task"] == task] if len(analysis.efficiency) else pd.DataFrame()


BOUND_MARKS = {"exact": "", "lower bound": "≥ ", "upper bound": "≤ ", "unknown direction": "~ "}


def answer_section(analysis: stats.Analysis) -> list[str]:
    """The page's answer in one table, above its first section: one row per algorithm, per task its steps and NFE to
    the target relative to the baseline with 95% CIs; bold where the CI excludes 100% (as :func:`task_verdict`
    reads it), marked where censored seeds make the ratio a bound. Empty when no task has a comparison."""
    tasks = [t for t in sorted(analysis.targets)
             if not math.isnan(analysis.targets[t]) and len(_efficiency(analysis, t))]
    if not tasks:
        return []
    algorithms = sorted({a for t in tasks for a in _efficiency(analysis, t)["algorithm"]})
    headers = ["algorithm"] + [f"`{t}`: {stats.COST_LABELS[c]}" for t in tasks for c in VERDICT_COSTS]
    rows = []
    for algorithm in algorithms:
        row = [f"`{algorithm}`"]
        for task in tasks:
            table = _efficiency(analysis, task)
            hit = table[table["algorithm"] == algorithm]
            for cost in VERDICT_COSTS:
                if not len(hit) or not int(hit.iloc[0]["baseline_n"]):
                    row.append("-")
                    continue
                r = hit.iloc[0]
                cell = BOUND_MARKS.get(r["bound"], "") + ratio_cell(r, cost)
                row.append(f"**{cell}**" if _excludes_one(r, cost) else cell)
        rows.append(row)
    return ([f"**The answer**: each algorithm's steps and NFE to the target relative to `{analysis.baseline}`'s "
             "(restricted means over seeds, 95% CIs); **bold**: the CI excludes 100%; ≥ / ≤: censored seeds make the "
             f"ratio a lower / upper bound. Per task, the forest plots and curves: [{HEADLINE}](#{anchor(HEADLINE)}).",
             ""] + markdown_table(headers, rows) + [""])


def headline_section(analysis: stats.Analysis, out_dir: Path | None = None) -> list[str]:
    """Per task: the target, the forest plot of the steps and NFE ratios (with ``out_dir``), the verdict, a compact
    table of the ratios with their CIs, then the eval reward curves (with ``out_dir``). The per-algorithm sentences
    and the full table (wall-clock, baseline seeds) are in :func:`cost_details_section`."""
    lines = [f"## {HEADLINE}", "",
             "Per task: each algorithm's steps and NFE to reach the target relative to the baseline's (restricted "
             f"means, censored seeds counted at their last step; 95% CIs), then the eval reward curves. Every "
             f"algorithm's sentence and wall-clock: [{COST_DETAILS}](#{anchor(COST_DETAILS)}); definitions: "
             f"[{DEFINITIONS}](#{anchor(DEFINITIONS)}).", ""]
    palette = _palette(analysis) if out_dir is not None else None
    for task in sorted(analysis.targets):
        lines += [f"### `{task}`", "", target_line(analysis, task), ""]
        table = _efficiency(analysis, task)
        if not math.isnan(analysis.targets[task]) and len(table) == 0:
            lines += [f"No algorithm other than `{analysis.baseline}` on this task.", ""]
        elif not math.isnan(analysis.targets[task]):
            if out_dir is not None:
                paths = figures.plot_forest(table, list(VERDICT_COSTS), stats.COST_LABELS, task, palette,
                                            out_dir / "figures" / f"{slug(task)}_forest")
                lines += _figure_lines(paths, out_dir, f"{task}: steps and NFE to the target relative to "
                                                       f"{analysis.baseline}, 95% CIs")
            if int(table.iloc[0]["baseline_n"]):
                lines += [f"**{task_verdict(table, analysis.baseline)}**", ""]
            headers = ["algorithm", "seeds reaching"] + [f"{stats.COST_LABELS[c]} vs baseline [95% CI]"
                                                         for c in VERDICT_COSTS] + ["bound"]
            rows = [[f"`{r['algorithm']}`", f"{r['reached']}/{r['n']}"] + [ratio_cell(r, c) for c in VERDICT_COSTS]
                    + [r["bound"]] for _, r in table.iterrows()]
            lines += markdown_table(headers, rows) + [""]
            lines += indistinct_note(headers, rows, [1, 2, 3])
        if out_dir is not None:
            lines += task_curves(analysis, task, out_dir, palette)
    return lines


def cost_details_section(analysis: stats.Analysis) -> list[str]:
    """Per task, one sentence per algorithm and the full cost table (steps, NFE and wall-clock ratios, the seeds of
    the algorithm and of the baseline reaching the target, the bound)."""
    lines = [f"## {COST_DETAILS}", "", CENSORING_NOTE, WALL_CLOCK_NOTE, ""]
    for task in sorted(analysis.targets):
        lines += [f"### `{task}`", "", target_line(analysis, task), ""]
        if math.isnan(analysis.targets[task]):
            continue
        table = _efficiency(analysis, task)
        if len(table) == 0:
            lines += [f"No algorithm other than `{analysis.baseline}` on this task.", ""]
            continue
        phrase = target_phrase(analysis, task)
        lines += [f"- {headline_sentence(row, analysis.baseline, phrase)}" for _, row in table.iterrows()] + [""]
        rows = [[f"`{r['algorithm']}`", f"{r['reached']}/{r['n']}", f"{r['baseline_reached']}/{r['baseline_n']}"]
                + [ratio_cell(r, c) for c in stats.COSTS]
                + [r["bound"]] for _, r in table.iterrows()]
        headers = ["algorithm", "seeds reaching", "baseline seeds reaching"] + [
            f"{stats.COST_LABELS[c]} vs baseline [95% CI]" + ("" if c in VERDICT_COSTS else " (load-dependent)")
            for c in stats.COSTS] + ["bound"]
        lines += markdown_table(headers, rows) + [""]
        lines += indistinct_note(headers, rows, [1, 3, 4])
    return lines


def gain_cost_section(analysis: stats.Analysis, out_dir: Path) -> list[str]:
    """What each algorithm's gain cost (:mod:`benchmark.analysis.costs`): per task the panel of reward gain against
    spread kept (and gold gain), and the table, over all seeds; nothing when no run logged a cost column."""
    base = analysis.curves.sort_values(["run", "step"], kind="stable").groupby("run")["eval_reward"].first()
    table = analysis.finals[["run", "task", "algorithm", "seed", "final_reward"]].copy()
    table["base"] = table["run"].map(base)
    run_cost = costs.run_costs(analysis.runs, analysis.smooth)
    for column in run_cost.columns:
        table[column] = table["run"].map(run_cost[column])
    rows = costs.cost_table(table, {"all": None})
    if rows.empty:
        return []
    lines = []
    for task, paths in gain_costs.plot_panels(rows, "all", _palette(analysis),
                                        lambda task: out_dir / "figures" / f"{slug(task)}_costs"):
        lines += _figure_lines(paths, out_dir, f"{task}: reward gain of every algorithm against what it cost")
    return gain_costs.cost_lines(rows, lines, "all")


def _algorithm_cell(row: pd.Series) -> str:
    return f"`{row['algorithm']}`" + (" †" if row["unfinished"] else "")


def _seeds_cell(row: pd.Series) -> str:
    return f"{row['n']}" + (f" ({row['unfinished']} unfinished)" if row["unfinished"] else "")


def _final_rows(table: pd.DataFrame) -> list[list[str]]:
    rows = []
    for _, r in table.iterrows():
        rows.append([_algorithm_cell(r), _seeds_cell(r),
                     fmt_number(r["mean"]), fmt_ci(r["mean_lo"], r["mean_hi"], n=r["n"]),
                     fmt_number(r["iqm"]), fmt_ci(r["iqm_lo"], r["iqm_hi"], n=r["n"])])
    return rows


def task_table(out_dir: Path, task: str, name: str, headers: list[str], rows: list[list[str]],
               caption: str) -> list[str]:
    """Write ``tables/<task>_<name>.tex`` and return the task's markdown subsection with the table and a link."""
    tex = (Path("tables") / f"{slug(task)}_{name}.tex").as_posix()
    atomic_write_text(out_dir / tex, latex_table(headers, [[plain(c) for c in row] for row in rows], caption))
    return [f"### `{task}`", ""] + markdown_table(headers, rows) + ["", f"LaTeX: [{tex}]({tex})", ""]


def final_section(analysis: stats.Analysis, out_dir: Path) -> list[str]:
    lines = ["## Final reward", "",
             f"Per seed: the smoothed eval reward at the last evaluation (mean of the last {analysis.smooth}); then "
             "mean and IQM across seeds with 95% bootstrap CIs. † = holds unfinished runs (their last evaluation "
             "so far).",
             ""]
    headers = ["algorithm", "seeds", "mean", "mean 95% CI", "IQM", "IQM 95% CI"]
    for task, table in analysis.final_table.groupby("task", sort=True):
        table = table.iloc[np.argsort([a != analysis.baseline for a in table["algorithm"]], kind="stable")]
        rows = _final_rows(table)
        caption = f"Final eval reward on {task} (mean and IQM over seeds, 95% bootstrap CI)."
        lines += task_table(out_dir, task, "final", headers, rows, caption)
        lines += indistinct_note(headers, rows, [2, 4])
    return lines


def _diagnostic_mean(analysis: stats.Analysis, task: str, algorithm: str, column: str) -> str:
    """A logged column of a cell averaged over training, then over seeds ("n/a" where it was not logged)."""
    if column not in analysis.runs.columns:
        return "n/a"
    runs = analysis.runs[(analysis.runs["task"] == task) & (analysis.runs["algorithm"] == algorithm)]
    per_seed = runs.groupby("run")[column].mean().dropna()
    return fmt_number(float(per_seed.mean())) if len(per_seed) else "n/a"


def ablation_columns(shown) -> dict[str, str]:
    """{column: description} of the per-step diagnostics the ablated methods declare (``Algorithm.diagnostics``;
    per-denoising-step columns ``..._t{k}`` left to the diagnostics section)."""
    columns: dict[str, str] = {}
    for base in sorted({figures.ablation_of(a) or a for a in shown}):
        for column, description in figures.diagnostics(base).items():
            if "{k}" not in column:
                columns.setdefault(column, description)
    return columns


def ablation_rows(algorithms) -> list[str]:
    """The algorithms of the ablation table: those that declare ``ablation_of`` and the methods with registered
    ablations."""
    return [a for a in algorithms if figures.ablation_of(a) is not None or figures.has_ablations(a)]


def ablations_heading(analysis: stats.Analysis) -> str:
    """The ablation section's title: "OP-GRPO ablations" for the methods whose ablations ran, else "Ablations"."""
    shown = ablation_rows(analysis.final_table["algorithm"].unique())
    return figures.ablations_title({figures.ablation_of(a) or a for a in shown})


def ablation_section(analysis: stats.Analysis, out_dir: Path) -> list[str]:
    shown = ablation_rows(analysis.final_table["algorithm"].unique())
    title = ablations_heading(analysis)
    lines = [f"## {title}", ""]
    finals = analysis.final_table[analysis.final_table["algorithm"].isin(shown)]
    if finals.empty:
        return lines + ["No runs of ablations (algorithms that declare `ablation_of`) or of the methods they ablate.",
                        ""]
    columns = ablation_columns(shown)
    declared = "; ".join(f"`{c}`: {d}" for c, d in columns.items())
    lines += ["Final reward and steps-to-target ratio vs the baseline for each method with registered ablations and "
              "each ablation (`ablation_of`)" + (f"; the diagnostics the methods declare, averaged over training, "
                                                 f"then over seeds ({declared})" if columns else "") + ".", ""]
    headers = ["variant", "seeds", "final reward [95% CI]", "steps vs baseline [95% CI]", "seeds reaching",
               *(f"`{c}`" for c in columns)]
    efficiency = analysis.efficiency.set_index(["task", "algorithm"]) if len(analysis.efficiency) else None
    for task, table in finals.groupby("task", sort=True):
        rows = []
        for _, r in table.iterrows():
            key = (task, r["algorithm"])
            eff = efficiency.loc[key] if efficiency is not None and key in efficiency.index else None
            steps = "n/a" if eff is None else ratio_cell(eff, "step")
            reaching = "n/a" if eff is None else f"{eff['reached']}/{eff['n']}"
            rows.append([_algorithm_cell(r), _seeds_cell(r),
                         f"{fmt_number(r['mean'])} {fmt_ci(r['mean_lo'], r['mean_hi'], n=r['n'])}", steps, reaching,
                         *(_diagnostic_mean(analysis, task, r["algorithm"], c) for c in columns)])
        lines += task_table(out_dir, task, "ablation", headers, rows, f"{title} on {task}.")
        lines += indistinct_note(headers, rows, list(range(2, len(headers))), what="variants")
    return lines


def _figure_lines(paths: list[Path], out_dir: Path, alt: str) -> list[str]:
    png, *svg = (p.relative_to(out_dir).as_posix() for p in paths)
    return [f"![{alt}]({png})", ""] + [f"SVG: [{v}]({v})" for v in svg] + ([""] if svg else [])


def _palette(analysis: stats.Analysis) -> dict:
    return figures.styles(analysis.summary["algorithm"])


def aggregate_section(analysis: stats.Analysis, out_dir: Path) -> list[str]:
    lines = ["## Across tasks: IQM, probability of improvement, performance profiles", "",
             f"Normalized final reward: 0 = the base model (`{analysis.baseline}` at step 0), "
             f"1 = `{analysis.baseline}`'s mean final reward, per task. IQM over every (task, seed) score; "
             f"P(improvement): the chance that a seed of the algorithm ends above a seed of `{analysis.baseline}` on "
             "the same task (ties count 1/2), averaged over tasks, on raw final rewards. 95% stratified bootstrap "
             f"CIs. Each algorithm is scored on the tasks it shares with `{analysis.baseline}` where "
             f"`{analysis.baseline}` improves on the base model.", ""]
    table = analysis.aggregate
    excluded = sorted(t for t in analysis.targets
                      if not (analysis.baseline_finals.get(t, math.nan) - analysis.bases.get(t, math.nan) > 0))
    if excluded:
        lines += ["Left out (the baseline does not improve on the base model there, or has no step-0 evaluation): "
                  + ", ".join(f"`{t}`" for t in excluded) + ".", ""]
    if table.empty or not table["n"].any():
        return lines + ["No task where the aggregates are defined.", ""]
    rows = []
    for _, r in table[table["n"] > 0].iterrows():
        poi = ("(baseline)" if r["algorithm"] == analysis.baseline else
               f"{fmt_number(r['poi'], 2)} {fmt_ci(r['poi_lo'], r['poi_hi'], lambda v: fmt_number(v, 2))}")
        rows.append([f"`{r['algorithm']}`", ", ".join(f"`{t}`" for t in r["tasks"]), r["n"],
                     f"{fmt_number(r['iqm'])} {fmt_ci(r['iqm_lo'], r['iqm_hi'])}", poi])
    headers = ["algorithm", "tasks", "runs", "IQM normalized final [95% CI]",
               f"P(better than `{analysis.baseline}`) [95% CI]"]
    lines += markdown_table(headers, rows) + [""]
    lines += indistinct_note(headers, [r for r in rows if r[4] != "(baseline)"], [3, 4])
    if len(analysis.profiles):
        paths = figures.plot_performance_profiles(analysis.profiles, analysis.baseline, _palette(analysis),
                                                  out_dir / "figures" / "performance_profiles")
        lines += _figure_lines(paths, out_dir, "performance profiles of normalized final reward")
    return lines


def task_curves(analysis: stats.Analysis, task: str, out_dir: Path, palette: dict) -> list[str]:
    """The task's eval reward curves against step, NFE and wall-clock (definitions: ``CURVES_NOTE``)."""
    curves = analysis.curves[analysis.curves["task"] == task]
    if curves.empty:
        return []
    lines = ["Eval reward over training: mean over seeds with 95% bands; dashed the target, dots each algorithm's mean "
             "cost to reach it (hollow: some seeds never did).", ""]
    costs = analysis.costs[analysis.costs["task"] == task]
    for x in X_AXES:
        stem = out_dir / "figures" / f"{slug(task)}_reward_vs_{x}"
        paths = figures.plot_eval_curves(curves, costs, task, x, analysis.targets[task], analysis.baseline,
                                         palette, stem)
        lines += _figure_lines(paths, out_dir, f"{task}: eval reward vs {X_AXES[x]}")
    return lines


def step_stem(pattern: str) -> str:
    """The name of a per-denoising-step pattern without its index: ``abs_log_ratio_t{k}`` -> ``abs_log_ratio``."""
    return re.sub(r"_?t?\{k\}", "", pattern) or "step"


def diagnostics_section(analysis: stats.Analysis, out_dir: Path) -> list[str]:
    lines = ["## Diagnostics", "",
             "The columns each algorithm declares in its class's `diagnostics` (docs/adding-an-algorithm.md): scalars "
             "over training, and per-denoising-step columns (`{k}`) averaged over training, against k; mean over "
             "seeds with 95% bootstrap bands.", ""]
    drawn, palette = False, _palette(analysis)
    for task, runs in analysis.runs.groupby("task", sort=True):
        declared = declared_diagnostics(runs)
        if not declared:
            continue
        drawn = True
        rows = [[f"`{pattern}`", ", ".join(f"`{a}`" for a in members), description]
                for pattern, (description, members) in declared.items()]
        lines += [f"### `{task}`", ""] + markdown_table(["column", "logged by", "what it measures"], rows, pipe="\\|") + [""]
        scalars = {p: members for p, (_, members) in declared.items() if "{k}" not in p}
        if scalars:
            paths = figures.plot_diagnostics_over_training(runs, scalars, task, palette,
                                                           out_dir / "figures" / f"{slug(task)}_diagnostics")
            lines += _figure_lines(paths, out_dir, f"{task}: {', '.join(scalars)} over training")
        for pattern, (_, members) in declared.items():
            if "{k}" not in pattern:
                continue
            stem = step_stem(pattern)
            paths = figures.plot_by_denoising_step(runs, step_columns(runs, pattern), stem, members, task, palette,
                                                   out_dir / "figures" / f"{slug(task)}_{slug(stem)}")
            lines += _figure_lines(paths, out_dir, f"{task}: {stem} by denoising step")
    return lines if drawn else lines + ["No run logged a column its algorithm declares in `diagnostics`.", ""]


def sample_grids(run_dir: Path) -> dict[int, Path]:
    """{step: path} of a run's ``samples/step_<N>.png`` files."""
    found = {}
    for path in (run_dir / "samples").glob("step_*.png"):
        if match := re.fullmatch(r"step_(\d+)\.png", path.name):
            found[int(match[1])] = path
    return found


def matched_steps(steps: list[set[int]], limit: int = MAX_SAMPLE_STEPS) -> list[int]:
    """Steps present for every algorithm; at most ``limit`` of them, evenly spread and always with first and last."""
    common = sorted(set.intersection(*steps)) if steps else []
    if len(common) <= limit:
        return common
    picks = np.unique(np.linspace(0, len(common) - 1, limit).round().astype(int))
    return [common[i] for i in picks]


def grid_sidecar(grid: Path) -> dict | None:
    """The JSON sidecar of a sample grid (:mod:`benchmark.run.sample_pictures`), or None (grids saved before sidecars existed)."""
    try:
        data = json.loads(grid.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class PointScorer:
    """Re-scores a toy-tier run's saved sample points with the run's own reward (from its ``config.yaml``: the
    reward, its arguments and the prompt set with its metadata) and maps each prompt's rewarded region. Built only for
    a reward that takes points; the toy rewards are closed-form, so this costs milliseconds."""

    def __init__(self, run_dir: Path):
        from flowzoo.benchmark.config.schema import read_stored_config
        from flowzoo.benchmark.prompts.sources import PromptSection, load_prompts
        from flowzoo.rewards import build

        config = read_stored_config(run_dir / "config.yaml")
        #: what the scores depend on: runs with equal keys share their regions
        self.key = json.dumps([config["reward"], config.get("reward_args"), config.get("prompts")], sort_keys=True,
                              default=str)
        self._regions: dict = {}
        self.reward = build(config["reward"], config.get("reward_args") or {})
        if "points" not in tuple(getattr(self.reward, "accepts", ()) or ()):
            raise ValueError(f"reward {config['reward']!r} does not score points")
        _, evaluation = load_prompts(PromptSection(**(config.get("prompts") or {})))
        self.metadata = {prompt: meta for prompt, meta in evaluation}
        targets = [np.hypot(*v) for m in self.metadata.values() for v in m.values()
                   if isinstance(v, (list, tuple)) and len(v) == 2]
        from flowzoo.benchmark.run.sample_pictures import LIMIT

        self.limit = max(LIMIT, math.ceil(5 * (max(targets, default=0.0) + 0.8)) / 5)

    def score(self, points: np.ndarray, prompts: list[str]) -> np.ndarray:
        import torch

        out = self.reward.score(torch.as_tensor(points, dtype=torch.float32), prompts,
                                [self.metadata[p] for p in prompts])
        return out.score.float().numpy()

    def regions(self, prompts, resolution: int = 121) -> dict:
        """{prompt: (xs, ys, reward on the grid)} over the axes (each prompt's computed once)."""
        axis = np.linspace(-self.limit, self.limit, resolution)
        xs, ys = np.meshgrid(axis, axis)
        grid = np.stack([xs.ravel(), ys.ravel()], axis=1)
        for p in set(prompts) - set(self._regions):
            self._regions[p] = (xs, ys, self.score(grid, [p] * len(grid)).reshape(xs.shape))
        return {p: self._regions[p] for p in sorted(set(prompts))}


def _points_panel(label: str, sidecar: dict, scorer: PointScorer) -> dict:
    points = np.array([[float(v) for v in p] for p in sidecar["points"]], dtype=float).reshape(-1, 2)
    prompts = [str(p) for p in sidecar["prompts"]]
    finite = np.isfinite(points).all(axis=1)
    rewards = np.zeros(len(points))
    rewards[finite] = scorer.score(points[finite], [p for p, f in zip(prompts, finite) if f])
    return {"label": label, "points": points, "rewards": rewards, "prompts": prompts,
            "regions": scorer.regions(prompts)}


def _toy_sample_figures(task: str, chosen: dict, algorithms: list[str], steps: list[int], out_dir: Path
                        ) -> list[str] | None:
    """The toy tier's samples redrawn from the grids' sidecars (points, prompts), one figure per matched step; None
    when some grid has no points sidecar or the reward cannot re-score points (then the saved PNGs are shown)."""
    sidecars = {(a, s): grid_sidecar(chosen[a][1][s]) for a in algorithms for s in steps}
    if not all(d and d.get("kind") == "points" and d.get("points") and d.get("prompts") for d in sidecars.values()):
        return None
    try:
        shared: dict[str, PointScorer] = {}  # runs of one reward and prompt set share a scorer and its regions
        scorers = {}
        for a in algorithms:
            scorer = PointScorer(chosen[a][2])
            scorers[a] = shared.setdefault(scorer.key, scorer)
        data = {key: _points_panel(f"{key[0]} (seed {chosen[key[0]][0]})", sidecar, scorers[key[0]])
                for key, sidecar in sidecars.items()}
    except Exception as e:  # a reward that needs weights or a server, an unreadable config: show the PNGs
        import logging

        logging.getLogger("flowzoo.report").warning("samples of %s are shown as saved: %s: %s", task,
                                                    type(e).__name__, e)
        return None
    limit = max(s.limit for s in scorers.values())
    lines = ["Each panel: one run's evaluation samples (the lowest seed of its algorithm that saved any), each "
             "point coloured by its reward (the run's reward re-scoring the saved point) and shaped by its prompt; "
             "dashed: each prompt's rewarded region (reward >= 0.5); points beyond the axes are drawn on the border "
             "with a red edge and counted. The title gives the mean reward of the panel's samples.", ""]
    for step in steps:
        stem = out_dir / "figures" / f"{slug(task)}_samples_step_{step}"
        paths = figures.plot_point_samples([data[(a, step)] for a in algorithms], limit,
                                           f"{task}: evaluation samples at step {step}", stem,
                                           per_row=SAMPLE_PANELS_PER_ROW)
        lines += _figure_lines(paths, out_dir, f"{task}: samples of every algorithm at step {step}")
    return lines


def _grid_table(task: str, chosen: dict, algorithms: list[str], steps: list[int], out_dir: Path) -> list[str]:
    """The saved sample grids, an algorithm a row and a matched step a column, with the grids' prompts listed."""
    rows = []
    for algorithm in algorithms:
        seed, grids, _ = chosen[algorithm]
        cells = [f"`{algorithm}` (seed {seed})"]
        for step in steps:
            rel = Path("samples") / slug(task) / f"{slug(algorithm)}_seed{seed}_step_{step}.png"
            data = grids[step].read_bytes()
            atomic_write(out_dir / rel, lambda f, data=data: f.write(data), "wb")
            cells.append(f"![{algorithm} seed {seed} step {step}]({rel.as_posix()})")
        rows.append(cells)
    lines = markdown_table(["algorithm"] + [f"step {s}" for s in steps], rows) + [""]
    first = grid_sidecar(chosen[algorithms[0]][1][steps[0]])
    prompts = (first or {}).get("prompts")
    if prompts and (first or {}).get("kind") != "points":
        lines += ["Prompts of the grids' samples, row by row (every grid of a task samples the same held-out "
                  "prompts with the same noise): " + "; ".join(f"{i + 1}: {p}" for i, p in enumerate(prompts))
                  + ".", ""]
        lines += _grid_rewards(chosen, algorithms, steps)
    elif not prompts:
        lines += ["These grids were saved without their prompts (runs older than the grids' JSON sidecars).", ""]
    else:
        lines += ["These toy-tier grids are shown as saved: their rewards could not be re-scored (see the warning "
                  "on stderr).", ""]
    return lines


def _grid_rewards(chosen: dict, algorithms: list[str], steps: list[int]) -> list[str]:
    """Each shown grid's per-sample rewards (from its sidecar), in the prompts' order; a note when the runs did not
    record them (grids saved before rewards were)."""
    rows = []
    for algorithm in algorithms:
        seed, grids, _ = chosen[algorithm]
        for step in steps:
            rewards = (grid_sidecar(grids[step]) or {}).get("rewards")
            if rewards is None:
                return ["The runs recorded no per-sample reward for these grids (saved before rewards were); the "
                        "evaluation's mean is `eval_reward` in metrics.csv.", ""]
            shown = ", ".join(f"{i + 1}: {fmt_number(float(r))}" for i, r in enumerate(rewards))
            rows.append([f"`{algorithm}` (seed {seed})", str(step), shown])
    return ["Each grid sample's reward, in the prompts' order:", ""] + markdown_table(
        ["algorithm", "step", "reward by sample"], rows) + [""]


def samples_section(analysis: stats.Analysis, runs_dir: Path, out_dir: Path) -> list[str]:
    lines = ["## Samples at matched steps", "",
             "Evaluation samples of the lowest seed of each algorithm that saved any, at steps saved by every "
             "algorithm (at most 4).", ""]
    drawn = False
    for task, summary in analysis.summary.groupby("task", sort=True):
        chosen = {}  # algorithm -> (seed, {step: path}, run directory)
        for r in summary.sort_values(["algorithm", "seed", "run"]).itertuples():
            grids = sample_grids(runs_dir / r.run)
            if grids and r.algorithm not in chosen:
                chosen[r.algorithm] = (r.seed, grids, runs_dir / r.run)
        steps = matched_steps([set(grids) for _, grids, _ in chosen.values()])
        if not steps:
            continue
        drawn = True
        algorithms = _hue_order(chosen, analysis.baseline)
        lines += [f"### `{task}`", ""]
        lines += (_toy_sample_figures(task, chosen, algorithms, steps, out_dir)
                  or _grid_table(task, chosen, algorithms, steps, out_dir))
    return lines if drawn else lines + ["No sample grids at steps shared by every algorithm.", ""]


# -------------------------------------------------------------------------------------------------------------- entry


DEFAULT_BASELINE = "flow_grpo"


def write_report(runs_dir, out_dir, baseline: str = DEFAULT_BASELINE, target=None,
                 smooth: int = stats.DEFAULT_SMOOTH) -> Path:
    """Write the report of every run under ``runs_dir`` into ``out_dir``; return the path of ``index.md``.

    ``target``: None (90% of the baseline's gain over the base model), a number (absolute), ``{task: value}``
    (absolute per task) or a :class:`benchmark.analysis.targets.Target` (e.g. ``Target("relative", 1.0)``: the baseline's final
    reward). Raises ``ConfigError`` (before writing anything) for an invalid target, a runs directory without
    readable runs, an unknown baseline, a target naming unknown tasks or runs of different budgets in one
    (task, algorithm) cell; unreadable runs are skipped with a warning and listed in the report.
    """
    runs_dir, out_dir = Path(runs_dir), Path(out_dir)
    analysis = stats.analyze(runs_dir, baseline=baseline, target=target, smooth=smooth)
    # all or nothing: written into a sibling stage (same relative paths), then moved into out_dir
    with staged_directory(out_dir) as stage:
        # the answer first (its table, then per task: cost ratios with CIs, then the curves); methods, definitions
        # and runs last
        lines = (header_section(analysis) + answer_section(analysis) + headline_section(analysis, stage)
                 + aggregate_section(analysis, stage) + final_section(analysis, stage)
                 + ablation_section(analysis, stage) + gain_cost_section(analysis, stage)
                 + diagnostics_section(analysis, stage)
                 + samples_section(analysis, runs_dir, stage) + cost_details_section(analysis)
                 + definitions_section(analysis) + runs_section(analysis))
        markdown = "\n".join(lines).rstrip("\n") + "\n"
        atomic_write_text(stage / "index.md", markdown)
        atomic_write_text(stage / "index.html", markdown_to_html(markdown, base_dir=stage))
        write_fingerprint(runs_dir, stage)  # what `python -m flowzoo.benchmark.render.freshness` reruns
    return out_dir / "index.md"
