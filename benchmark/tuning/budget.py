"""The budget of a cell's trials and the queue of re-runs: which trials count (complete, pruned, running), which died
(their process gone on this host, or unclaimed past a grace), how a dead trial is failed and queued again with its
values, and how a queued copy that another trial already re-runs is told apart from an over-budget trial."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path


RETRIES = 3  # a trial killed more often than this is left failed (the budget then takes a fresh one)


class OverBudget(Exception):
    """The cell's budget is spent by trials numbered before this one."""


def _process_id() -> str:
    """host:pid:start time, so a reused pid is not taken for the process that died."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def _dead_here(worker: str) -> bool:
    """The trial's process ran on this host and is gone (another host's trials are Optuna's heartbeat's)."""
    host, _, rest = worker.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return started not in ("?", _start_time(int(pid)))


def _retry(study, trial, params: dict | None = None) -> None:
    """A trial whose process died runs again with the same values (the failed_trial_callback of the storage)."""
    first = trial.user_attrs.get("retry_of", trial.number)
    if trial.user_attrs.get("retries", 0) >= RETRIES:
        return
    study.enqueue_trial(trial.params if params is None else params, user_attrs={"retry_of": first, "retries": trial.user_attrs.get("retries", 0) + 1})


def _duplicate_retry(trial, trials: list | None = None) -> bool:
    """Whether this trial re-runs a dead trial that a lower-numbered trial already re-runs (or re-ran); ``trials``:
    the study's trials (default: read from ``trial.study``)."""
    from optuna.trial import TrialState

    if "retry_of" not in trial.user_attrs:
        return False
    key = (trial.user_attrs["retry_of"], trial.user_attrs.get("retries"))
    live = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
    trials = trial.study.get_trials(deepcopy=False, states=live) if trials is None else trials
    return any(t.state in live and t.number < trial.number
               and (t.user_attrs.get("retry_of"), t.user_attrs.get("retries")) == key for t in trials)


def waiting_duplicate(study) -> bool:
    """Whether a queued trial re-runs what a lower-numbered trial already re-runs (or re-ran): a copy left by two
    workers that both failed one dead trial. The budget loop pops such a copy (marking it ``duplicate``, uncounted)
    even when the budget is spent, so no copy stays queued: a later larger ``--trials`` would pop it and, before the
    copy was told apart from an over-budget trial, end its worker one trial short; a queued trial also holds back the
    confirmation."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    return any(_duplicate_retry(t, trials) for t in trials if t.state == TrialState.WAITING)


#: how long a running trial may stay unclaimed (no ``worker`` attribute yet) before it counts as dead: a process
#: killed between Optuna creating the trial and the objective's first line leaves such a trial, running forever
UNCLAIMED_GRACE_S = 60.0


def fail_dead_trials(study, grace_s: float = UNCLAIMED_GRACE_S, lock=None) -> None:
    """Fail (and re-run) the running trials of this host whose process is dead: no waiting for the heartbeat.

    A running trial that no worker has claimed is dead once it is ``grace_s`` old (a live worker claims its trial as
    the objective's first step); while a younger one is unclaimed this waits for it to be claimed or to age out, so a
    resumed tune never leaves one running forever and counted against the budget. Each look runs under ``lock`` (the
    SQLite storage's :func:`claim_lock`): SQLite reads a trial's state and writes FAIL without a row lock between, so
    two workers resuming at once both failed one dead trial and both queued its re-run (a duplicate)."""
    import datetime
    from contextlib import nullcontext

    from optuna.trial import TrialState

    while True:
        waiting = False
        with lock if lock is not None else nullcontext():
            for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                worker = trial.user_attrs.get("worker")
                if worker:
                    if _dead_here(worker):
                        _fail(study, trial, trial.params)
                    continue
                age = (datetime.datetime.now() - trial.datetime_start).total_seconds() if trial.datetime_start else 0.0
                if age < grace_s:
                    waiting = True
                elif "retry_of" in trial.user_attrs:  # a re-run popped from the queue: its values are still owed
                    _fail(study, trial, trial.system_attrs.get("fixed_params", {}))
                else:  # it died before drawing anything: nothing to re-run
                    _fail(study, trial, None)
        if not waiting:
            return
        time.sleep(1.0)


def _fail(study, trial, params: dict | None) -> None:
    """Mark a dead trial failed and, with its values, queue it again (unless another worker failed it first)."""
    import optuna
    from optuna.trial import TrialState

    try:
        changed = study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    except (RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
        changed = False  # another worker failed it first
    if changed and params is not None:
        _retry(study, trial, params)


def counted(study, before: int | None = None) -> int:
    """Trials that count against the budget (complete, pruned, running), those numbered below ``before`` if given."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    return sum(1 for t in study.get_trials(deepcopy=False, states=states) if before is None or t.number < before)
