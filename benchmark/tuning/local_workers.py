"""The local tune workers of ``flowzoo tune --workers N``: N processes started here, each training trials against the
shared storage, waited for; and what the command says when one of them dies.

A worker that raises (a bad value, Ctrl-C) passes its error back, and the command raises it once every worker has
ended. A worker that dies without a word (``kill -9``: what the out-of-memory killer sends) stops the others as Ctrl-C
does (their trials are failed and queued again with their values) and is reported in one line naming the signal and
the trial it was running, which :func:`worker_death` fails and queues again too: the storage is left
with no trial running, and a rerun of the same command resumes every interrupted trial from its runs' checkpoints
and finishes the budget.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Callable

from flowzoo.benchmark.run.suite import Suite
from flowzoo.benchmark.tuning.budget import _fail
from flowzoo.benchmark.tuning.cells import Cell
from flowzoo.benchmark.tuning.storage import claim_lock, open_storage
from flowzoo.errors import ConfigError


def die_with_parent(parent: int) -> None:
    """A local worker ends with the ``flowzoo tune`` that started it (Linux ``PR_SET_PDEATHSIG``): a kill -9 of the
    command leaves no worker training unseen (its trial is failed and re-run by the next tune, from its runs'
    checkpoints). Elsewhere a no-op."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call: nothing would signal us
        os._exit(1)


class WorkerTraceback(Exception):
    """A worker's traceback, attached as the cause of the error it passed back (a bug shows where it happened)."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Death:
    """A worker that ended without passing back a result: its index, pid and exit code (negative: the signal)."""

    index: int
    pid: int
    exitcode: int | None

    def how(self) -> str:
        """How it ended, in words: ``killed by SIGKILL (likely the out-of-memory killer)``, ``exited with status 1``."""
        if self.exitcode is not None and self.exitcode < 0:
            try:
                name = signal.Signals(-self.exitcode).name
            except ValueError:
                name = f"signal {-self.exitcode}"
            oom = " (likely the out-of-memory killer, which sends it)" if -self.exitcode == signal.SIGKILL else ""
            return f"killed by {name}{oom}"
        return f"exited with status {self.exitcode} without a result"


def _child(connection, parent: int, target: Callable, args: tuple) -> None:
    die_with_parent(parent)
    try:
        target(*args)
        outcome = None
    except BaseException as error:  # noqa: BLE001 - every error goes back to the command, Ctrl-C included
        outcome = (error, traceback.format_exc())
    try:
        connection.send(outcome)
    except Exception:  # an error that does not pickle: its traceback as text
        connection.send((RuntimeError(outcome[1].strip().splitlines()[-1]), outcome[1]))
    connection.close()


def run_local_workers(target: Callable, args_of: Callable[[int], tuple], workers: int) -> Death | None:
    """``target(*args_of(index))`` in ``workers`` processes, waited for. The first worker that dies without a result
    stops the others (SIGINT, as Ctrl-C) and is returned once all have ended; else the first error a worker passed
    back is raised (with its traceback as the cause) once all have ended; else None."""
    context = multiprocessing.get_context()
    parent = os.getpid()
    running: dict = {}  # sentinel -> (index, process, connection)
    for index in range(workers):
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_child, args=(send, parent, target, args_of(index)), daemon=False)
        process.start()
        send.close()
        running[process.sentinel] = (index, process, receive)
    outcomes: dict[int, object] = {}
    try:
        death = _wait(running, outcomes)
    except KeyboardInterrupt:  # Ctrl-C reached the workers too: let them queue their trials again, then stop
        for _, process, _ in running.values():
            process.join()
        raise
    if death is not None:
        return death
    errors = [outcomes[i] for i in sorted(outcomes) if outcomes[i] is not None and outcomes[i] is not _DIED]
    if errors:
        error, text = errors[0]
        raise error from WorkerTraceback(text)
    return None


def _wait(running: dict, outcomes: dict) -> Death | None:
    """Every worker's end and what it passed back (into ``outcomes``); the first that died without a result."""
    death: Death | None = None
    while running:
        readers = {connection: index for index, _, connection in running.values() if index not in outcomes}
        for ready in wait([*running, *readers]):
            if ready in readers:
                outcomes[readers[ready]] = _receive(ready)
                continue
            index, process, connection = running.pop(ready)
            process.join()
            if index not in outcomes:  # what it sent before it ended is still in the pipe
                outcomes[index] = _receive(connection) if connection.poll() else _receive(None)
            connection.close()
            if outcomes[index] is _DIED and death is None:
                death = Death(index, process.pid, process.exitcode)
                for _, other, _ in running.values():  # stop the others as Ctrl-C does: their trials queued again
                    if other.is_alive():
                        os.kill(other.pid, signal.SIGINT)
    return death


_DIED = object()  # a worker that passed back nothing


def _receive(connection):
    if connection is None:
        return _DIED
    try:
        return connection.recv()
    except (EOFError, OSError):
        return _DIED


#: local tune workers per CPU at most: each is a training process, and beyond a few per core they only contend (and
#: hundreds meet the process limit)
LOCAL_WORKERS_PER_CPU = 4


def worker_death(suite: Suite, cells: list[Cell], url: str, budget: int, workers: int, death) -> str:
    """The one line for a local worker that died (:class:`Death`), naming the trial it
    was running, which is failed and queued again with its values here (so the storage holds no trial running)."""
    import socket
    from contextlib import nullcontext

    import optuna
    from optuna.trial import TrialState

    storage, lock = open_storage(url), claim_lock(url)
    prefix = f"{socket.gethostname()}:{death.pid}:"
    where = []
    for cell in cells:
        try:
            study = optuna.load_study(study_name=f"{suite.name}/{cell.study_name}", storage=storage)
        except KeyError:  # no worker opened it
            continue
        with lock if lock is not None else nullcontext():
            mine = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.FAIL))
                    if str(t.user_attrs.get("worker", "")).startswith(prefix)
                    and not {"duplicate", "over_budget"} & set(t.user_attrs)]  # failed on purpose, not by its death
            # its last trial: still running, or already failed and queued again by a surviving worker that looked
            # for dead trials before this (budget.fail_dead_trials): named either way
            last = max(mine, key=lambda t: t.number, default=None)
            if last is not None:
                where.append(f"trial {last.number} of {cell.study_name}")
                if last.state == TrialState.RUNNING:
                    _fail(study, last, last.params)
    during = f"in {', '.join(where)}" if where else "between trials"
    return (f"tune {suite.name}: worker {death.index + 1} of {workers} (pid {death.pid}) died, {death.how()}, {during}; "
            f"the other workers were stopped; finished trials are kept and the interrupted ones queued again: rerun "
            f"the same command to resume them from their checkpoints and finish the budget ({budget} trials per cell)")


def check_workers(workers: int, total_trials: int, local: bool) -> None:
    """A one-line ConfigError for more workers than trials to run (the rest would idle), or, run here, more processes
    than ``LOCAL_WORKERS_PER_CPU`` per CPU; before anything is written."""
    if workers > total_trials:
        raise ConfigError(f"--workers {workers}: the tuning has {total_trials} trial(s) in all, so at most "
                          f"{total_trials} worker(s) can have one")
    most = LOCAL_WORKERS_PER_CPU * (os.cpu_count() or 1)
    if local and workers > most:
        raise ConfigError(f"--workers {workers}: at most {most} local worker processes on this machine's "
                          f"{os.cpu_count() or 1} CPU(s) ({LOCAL_WORKERS_PER_CPU} per CPU); use --executor slurm for "
                          f"more")
