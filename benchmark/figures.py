"""The report's figures: colours by method family, main methods / variants / ablations in separate panels.

* **Families** have one colour map each (Flow-GRPO blues, DanceGRPO greens, MixGRPO oranges, OP-GRPO purples, any
  other algorithm greys); the family's own method is its darkest shade and a solid line, its variants lighter shades
  with dashed, dotted, ... lines. An algorithm keeps its colour and line style in every figure of a report.
* **Panels**: "methods" (each family's own method and any unknown algorithm), "variants" (Flow-GRPO-Fast,
  MixGRPO-Flash, ...), "OP-GRPO ablations" (with OP-GRPO itself). Every panel also draws the baseline, and holds at
  most ``MAX_LINES`` lines (a longer list is split over several panels).

Every file is saved as PNG and SVG, atomically and without dates (``save_figure``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from benchmark import stats
from flowzoo.io import atomic_write

FAMILIES = (("flow_grpo", "Flow-GRPO", "Blues"), ("dance_grpo", "DanceGRPO", "Greens"),
            ("mix_grpo", "MixGRPO", "Oranges"), ("op_grpo", "OP-GRPO", "Purples"))
OTHER_COLORMAP = "Greys"
LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
MAX_LINES = 6
CURVE_GRID_POINTS = 50
PLOT_BOOTSTRAPS = 1000
X_AXES = {"step": "training step", "nfe": "network evaluations (NFE)", "wall_s": "training wall-clock (s)"}
PANEL_SIZE = (4.6, 3.6)


# ------------------------------------------------------------------------------------------------ families and style


def family(algorithm: str) -> str | None:
    """The family root an algorithm belongs to (its name starts with it), or None."""
    matches = [root for root, _, _ in FAMILIES if algorithm == root or algorithm.startswith(root + "_")]
    return max(matches, key=len) if matches else None


def role(algorithm: str) -> str:
    """'methods' (a family's own method, or an unknown algorithm), 'ablations' (an OP-GRPO variant) or 'variants'."""
    root = family(algorithm)
    if root is None or root == algorithm:
        return "methods"
    return "ablations" if root == "op_grpo" else "variants"


def styles(algorithms) -> dict[str, tuple]:
    """{algorithm: (colour, line style)} for every algorithm, stable whatever subset a figure draws."""
    import matplotlib

    groups: dict[str | None, list[str]] = {}
    for algorithm in sorted(set(algorithms)):
        groups.setdefault(family(algorithm), []).append(algorithm)
    maps = {root: cmap for root, _, cmap in FAMILIES}
    out = {}
    for root, members in groups.items():
        members = sorted(members, key=lambda a: (a != root, a))
        cmap = matplotlib.colormaps[maps.get(root, OTHER_COLORMAP)]
        shades = np.linspace(0.9, 0.45, len(members)) if len(members) > 1 else [0.85]
        for i, (algorithm, shade) in enumerate(zip(members, shades)):
            out[algorithm] = (cmap(float(shade)), LINE_STYLES[i % len(LINE_STYLES)])
    return out


def panels(algorithms, baseline: str) -> list[tuple[str, list[str]]]:
    """[(title, algorithms)]: methods, variants and OP-GRPO ablations, each with the baseline first (and OP-GRPO
    second among the ablations), at most ``MAX_LINES`` lines each; panels holding only the baseline are dropped."""
    present = sorted(set(algorithms))
    out = []
    for name, title in (("methods", "methods"), ("variants", "variants"), ("ablations", "OP-GRPO ablations")):
        members = [a for a in present if role(a) == name and a != baseline]
        if not members:
            continue
        fixed = [baseline] if baseline in present else []
        if name == "ablations" and "op_grpo" in present and "op_grpo" != baseline:
            fixed.append("op_grpo")
            members = [a for a in members if a != "op_grpo"]
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


def mean_and_band(data: pd.DataFrame, by: list[str], y: str) -> pd.DataFrame:
    """Mean of ``y`` across seeds per ``by`` group, with the 95% bootstrap band of :func:`stats.bootstrap_ci`."""
    rows = []
    for key, group in data.dropna(subset=[y]).groupby(by, sort=True):
        values = group[y].to_numpy(float)
        lo, hi = stats.bootstrap_ci(values, np.mean, resamples=PLOT_BOOTSTRAPS)
        rows.append({**dict(zip(by, key)), y: values.mean(), "lo": lo, "hi": hi})
    return pd.DataFrame(rows, columns=[*by, y, "lo", "hi"])


def draw_band(ax, band: pd.DataFrame, x: str, y: str, style: tuple, label: str, marker: str | None = None) -> None:
    colour, line = style
    band = band.sort_values(x)
    ax.plot(band[x], band[y], color=colour, linestyle=line, marker=marker, markersize=3, linewidth=1.6, label=label)
    ax.fill_between(band[x], band["lo"], band["hi"], color=colour, alpha=0.15, linewidth=0)


# ----------------------------------------------------------------------------------------------------------- figures


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
            band = mean_and_band(data[data["algorithm"] == algorithm], ["algorithm", x], "eval_reward")
            draw_band(ax, band, x, "eval_reward", palette[algorithm], algorithm)
        if not math.isnan(target):
            ax.axhline(target, color="black", linestyle=(0, (4, 3)), linewidth=0.9, label="target")
            for algorithm in members:
                cost = costs[costs["algorithm"] == algorithm]
                if len(cost):
                    all_reached = bool(cost["reached"].all())
                    colour = palette[algorithm][0]
                    ax.plot([cost[x].mean()], [target], marker="o", markersize=7, linestyle="none",
                            markeredgecolor=colour, markerfacecolor=colour if all_reached else "white", zorder=5)
        ax.set(xlabel=X_AXES[x], title=title)
        ax.legend(fontsize="x-small", loc="lower right", framealpha=0.85)
    axes[0].set_ylabel("eval reward")
    fig.suptitle(f"{task}: eval reward vs {X_AXES[x]}")
    return save_figure(fig, stem)


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


def plot_clip_fractions(runs: pd.DataFrame, task: str, palette: dict, stem: Path) -> list[Path]:
    """On-policy (solid) and off-policy (dashed) clip fractions over training, mean and 95% band across seeds."""
    columns = [c for c in ("clip_frac_on", "clip_frac_off") if c in runs.columns]
    fig, axes = panel_axes(1)
    ax = axes[0]
    for algorithm, group in runs.groupby("algorithm", sort=True):
        for column, line in zip(columns, ("-", "--")):
            band = mean_and_band(group.dropna(subset=[column]), ["algorithm", "step"], column)
            if len(band):
                draw_band(ax, band, "step", column, (palette[algorithm][0], line),
                          f"{algorithm} {'on' if column.endswith('on') else 'off'}-policy")
    ax.set(xlabel="training step", ylabel="clip fraction", title=f"{task}: PPO clip fraction, on- vs off-policy")
    ax.legend(fontsize="x-small", loc="upper right", framealpha=0.85)
    return save_figure(fig, stem)


def plot_log_ratio_by_step(runs: pd.DataFrame, columns: list[str], task: str, palette: dict, stem: Path
                           ) -> list[Path]:
    """Mean |log-ratio| at each denoising step k: averaged over training per seed, then mean and 95% band over seeds."""
    per_seed = runs.groupby(["algorithm", "run"], sort=True)[columns].mean().reset_index()
    data = per_seed.melt(id_vars=["algorithm", "run"], value_vars=columns, var_name="k", value_name="abs_log_ratio")
    data = data.dropna(subset=["abs_log_ratio"])
    data["k"] = data["k"].str.rsplit("t", n=1).str[1].astype(int)
    fig, axes = panel_axes(1)
    ax = axes[0]
    for algorithm, group in data.groupby("algorithm", sort=True):
        draw_band(ax, mean_and_band(group, ["algorithm", "k"], "abs_log_ratio"), "k", "abs_log_ratio",
                  palette[algorithm], algorithm, marker="o")
    ax.set(xlabel="denoising step k", ylabel="mean |log ratio|", title=f"{task}: |log-ratio| by denoising step")
    ax.legend(fontsize="x-small", loc="upper left", framealpha=0.85)
    return save_figure(fig, stem)
