"""Round 5 of hostile inputs, tune interruption and concurrency (issue 73, items 10, 11 and 13): several `flowzoo tune`
commands on one fresh storage, a duplicate re-run left by a 2-worker resume, and kill -9 of one tune worker."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from flowzoo.benchmark.cli import main
from flowzoo.benchmark.tuning import tune as tuning
from flowzoo.errors import RunError
from tests.test_tuning import _tune_args, states, studies, write_suite

ROOT = Path(__file__).resolve().parents[1]
STUDY = "mini/toy2d_mode/flow_grpo"


def _counted(study) -> list:
    return [t for t in study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED")]


# ------------------------------------------------------------------------ item 10: commands at once, fresh storage

#: each command: Optuna's stamp of a new storage's schema version slowed by 2 s, between reading that none is stamped
#: and writing it (the window of the race, widened so that it is hit every time, not about half the time), then a
#: wait for the test's go file, so that the commands open the fresh storage at the same moment
AT_ONCE = """
import sys, time
from pathlib import Path
from alembic.runtime import migration
original = migration.HeadMaintainer.__init__
def slow(self, *args, **kwargs):
    time.sleep(2.0)
    return original(self, *args, **kwargs)
migration.HeadMaintainer.__init__ = slow
from flowzoo.benchmark.cli import main
go = Path(sys.argv[1])
(go.parent / ("ready" + sys.argv[2])).touch()
while not go.exists():
    time.sleep(0.01)
sys.exit(main(sys.argv[3:]))
"""


def test_three_tune_commands_at_once_on_a_fresh_storage_all_succeed(tmp_path):
    """Item 10: one of three commands failed with an IntegrityError on alembic_version (or "table ... already
    exists"): each made the new storage's schema. Now the first makes it under a lock beside the file; the three
    share the budget exactly."""
    suite_file = write_suite(tmp_path, **{"tuning.pruner.name": "none"})
    runs, go = tmp_path / "runs", tmp_path / "go"
    commands = [subprocess.Popen([sys.executable, "-c", AT_ONCE, str(go), str(i),
                                  *_tune_args(suite_file, runs, "--trials", "3")],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(3)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    results = [(c.wait(timeout=300), c.stderr.read()) for c in commands]
    assert [code for code, _ in results] == [0, 0, 0], [err[-500:] for _, err in results]
    assert not any(err.strip() for _, err in results)
    study = studies(runs)[STUDY]
    assert len(_counted(study)) == 3 and "RUNNING" not in states(study) and "WAITING" not in states(study)


# -------------------------------------------------------------- item 11: a duplicate re-run left by a 2-worker resume

def _dead_worker() -> str:
    """The worker id (host:pid:start) of a process that has ended: what a trial of a kill -9'd tune records."""
    line = subprocess.run([sys.executable, "-c", "import os; print(os.getpid(), open(f'/proc/{os.getpid()}/stat')"
                           ".read().rsplit(')', 1)[1].split()[19])"], capture_output=True, text=True, check=True)
    pid, started = line.stdout.split()
    return f"{socket.gethostname()}:{pid}:{started}"


def _killed_trial(suite_file: Path, study):
    """A trial as kill -9 of its tune leaves it: running, its values drawn, claimed by a worker that is gone."""
    suite, design = tuning.load_tuning(str(suite_file))
    cell = tuning.tuning_cells(suite, design, "toy2d_mode", "flow_grpo")[0]
    trial = study.ask()
    values = {name: knob.suggest(trial, name) for name, knob in cell.all_knobs().items()}
    trial.set_user_attr("worker", _dead_worker())
    return study.get_trials(deepcopy=False)[trial.number], values


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")
def test_a_duplicate_rerun_left_in_the_queue_never_cuts_a_later_budget(tmp_path):
    """Item 11, on a storage state built here (deterministic), the one kill -9 and a 2-worker resume left: trial 1
    killed, and both resuming workers failed it and queued its re-run (two queued copies with one retry key). The
    resume to 2 trials ran one copy and left the other queued; `--trials 3` then popped it, took it for an
    over-budget trial and exited 0 one trial short. Now no copy stays queued and every budget is exact."""
    suite_file = write_suite(tmp_path, **{"tuning.pruner.name": "none"})
    runs = tmp_path / "runs"
    assert main(_tune_args(suite_file, runs, "--trials", "1")) == 0
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{runs / 'mini' / 'tuning' / 'optuna.db'}")
    killed, values = _killed_trial(suite_file, study)
    study._storage.set_trial_state_values(killed._trial_id, TrialState.FAIL)  # both racing workers wrote this
    for _ in range(2):  # and each queued the re-run
        tuning._retry(study, killed, values)
    assert states(study).count("WAITING") == 2
    assert main(_tune_args(suite_file, runs, "--trials", "2")) == 0
    study = studies(runs)[STUDY]
    assert len(_counted(study)) == 2 and "WAITING" not in states(study)
    rerun = [t for t in _counted(study) if t.user_attrs.get("retry_of") == killed.number]
    assert len(rerun) == 1 and rerun[0].params == values  # the killed trial's values, run once
    assert main(_tune_args(suite_file, runs, "--trials", "3")) == 0
    study = studies(runs)[STUDY]
    assert len(_counted(study)) == 3 and "WAITING" not in states(study) and "RUNNING" not in states(study)


def _fail_dead_at_once(url: str, barrier, with_lock: bool) -> None:
    import optuna

    study = optuna.load_study(study_name="s", storage=tuning.open_storage(url))
    barrier.wait()
    tuning.fail_dead_trials(study, grace_s=3600.0, lock=tuning.claim_lock(url) if with_lock else None)


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")
@pytest.mark.parametrize("with_lock, queued", [(False, 2), (True, 1)])
def test_two_workers_failing_one_dead_trial_at_once_queue_one_rerun(tmp_path, monkeypatch, with_lock, queued):
    """Item 11's cause: SQLite reads a trial's state and writes FAIL without a row lock between, so two workers
    resuming at once both failed the dead trial and both queued its re-run. That moment is slowed here (1 s) so both
    always read before either writes: without the claim lock two copies are queued (the race, shown), with it one."""
    import optuna

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(storage=tuning.open_storage(url), study_name="s")
    trial = study.ask()
    trial.suggest_float("lr", 1e-5, 1e-3, log=True)
    trial.set_user_attr("worker", _dead_worker())
    check = optuna.storages.RDBStorage.check_trial_is_updatable

    def slow(self, trial_id, trial_state):
        if trial_state == optuna.trial.TrialState.RUNNING:  # read the dead trial running; FAIL not yet written
            time.sleep(1.0)
        return check(self, trial_id, trial_state)

    monkeypatch.setattr(optuna.storages.RDBStorage, "check_trial_is_updatable", slow)  # forked into both
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    workers = [context.Process(target=_fail_dead_at_once, args=(url, barrier, with_lock)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0, 0]
    study = optuna.load_study(study_name="s", storage=tuning.open_storage(url))
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == queued
    assert all(t.system_attrs["fixed_params"] == trial.params for t in waiting)


# --------------------------------------------------------------------------------- item 13: kill -9 of one worker

#: the command with 2 workers, the worker that draws trial 1 killed by SIGKILL as the trial starts training (as the
#: out-of-memory killer ends a process: no Python code runs)
KILL_ONE = """
import os, signal, sys
from flowzoo.benchmark.tuning import tune
original = tune.Objective._train
def train(self, trial, *args, **kwargs):
    if trial.number == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(self, trial, *args, **kwargs)
tune.Objective._train = train
from flowzoo.benchmark.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux /proc")
def test_kill_9_of_one_worker_is_one_line_and_a_rerun_finishes_the_budget(tmp_path):
    """Item 13: a worker killed by SIGKILL gave the process pool's BrokenProcessPool traceback. Now: one line naming
    the worker, the signal, the trial it ran and the rerun; exit 2; no trial left running; the rerun runs the killed
    trial's values and ends with exactly the budget."""
    suite_file = write_suite(tmp_path, **{"tuning.trials": 4, "tuning.pruner.name": "none",
                                          "defaults.train.steps": 40, "defaults.train.eval_every": 10,
                                          "defaults.train.checkpoint_every": 10})
    runs = tmp_path / "runs"
    done = subprocess.run([sys.executable, "-c", KILL_ONE, *_tune_args(suite_file, runs, "--workers", "2")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    err = done.stderr.strip()
    assert done.returncode == 2, err[-2000:]
    assert len(err.splitlines()) == 1, err[-2000:]
    assert err.startswith("flowzoo: error: tune mini: worker ")
    assert "died, killed by SIGKILL (likely the out-of-memory killer" in err
    assert "in trial 1 of toy2d_mode/flow_grpo" in err and "rerun the same command" in err
    study = studies(runs)[STUDY]
    assert "RUNNING" not in states(study)  # the killed trial and the stopped one failed, their values queued
    killed = study.get_trials(deepcopy=False)[1]
    # its values are owed: queued again, or (under load, when the surviving worker found the dead trial before the
    # command stopped it) already re-run by the survivor, finished or queued once more
    owed = study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.COMPLETE, TrialState.PRUNED))
    assert any(t.user_attrs.get("retry_of") == 1 and t.system_attrs["fixed_params"] == killed.params for t in owed)
    assert main(_tune_args(suite_file, runs, "--workers", "2")) == 0
    study = studies(runs)[STUDY]
    ran = _counted(study)
    assert len(ran) == 4 and "RUNNING" not in states(study) and "WAITING" not in states(study)
    assert [t.params for t in ran if t.user_attrs.get("retry_of") == 1] == [killed.params]


def _killed_run(config):
    os.kill(os.getpid(), signal.SIGKILL)


def test_kill_9_of_a_confirmation_process_is_one_line(monkeypatch):
    """The confirmation's runs in a process pool: one killed is one line naming it and the rerun, not the pool's
    traceback."""
    from flowzoo.benchmark.tuning import confirm

    monkeypatch.setattr(confirm, "_train", _killed_run)  # forked into the pool's processes
    with pytest.raises(RunError, match="a process of the confirmation died .* rerun the same command"):
        confirm._train_all([1, 2], workers=2)


def test_a_dead_workers_trial_already_failed_by_a_survivor_is_still_named(tmp_path):
    """The race under load: the surviving worker's look for dead trials (budget.fail_dead_trials) fails and queues the
    killed worker's trial before the command writes its line. The line still names that trial (it said "between
    trials"), and nothing is queued twice."""
    from flowzoo.benchmark.tuning.budget import _fail
    from flowzoo.benchmark.tuning.local_workers import Death, worker_death
    from flowzoo.benchmark.tuning.studies import open_study

    suite, design = tuning.load_tuning(str(write_suite(tmp_path)))
    cells = tuning.tuning_cells(suite, design, None, None)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = open_study(tuning.open_storage(url), suite, design, cells[0])
    pid = 4242
    for state in ("complete", "killed"):
        trial = study.ask()
        trial.suggest_float("lr", 1e-5, 1e-3, log=True)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{pid}:123")
        if state == "complete":
            study.tell(trial, 0.5)
    killed = study.get_trials(deepcopy=False)[1]
    _fail(study, killed, killed.params)  # what the survivor did first
    line = worker_death(suite, cells, url, 4, 2, Death(1, pid, -signal.SIGKILL))
    assert f"in trial 1 of {cells[0].study_name}" in line and "between trials" not in line
    queued = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert len(queued) == 1 and queued[0].user_attrs.get("retry_of") == 1
    # a worker killed between trials (its last one finished) is still said to be between trials
    other = worker_death(suite, cells, url, 4, 2, Death(0, 999999, -signal.SIGKILL))
    assert "between trials" in other
