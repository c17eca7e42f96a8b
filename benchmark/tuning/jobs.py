"""``flowzoo tune --executor slurm``: the tune workers as scheduler jobs (submitit), each one worker seeded as the local
worker of its index, asking for the largest of its cells' resources; the progress lines printed here as the storage
shows the trials."""

from __future__ import annotations

import math
import os
from typing import Any

from flowzoo.benchmark.run.executors import Resources
from flowzoo.benchmark.run.suite import Suite
from flowzoo.benchmark.tuning.cells import Cell
from flowzoo.benchmark.tuning.storage import open_storage, resolve_storage, shown_url, storage_for_jobs
from flowzoo.benchmark.tuning.studies import progress_line
from flowzoo.benchmark.tuning.trial_worker import _worker


class TuneJob:
    """One tune worker as a submitit job: the trials of every cell against the shared storage until each budget is
    spent, seeded as local worker ``worker_index`` is. Preempted or out of time, it is requeued as it is; the trial
    it was running is failed and re-run with the same values (its runs resume from their checkpoints) by the next
    worker that looks: at once on the same host (its pid is gone), else after the heartbeat grace."""

    def __init__(self, args: tuple, threads: int | None, worker_index: int, key: str, cwd: str | None = None):
        self.args, self.threads, self.worker_index, self.key = args, threads, worker_index, key
        self.cwd = cwd or os.getcwd()  # --runs and a relative sqlite path are relative to where tune started

    def __call__(self) -> tuple[str, str | None]:
        os.chdir(self.cwd)
        url = resolve_storage(self.args[4])  # a password travels in a 0600 file, never in the job's pickle or log
        print(f"flowzoo tune job: worker {self.worker_index} on {shown_url(url)}", flush=True)
        _worker(*self.args[:4], url, *self.args[5:], self.threads, self.worker_index)
        return self.key, None

    def checkpoint(self, *args, **kwargs):
        """submitit's preemption/timeout hook: resubmit this worker unchanged."""
        import submitit

        print(f"flowzoo tune job: worker {self.worker_index} interrupted by the scheduler; requeued", flush=True)
        return submitit.helpers.DelayedSubmission(TuneJob(self.args, self.threads, self.worker_index, self.key,
                                                          self.cwd), *args, **kwargs)


def worker_resources(suite: Suite, cells: list[Cell], site: dict | None) -> Resources:
    """What one tune job asks for: the largest of its cells' tasks' resources (a worker trains every cell's trials,
    one run at a time in its own process: one GPU at most, its CPUs as torch threads)."""
    from flowzoo.benchmark.run.suite import task_resources

    each = [task_resources(suite, task, site) for task in dict.fromkeys(c.task for c in cells)]
    return Resources(gpus=min(1, max(r.gpus for r in each)), cpus=max(r.cpus for r in each),
                     mem_gb=max(r.mem_gb for r in each), time_min=max(r.time_min for r in each))


class TrialLines:
    """The progress line of each trial the jobs finish, printed here as the storage shows it (the jobs' own lines go
    to their logs)."""

    def __init__(self, suite: Suite, cells: list[Cell], budget: int, url: str):
        self.suite, self.cells, self.budget, self.url = suite, cells, budget, url
        self.seen: set[tuple[str, int]] = set()
        self.storage = None  # opened once, at the first look (opening one checks the schema: not at every poll)
        self.studies: dict[str, Any] = {}

    def __call__(self) -> None:
        import optuna
        from optuna.trial import TrialState

        self.storage = self.storage or open_storage(self.url)
        for cell in self.cells:
            study = self.studies.get(cell.study_name)
            if study is None:
                try:
                    study = optuna.load_study(study_name=f"{self.suite.name}/{cell.study_name}", storage=self.storage)
                except KeyError:  # no job has opened it yet
                    continue
                self.studies[cell.study_name] = study
            for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
                if (cell.study_name, trial.number) in self.seen:
                    continue
                self.seen.add((cell.study_name, trial.number))
                seconds = (trial.datetime_complete - trial.datetime_start).total_seconds()
                print(progress_line(self.suite, cell, study, trial, self.budget, seconds), flush=True)


def tune_as_jobs(executor, suite: Suite, cells: list[Cell], args: tuple, workers: int, budget: int) -> None:
    """``workers`` scheduler jobs, each one tune worker (:class:`TuneJob`, worker indices 0..workers-1 as local
    workers have), waited for; a failed job is one line naming it and its log."""
    from flowzoo.benchmark.run.executors import GridJob
    from flowzoo.errors import RunError

    res = worker_resources(suite, cells, executor.cluster.resources)
    executor.check([res])
    url = args[4]
    scope = f"{','.join(c.study_name for c in cells)} x {budget} trials on {shown_url(url)}"
    job_args = (*args[:4], storage_for_jobs(url, executor.folder), *args[5:])
    jobs = []
    for index in range(workers):
        key = f"tune {suite.name} worker {index}/{workers}: {scope}"  # a rerun waits for its live job
        jobs.append(GridJob(key, f"tune/{suite.name}/worker{index}", TuneJob(job_args, res.threads, index, key), res))
    failures: list[str] = []
    executor.run_jobs(jobs, workers, math.inf, lambda key, error: error and failures.append(error),
                      on_poll=TrialLines(suite, cells, budget, url))
    if failures:
        raise RunError(f"{len(failures)} of {workers} tune job(s) failed (first: {failures[0]}); finished trials are "
                       f"kept: rerun the same command to go on")
