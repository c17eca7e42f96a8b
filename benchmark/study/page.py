"""A study's page: the figures' markdown and files (:mod:`benchmark.study.figures`), a hand-written answer
kept across regenerations, and ``index.html`` beside ``README.md`` (:mod:`benchmark.render.markdown_html`, as the
quick report renders its page).

The page leads with its answer (:mod:`benchmark.study.answer`: the title with the suite's question, the
hand-written ``ANSWER.md`` of at most 5 lines, never overwritten, and the table of the claims' verdicts), then the
claims' forest plots (the answer as a picture), the generated answer, per task the eval-reward curves of every cell
against steps and NFE, then the tables (:func:`benchmark.study.verdicts.render`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from flowzoo.benchmark.render import gain_costs
from flowzoo.benchmark.study import figures as study_figures
from flowzoo.benchmark.render.markdown_html import markdown_to_html
from flowzoo.benchmark.study.seed_sets import ALL_SEEDS
from flowzoo.io import atomic_write_text

FIGURES = "figures"
#: (the targets drawn on the curves: the cost metrics' 50% and 80% of the baseline's gain, all seeds)
TARGET_METRICS = {"50% of the gain": "steps_to_50", "80% of the gain": "steps_to_80"}


def _figure(path: Path, stage: Path, alt: str) -> list[str]:
    return [f"![{alt}]({path.relative_to(stage).as_posix()})", ""]


def figure_sets(estimates: pd.DataFrame) -> list[str]:
    """The seed sets the claims' figures show: every judged set but ``all`` (or ``all`` alone)."""
    sets = list(dict.fromkeys(estimates["seed_set"]))
    return [s for s in sets if s != ALL_SEEDS] or sets


def claim_figures(estimates: pd.DataFrame | None, stage: Path) -> list[str]:
    """The claims' forest plots (ratios, then differences) into ``stage/figures``; their markdown lines."""
    if estimates is None or estimates.empty:
        return []
    sets = figure_sets(estimates)
    shown = estimates[estimates["seed_set"].isin(sets)]
    lines = []
    if (shown["kind"] == "ratio").any():
        paths = study_figures.plot_claim_ratios(shown, sets, stage / FIGURES / "claims_ratios")
        lines += _figure(paths[0], stage, "each claim's measured ratio with its 95% CI per seed set, the paper's "
                         "value and the verdict zones")
    lines += ["Each claim's figure on each seed set (`claim_estimates.csv`): the estimate (dot) and its 95% CI (bar); "
              "a star marks the paper's own value (the steps claim is reproduced when the CI covers it); a CI inside "
              "the green zone reproduces the claim, inside the red zone contradicts it; the set's verdict is at the "
              "right. The rules and the figures in words are in the claims table below.", ""]
    if (shown["kind"] == "difference").any():
        paths = study_figures.plot_claim_differences(shown, sets, stage / FIGURES / "claims_differences")
        lines += _figure(paths[0], stage, "each difference claim with its 95% CI per seed set and its verdict zones")
        lines += ["The ablations' rows draw the final-reward half of their rule; their instability counts are in the "
                  "table.", ""]
    return lines


def curve_figures(runs: pd.DataFrame, effect_rows: pd.DataFrame, baseline: str, stage: Path) -> list[str]:
    """Per task, every cell's eval reward against steps and NFE with the targets dashed; their markdown lines."""
    if runs.empty:
        return []
    curves = runs[runs["eval_reward"].notna()][["task", "algorithm", "run", "step", "nfe", "eval_reward"]]
    palette = study_figures.cell_styles(curves["algorithm"])
    lines = ["## Eval reward over training", "",
             "Every cell's mean eval reward over all its seeds with 95% bootstrap bands (raw evaluations; the metrics "
             "read them smoothed), against training steps and network evaluations (NFE, every extra rollout counted); "
             f"dotted and dashed: 50% and 80% of `{baseline}`'s gain over the base model on all seeds, the cost "
             "metrics' targets.", ""]
    for task, task_curves in curves.groupby("task", sort=True):
        targets = _targets(effect_rows, task, baseline)
        for x in ("step", "nfe"):
            stem = stage / FIGURES / f"{_slug(task)}_reward_vs_{x}"
            paths = study_figures.plot_cell_curves(task_curves, task, x, targets, baseline, palette, stem)
            lines += _figure(paths[0], stage, f"{task}: eval reward of every cell vs {x}")
    return lines


def cost_section(cost_rows: pd.DataFrame, runs: pd.DataFrame, stage: Path) -> list[str]:
    """What the gain cost (:mod:`benchmark.analysis.costs`): per task its panel into ``stage/figures`` and its table,
    on all seeds (the designers' set where no ``all`` set was judged); nothing when no run logged a cost column."""
    if cost_rows.empty:
        return []
    sets = list(dict.fromkeys(cost_rows["seed_set"]))
    shown = ALL_SEEDS if ALL_SEEDS in sets else sets[0]
    palette = study_figures.cell_styles(runs["algorithm"])
    lines = []
    for task, paths in gain_costs.plot_panels(cost_rows, shown, palette,
                                        lambda task: stage / FIGURES / f"{_slug(task)}_costs"):
        lines += _figure(paths[0], stage, f"{task}: reward gain of every cell against what it cost")
    return gain_costs.cost_lines(cost_rows, lines, shown)


def _targets(effect_rows: pd.DataFrame, task: str, baseline: str) -> dict[str, float]:
    rows = effect_rows[(effect_rows["task"] == task) & (effect_rows["reference"] == baseline)
                       & (effect_rows["seed_set"] == ALL_SEEDS)]
    out = {}
    for label, metric in TARGET_METRICS.items():
        hit = rows[rows["metric"] == metric]
        if len(hit):
            out[label] = float(hit["target"].iloc[0])
    return out


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def write_page(stage: Path, markdown: str, title: str) -> None:
    """``README.md`` and ``index.html`` (the same page) into ``stage``."""
    atomic_write_text(stage / "README.md", markdown)
    atomic_write_text(stage / "index.html", markdown_to_html(markdown, title=title, base_dir=stage))
