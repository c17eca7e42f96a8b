"""What a reward gain cost, per run and per cell: the variety of the samples kept, the gold judge's verdict and the
reward on prompts never trained on, beside the reward gain (issue: "what a gain costs").

Per run (:func:`run_costs`), from the evaluation columns the runner logs (benchmark/run/runner.py), each read
as the final reward is: the mean of the run's last ``smooth`` evaluations against its step-0 evaluation (the base
model, same prompts and noise):

* ``spread_kept``: final ``eval_spread`` over the base's (benchmark/measures/diversity.py): 1 keeps the base's
  variety per prompt, 0 has collapsed to one sample per prompt; ``feature_spread_kept`` the same on CLIP image
  embeddings (``eval_spread_features``, the image tiers with ``train.spread_features``);
* ``gold_gain``: the gold measure's change, signed so that positive is better by the gold: final - base of
  ``eval_gold`` (a judge), base - final of ``eval_gold_distance`` (a distance to the ideal density;
  benchmark/measures/gold.py). A proxy gain with a gold loss is reward hacking;
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
