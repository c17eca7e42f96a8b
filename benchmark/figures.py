"""The report's figures: colours by method family, main methods / variants / ablations in separate panels.

What an algorithm is comes from its class's declarations (``algorithms/base.py``), never from its name:
``family``, ``ablation_of`` and ``diagnostics`` (:func:`family`, :func:`ablation_of`, :func:`diagnostics`; a name
that is not registered is a method of no known family and declares nothing).

* **Families** have one colour map each (Flow-GRPO blues, DanceGRPO greens, MixGRPO oranges, OP-GRPO purples,
  DiffusionNFT reds, AWM yellow-browns, any
  other algorithm greys); the family's own method is its darkest shade and a solid line, its variants lighter shades
  with dashed, dotted, ... lines. An algorithm keeps its colour and line style in every figure of a report.
* **Panels**: "methods" (each family's own method and any unknown algorithm), "variants" (Flow-GRPO-Fast,
  MixGRPO-Flash, ...), "<method> ablations" (algorithms declaring ``ablation_of``, with the method they ablate).
  Every panel also draws the baseline, and holds at most ``MAX_LINES`` lines (a longer list is split over several
  panels).

* **Bands**: ``seaborn.lineplot`` groups the seeds at each x and draws their mean and 95% band; the band is
  :func:`stats.bootstrap_ci` (``PLOT_BOOTSTRAPS`` resamples, fixed seed; none under 2 seeds) passed as ``errorbar``,
  so figures and tables share one bootstrap (seaborn's own ``("ci", 95)`` resamples in a Python loop: 11 s instead of
  1.3-2.7 s for an 8-algorithm, 10-seed, 41-eval figure). The performance profiles' bands are stratified over tasks,
  computed in ``benchmark/stats.py``, drawn as they are (``draw_band``).
* **Theme**: seaborn's ``THEME`` (white grid, paper fonts), set for each figure only (``themed``), never globally.

Every file is saved as PNG and SVG, atomically and without dates (``save_figure``).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd

import algorithms as registry
from benchmark import stats
from flowzoo.io import atomic_write

FAMILIES = (("flow_grpo", "Flow-GRPO", "Blues"), ("dance_grpo", "DanceGRPO", "Greens"),
            ("mix_grpo", "MixGRPO", "Oranges"), ("op_grpo", "OP-GRPO", "Purples"),
            ("diffusion_nft", "DiffusionNFT", "Reds"), ("awm", "AWM", "YlOrBr"))
OTHER_COLORMAP = "Greys"
LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
MAX_LINES = 6
CURVE_GRID_POINTS = 50
PLOT_BOOTSTRAPS = 1000
THEME = {"style": "whitegrid", "context": "paper"}  # seaborn.axes_style / seaborn.plotting_context names
X_AXES = {"step": "training step", "nfe": "network evaluations (NFE)", "wall_s": "training wall-clock (s)"}
PANEL_SIZE = (4.6, 3.6)
DIAGNOSTIC_PANELS_PER_ROW = 3


# ------------------------------------------------------------------------------------------------ families and style


def family(algorithm: str) -> str | None:
    """The family the algorithm's class declares (``Algorithm.family``), or None for a name not registered."""
    cls = registry.find(algorithm)
    return None if cls is None else cls.family


def ablation_of(algorithm: str) -> str | None:
    """The method the algorithm's class declares it ablates (``Algorithm.ablation_of``), or None."""
    cls = registry.find(algorithm)
    return None if cls is None else cls.ablation_of


def diagnostics(algorithm: str) -> dict[str, str]:
    """The diagnostic columns the algorithm's class declares (``Algorithm.diagnostics``): {column: description}."""
    cls = registry.find(algorithm)
    return {} if cls is None else dict(cls.diagnostics)


def has_ablations(algorithm: str) -> bool:
    """Whether some registered algorithm declares itself an ablation of ``algorithm``."""
    return algorithm in registry.ablations()


def method_label(algorithm: str) -> str:
    """A family's display name for its own method ("OP-GRPO"), else the algorithm's name."""
    return {root: label for root, label, _ in FAMILIES}.get(algorithm, algorithm)


def ablations_title(bases) -> str:
    """"OP-GRPO ablations" for the methods ``bases`` (those whose ablations are shown); "Ablations" for none."""
    bases = sorted(set(bases))
    return f"{' / '.join(method_label(b) for b in bases)} ablations" if bases else "Ablations"


def role(algorithm: str) -> str:
    """'ablations' (it declares ``ablation_of``), 'methods' (a family's own method, or an unknown algorithm) or
    'variants' (a member of another algorithm's family)."""
    if ablation_of(algorithm) is not None:
        return "ablations"
    root = family(algorithm)
    return "methods" if root is None or root == algorithm else "variants"


def styles(algorithms) -> dict[str, tuple]:
    """{algorithm: (colour, line style)} for every algorithm, stable whatever subset a figure draws."""
    import matplotlib

    maps = {root: cmap for root, _, cmap in FAMILIES}
    groups: dict[str | None, list[str]] = {}  # families without a colour map of their own share the greys (None)
    for algorithm in sorted(set(algorithms)):
        root = family(algorithm)
        groups.setdefault(root if root in maps else None, []).append(algorithm)
    out = {}
    for root, members in groups.items():
        members = sorted(members, key=lambda a: (a != root, a))
        cmap = matplotlib.colormaps[maps.get(root, OTHER_COLORMAP)]
        shades = np.linspace(0.9, 0.45, len(members)) if len(members) > 1 else [0.85]
        for i, (algorithm, shade) in enumerate(zip(members, shades)):
            out[algorithm] = (cmap(float(shade)), LINE_STYLES[i % len(LINE_STYLES)])
    return out


def panels(algorithms, baseline: str) -> list[tuple[str, list[str]]]:
    """[(title, algorithms)]: methods, variants and ablations, each with the baseline first (and the ablated methods
    next among the ablations), at most ``MAX_LINES`` lines each; panels holding only the baseline are dropped."""
    present = sorted(set(algorithms))
    out = []
    for name in ("methods", "variants", "ablations"):
        members = [a for a in present if role(a) == name and a != baseline]
        if not members:
            continue
        title, fixed = name, [baseline] if baseline in present else []
        if name == "ablations":
            bases = sorted({ablation_of(a) for a in members})
            title = ablations_title(bases)
            fixed += [b for b in bases if b in present and b != baseline]
        room = MAX_LINES - len(fixed)
        chunks = [members[i:i + room] for i in range(0, len(members), room)]
        for k, chunk in enumerate(chunks):
            suffix = f" ({k + 1}/{len(chunks)})" if len(chunks) > 1 else ""
            out.append((title + suffix, fixed + chunk))
    if not out and present:
        out.append(("methods", present[:MAX_LINES]))
    return out


# ------------------------------------------------------------------------------------------------------------ saving


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def themed(plot):
    """Run the figure function ``plot`` under seaborn's ``THEME`` (rc parameters for this figure only)."""

    @functools.wraps(plot)
    def wrapper(*args, **kwargs):
        pyplot()
        import seaborn as sns

        with sns.axes_style(THEME["style"]), sns.plotting_context(THEME["context"]):
            return plot(*args, **kwargs)

    return wrapper


def save_figure(fig, stem: Path) -> list[Path]:
    """Save ``fig`` as ``stem.png`` and ``stem.svg``, each atomically and without dates, then close it."""
    import matplotlib
    import matplotlib.pyplot as plt

    paths = []
    with matplotlib.rc_context({"svg.hashsalt": "flowzoo-report"}):
        for fmt, metadata in (("png", {"Software": None}), ("svg", {"Date": None, "Creator": None})):
            path = stem.with_suffix(f".{fmt}")
            atomic_write(path, lambda f: fig.savefig(f, format=fmt, metadata=metadata), "wb")
            paths.append(path)
    plt.close(fig)
    return paths


def panel_axes(count: int):
    """A row of ``count`` panels sharing the y axis, with fixed margins (no layout engine: one draw per file)."""
    plt = pyplot()
    width, height = PANEL_SIZE
    fig, axes = plt.subplots(1, count, figsize=(width * count, height), sharey=True, squeeze=False)
    fig.subplots_adjust(left=0.08 if count > 1 else 0.14, right=0.98, bottom=0.14, top=0.84, wspace=0.08)
    return fig, list(axes[0])


# -------------------------------------------------------------------------------------------------------------- data


def align_curves(curves: pd.DataFrame, x: str, grid_points: int = CURVE_GRID_POINTS) -> pd.DataFrame:
    """Eval curves with a shared x per algorithm, so that seeds can be averaged at each x.

    Where the seeds of an algorithm were evaluated on one common schedule of x values (steps, usually NFE; an
    unfinished seed may stop early) they are used as they are; otherwise (wall-clock) each seed is linearly
    interpolated onto an even grid from 0 to the largest x of the algorithm, and a seed contributes only inside its
    own range (beyond it, fewer seeds make the band).
    """
    frames = []
    for algorithm, group in curves.groupby("algorithm", sort=True):
        longest = group.groupby("run")[x].count().max()
        if group[x].nunique() <= longest:
            frames.append(group[["algorithm", "run", x, "eval_reward"]])
            continue
        grid = np.linspace(0.0, float(group[x].max()), grid_points)
        for run, g in group.groupby("run", sort=True):
            inside = grid <= g[x].max()
            values = np.interp(grid[inside], g[x].to_numpy(float), g["eval_reward"].to_numpy(float))
            frames.append(pd.DataFrame({"algorithm": algorithm, "run": run, x: grid[inside], "eval_reward": values}))
    return pd.concat(frames, ignore_index=True)


def draw_mean(ax, data: pd.DataFrame, x: str, y: str, style: tuple, label: str, marker: str | None = None) -> None:
    """Mean of ``y`` over the rows (seeds) at each ``x``, with its 95% bootstrap band (module docstring)."""
    import seaborn as sns

    colour, line = style
    band = functools.partial(stats.bootstrap_ci, statistic=np.mean, resamples=PLOT_BOOTSTRAPS)
    sns.lineplot(data=data, x=x, y=y, estimator="mean", errorbar=band, color=colour, linestyle=line, marker=marker,
                 linewidth=1.6, label=label, legend=False, ax=ax, err_kws={"alpha": 0.15, "linewidth": 0})


def draw_band(ax, band: pd.DataFrame, x: str, y: str, style: tuple, label: str) -> None:
    """A line through ``y`` and its precomputed band (columns ``lo``, ``hi``)."""
    colour, line = style
    band = band.sort_values(x)
    ax.plot(band[x], band[y], color=colour, linestyle=line, linewidth=1.6, label=label)
    ax.fill_between(band[x], band["lo"], band["hi"], color=colour, alpha=0.15, linewidth=0)


# ----------------------------------------------------------------------------------------------------------- figures


@themed
def plot_eval_curves(curves: pd.DataFrame, costs: pd.DataFrame, task: str, x: str, target: float, baseline: str,
                     palette: dict, stem: Path) -> list[Path]:
    """Mean eval reward across seeds with 95% bootstrap bands, one panel per group of algorithms; the target dashed
    and, on it, each algorithm's mean cost to reach it (filled: every seed reached it; hollow: some seeds are
    censored, so the mark is a lower bound)."""
    data = align_curves(curves, x)
    groups = panels(data["algorithm"].unique(), baseline)
    fig, axes = panel_axes(len(groups))
    for ax, (title, members) in zip(axes, groups):
        for algorithm in members:
            draw_mean(ax, data[data["algorithm"] == algorithm], x, "eval_reward", palette[algorithm], algorithm)
        if not math.isnan(target):
            ax.axhline(target, color="black", linestyle=(0, (4, 3)), linewidth=0.9, label="target")
            for algorithm in members:
                cost = costs[costs["algorithm"] == algorithm]
                if len(cost):
                    all_reached = bool(cost["reached"].all())
                    colour = palette[algorithm][0]
                    ax.plot([cost[x].mean()], [target], marker="o", markersize=7, linestyle="none",
                            markeredgecolor=colour, markerfacecolor=colour if all_reached else "white", zorder=5)
        ax.set(xlabel=X_AXES[x], ylabel="eval reward" if ax is axes[0] else "", title=title)
        ax.legend(fontsize="x-small", loc="lower right", framealpha=0.85)
    fig.suptitle(f"{task}: eval reward vs {X_AXES[x]}")
    return save_figure(fig, stem)


@themed
def plot_performance_profiles(profiles: pd.DataFrame, baseline: str, palette: dict, stem: Path) -> list[Path]:
    """Share of (task, seed) runs whose normalized final reward exceeds tau, with stratified bootstrap bands."""
    groups = panels(profiles["algorithm"].unique(), baseline)
    fig, axes = panel_axes(len(groups))
    for ax, (title, members) in zip(axes, groups):
        for algorithm in members:
            band = profiles[profiles["algorithm"] == algorithm]
            draw_band(ax, band, "tau", "share", palette[algorithm], algorithm)
        ax.axvline(1.0, color="black", linestyle=(0, (4, 3)), linewidth=0.9)
        ax.set(xlabel="normalized final reward tau (0 base model, 1 baseline)", title=title, ylim=(-0.02, 1.02))
        ax.legend(fontsize="x-small", loc="lower left", framealpha=0.85)
    axes[0].set_ylabel("share of runs with score > tau")
    fig.suptitle("performance profiles across tasks")
    return save_figure(fig, stem)


@themed
def plot_diagnostics_over_training(runs: pd.DataFrame, columns: dict[str, list[str]], task: str, palette: dict,
                                   stem: Path) -> list[Path]:
    """One panel per diagnostic column ({column: the algorithms declaring it}) against the training step: mean and
    95% band across seeds, a line per algorithm; at most ``DIAGNOSTIC_PANELS_PER_ROW`` panels a row."""
    plt = pyplot()
    per_row = min(len(columns), DIAGNOSTIC_PANELS_PER_ROW)
    rows = math.ceil(len(columns) / per_row)
    width, height = PANEL_SIZE
    fig, axes = plt.subplots(rows, per_row, figsize=(width * per_row, height * rows), squeeze=False)
    fig.subplots_adjust(left=0.1 if per_row > 1 else 0.16, right=0.98, bottom=0.14 / rows, top=1 - 0.16 / rows,
                        wspace=0.28, hspace=0.45)
    flat = list(axes.flat)
    for ax, (column, members) in zip(flat, columns.items()):
        for algorithm in members:
            group = runs[runs["algorithm"] == algorithm].dropna(subset=[column])
            if len(group):
                draw_mean(ax, group, "step", column, palette[algorithm], algorithm)
        ax.set(xlabel="training step", ylabel="", title=column)
        ax.legend(fontsize="x-small", loc="best", framealpha=0.85)
    for ax in flat[len(columns):]:
        ax.set_visible(False)
    fig.suptitle(f"{task}: declared diagnostics over training")
    return save_figure(fig, stem)


@themed
def plot_by_denoising_step(runs: pd.DataFrame, columns: dict[int, str], label: str, members: list[str], task: str,
                           palette: dict, stem: Path) -> list[Path]:
    """A per-denoising-step diagnostic ({k: column}) against k: averaged over training per seed, then mean and 95%
    band over seeds, a line per algorithm of ``members``."""
    names = list(columns.values())
    runs = runs[runs["algorithm"].isin(members)]
    per_seed = runs.groupby(["algorithm", "run"], sort=True)[names].mean().reset_index()
    data = per_seed.melt(id_vars=["algorithm", "run"], value_vars=names, var_name="column", value_name="value")
    data = data.dropna(subset=["value"])
    data["k"] = data["column"].map({column: k for k, column in columns.items()})
    fig, axes = panel_axes(1)
    ax = axes[0]
    for algorithm, group in data.groupby("algorithm", sort=True):
        draw_mean(ax, group, "k", "value", palette[algorithm], algorithm, marker="o")
    ax.set(xlabel="denoising step k", ylabel=f"mean {label}", title=f"{task}: {label} by denoising step")
    ax.legend(fontsize="x-small", loc="upper left", framealpha=0.85)
    return save_figure(fig, stem)
