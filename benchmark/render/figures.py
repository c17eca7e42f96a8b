"""The report's figures: colours by method family, main methods / variants / ablations in separate panels.

What an algorithm is comes from its class's declarations (``algorithms/engine/base.py``), never from its name:
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
  computed in ``benchmark/analysis/stats.py``, drawn as they are (``draw_band``).
* **Theme**: seaborn's ``THEME`` (white grid, paper fonts), set for each figure only (``themed``), never globally.

Every file is saved as PNG and SVG, atomically and without dates (``save_figure``).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd

from flowzoo import algorithms as registry
from flowzoo.benchmark.analysis import stats
from flowzoo.io import atomic_write

OTHER_COLORMAP = "Greys"
LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
#: markers of a family's members after its own method (which has none), so that 5 shades of one colour stay apart
MARKERS = (None, "o", "s", "^", "D", "v", "P", "X")
MAX_LINES = 6
CURVE_GRID_POINTS = 50
PLOT_BOOTSTRAPS = 1000
THEME = {"style": "whitegrid", "context": "paper"}  # seaborn.axes_style / seaborn.plotting_context names
#: font sizes (pt) at the size a figure is shown: the report page shows a PNG at its physical size (width in inches
#: x 96 CSS px, from the PNG's resolution: ``markdown_html``), so these are the sizes a reader sees
FONTS = {"font.size": 10, "axes.labelsize": 10, "axes.titlesize": 10.5, "xtick.labelsize": 9, "ytick.labelsize": 9,
         "legend.fontsize": 9, "legend.title_fontsize": 9, "figure.titlesize": 11}
#: the widest figure, in inches: the page's 1100 CSS px column holds 11.46 in at 96 px an inch
PAGE_WIDTH = 11.0
#: PNG resolution: 1.5 times the page's 96 px an inch, sharp on high-density screens at a third of 2x's bytes
DPI = 144
X_AXES = {"step": "training step", "nfe": "network evaluations (NFE)", "wall_s": "training wall-clock (s)"}
PANEL_SIZE = (PAGE_WIDTH / 3, 3.6)
DIAGNOSTIC_PANELS_PER_ROW = 3
#: vertical distance (pt) between the target-crossing dots of one panel
CROSSING_SPACING = 4.0


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


def declared(algorithm: str, attribute: str) -> str | None:
    """What the algorithm's class itself declares as ``attribute`` (``label``, ``colormap``), not inherited."""
    cls = registry.find(algorithm)
    return None if cls is None else vars(cls).get(attribute)


def method_label(algorithm: str) -> str:
    """A family's display name for its own method ("OP-GRPO": ``Algorithm.label``), else the algorithm's name."""
    return declared(algorithm, "label") or algorithm


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


def styles(algorithms, base=None) -> dict[str, tuple]:
    """{algorithm: (colour, line style, marker)} for every algorithm, stable whatever subset a figure draws: within a
    family each member has its own shade, line style and (after the family's own method) marker. ``base``: maps a
    name to the algorithm whose family it belongs to (a study's control cell ``flow_grpo@variance`` to
    ``flow_grpo``)."""
    import matplotlib

    maps = {root: declared(root, "colormap") for root in registry.names() if declared(root, "colormap")}
    groups: dict[str | None, list[str]] = {}  # families without a colour map of their own share the greys (None)
    for algorithm in sorted(set(algorithms)):
        root = family(base(algorithm) if base else algorithm)
        groups.setdefault(root if root in maps else None, []).append(algorithm)
    out = {}
    for root, members in groups.items():
        members = sorted(members, key=lambda a: (a != root, a))
        cmap = matplotlib.colormaps[maps.get(root, OTHER_COLORMAP)]
        shades = np.linspace(0.9, 0.45, len(members)) if len(members) > 1 else [0.85]
        for i, (algorithm, shade) in enumerate(zip(members, shades)):
            out[algorithm] = (cmap(float(shade)), LINE_STYLES[i % len(LINE_STYLES)], MARKERS[i % len(MARKERS)])
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

        import matplotlib

        with sns.axes_style(THEME["style"]), sns.plotting_context(THEME["context"]), matplotlib.rc_context(FONTS):
            return plot(*args, **kwargs)

    return wrapper


def save_figure(fig, stem: Path, formats: tuple[str, ...] = ("png", "svg")) -> list[Path]:
    """Save ``fig`` as ``stem.png`` and ``stem.svg`` (``formats``), each atomically and without dates, then close it."""
    import matplotlib
    import matplotlib.pyplot as plt

    paths = []
    metadata_of = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None}}
    with matplotlib.rc_context({"svg.hashsalt": "flowzoo-report"}):
        for fmt, metadata in ((f, metadata_of[f]) for f in formats):
            path = stem.with_suffix(f".{fmt}")
            atomic_write(path, lambda f: fig.savefig(f, format=fmt, metadata=metadata, dpi=DPI), "wb")
            paths.append(path)
    plt.close(fig)
    return paths


def panel_axes(count: int):
    """A row of ``count`` panels sharing the y axis, with fixed margins (no layout engine: one draw per file)."""
    plt = pyplot()
    width, height = PANEL_SIZE
    fig, axes = plt.subplots(1, count, figsize=(max(6.0, width * count), height), sharey=True, squeeze=False)
    fig.subplots_adjust(left=0.07 if count > 1 else 0.14, right=0.99, bottom=0.15, top=0.84, wspace=0.06)
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
    """Mean of ``y`` over the rows (seeds) at each ``x``, with its 95% bootstrap band (module docstring). Without
    ``marker`` the style's own marks the line every tenth of the axes' diagonal."""
    import seaborn as sns

    colour, line, *rest = style  # (colour, line style[, marker])
    own = rest[0] if rest else None
    band = functools.partial(stats.bootstrap_ci, statistic=np.mean, resamples=PLOT_BOOTSTRAPS)
    spacing = {} if marker else {"markevery": 0.1}
    sns.lineplot(data=data, x=x, y=y, estimator="mean", errorbar=band, color=colour, linestyle=line,
                 marker=marker or own, markersize=5, linewidth=1.6, label=label, legend=False, ax=ax,
                 err_kws={"alpha": 0.15, "linewidth": 0}, **spacing)


def draw_band(ax, band: pd.DataFrame, x: str, y: str, style: tuple, label: str) -> None:
    """A line through ``y`` and its precomputed band (columns ``lo``, ``hi``)."""
    colour, line, *rest = style
    marker = rest[0] if rest else None
    band = band.sort_values(x)
    ax.plot(band[x], band[y], color=colour, linestyle=line, marker=marker, markevery=0.1, markersize=5,
            linewidth=1.6, label=label)
    ax.fill_between(band[x], band["lo"], band["hi"], color=colour, alpha=0.15, linewidth=0)


# ----------------------------------------------------------------------------------------------------------- figures


@themed
def plot_eval_curves(curves: pd.DataFrame, costs: pd.DataFrame, task: str, x: str, target: float, baseline: str,
                     palette: dict, stem: Path) -> list[Path]:
    """Mean eval reward across seeds with 95% bootstrap bands, one panel per group of algorithms; the target dashed
    and, on it, each algorithm's mean cost to reach it (filled: every seed reached it; hollow: some seeds are
    censored, so the mark is a lower bound)."""
    from matplotlib import transforms
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    data = align_curves(curves, x)
    groups = panels(data["algorithm"].unique(), baseline)
    fig, axes = panel_axes(len(groups))
    for ax, (title, members) in zip(axes, groups):
        for algorithm in members:
            draw_mean(ax, data[data["algorithm"] == algorithm], x, "eval_reward", palette[algorithm], algorithm)
        if not math.isnan(target):
            ax.axhline(target, color="black", linestyle=(0, (4, 3)), linewidth=0.9, label="target")
            marked = [a for a in members if (costs["algorithm"] == a).any()]
            for i, algorithm in enumerate(marked):
                cost = costs[costs["algorithm"] == algorithm]
                all_reached = bool(cost["reached"].all())
                colour = palette[algorithm][0]
                # each algorithm's dot a few points above or below the line, so that equal costs stack, not hide
                shift = transforms.offset_copy(ax.transData, fig=fig, y=CROSSING_SPACING * (i - (len(marked) - 1) / 2),
                                               units="points")
                ax.plot([cost[x].mean()], [target], marker="o", markersize=5.5, linestyle="none", transform=shift,
                        markeredgecolor=colour, markeredgewidth=1.2,
                        markerfacecolor=colour if all_reached else "white", zorder=5, clip_on=False)
        ax.set(xlabel=X_AXES[x], ylabel="eval reward" if ax is axes[0] else "", title=title)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        if x == "nfe":  # 120000 -> 120k: five-digit ticks of three panels do not fit side by side
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k" if v else "0"))
        ax.legend(loc="best", framealpha=0.85)
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
        ax.legend(loc="lower left", framealpha=0.85)
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
    fig.subplots_adjust(left=0.08 if per_row > 1 else 0.16, right=0.98, bottom=0.5 / (height * rows),
                        top=1 - 0.75 / (height * rows), wspace=0.38, hspace=0.5)
    flat = list(axes.flat)
    for ax, (column, members) in zip(flat, columns.items()):
        for algorithm in members:
            group = runs[runs["algorithm"] == algorithm].dropna(subset=[column])
            if len(group):
                draw_mean(ax, group, "step", column, palette[algorithm], algorithm)
        ax.set(xlabel="training step", ylabel=column, title=column)
        ax.legend(loc="best", framealpha=0.85)
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
    ax.legend(loc="upper left", framealpha=0.85)
    return save_figure(fig, stem)


#: how a forest plot marks a ratio's point estimate, by what censoring makes of it (``stats`` column ``bound``)
BOUND_MARKERS = {"exact": ("o", "full"), "lower bound": (">", "full"), "upper bound": ("<", "full"),
                 "unknown direction": ("D", "none")}
RATIO_TICKS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@themed
def plot_forest(table: pd.DataFrame, costs: list[str], labels: dict[str, str], task: str, palette: dict,
                stem: Path) -> list[Path]:
    """Interval estimates as rliable draws them: per algorithm (a row) and cost (a panel) the ratio to the baseline as
    a mark and its 95% CI as a bar, on a log axis with 100% (the baseline) dashed. The mark's shape says what
    censoring makes of the ratio (``BOUND_MARKERS``); rows without a ratio are left empty."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    plt = pyplot()
    rows = list(table["algorithm"])
    height = 0.9 + 0.3 * len(rows)
    fig, axes = plt.subplots(1, len(costs), figsize=(min(PAGE_WIDTH, 3.2 * len(costs) + 2.2), height), sharey=True,
                             squeeze=False)
    axes = list(axes[0])
    fig.subplots_adjust(left=1.9 / (3.2 * len(costs) + 2.2), right=0.98, top=1 - 0.45 / height,
                        bottom=0.62 / height, wspace=0.08)
    y = np.arange(len(rows))[::-1]
    values = [v for c in costs for v in table[[f"{c}_ratio", f"{c}_lo", f"{c}_hi"]].to_numpy().ravel()
              if np.isfinite(v) and v > 0]
    lo, hi = (min(values + [0.8]) / 1.15, max(values + [1.25]) * 1.15) if values else (0.5, 2.0)
    for ax, cost in zip(axes, costs):
        for yi, (_, r) in zip(y, table.iterrows()):
            ratio, low, high = r[f"{cost}_ratio"], r[f"{cost}_lo"], r[f"{cost}_hi"]
            if not np.isfinite(ratio):
                continue
            colour = palette[r["algorithm"]][0]
            if np.isfinite(low) and np.isfinite(high):
                ax.barh(yi, high - low, left=low, height=0.6, color=colour, alpha=0.75, linewidth=0)
            marker, fill = BOUND_MARKERS.get(r["bound"], ("o", "full"))
            ax.plot([ratio], [yi], marker=marker, markersize=6, color="black", fillstyle=fill, linestyle="none",
                    zorder=4)
        ax.axvline(1.0, color="black", linestyle=(0, (4, 3)), linewidth=0.9)
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(FixedLocator([t for t in RATIO_TICKS if lo <= t <= hi]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:.0f}%"))
        ax.set_xlabel(f"{labels[cost]} vs baseline")
        ax.grid(axis="y", visible=False)
    axes[0].set_yticks(y, [f"{a} ({r}/{n})" for a, r, n in zip(rows, table["reached"], table["n"])])
    axes[0].set_ylim(-0.6, len(rows) - 0.4)
    handles = [Line2D([], [], marker=m, fillstyle=f, color="black", linestyle="none", label=b)
               for b, (m, f) in BOUND_MARKERS.items() if b in set(table["bound"])]
    fig.legend(handles=handles, loc="lower left", ncol=len(handles), frameon=False,
               bbox_to_anchor=(0.0, 0.0), title=None)
    fig.suptitle(f"{task}: cost to the target relative to the baseline (95% CI; seeds reaching)")
    return save_figure(fig, stem)


@themed
def plot_point_samples(panels_data: list[dict], limit: float, title: str, stem: Path,
                       per_row: int = 5) -> list[Path]:
    """Toy-tier samples of several runs at one step, one panel each (wrapped at ``per_row``): each point coloured by
    its reward and shaped by its prompt, each prompt's rewarded region (reward >= 0.5) outlined, points beyond the
    axes drawn on the border as red-edged marks and counted in the panel's title.

    ``panels_data``: dicts with ``label``, ``points`` [N, 2], ``rewards`` [N], ``prompts`` [N] and ``regions``
    {prompt: (xs, ys, values on the grid)} (any of them empty)."""
    from matplotlib.lines import Line2D

    from flowzoo.benchmark.run.sample_pictures import on_border, outside

    import torch

    plt = pyplot()
    count = len(panels_data)
    per_row = min(per_row, count)
    rows = math.ceil(count / per_row)
    size = (PAGE_WIDTH - 0.9) / 5
    height = (size + 0.45) * rows + 0.9
    fig, axes = plt.subplots(rows, per_row, figsize=(size * per_row + 0.9, height), squeeze=False)
    fig.subplots_adjust(left=0.02, right=1 - 0.9 / (size * per_row + 0.9), top=1 - 0.85 / height,
                        bottom=0.4 / height, wspace=0.06, hspace=0.32)
    prompts = sorted({p for d in panels_data for p in d["prompts"]}, key=_natural)
    shapes = {p: "osD^v<>pP*hX"[i % 12] for i, p in enumerate(prompts)} if len(prompts) <= 12 else {}
    cmap = pyplot().get_cmap("viridis")
    for ax, data in zip(axes.flat, panels_data):
        points = torch.as_tensor(np.asarray(data["points"], dtype=float).reshape(-1, 2))
        far = outside(points, limit).numpy()
        shown = on_border(points, limit).numpy()
        rewards = np.asarray(data["rewards"], dtype=float)
        for prompt, (xs, ys, values) in data["regions"].items():
            ax.contour(xs, ys, values, levels=[0.5], colors="#444444", linewidths=0.8, linestyles="--")
        for prompt in prompts:
            mask = np.array([p == prompt for p in data["prompts"]], dtype=bool)
            if not mask.any():
                continue
            marker = shapes.get(prompt, "o")
            for part, edge, size_pt in ((mask & ~far, "none", 14), (mask & far, "#d00000", 30)):
                if part.any():
                    ax.scatter(shown[part, 0], shown[part, 1], c=rewards[part] if len(rewards) else "grey",
                               cmap=cmap, vmin=0, vmax=1, s=size_pt, marker=marker, edgecolors=edge,
                               linewidths=0.9, clip_on=False, zorder=3)
        mean = f"\nmean reward {rewards.mean():.3f}" if len(rewards) else ""
        ax.set_title(f"{data['label']}{mean}", fontsize=9)
        if far.any():
            ax.text(0.5, 0.02, f"{int(far.sum())} of {len(far)} outside the axes", transform=ax.transAxes,
                    ha="center", va="bottom", fontsize=9, color="#d00000")
        ax.set_xlim(-limit, limit)
        ax.set_ylim(-limit, limit)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in list(axes.flat)[count:]:
        ax.set_visible(False)
    colorbar = fig.colorbar(pyplot().cm.ScalarMappable(cmap=cmap, norm=pyplot().Normalize(0, 1)),
                            ax=list(axes.flat), fraction=0.02, pad=0.01)
    colorbar.set_label("sample's reward")
    handles = [Line2D([], [], marker=m, color="grey", linestyle="none", label=p) for p, m in shapes.items()]
    handles.append(Line2D([], [], color="#444444", linestyle="--", label="rewarded region (reward >= 0.5)"))
    fig.legend(handles=handles, loc="lower left", ncol=len(handles), frameon=False, bbox_to_anchor=(0.0, 0.0))
    fig.suptitle(title)
    return save_figure(fig, stem, formats=("png",))  # thousands of points: an SVG would weigh ~0.6 MB


def _natural(text: str):
    """Sort key that orders "class 2" before "class 10"."""
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(text))]
