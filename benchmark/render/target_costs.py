"""The report's cost-to-target sections: the answer table above the page's first section, the headline per task
(the target, the forest plot, the verdict, the ratios with their CIs, the eval reward curves) and every algorithm's
cost in words and in full (:func:`cost_details_section`). The numbers come from :mod:`benchmark.analysis.stats`."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from flowzoo.benchmark.analysis import stats, targets
from flowzoo.benchmark.render import figures
from flowzoo.benchmark.render.formats import anchor, figure_lines, fmt_ci, fmt_number, fmt_pct, palette, slug
from flowzoo.benchmark.render.tables import indistinct_note, markdown_table

X_AXES = figures.X_AXES
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
#: the title of the report's definitions section (:mod:`benchmark.render.report`), linked from the sections here
DEFINITIONS = "Methods and definitions"


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
    colours = palette(analysis) if out_dir is not None else None
    for task in sorted(analysis.targets):
        lines += [f"### `{task}`", "", target_line(analysis, task), ""]
        table = _efficiency(analysis, task)
        if not math.isnan(analysis.targets[task]) and len(table) == 0:
            lines += [f"No algorithm other than `{analysis.baseline}` on this task.", ""]
        elif not math.isnan(analysis.targets[task]):
            if out_dir is not None:
                paths = figures.plot_forest(table, list(VERDICT_COSTS), stats.COST_LABELS, task, colours,
                                            out_dir / "figures" / f"{slug(task)}_forest")
                lines += figure_lines(paths, out_dir, f"{task}: steps and NFE to the target relative to "
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
            lines += task_curves(analysis, task, out_dir, colours)
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
        lines += figure_lines(paths, out_dir, f"{task}: eval reward vs {X_AXES[x]}")
    return lines
