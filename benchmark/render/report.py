"""The report writer: runs directory in, ``index.md`` + ``index.html`` + tables + figures out.

``write_report(runs_dir, out_dir)`` is a pure function of the run directories: no timestamps, sorted iteration,
fixed bootstrap seeds and SVG hash salt, so the same runs give the same bytes (PNG/SVG up to the matplotlib
version). Every file is written atomically (temporary sibling, then ``os.replace``). All numbers come from
:mod:`benchmark.analysis.stats` (and :mod:`benchmark.analysis.aggregate`); the report only formats them,
:mod:`benchmark.render.figures` plots them. This module holds the page's order (:func:`write_report`) and its sections
of runs, final reward, ablations, aggregates, gain costs, diagnostics and definitions; the cost-to-target sections are
:mod:`benchmark.render.target_costs`, the samples :mod:`benchmark.render.samples`, the number and name formatters
:mod:`benchmark.render.formats` and the markdown and LaTeX tables :mod:`benchmark.render.tables`.

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
    samples/<task>/<algorithm>_seed<S>_step_<N>.png   copies of the runs' sample grids at matched steps (image tiers,
                                                      and toy runs without the grids' JSON sidecars)

Which algorithms are ablations (and of what), their families and their diagnostic columns come from the algorithm
classes' declarations (``family``, ``ablation_of``, ``diagnostics``; see :mod:`benchmark.render.figures`), never from names.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from flowzoo.benchmark.analysis import costs, stats
from flowzoo.benchmark.analysis.runs import protocol_line, recipe_text
from flowzoo.benchmark.render import figures, gain_costs
from flowzoo.benchmark.render.formats import anchor, figure_lines, fmt_ci, fmt_number, palette, slug
from flowzoo.benchmark.render.freshness import write_fingerprint
from flowzoo.benchmark.render.markdown_html import markdown_to_html
from flowzoo.benchmark.render.samples import samples_section
from flowzoo.benchmark.render.tables import indistinct_note, latex_table, markdown_table, plain
from flowzoo.benchmark.render.target_costs import (
    CENSORING_NOTE, COST_DETAILS, CURVES_NOTE, DEFINITIONS, HEADLINE, WALL_CLOCK_NOTE, answer_section,
    cost_details_section, headline_section, ratio_cell,
)
from flowzoo.io import atomic_write_text, staged_directory

# the sections' helpers moved beside them, still importable from here (as the tests do)
from flowzoo.benchmark.render.samples import PointScorer, _grid_rewards, grid_sidecar  # noqa: E402,F401
from flowzoo.benchmark.render.target_costs import headline_sentence, task_verdict  # noqa: E402,F401

# ------------------------------------------------------------------------------------------------------- diagnostics


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
        f"- {protocol_line(analysis.protocols, dict(zip(analysis.finals['run'], analysis.finals['task'])))}",
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
    for task, paths in gain_costs.plot_panels(rows, "all", palette(analysis),
                                        lambda task: out_dir / "figures" / f"{slug(task)}_costs"):
        lines += figure_lines(paths, out_dir, f"{task}: reward gain of every algorithm against what it cost")
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
        paths = figures.plot_performance_profiles(analysis.profiles, analysis.baseline, palette(analysis),
                                                  out_dir / "figures" / "performance_profiles")
        lines += figure_lines(paths, out_dir, "performance profiles of normalized final reward")
    return lines


def step_stem(pattern: str) -> str:
    """The name of a per-denoising-step pattern without its index: ``abs_log_ratio_t{k}`` -> ``abs_log_ratio``."""
    return re.sub(r"_?t?\{k\}", "", pattern) or "step"


def diagnostics_section(analysis: stats.Analysis, out_dir: Path) -> list[str]:
    lines = ["## Diagnostics", "",
             "The columns each algorithm declares in its class's `diagnostics` (docs/adding-an-algorithm.md): scalars "
             "over training, and per-denoising-step columns (`{k}`) averaged over training, against k; mean over "
             "seeds with 95% bootstrap bands.", ""]
    drawn, colours = False, palette(analysis)
    for task, runs in analysis.runs.groupby("task", sort=True):
        declared = declared_diagnostics(runs)
        if not declared:
            continue
        drawn = True
        rows = [[f"`{pattern}`", ", ".join(f"`{a}`" for a in members), description]
                for pattern, (description, members) in declared.items()]
        table = markdown_table(["column", "logged by", "what it measures"], rows, pipe="\\|")
        lines += [f"### `{task}`", "", *table, ""]
        scalars = {p: members for p, (_, members) in declared.items() if "{k}" not in p}
        if scalars:
            paths = figures.plot_diagnostics_over_training(runs, scalars, task, colours,
                                                           out_dir / "figures" / f"{slug(task)}_diagnostics")
            lines += figure_lines(paths, out_dir, f"{task}: {', '.join(scalars)} over training")
        for pattern, (_, members) in declared.items():
            if "{k}" not in pattern:
                continue
            stem = step_stem(pattern)
            paths = figures.plot_by_denoising_step(runs, step_columns(runs, pattern), stem, members, task, colours,
                                                   out_dir / "figures" / f"{slug(task)}_{slug(stem)}")
            lines += figure_lines(paths, out_dir, f"{task}: {stem} by denoising step")
    return lines if drawn else lines + ["No run logged a column its algorithm declares in `diagnostics`.", ""]


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
