"""The confirmation stage of ``flowzoo tune``: the pick is confirmed on fresh seeds, against the untuned recipe.

The best of N noisy trials is biased upward (the winner's curse): on the tiny rare-counting study's first tuning, one
tuning seed on a sparse reward, every tuned cell but one ended *lower* on the study's seeds than at the shared recipe.
So when a design has ``confirmation: {seeds: [...], top_k: K}``, after a cell's trials are spent the K best complete
trials and the cell's shared recipe (no tuned value) each train once per confirmation seed, on the same validation
split as the trials (benchmark/tuning/cells.py ``trial_configs``), and:

- the pick is the candidate with the highest mean objective on the confirmation seeds;
- when that is the shared recipe, the cell keeps it: its tuned file holds no value and says so;
- the page shows each candidate's mean with a bootstrap interval over the confirmation seeds, the paired difference
  of the pick against the shared recipe, and the objective's between-seed spread at the pick (is the tuning's noise
  small enough for its trials to tell the top recipes apart?).

The runs live in ``RUNS/<suite>/tuning/<task>/<algorithm>/confirm/<candidate>/s<seed>`` (a killed tune resumes them:
finished runs are kept, killed ones resume from their checkpoints); the objectives are stored in the cell's Optuna
study (user attribute ``confirmation``), so ``flowzoo tune --report`` needs the storage alone. How often the plain
argmax and the confirmed pick choose a recipe worse than the default: ``benchmark/tuning/selection.py``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from flowzoo.algorithms.engine.distributed import SingleProcess
from flowzoo.benchmark.analysis.stats import bootstrap_ci
from flowzoo.benchmark.run.runner import Runner, is_finished
from flowzoo.benchmark.run.suite import Suite
from flowzoo.benchmark.config.tuning_design import TuningDesign
from flowzoo.benchmark.tuning.tune import Cell, counted, curve_value, eval_curve, open_storage, trial_configs

SHARED = "shared"  # the candidate that runs the cell's shared (untuned) recipe
ATTRIBUTE = "confirmation"


@dataclass(frozen=True)
class Candidate:
    label: str  # "shared" or "trial<N>"
    trial: int | None
    values: dict  # the study's parameter names -> values (empty for the shared recipe)


def candidates(study, top_k: int) -> list[Candidate]:
    """The shared recipe and the ``top_k`` best complete trials (highest objective, the lower number among equals)."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    best = sorted(complete, key=lambda t: (-t.value, t.number))[:top_k]
    return [Candidate(SHARED, None, {}), *(Candidate(f"trial{t.number}", t.number, dict(t.params)) for t in best)]


def confirm_cell(suite: Suite, design: TuningDesign, cell: Cell, storage_url: str, trials_dir: Path, budget: int,
                 threads: int | None = None, workers: int = 1) -> pd.DataFrame | None:
    """Run the cell's confirmation (module docstring) once its trials are spent; the rows (candidate, trial, seed,
    objective, cpu_s), also stored in its study. None when the design has no confirmation or the trials are not all
    done (``flowzoo tune`` runs it again after the next trials)."""
    import optuna

    if design.confirmation is None:
        return None
    storage = open_storage(storage_url)
    study = optuna.load_study(study_name=f"{suite.name}/{cell.study_name}", storage=storage)
    if counted(study) < budget or any(t.state.name in ("RUNNING", "WAITING") for t in study.get_trials(deepcopy=False)):
        return None
    root = Path(trials_dir) / cell.task / cell.algorithm / "confirm"
    runs = [(candidate, config) for candidate in candidates(study, design.confirmation.top_k)
            for config in trial_configs(suite, design, cell, candidate.values, root / candidate.label,
                                        seeds=design.confirmation.seeds)]
    for _, config in runs:
        config.train.threads = config.train.threads or threads or (1 if workers > 1 else None)
    cpu = dict(_train_all([config for _, config in runs], workers))
    rows = [{"candidate": candidate.label, "trial": candidate.trial, "seed": config.seed,
             "objective": curve_value(eval_curve(config.resolved_run_dir()), design.objective),
             "cpu_s": cpu[str(config.resolved_run_dir())],
             "values": json.dumps(candidate.values, sort_keys=True, default=str)} for candidate, config in runs]
    for label in dict.fromkeys(r["candidate"] for r in rows):
        mine = [r["objective"] for r in rows if r["candidate"] == label]
        print(f"tune {suite.name} {cell.study_name} confirmation {label}: {np.mean(mine):.4f} over {len(mine)} seeds",
              flush=True)
    study.set_user_attr(ATTRIBUTE, rows)
    return pd.DataFrame(rows)


def _train(config) -> tuple[str, float]:
    """One confirmation run (kept when finished, resumed when killed): its directory and the CPU seconds it took."""
    run_dir = config.resolved_run_dir()
    start = time.process_time()
    if not is_finished(run_dir, config):
        Runner(config, progress=False, dist=SingleProcess()).run()
    return str(run_dir), round(time.process_time() - start, 3)


def _train_all(configs: list, workers: int) -> list[tuple[str, float]]:
    """Every run, in ``workers`` processes (each run's CPU seconds measured in its own process)."""
    if workers <= 1 or len(configs) <= 1:
        return [_train(config) for config in configs]
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from flowzoo.errors import RunError

    try:
        with ProcessPoolExecutor(max_workers=min(workers, len(configs))) as pool:
            return list(pool.map(_train, configs))
    except BrokenProcessPool:  # kill -9 of one (the out-of-memory killer's way): one line, not the pool's traceback
        raise RunError("a process of the confirmation died (killed, likely by the out-of-memory killer); its finished "
                       "runs are kept: rerun the same command to resume the others from their checkpoints") from None


def stored_rows(study) -> pd.DataFrame | None:
    """The confirmation rows a study holds, or None."""
    rows = study.user_attrs.get(ATTRIBUTE)
    return pd.DataFrame(rows) if rows else None


@dataclass(frozen=True)
class Verdict:
    """What the confirmation decided for one cell."""

    pick: str  # a candidate label; SHARED keeps the shared recipe
    values: dict  # the pick's parameter values (empty for the shared recipe)
    table: pd.DataFrame  # per candidate: mean, ci_low, ci_high, sd, n
    difference: tuple[float, float, float]  # the best tuned candidate minus shared, paired by seed: mean, ci
    best_tuned: str | None

    @property
    def keeps_shared(self) -> bool:
        return self.pick == SHARED

    def sentence(self) -> str:
        """One line for the page."""
        if self.best_tuned is None:
            return "no complete trial: the shared recipe is kept"
        mean, low, high = self.difference
        shown = f"{self.best_tuned} - shared = {mean:+.4f} [{low:+.4f}, {high:+.4f}] on the confirmation seeds"
        if self.keeps_shared:
            return f"the shared recipe is kept: no tuned candidate beat it ({shown})"
        return f"tuned pick {self.pick} ({shown})"


def verdict(rows: pd.DataFrame) -> Verdict:
    """The pick from the confirmation rows: the highest mean objective; each candidate's mean with a 95% bootstrap
    interval over seeds (benchmark/analysis/stats.py, the report's and the study's intervals) and its spread."""
    summary = []
    for label, group in rows.groupby("candidate", sort=False):
        values = group["objective"].to_numpy(dtype=float)
        low, high = bootstrap_ci(values)
        summary.append({"candidate": label, "trial": group["trial"].iloc[0], "mean": float(values.mean()),
                        "ci_low": low, "ci_high": high, "sd": float(values.std(ddof=1)) if len(values) > 1 else math.nan,
                        "n": len(values), "values": group["values"].iloc[0], "cpu_s": float(group["cpu_s"].sum())})
    table = pd.DataFrame(summary)
    tuned = table[table["candidate"] != SHARED].sort_values(["mean", "trial"], ascending=[False, True])
    best_tuned = None if tuned.empty else str(tuned.iloc[0]["candidate"])
    shared_mean = float(table.loc[table["candidate"] == SHARED, "mean"].iloc[0])
    pick = SHARED if best_tuned is None or float(tuned.iloc[0]["mean"]) <= shared_mean else best_tuned
    difference = (math.nan, math.nan, math.nan)
    if best_tuned is not None:
        paired = (rows[rows["candidate"] == best_tuned].set_index("seed")["objective"]
                  - rows[rows["candidate"] == SHARED].set_index("seed")["objective"]).dropna().to_numpy(dtype=float)
        difference = (float(paired.mean()), *bootstrap_ci(paired))
    values = {} if pick == SHARED else json.loads(table.loc[table["candidate"] == pick, "values"].iloc[0])
    return Verdict(pick, values, table, difference, best_tuned)


def confirm_cells(suite: Suite, design: TuningDesign, cells: list[Cell], storage_url: str, trials_dir: Path,
                  budget: int, threads: int | None = None, workers: int | None = None) -> None:
    """The confirmation of every cell whose trials are spent (``flowzoo tune`` runs it after the trials, here, its
    runs in ``workers`` processes: default the number of CPUs)."""
    import os

    workers = workers or os.cpu_count() or 1
    if design.confirmation is None:
        return
    runs = len(design.confirmation.seeds) * (design.confirmation.top_k + 1)
    print(f"tune {suite.name}: confirmation of {len(cells)} cells, up to {runs} runs each (the shared recipe and the "
          f"{design.confirmation.top_k} best trials x seeds {list(design.confirmation.seeds)})", flush=True)
    for cell in cells:
        confirm_cell(suite, design, cell, storage_url, trials_dir, budget, threads, workers)
