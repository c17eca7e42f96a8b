"""The report's samples at matched steps: per task the evaluation samples of the lowest seed of each algorithm that
saved any, at steps every algorithm saved; the toy tier's points redrawn with their rewards and each prompt's rewarded
region (:class:`PointScorer`), the image tiers' grids an algorithm a row with their prompts and rewards."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from flowzoo.benchmark.analysis import stats
from flowzoo.benchmark.render import figures
from flowzoo.benchmark.render.formats import figure_lines, fmt_number, slug
from flowzoo.benchmark.render.tables import markdown_table
from flowzoo.io import atomic_write

#: at most this many matched steps are shown
MAX_SAMPLE_STEPS = 4
#: toy-tier sample panels a row
SAMPLE_PANELS_PER_ROW = 5


def _hue_order(algorithms, baseline: str) -> list[str]:
    return sorted(set(algorithms), key=lambda a: (a != baseline, a))


def sample_grids(run_dir: Path) -> dict[int, Path]:
    """{step: path} of a run's ``samples/step_<N>.png`` files."""
    found = {}
    for path in (run_dir / "samples").glob("step_*.png"):
        if match := re.fullmatch(r"step_(\d+)\.png", path.name):
            found[int(match[1])] = path
    return found


def matched_steps(steps: list[set[int]], limit: int = MAX_SAMPLE_STEPS) -> list[int]:
    """Steps present for every algorithm; at most ``limit`` of them, evenly spread and always with first and last."""
    common = sorted(set.intersection(*steps)) if steps else []
    if len(common) <= limit:
        return common
    picks = np.unique(np.linspace(0, len(common) - 1, limit).round().astype(int))
    return [common[i] for i in picks]


def grid_sidecar(grid: Path) -> dict | None:
    """The JSON sidecar of a sample grid (:mod:`benchmark.run.sample_pictures`), or None (grids saved before sidecars existed)."""
    try:
        data = json.loads(grid.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class PointScorer:
    """Re-scores a toy-tier run's saved sample points with the run's own reward (from its ``config.yaml``: the
    reward, its arguments and the prompt set with its metadata) and maps each prompt's rewarded region. Built only for
    a reward that takes points; the toy rewards are closed-form, so this costs milliseconds."""

    def __init__(self, run_dir: Path):
        from flowzoo.benchmark.config.schema import read_stored_config
        from flowzoo.benchmark.prompts.sources import PromptSection, load_prompts
        from flowzoo.rewards import build

        config = read_stored_config(run_dir / "config.yaml")
        #: what the scores depend on: runs with equal keys share their regions
        self.key = json.dumps([config["reward"], config.get("reward_args"), config.get("prompts")], sort_keys=True,
                              default=str)
        self._regions: dict = {}
        self.reward = build(config["reward"], config.get("reward_args") or {})
        if "points" not in tuple(getattr(self.reward, "accepts", ()) or ()):
            raise ValueError(f"reward {config['reward']!r} does not score points")
        _, evaluation = load_prompts(PromptSection(**(config.get("prompts") or {})))
        self.metadata = {prompt: meta for prompt, meta in evaluation}
        targets = [np.hypot(*v) for m in self.metadata.values() for v in m.values()
                   if isinstance(v, (list, tuple)) and len(v) == 2]
        from flowzoo.benchmark.run.sample_pictures import LIMIT

        self.limit = max(LIMIT, math.ceil(5 * (max(targets, default=0.0) + 0.8)) / 5)

    def score(self, points: np.ndarray, prompts: list[str]) -> np.ndarray:
        import torch

        out = self.reward.score(torch.as_tensor(points, dtype=torch.float32), prompts,
                                [self.metadata[p] for p in prompts])
        return out.score.float().numpy()

    def regions(self, prompts, resolution: int = 121) -> dict:
        """{prompt: (xs, ys, reward on the grid)} over the axes (each prompt's computed once)."""
        axis = np.linspace(-self.limit, self.limit, resolution)
        xs, ys = np.meshgrid(axis, axis)
        grid = np.stack([xs.ravel(), ys.ravel()], axis=1)
        for p in set(prompts) - set(self._regions):
            self._regions[p] = (xs, ys, self.score(grid, [p] * len(grid)).reshape(xs.shape))
        return {p: self._regions[p] for p in sorted(set(prompts))}


def _points_panel(label: str, sidecar: dict, scorer: PointScorer) -> dict:
    points = np.array([[float(v) for v in p] for p in sidecar["points"]], dtype=float).reshape(-1, 2)
    prompts = [str(p) for p in sidecar["prompts"]]
    finite = np.isfinite(points).all(axis=1)
    rewards = np.zeros(len(points))
    rewards[finite] = scorer.score(points[finite], [p for p, f in zip(prompts, finite) if f])
    return {"label": label, "points": points, "rewards": rewards, "prompts": prompts,
            "regions": scorer.regions(prompts)}


def _toy_sample_figures(task: str, chosen: dict, algorithms: list[str], steps: list[int], out_dir: Path
                        ) -> list[str] | None:
    """The toy tier's samples redrawn from the grids' sidecars (points, prompts), one figure per matched step; None
    when some grid has no points sidecar or the reward cannot re-score points (then the saved PNGs are shown)."""
    sidecars = {(a, s): grid_sidecar(chosen[a][1][s]) for a in algorithms for s in steps}
    if not all(d and d.get("kind") == "points" and d.get("points") and d.get("prompts") for d in sidecars.values()):
        return None
    try:
        shared: dict[str, PointScorer] = {}  # runs of one reward and prompt set share a scorer and its regions
        scorers = {}
        for a in algorithms:
            scorer = PointScorer(chosen[a][2])
            scorers[a] = shared.setdefault(scorer.key, scorer)
        data = {key: _points_panel(f"{key[0]} (seed {chosen[key[0]][0]})", sidecar, scorers[key[0]])
                for key, sidecar in sidecars.items()}
    except Exception as e:  # a reward that needs weights or a server, an unreadable config: show the PNGs
        import logging

        logging.getLogger("flowzoo.report").warning("samples of %s are shown as saved: %s: %s", task,
                                                    type(e).__name__, e)
        return None
    limit = max(s.limit for s in scorers.values())
    lines = ["Each panel: one run's evaluation samples (the lowest seed of its algorithm that saved any), each "
             "point coloured by its reward (the run's reward re-scoring the saved point) and shaped by its prompt; "
             "dashed: each prompt's rewarded region (reward >= 0.5); points beyond the axes are drawn on the border "
             "with a red edge and counted. The title gives the mean reward of the panel's samples.", ""]
    for step in steps:
        stem = out_dir / "figures" / f"{slug(task)}_samples_step_{step}"
        paths = figures.plot_point_samples([data[(a, step)] for a in algorithms], limit,
                                           f"{task}: evaluation samples at step {step}", stem,
                                           per_row=SAMPLE_PANELS_PER_ROW)
        lines += figure_lines(paths, out_dir, f"{task}: samples of every algorithm at step {step}")
    return lines


def _grid_table(task: str, chosen: dict, algorithms: list[str], steps: list[int], out_dir: Path) -> list[str]:
    """The saved sample grids, an algorithm a row and a matched step a column, with the grids' prompts listed."""
    rows = []
    for algorithm in algorithms:
        seed, grids, _ = chosen[algorithm]
        cells = [f"`{algorithm}` (seed {seed})"]
        for step in steps:
            rel = Path("samples") / slug(task) / f"{slug(algorithm)}_seed{seed}_step_{step}.png"
            data = grids[step].read_bytes()
            atomic_write(out_dir / rel, lambda f, data=data: f.write(data), "wb")
            cells.append(f"![{algorithm} seed {seed} step {step}]({rel.as_posix()})")
        rows.append(cells)
    lines = markdown_table(["algorithm"] + [f"step {s}" for s in steps], rows) + [""]
    first = grid_sidecar(chosen[algorithms[0]][1][steps[0]])
    prompts = (first or {}).get("prompts")
    if prompts and (first or {}).get("kind") != "points":
        lines += ["Prompts of the grids' samples, row by row (every grid of a task samples the same held-out "
                  "prompts with the same noise): " + "; ".join(f"{i + 1}: {p}" for i, p in enumerate(prompts))
                  + ".", ""]
        lines += _grid_rewards(chosen, algorithms, steps)
    elif not prompts:
        lines += ["These grids were saved without their prompts (runs older than the grids' JSON sidecars).", ""]
    else:
        lines += ["These toy-tier grids are shown as saved: their rewards could not be re-scored (see the warning "
                  "on stderr).", ""]
    return lines


def _grid_rewards(chosen: dict, algorithms: list[str], steps: list[int]) -> list[str]:
    """Each shown grid's per-sample rewards (from its sidecar), in the prompts' order; a note when the runs did not
    record them (grids saved before rewards were)."""
    rows = []
    for algorithm in algorithms:
        seed, grids, _ = chosen[algorithm]
        for step in steps:
            rewards = (grid_sidecar(grids[step]) or {}).get("rewards")
            if rewards is None:
                return ["The runs recorded no per-sample reward for these grids (saved before rewards were); the "
                        "evaluation's mean is `eval_reward` in metrics.csv.", ""]
            shown = ", ".join(f"{i + 1}: {fmt_number(float(r))}" for i, r in enumerate(rewards))
            rows.append([f"`{algorithm}` (seed {seed})", str(step), shown])
    return ["Each grid sample's reward, in the prompts' order:", ""] + markdown_table(
        ["algorithm", "step", "reward by sample"], rows) + [""]


def samples_section(analysis: stats.Analysis, runs_dir: Path, out_dir: Path) -> list[str]:
    lines = ["## Samples at matched steps", "",
             "Evaluation samples of the lowest seed of each algorithm that saved any, at steps saved by every "
             "algorithm (at most 4).", ""]
    drawn = False
    for task, summary in analysis.summary.groupby("task", sort=True):
        chosen = {}  # algorithm -> (seed, {step: path}, run directory)
        for r in summary.sort_values(["algorithm", "seed", "run"]).itertuples():
            grids = sample_grids(runs_dir / r.run)
            if grids and r.algorithm not in chosen:
                chosen[r.algorithm] = (r.seed, grids, runs_dir / r.run)
        steps = matched_steps([set(grids) for _, grids, _ in chosen.values()])
        if not steps:
            continue
        drawn = True
        algorithms = _hue_order(chosen, analysis.baseline)
        lines += [f"### `{task}`", ""]
        lines += (_toy_sample_figures(task, chosen, algorithms, steps, out_dir)
                  or _grid_table(task, chosen, algorithms, steps, out_dir))
    return lines if drawn else lines + ["No sample grids at steps shared by every algorithm.", ""]
