"""What a reward gain cost, per run and per cell: the variety of the samples kept, the gold judge's verdict and the
reward on prompts never trained on, beside the reward gain (issue: "what a gain costs").

Per run (:func:`run_costs`), from the evaluation columns the runner logs (benchmark/experiments/runner.py), each read
as the final reward is: the mean of the run's last ``smooth`` evaluations against its step-0 evaluation (the base
model, same prompts and noise):

* ``spread_kept``: final ``eval_spread`` over the base's (benchmark/experiments/diversity.py): 1 keeps the base's
  variety per prompt, 0 has collapsed to one sample per prompt; ``feature_spread_kept`` the same on CLIP image
  embeddings (``eval_spread_features``, the image tiers with ``train.spread_features``);
* ``gold_gain``: the gold measure's change, signed so that positive is better by the gold: final - base of
  ``eval_gold`` (a judge), base - final of ``eval_gold_distance`` (a distance to the ideal density;
  benchmark/experiments/gold.py). A proxy gain with a gold loss is reward hacking;
* ``unseen_gain``: final - base of ``eval_unseen_reward``, the reward on prompts never trained on.

Per cell (:func:`cost_table`), on each seed set: the mean of each with a 95% percentile bootstrap CI over seeds, and
whether the cell is on the Pareto front of (reward gain, spread kept): no other cell of the task has at least as much
of both and more of one (means).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from flowzoo.benchmark.analysis import figures
from flowzoo.benchmark.analysis.stats import bootstrap_ci

#: the per-run cost columns: name -> (metrics.csv column, how the change is read)
SOURCES = {"spread_kept": ("eval_spread", "ratio"), "feature_spread_kept": ("eval_spread_features", "ratio"),
           "gold_gain": ("eval_gold", "gain"), "unseen_gain": ("eval_unseen_reward", "gain")}
GOLD_DISTANCE = "eval_gold_distance"  # a gold distance: its gain is base - final
COSTS = ("reward_gain", *SOURCES)
LABELS = {"reward_gain": "reward gain", "spread_kept": "spread kept", "feature_spread_kept": "CLIP spread kept",
          "gold_gain": "gold gain", "unseen_gain": "unseen-prompt gain"}
#: metrics.csv columns the costs read (a study's trimmed copy keeps them)
COLUMNS = ("eval_spread", "eval_spread_features", "eval_gold", GOLD_DISTANCE, "eval_unseen_reward")


def _change(values: np.ndarray, smooth: int, how: str) -> float:
    values = values[np.isfinite(values)]
    if len(values) < 2:
        return math.nan
    base, final = values[0], values[-smooth:].mean() if len(values) > smooth else values[1:].mean()
    if how == "ratio":
        return final / base if base > 0 else math.nan
    return final - base if how == "gain" else base - final


def run_costs(runs: pd.DataFrame, smooth: int) -> pd.DataFrame:
    """One row per run (indexed by ``run``): ``spread_kept``, ``gold_gain``, ``unseen_gain`` (module docstring); NaN
    where the run did not log the column. ``runs``: the loaded metrics rows (``run``, ``step``, ``eval_reward``, ...)."""
    evaluations = runs[runs["eval_reward"].notna()].sort_values(["run", "step"], kind="stable")
    rows = {}
    for run, rows_of in evaluations.groupby("run", sort=True):
        row = {}
        for name, (column, how) in SOURCES.items():
            if name == "gold_gain" and GOLD_DISTANCE in rows_of and rows_of[GOLD_DISTANCE].notna().any():
                column, how = GOLD_DISTANCE, "loss"
            row[name] = _change(rows_of[column].to_numpy(float), smooth, how) if column in rows_of else math.nan
        rows[run] = row
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(SOURCES))


def pareto(points: list[tuple[float, float]]) -> list[bool]:
    """For each (x, y) point, whether no other point has at least as much of both and more of one (NaN: never)."""
    out = []
    for i, (x, y) in enumerate(points):
        if not (math.isfinite(x) and math.isfinite(y)):
            out.append(False)
            continue
        out.append(not any(j != i and math.isfinite(a) and math.isfinite(b) and a >= x and b >= y and (a > x or b > y)
                           for j, (a, b) in enumerate(points)))
    return out


def cost_table(table: pd.DataFrame, seed_sets: dict[str, list[int]]) -> pd.DataFrame:
    """Per seed set, task and cell: ``n`` and, for each of :data:`COSTS`, its mean, ``<cost>_low`` and ``<cost>_high``
    (95% bootstrap CI over seeds; NaN where fewer than 2 seeds measured it), and ``pareto`` on (reward gain, spread
    kept). Empty when no run logged a cost column."""
    if table.empty or not any(c in table and table[c].notna().any() for c in SOURCES):
        return pd.DataFrame()
    rows = []
    for set_name, seeds in seed_sets.items():
        chosen = table[table["seed"].isin(seeds)] if seeds is not None else table
        for task, task_rows in chosen.groupby("task", sort=True):
            cells = []
            for cell, runs in task_rows.groupby("algorithm", sort=True):
                row = {"seed_set": set_name, "task": task, "algorithm": cell, "n": len(runs)}
                values = {"reward_gain": (runs["final_reward"] - runs["base"]).to_numpy(float),
                          **{c: runs[c].to_numpy(float) if c in runs else np.full(len(runs), math.nan)
                             for c in SOURCES}}
                for cost, v in values.items():
                    v = v[np.isfinite(v)]
                    row[cost] = float(v.mean()) if len(v) else math.nan
                    row[f"{cost}_low"], row[f"{cost}_high"] = bootstrap_ci(v) if len(v) >= 2 else (math.nan, math.nan)
                cells.append(row)
            for row, front in zip(cells, pareto([(r["spread_kept"], r["reward_gain"]) for r in cells])):
                row["pareto"] = front
            rows += cells
    return pd.DataFrame(rows)


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
    for task, rows in shown.groupby("task", sort=True):
        lines += [f"### {task}", "", "| cell | n | " + " | ".join(LABELS[c] for c in ("reward_gain", *measured))
                  + " | Pareto |", "|---" * (len(measured) + 4) + "|"]
        for _, row in rows.iterrows():
            lines.append(f"| {row['algorithm']} | {int(row['n'])} | "
                         + " | ".join(_cell(row, c) for c in ("reward_gain", *measured))
                         + f" | {'yes' if row['pareto'] else ''} |")
        lines.append("")
    return lines


@figures.themed
def plot_costs(costs: pd.DataFrame, task: str, seed_set: str, palette: dict, stem: Path) -> list[Path]:
    """Per task: reward gain against spread kept (and against gold gain where measured), one point per cell with
    its 95% CIs as bars, the Pareto front joined."""
    plt = figures.pyplot()
    rows = costs[(costs["task"] == task) & (costs["seed_set"] == seed_set)]
    xs = [c for c in ("spread_kept", "gold_gain", "unseen_gain") if rows[c].notna().any()]
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
    """Every task's panel (:func:`plot_costs`) at ``stem_of(task)``: (task, paths) in task order."""
    return [(task, plot_costs(costs, task, seed_set, palette, stem_of(task))) for task in sorted(set(costs["task"]))]
