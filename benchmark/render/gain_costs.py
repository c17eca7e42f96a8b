"""The page section of what a reward gain cost (:mod:`benchmark.analysis.costs` computes it): the definitions, a
table per task and its figure, on one seed set. The report and a study's page both show it."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from flowzoo.benchmark.analysis.costs import LABELS, SOURCES
from flowzoo.benchmark.render import figures
from flowzoo.benchmark.render.tables import markdown_table


#: the costs a panel draws the reward gain against, in panel order
PANEL_COSTS = ("spread_kept", "gold_gain", "unseen_gain")


def _cell(row: pd.Series, cost: str, digits: int = 3) -> str:
    value = row[cost]
    if not math.isfinite(value):
        return "-"
    low, high = row[f"{cost}_low"], row[f"{cost}_high"]
    interval = f" [{low:.{digits}f}, {high:.{digits}f}]" if math.isfinite(low) else ""
    return f"{value:+.{digits}f}{interval}" if cost != "spread_kept" else f"{value:.{digits}f}{interval}"


def cost_lines(costs: pd.DataFrame, figure_lines: list[str], seed_set: str) -> list[str]:
    """The page's section: the definitions, the figures and per task a table of every cell on ``seed_set``."""
    if costs.empty:
        return []
    shown = costs[costs["seed_set"] == seed_set]
    measured = [c for c in SOURCES if shown[c].notna().any()]
    lines = ["## What the gain cost", "",
             "Per cell, mean over its seeds (`" + seed_set + "`) with 95% bootstrap CIs: the reward gain (final - "
             "base) beside what it cost (`benchmark/analysis/costs.py`, definitions in docs/harness.md): **spread "
             "kept**, each prompt's mean pairwise sample distance at the end over the base model's (1: the base's "
             "variety, 0: one sample per prompt; **CLIP spread kept** the same on CLIP image embeddings); **gold gain**, the change of a judge the method never trains on "
             "(positive: better by the gold; a proxy gain with a gold loss is reward hacking); **unseen-prompt gain**, "
             "the reward's change on prompts never trained on. Pareto: no other cell has at least as much reward gain "
             "and spread kept and more of one. Not measured: " + (", ".join(LABELS[c] for c in SOURCES
                                                                          if c not in measured) or "none") + ".", "",
             *figure_lines]
    columns = ("reward_gain", *measured)
    for task, rows in shown.groupby("task", sort=True):
        cells = [[row["algorithm"], int(row["n"]), *(_cell(row, c) for c in columns), "yes" if row["pareto"] else ""]
                 for _, row in rows.iterrows()]
        lines += [f"### {task}", "", *markdown_table(["cell", "n", *(LABELS[c] for c in columns), "Pareto"], cells), ""]
    return lines


@figures.themed
def plot_costs(costs: pd.DataFrame, task: str, seed_set: str, palette: dict, stem: Path) -> list[Path]:
    """Per task: reward gain against spread kept (and against gold gain where measured), one point per cell with
    its 95% CIs as bars, the Pareto front joined."""
    plt = figures.pyplot()
    rows = costs[(costs["task"] == task) & (costs["seed_set"] == seed_set)]
    xs = [c for c in PANEL_COSTS if rows[c].notna().any()]
    fig, axes = plt.subplots(1, len(xs), figsize=(5.2 * len(xs), 4.2), squeeze=False, sharey=True)
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.14, top=0.86, wspace=0.08)
    for ax, x in zip(axes[0], xs):
        for _, row in rows.iterrows():
            colour, _, marker = palette.get(row["algorithm"], ("#555555", "-", "o"))
            xerr = [[row[x] - row[f"{x}_low"]], [row[f"{x}_high"] - row[x]]] if math.isfinite(row[f"{x}_low"]) else None
            yerr = ([[row["reward_gain"] - row["reward_gain_low"]], [row["reward_gain_high"] - row["reward_gain"]]]
                    if math.isfinite(row["reward_gain_low"]) else None)
            ax.errorbar(row[x], row["reward_gain"], xerr=xerr, yerr=yerr, color=colour, marker=marker or "o",
                        markersize=6, capsize=2, linewidth=1, label=row["algorithm"])
        if x == "spread_kept":
            front = rows[rows["pareto"]].sort_values(x)
            ax.plot(front[x], front["reward_gain"], color="#444444", linestyle=":", linewidth=1, label="Pareto front")
            ax.axvline(1.0, color="#999999", linewidth=0.8)
        else:
            ax.axvline(0.0, color="#999999", linewidth=0.8)
        ax.set_xlabel(LABELS[x] + (" (final / base)" if x == "spread_kept" else " (final - base)"))
    axes[0][0].set_ylabel("reward gain (final - base)")
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(f"{task}: what the gain cost (seeds {seed_set}, 95% CIs)")
    return figures.save_figure(fig, stem)


def plot_panels(costs: pd.DataFrame, seed_set: str, palette: dict, stem_of) -> list[tuple[str, list[Path]]]:
    """Every task's panel (:func:`plot_costs`) at ``stem_of(task)``: (task, paths) in task order. A task none of whose
    runs measured a cost of :data:`PANEL_COSTS` (e.g. one sample per prompt and no gold, beside tasks that measure
    them) has no panel; its table row still shows the reward gain."""
    shown = costs[costs["seed_set"] == seed_set]
    tasks = [task for task, rows in shown.groupby("task", sort=True) if rows[list(PANEL_COSTS)].notna().any().any()]
    return [(task, plot_costs(costs, task, seed_set, palette, stem_of(task))) for task in tasks]
