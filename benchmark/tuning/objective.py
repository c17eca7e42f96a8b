"""A trial's objective: the value of one run's eval-reward curve (``auc`` or ``final``), the mean over a trial's runs,
and how many evaluations a run makes (the positions its partial objectives are reported at)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from flowzoo.curves import DEFAULT_SMOOTH, smooth_trailing


def curve_value(curve, objective: str) -> float:
    """The objective of one run's eval-reward curve (its evaluations in order, the step-0 one first): ``auc`` the
    mean over them, ``final`` the mean of the last 3 (the study's smoothed final reward)."""
    values = np.asarray(curve, dtype=float)
    if objective == "auc":
        return float(values.mean())
    return float(smooth_trailing(values, DEFAULT_SMOOTH)[-1])


def objective_value(curves: list, objective: str) -> float:
    """The trial's objective: the mean over its seeds' runs of each run's value (a partial last curve gives the
    partial objective the pruner compares)."""
    return float(np.mean([curve_value(c, objective) for c in curves]))


def evaluations_per_run(steps: int, eval_every: int) -> int:
    """How many evaluations a run of ``steps`` makes: step 0, every ``eval_every`` steps and the last step."""
    multiples = steps // eval_every if eval_every else 0  # closed form: no set of every step (steps may be huge)
    return 1 + multiples + (0 if eval_every and steps % eval_every == 0 else 1)


def eval_curve(run_dir: Path) -> list[float]:
    """A finished run's eval rewards in step order (its metrics.csv)."""
    frame = pd.read_csv(run_dir / "metrics.csv")
    return frame.loc[frame["eval_reward"].notna()].sort_values("step")["eval_reward"].tolist()
