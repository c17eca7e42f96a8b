"""A tune worker: the objective of one trial (claim it, check the budget, draw the values, train each tuning seed,
report every evaluation's partial objective to the pruner) and the loop of trials of each cell until its budget is
spent."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from flowzoo.algorithms.engine.distributed import SingleProcess
from flowzoo.benchmark.run.runner import Runner
from flowzoo.benchmark.run.suite import Suite
from flowzoo.benchmark.tuning.budget import (OverBudget, _duplicate_retry, _process_id, _retry, counted,
                                             fail_dead_trials, waiting_duplicate)
from flowzoo.benchmark.tuning.cells import Cell, load_tuning, trial_configs, tuning_cells
from flowzoo.benchmark.config.tuning_design import TuningDesign
from flowzoo.benchmark.tuning.objective import eval_curve, evaluations_per_run, objective_value
from flowzoo.benchmark.tuning.storage import claim_lock, open_storage
from flowzoo.benchmark.tuning.studies import WORKER_SEED_STRIDE, drawn, make_sampler, open_study, progress_line
from flowzoo.errors import FlowZooError


class Objective:
    """One trial of a cell: check the budget, draw the values, train every tuning seed, return the objective."""

    def __init__(self, suite: Suite, design: TuningDesign, cell: Cell, budget: int, trials_dir: Path, threads: int | None,
                 claimed=None):
        self.suite, self.design, self.cell, self.budget = suite, design, cell, budget
        self.trials_dir, self.threads = trials_dir, threads
        self.claimed = claimed  # called once the trial is this process's (releases the claim lock)

    def __call__(self, trial) -> float:
        import optuna

        trial.set_user_attr("worker", _process_id())
        if self.claimed is not None:
            self.claimed()
        if _duplicate_retry(trial):  # two workers both re-queued one dead trial: the lower-numbered copy runs it
            trial.set_user_attr("duplicate", True)  # uncounted, and its worker goes on (the budget may not be spent)
            raise OverBudget(trial.number)
        if counted(trial.study, before=trial.number) >= self.budget:
            trial.set_user_attr("over_budget", True)
            raise OverBudget(trial.number)
        values = {name: knob.suggest(trial, name) for name, knob in self.cell.all_knobs().items()}
        directory = self.trials_dir / f"trial{trial.user_attrs.get('retry_of', trial.number)}"
        configs = trial_configs(self.suite, self.design, self.cell, values, directory)
        per_run = evaluations_per_run(configs[0].train.steps, configs[0].train.eval_every)
        curves: list[list[float]] = []
        reported: set[int] = set()

        def report(curve: list[float]) -> None:
            """Each new evaluation's partial objective, at position (seed index, evaluation index)."""
            for j in range(len(curve)):
                step = len(curves) * per_run + j
                if step not in reported:
                    reported.add(step)
                    trial.report(objective_value([*curves, curve[: j + 1]], self.design.objective), step)
            if trial.should_prune():
                raise optuna.TrialPruned()

        cpu_start = time.process_time()  # the trial's compute, pruned or not (the tuning page sums it per cell)
        try:
            return self._train(trial, values, configs, report, curves)
        except KeyboardInterrupt:  # Optuna marks the trial failed: queue its values, so a rerun resumes its runs
            _retry(trial.study, trial, values)
            raise
        finally:
            trial.set_user_attr("cpu_s", round(time.process_time() - cpu_start, 3))

    def _train(self, trial, values: dict, configs: list, report, curves: list) -> float:
        """Train the trial's runs, one per tuning seed, reporting each evaluation; the objective of their curves."""
        import optuna

        for config in configs:
            config.train.threads = config.train.threads or self.threads
            try:
                Runner(config, progress=False, dist=SingleProcess(), on_evaluation=lambda rows: report(
                    [r["eval_reward"] for r in rows if not _missing(r.get("eval_reward"))])).run()
            except FlowZooError as error:  # a diverged run: the trial ends where it stopped, as if pruned there
                trial.set_user_attr("stopped", str(error).splitlines()[0][:300])
                raise optuna.TrialPruned() from None
            curve = eval_curve(config.resolved_run_dir())
            report(curve)
            curves.append(curve)
        return objective_value(curves, self.design.objective)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def tune_cell(suite: Suite, design: TuningDesign, cell: Cell, budget: int, storage_url: str, trials_dir: Path,
              threads: int | None = None, worker_index: int = 0) -> None:
    """Trials of one cell until its budget is spent (complete + pruned + running elsewhere)."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # its "trial failed" traceback on Ctrl-C: our one line instead
    storage = open_storage(storage_url)
    study = open_study(storage, suite, design, cell)
    lock = claim_lock(storage_url)
    release = (lambda: lock.release(force=True)) if lock is not None else None
    objective = Objective(suite, design, cell, budget, trials_dir / cell.task / cell.algorithm, threads, release)
    while True:
        fail_dead_trials(study, lock=lock)
        if counted(study) >= budget and not waiting_duplicate(study):
            return
        # seeded by the trials so far and this worker's index: two workers that ask at the same moment must not
        # draw the same values (worker 0 alone: a serial tune is reproducible)
        study.sampler = make_sampler(design, drawn(study) + WORKER_SEED_STRIDE * worker_index)
        started = time.perf_counter()
        if lock is not None:
            lock.acquire()  # released by the objective once its trial is claimed (claim_lock)
        try:
            study.optimize(objective, n_trials=1, catch=(OverBudget,))
        finally:
            if lock is not None:
                lock.release(force=True)  # no-op when the objective released it
        last = max((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("worker") == _process_id()),
                   key=lambda t: t.number, default=None)
        if last is not None and last.user_attrs.get("duplicate"):
            continue
        if last is None or last.user_attrs.get("over_budget"):
            return
        if last.state in (TrialState.COMPLETE, TrialState.PRUNED):
            print(progress_line(suite, cell, study, last, budget, time.perf_counter() - started), flush=True)


def _worker(suite_ref: str, tasks: str | None, algorithms: str | None, trials: int | None, storage_url: str,
            trials_dir: str, threads: int | None, worker_index: int = 0) -> None:
    suite, design = load_tuning(suite_ref)
    budget = trials or design.trials
    for cell in tuning_cells(suite, design, tasks, algorithms):
        tune_cell(suite, design, cell, budget, storage_url, Path(trials_dir), threads, worker_index)
