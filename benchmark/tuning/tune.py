"""``flowzoo tune SUITE``: one Optuna study per (task, algorithm) cell of a suite, the same budget for every cell.

The design comes from the suite's ``tuning:`` section (:mod:`benchmark.config.tuning_design`), the knobs from
each algorithm's and prompt sampler's declared search space (:mod:`benchmark.config.search_space`). A trial
trains the cell's config (the suite's, as ``flowzoo bench`` builds it, with the trial's values in the tuned layer)
once per tuning seed through the runner, reporting every evaluation's partial objective to the pruner.

Fairness by construction: one ``trials`` number for every cell (``--trials`` replaces it for all); the same seeded
TPE sampler and the same pruner; the objective fixed in the suite and recorded in each study, which refuses to
resume under another design. The budget counts complete and pruned trials: a trial numbered after ``trials`` such
trials (finished or running) gives way (it is marked failed with ``over_budget``, so concurrent workers never
overshoot), and a trial whose process died (``kill -9``; on this host at once by its pid, elsewhere by Optuna's
heartbeat) is failed and re-run with the same values in the same run directories, so its runs resume from their
checkpoints and no finished trial is redone. Workers (``--workers N``) are processes sharing the storage, or with
``--executor slurm`` (:func:`tune_as_jobs`) scheduler jobs, one worker each, seeded as the local workers are.

The command's parts: :mod:`benchmark.tuning.cells` (the cells, their spaces and a trial's runs),
:mod:`benchmark.tuning.objective`, :mod:`benchmark.tuning.budget` (the budget and the queue of re-runs),
:mod:`benchmark.tuning.storage`, :mod:`benchmark.tuning.studies`, :mod:`benchmark.tuning.trial_worker` (a trial and a
worker's loop), :mod:`benchmark.tuning.local_workers` and :mod:`benchmark.tuning.jobs` (workers as processes here or
as scheduler jobs). The names other modules use are importable from here.
"""

from __future__ import annotations

from pathlib import Path

from flowzoo.benchmark.run.suite import Suite, cell_keys
from flowzoo.benchmark.tuning.budget import _duplicate_retry, _retry, counted, fail_dead_trials
from flowzoo.benchmark.tuning.cells import (UNREAD_BY_OBJECTIVES, Cell, check_space, inert_knobs, load_tuning,
                                            trial_configs, tuning_cells)
from flowzoo.benchmark.config.tuning_design import TuningDesign
from flowzoo.benchmark.tuning.jobs import TuneJob, tune_as_jobs, worker_resources
from flowzoo.benchmark.tuning.local_workers import check_workers, run_local_workers, worker_death
from flowzoo.benchmark.tuning.objective import curve_value, eval_curve, evaluations_per_run, objective_value
from flowzoo.benchmark.tuning.storage import (CONNECT_TIMEOUT_S, SECRET_FILE, check_report_storage, check_sqlite_storage,
                                              check_storage, claim_lock, default_storage, engine_kwargs, open_storage,
                                              shown_url, storage_for_jobs)
from flowzoo.benchmark.tuning.studies import check_design
from flowzoo.benchmark.tuning.trial_worker import Objective, _worker
from flowzoo.errors import ConfigError, RunError

#: what other modules and the tests import from here (the parts above hold them)
__all__ = ["CONNECT_TIMEOUT_S", "SECRET_FILE", "UNREAD_BY_OBJECTIVES", "Cell", "Objective", "TuneJob",
           "_duplicate_retry", "_retry", "cell_keys", "check_design", "check_report_storage", "check_space",
           "check_sqlite_storage", "check_storage", "claim_lock", "counted", "curve_value", "default_storage",
           "engine_kwargs", "eval_curve", "evaluations_per_run", "fail_dead_trials", "inert_knobs", "load_tuning",
           "objective_value", "open_storage", "shown_url", "storage_for_jobs", "trial_configs", "tune", "tuning_cells",
           "worker_resources"]


def tune(suite_ref: str, runs_dir: Path, workers: int = 1, trials: int | None = None, tasks: str | None = None,
         algorithms: str | None = None, storage: str | None = None,
         executor=None) -> tuple[Suite, TuningDesign, list[Cell], str]:
    """Run every cell's trials (``workers`` processes sharing the storage, or with ``executor``, a
    :class:`benchmark.run.executors.SubmititGrid`, ``workers`` scheduler jobs); returns what the report
    needs."""
    if trials is not None and trials < 1:
        raise ConfigError(f"--trials {trials}: give a positive number of trials (the same for every cell)")
    if workers < 1:
        raise ConfigError(f"--workers {workers}: give at least 1")
    suite, design = load_tuning(suite_ref)
    cells = tuning_cells(suite, design, tasks, algorithms)
    check_workers(workers, len(cells) * (trials or design.trials), executor is None)
    url = storage or default_storage(runs_dir, suite)
    note = check_storage(url, executor.kind if executor is not None else "local")
    for cell in cells:
        check_space(suite, design, cell, Path(runs_dir) / suite.name / "tuning")
    open_storage(url)  # a bad URL fails here, once
    trials_dir = Path(runs_dir) / suite.name / "tuning"
    budget = trials or design.trials
    where = f"{workers} {executor.kind} job(s)" if executor is not None else f"{workers} worker(s)"
    print(f"tune {suite.name}: {len(cells)} cells x {budget} trials x {len(design.seeds)} seeds "
          f"(objective {design.objective}), storage {shown_url(url)}, {where}", flush=True)
    if note:
        print(f"tune {suite.name}: {note}", flush=True)
    for cell in cells:
        for knob, why in cell.inert.items():
            print(f"tune {suite.name} {cell.study_name}: {knob} left out of the space: {why}", flush=True)
    args = (suite_ref, tasks, algorithms, trials, url, str(trials_dir))
    if executor is not None:
        tune_as_jobs(executor, suite, cells, args, workers, budget)
    elif workers == 1:
        _worker(*args, None)
    else:
        death = run_local_workers(_worker, lambda index: (*args, 1, index), workers)
        if death is not None:
            raise RunError(worker_death(suite, cells, url, budget, workers, death))
    return suite, design, cells, url
