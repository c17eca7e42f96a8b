"""A study page's figures (``flowzoo study``): the claims' forest plots and each task's eval-reward curves.

* **Claims** (:func:`plot_claim_ratios`, :func:`plot_claim_differences`): every claim with a figure
  (``claim_estimates.csv``, :func:`benchmark.study.claims.estimate`), one line per seed set: the estimate and
  its 95% CI, the paper's value as a star, the rule's verdict zones shaded (green: a CI inside it reproduces the claim;
  red: contradicts it), and the set's verdict at the right. Ratios share one log axis; each difference has its own
  panel in its own unit.
* **Curves** (:func:`plot_cell_curves`): mean eval reward over seeds with 95% bootstrap bands
  (:func:`benchmark.render.figures.draw_mean`, the report's) of every cell against steps or NFE, the targets dashed;
  cells in panels of methods, ablations and controls (``task@variant`` cells), the baseline in each, coloured by their
  algorithm's family.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from flowzoo.benchmark.render import figures
from flowzoo.cells import base_task, split_task

#: colours of the seed sets, in the order a study lists them (the designers' first)
SET_COLOURS = ("#1f5fa8", "#d9730d", "#2a9d4b", "#8e44ad", "#7f7f7f", "#b5651d")
REPRODUCED_ZONE, CONTRADICTED_ZONE = "#cfe8cf", "#f4cccc"
VERDICT_COLOURS = {"reproduced": "#1e7b34", "contradicted": "#b3261e"}
ROW_HEIGHT = 0.17  # inches per seed-set line
CLAIM_GAP = 0.5  # lines between two claims
LABEL_WIDTH, VERDICT_WIDTH = 3.3, 1.0  # inches left of and right of the axes
PANELS_PER_ROW = 3
CONTROL_PANEL = "controls"


def _verdict_colour(verdict: str) -> str:
    return VERDICT_COLOURS.get(str(verdict).split(" ")[0], "#555555")


def _verdict_word(verdict: str) -> str:
    """'contradicted (needs more steps)' -> 'contradicted'; 'not tested (no target)' -> 'not tested'."""
    words = str(verdict).split(" ")
    return " ".join(words[:2]) if words[0] == "not" else words[0]


def _zone(ax, low: float, high: float, y0: float, y1: float, colour: str, lo: float, hi: float) -> None:
    if not (math.isnan(low) and math.isnan(high)):
        left, right = max(low, lo) if math.isfinite(low) else lo, min(high, hi) if math.isfinite(high) else hi
        if right > left:
            ax.fill_between([left, right], y0, y1, color=colour, linewidth=0, zorder=0)
        for edge in (low, high):
            if math.isfinite(edge) and lo < edge < hi:
                ax.plot([edge, edge], [y0, y1], color="#444444", linewidth=0.8, zorder=1)


def _draw_claim(ax, rows: pd.DataFrame, sets: list[str], top: float, lo: float, hi: float, trans) -> float:
    """One claim's lines from y = ``top`` downwards; returns the y below them."""
    for i, name in enumerate(sets):
        y = top - i
        hit = rows[rows["seed_set"] == name]
        if hit.empty:
            continue
        r = hit.iloc[0]
        _zone(ax, r["reproduced_low"], r["reproduced_high"], y - 0.5, y + 0.5, REPRODUCED_ZONE, lo, hi)
        _zone(ax, r["contradicted_low"], r["contradicted_high"], y - 0.5, y + 0.5, CONTRADICTED_ZONE, lo, hi)
        colour = SET_COLOURS[sets.index(name) % len(SET_COLOURS)]
        low, high = r["ci_low"], r["ci_high"]
        if math.isfinite(low) and math.isfinite(high):
            ax.plot([max(low, lo), min(high, hi)], [y, y], color=colour, linewidth=2.2, solid_capstyle="butt",
                    zorder=3)
        if math.isfinite(r["estimate"]):
            ax.plot([min(max(r["estimate"], lo), hi)], [y], marker="o", markersize=4.5, color=colour, zorder=4)
        if math.isfinite(r["paper"]):
            ax.plot([r["paper"]], [y], marker="*", markersize=8, color="black", zorder=5)
        ax.text(1.01, y, _verdict_word(r["verdict"]), transform=trans, va="center", ha="left", fontsize=8,
                color=_verdict_colour(r["verdict"]))
    return top - len(sets)


def _limits(rows: pd.DataFrame, log: bool) -> tuple[float, float]:
    columns = ["estimate", "ci_low", "ci_high", "paper", "reproduced_low", "reproduced_high", "contradicted_low",
               "contradicted_high"]
    values = rows[columns].to_numpy(float).ravel()
    values = values[np.isfinite(values) & ((values > 0) if log else True)]
    if log:
        values = np.append(values, 1.0)
        return float(values.min()) / 1.25, float(values.max()) * 1.25
    if not len(values):
        return -1.0, 1.0
    low, high = float(values.min()), float(values.max())
    pad = 0.08 * (high - low) if high > low else max(abs(high), 1.0) * 0.1
    return low - pad, high + pad


def _legend(fig, sets: list[str], y: float) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Line2D([], [], color=SET_COLOURS[i % len(SET_COLOURS)], marker="o", linewidth=2.2, markersize=4.5,
                      label=f"seeds: {name}") for i, name in enumerate(sets)]
    handles += [Line2D([], [], color="black", marker="*", linestyle="none", markersize=8, label="paper's value"),
                Patch(color=REPRODUCED_ZONE, label="CI here: reproduced"),
                Patch(color=CONTRADICTED_ZONE, label="CI here: contradicted")]
    fig.legend(handles=handles, loc="upper left", ncol=min(len(handles), 6), frameon=False, bbox_to_anchor=(0.0, y),
               fontsize=8.5)


@figures.themed
def plot_claim_ratios(estimates: pd.DataFrame, sets: list[str], stem: Path) -> list[Path]:
    """Every ratio claim on one log axis (module docstring)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    plt = figures.pyplot()
    rows = estimates[estimates["kind"] == "ratio"]
    claims = list(dict.fromkeys(rows["label"]))
    lines = len(claims) * len(sets) + (len(claims) - 1) * CLAIM_GAP
    height = ROW_HEIGHT * lines + 1.3
    fig, ax = plt.subplots(figsize=(figures.PAGE_WIDTH, height))
    fig.subplots_adjust(left=LABEL_WIDTH / figures.PAGE_WIDTH, right=1 - VERDICT_WIDTH / figures.PAGE_WIDTH,
                        top=1 - 0.75 / height, bottom=0.5 / height)
    lo, hi = _limits(rows, log=True)
    ax.set_xscale("log")
    trans = ax.get_yaxis_transform()
    top, ticks = 0.0, []
    for label in claims:
        ticks.append((top - (len(sets) - 1) / 2, label))
        top = _draw_claim(ax, rows[rows["label"] == label], sets, top, lo, hi, trans) - CLAIM_GAP
    ax.axvline(1.0, color="black", linestyle=(0, (4, 3)), linewidth=0.9, zorder=2)
    ax.set_xlim(lo, hi)
    ax.set_ylim(top + CLAIM_GAP - 0.5, 0.5)
    ax.xaxis.set_major_locator(FixedLocator([t for t in figures.RATIO_TICKS + (0.125, 0.342, 8.0) if lo <= t <= hi]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_yticks([y for y, _ in ticks], [label for _, label in ticks], fontsize=8)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("ratio of the cost to 80% of the baseline's gain (cell / reference), 95% CI; dashed: 1")
    fig.suptitle("Claims as ratios: each seed set's estimate against the paper's value and the rule's zones",
                 x=0.01, ha="left", y=1 - 0.12 / height)
    _legend(fig, sets, 1 - 0.38 / height)
    return figures.save_figure(fig, stem, formats=("png",))


@figures.themed
def plot_claim_differences(estimates: pd.DataFrame, sets: list[str], stem: Path) -> list[Path]:
    """Every difference claim in its own panel and unit (module docstring)."""
    plt = figures.pyplot()
    rows = estimates[estimates["kind"] == "difference"]
    claims = list(dict.fromkeys(rows["label"]))
    panel = ROW_HEIGHT * len(sets) + 0.55
    height = panel * len(claims) + 0.9
    fig, axes = plt.subplots(len(claims), 1, figsize=(figures.PAGE_WIDTH, height), squeeze=False)
    fig.subplots_adjust(left=LABEL_WIDTH / figures.PAGE_WIDTH, right=1 - VERDICT_WIDTH / figures.PAGE_WIDTH,
                        top=1 - 0.7 / height, bottom=0.35 / height, hspace=0.55 / panel * 2.2)
    for ax, label in zip(axes[:, 0], claims):
        claim = rows[rows["label"] == label]
        lo, hi = _limits(claim, log=False)
        _draw_claim(ax, claim, sets, 0.0, lo, hi, ax.get_yaxis_transform())
        ax.axvline(0.0, color="black", linestyle=(0, (4, 3)), linewidth=0.9, zorder=2) if lo < 0 < hi else None
        ax.set_xlim(lo, hi)
        ax.set_ylim(-len(sets) + 0.5, 0.5)
        ax.set_yticks([-(len(sets) - 1) / 2], [label], fontsize=8)
        ax.grid(axis="y", visible=False)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_xlabel(claim["unit"].iloc[0], fontsize=8, labelpad=1)
    fig.suptitle("Claims as differences, each in its own unit", x=0.01, ha="left", y=1 - 0.12 / height)
    _legend(fig, sets, 1 - 0.33 / height)
    return figures.save_figure(fig, stem, formats=("png",))


def cell_panels(cells, baseline: str) -> list[tuple[str, list[str]]]:
    """[(title, cells)]: the report's panels of algorithms (:func:`benchmark.render.figures.panels`), then the
    control cells (``algorithm@variant``), the baseline in each, at most ``figures.MAX_LINES`` lines a panel."""
    cells = sorted(set(cells))
    plain = [c for c in cells if not split_task(c)[1]]
    out = figures.panels(plain, baseline) if len(plain) > 1 else []
    controls = [c for c in cells if split_task(c)[1]]
    count = math.ceil(len(controls) / (figures.MAX_LINES - 1))
    size = math.ceil(len(controls) / count) if controls else 1
    chunks = [controls[i:i + size] for i in range(0, len(controls), size)]
    for k, chunk in enumerate(chunks):
        suffix = f" ({k + 1}/{len(chunks)})" if len(chunks) > 1 else ""
        out.append((CONTROL_PANEL + suffix, [baseline, *chunk] if baseline in cells else chunk))
    return out


def cell_styles(cells) -> dict[str, tuple]:
    """Each cell's (colour, line style, marker): a control cell in its algorithm's family colours."""
    return figures.styles(cells, base=base_task)


@figures.themed
def plot_cell_curves(curves: pd.DataFrame, task: str, x: str, targets: dict[str, float], baseline: str,
                     palette: dict, stem: Path) -> list[Path]:
    """Eval reward of every cell of ``task`` against ``x`` (``step`` or ``nfe``): ``curves`` rows of ``algorithm``
    (the cell), ``run``, ``x``, ``eval_reward``; ``targets`` {label: reward} dashed."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    plt = figures.pyplot()
    data = figures.align_curves(curves, x)
    # each cell drawn up to where every one of its seeds has data: past it the band would be the survivors'
    ends = data.groupby(["algorithm", "run"])[x].max().groupby("algorithm").min()
    data = data[data[x] <= data["algorithm"].map(ends)]
    groups = cell_panels(data["algorithm"].unique(), baseline)
    per_row = min(len(groups), PANELS_PER_ROW)
    rows = math.ceil(len(groups) / per_row)
    width, height = figures.PANEL_SIZE
    fig_height = height * rows
    fig, axes = plt.subplots(rows, per_row, figsize=(min(figures.PAGE_WIDTH, max(6.0, width * per_row)), fig_height),
                             sharey=True, squeeze=False)
    fig.subplots_adjust(left=0.08 if per_row > 1 else 0.14, right=0.99, bottom=0.55 / fig_height,
                        top=1 - 0.6 / fig_height, wspace=0.06, hspace=0.45)
    flat = list(axes.flat)
    for ax, (title, members) in zip(flat, groups):
        for cell in members:
            figures.draw_mean(ax, data[data["algorithm"] == cell], x, "eval_reward", palette[cell], cell)
        for k, (label, target) in enumerate(targets.items()):
            if math.isfinite(target):
                ax.axhline(target, color="black", linestyle=(0, (4, 3)) if k else (0, (1, 2)), linewidth=0.9,
                           label=label)
        ax.set(xlabel=figures.X_AXES[x], title=title)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        if x == "nfe":
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k" if v else "0"))
        ax.legend(loc="best", framealpha=0.85, fontsize=8)
    for ax in flat[::per_row]:
        ax.set_ylabel("eval reward")
    for ax in flat[len(groups):]:
        ax.set_visible(False)
    fig.suptitle(f"{task}: eval reward vs {figures.X_AXES[x]}")
    return figures.save_figure(fig, stem, formats=("png",))
