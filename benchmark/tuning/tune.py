"""``flowzoo tune SUITE``: one Optuna study per (task, algorithm) cell of a suite, the same budget for every cell.

The design comes from the suite's ``tuning:`` section (:mod:`benchmark.tuning.design`), the knobs from
each algorithm's and prompt sampler's declared search space (:mod:`benchmark.experiments.search_space`). A trial
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
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flowzoo.algorithms.distributed import SingleProcess
from flowzoo.benchmark.experiments.config import ExperimentConfig
from flowzoo.benchmark.experiments.executors import Resources
from flowzoo.benchmark.experiments.runner import Runner
from flowzoo.benchmark.experiments.search_space import Knob, algorithm_space, sampler_space
from flowzoo.benchmark.experiments.suite import Suite, cell_keys, expand, load_suite, select
from flowzoo.benchmark.experiments.suite import cells as suite_cells_of
from flowzoo.benchmark.tuning.design import TuningDesign, read_design
from flowzoo.benchmark.experiments.tuned import TunedValues, sampler_name
from flowzoo.benchmark.tuning.local_workers import run_local_workers
from flowzoo.benchmark.tuning.pruners import make_pruner
from flowzoo.cells import base_task
from flowzoo.curves import DEFAULT_SMOOTH, smooth_trailing
from flowzoo.errors import ConfigError, FlowZooError, RunError

#: seconds between a worker's heartbeats, and the silence after which another host's trial counts as dead
HEARTBEAT_S, GRACE_S = 20, 120
RETRIES = 3  # a trial killed more often than this is left failed (the budget then takes a fresh one)


# ------------------------------------------------------------------------------------------------------- objective

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


# ----------------------------------------------------------------------------------------------------------- cells

@dataclass(frozen=True)
class Cell:
    """A (task, algorithm) of the suite with what its trials may change."""

    task: str
    algorithm: str
    knobs: dict  # algorithm key -> Knob
    sampler: str | None
    sampler_knobs: dict  # sampler argument -> Knob
    inert: dict = field(default_factory=dict)  # knob -> why it was left out: its value cannot change the cell's runs

    @property
    def study_name(self) -> str:
        return f"{self.task}/{self.algorithm}"

    def all_knobs(self) -> dict[str, Knob]:
        """Every knob under the name its parameter has in the study (sampler arguments prefixed ``sampler.``)."""
        return {**self.knobs, **{f"sampler.{k}": v for k, v in self.sampler_knobs.items()}}


def tuning_cells(suite: Suite, design: TuningDesign, tasks_csv: str | None = None,
                 algorithms_csv: str | None = None) -> list[Cell]:
    """The design's cells (default: every cell of the suite), cut by ``--tasks``/``--algorithms``; a cell's space
    is its algorithm's and its prompt sampler's, less the keys the cell pins (its own ``per_algorithm`` block and the
    sampler arguments it names): those make a control what it is."""
    suite_cells = suite_cells_of(suite)
    wanted = [(t, a) for t, algs in design.cells.items() for a in algs] if design.cells else suite_cells
    unknown = [f"{t}/{a}" for t, a in wanted if (t, a) not in suite_cells]
    if unknown:
        raise ConfigError(f"suite {suite.name}: tuning.cells names {', '.join(unknown)}, not cells of the suite; "
                          f"cells: {', '.join(f'{t}/{a}' for t, a in suite_cells)}")
    chosen = select(suite, algorithms_csv, None, tasks_csv)  # validates the names
    wanted = [(t, a) for t, a in wanted if (t, a) in suite_cells_of(chosen)]
    if not wanted:
        raise ConfigError(f"--tasks/--algorithms leave no cell of suite {suite.name}'s tuning design to tune")
    cells = []
    for task, alg in wanted:
        keys = cell_keys(suite, task, alg)
        check_validation(suite, design, task, keys)
        model, base = keys.model, base_task(task)
        knobs = {k: v for k, v in algorithm_space(alg, model, base).items() if k not in keys.pinned}
        spec = keys.data["train"].get("prompt_sampler")
        sampler = sampler_name(spec)
        named = set(spec) - {"name"} if isinstance(spec, dict) else set()
        sampler_knobs = ({k: v for k, v in sampler_space(sampler, model, base).items() if k not in named}
                         if sampler else {})
        inert = inert_knobs(keys, task, alg, knobs)
        named_inert = [k for k in design.knobs if k in inert]
        if named_inert:
            raise ConfigError(f"suite {suite.name}: tuning.knobs names {named_inert[0]!r}, inert in {task}/{alg} "
                              f"({inert[named_inert[0]]}): tuning it would spend trials on a value that changes nothing")
        knobs = {k: v for k, v in knobs.items() if k not in inert}
        if design.knobs:
            missing = [k for k in design.knobs if k not in knobs and k not in sampler_knobs]
            if missing:
                raise ConfigError(f"suite {suite.name}: tuning.knobs {missing} are not in the space of {task}/{alg}; "
                                  f"its knobs: {', '.join([*knobs, *sampler_knobs]) or 'none'}")
            knobs = {k: v for k, v in knobs.items() if k in design.knobs}
            sampler_knobs = {k: v for k, v in sampler_knobs.items() if k in design.knobs}
        if not knobs and not sampler_knobs:
            raise ConfigError(f"{alg} declares no search space; add a `search_space:` section to "
                              f"benchmark/hyperparams/{alg}.yaml (docs/tuning.md)")
        cells.append(Cell(task, alg, knobs, sampler, sampler_knobs, inert))
    return cells


#: what an evaluation measures beside ``eval_reward`` that no objective reads (what a gain cost: the gold judge, the
#: prompts never trained on, the image-feature spread; the algorithm sampler's extra column): a trial leaves them out.
#: They read the evaluation's samples and draw no training randomness, so a trial trains as the reported run would
#: (tests/test_tuning.py); on the tiny rare-counting task they were 2/3 of the evaluations' samples. Held-out
#: *training* conditions (``prompts.unseen_every``) change what trains and are kept
UNREAD_BY_OBJECTIVES = ("train.gold=null", "prompts.unseen=null", "train.spread_features=null", "train.eval_own=false")


def validation_overrides(design: TuningDesign) -> list[str]:
    """What makes a trial's evaluations validation ones: the design's evaluation noise, its held-out prompts, and
    nothing measured that the objective does not read (:data:`UNREAD_BY_OBJECTIVES`)."""
    overrides = [f"train.eval_seed={design.validation.eval_seed}", *UNREAD_BY_OBJECTIVES]
    if design.validation.prompts == "held_out":
        overrides.append("prompts.eval_split=validation")
    return overrides


def check_validation(suite: Suite, design: TuningDesign, task: str, keys) -> None:
    """A one-line ConfigError when a cell's trials would score on its reported evaluation set: the design's
    evaluation noise is the cell's own, or its held-out prompts do not exist for the cell's prompt source."""
    from flowzoo.benchmark.experiments.config import TrainSection
    from flowzoo.benchmark.experiments.prompts import PromptSection, load_prompts
    from flowzoo.schema import from_mapping

    where = f"suite {suite.name}: tuning.validation"
    reported = keys.data["train"].get("eval_seed", TrainSection.eval_seed)
    if design.validation.eval_seed == reported:
        raise ConfigError(f"{where}.eval_seed {reported} is the evaluation noise of the reported runs of {task}: "
                          f"trials would score on the reported evaluation set; give another eval_seed")
    if design.validation.prompts == "held_out":
        section = from_mapping(PromptSection, {**(keys.data.get("prompts") or {}), "eval_split": "validation"},
                               where="prompts")
        try:
            load_prompts(section)
        except ConfigError as error:
            raise ConfigError(f"{where}.prompts held_out, task {task}: {error}") from None


def inert_knobs(keys, task: str, alg: str, knobs: dict) -> dict[str, str]:
    """The knobs of a cell's space whose value cannot change its runs at the cell's own keys (the algorithm config's
    ``inert_keys``: e.g. AWM's ``ema_kl_beta`` at ``kl_beta`` 0), unless a knob that makes them inert is tuned too:
    {knob: why}."""
    from flowzoo import algorithms
    from flowzoo.benchmark.experiments.resolve import Layers, resolve

    data = {**keys.data, "task": task}
    resolved = resolve(data, alg, Layers(keys.shared, keys.own, keys.pinned)).data["algorithm"]
    config = algorithms.get(alg).typed_config({k: v for k, v in resolved.items() if k != "name"})
    return {knob: why for knob, (why, switches) in config.inert_keys().items()
            if knob in knobs and not any(switch in knobs for switch in switches)}


def trial_configs(suite: Suite, design: TuningDesign, cell: Cell, values: dict, trial_dir: Path,
                  seeds: list[int] | None = None) -> list[ExperimentConfig]:
    """The trial's runs, one per tuning seed (or per one of ``seeds``: the confirmation's): the suite's cell config
    (as bench builds it) with ``values`` in the tuned layer, the design's steps and validation split, in
    ``trial_dir/s<seed>``."""
    algorithm_values = {k: v for k, v in values.items() if not k.startswith("sampler.")}
    sampler_values = {k.removeprefix("sampler."): v for k, v in values.items() if k.startswith("sampler.")}
    layer = TunedValues(algorithm_values, sampler_values, f"trial {trial_dir.name}")
    seeds = ",".join(str(s) for s in (design.seeds if seeds is None else seeds))
    one_cell = select(suite, cell.algorithm, seeds, cell.task)
    overrides = [f"train.steps={design.steps}"] if design.steps else []
    overrides += validation_overrides(design)
    configs = expand(one_cell, trial_dir, overrides, tuned=lambda task, alg: layer)
    for config in configs:
        config.run_dir = str(trial_dir / f"s{config.seed}")
    return configs


def check_space(suite: Suite, design: TuningDesign, cell: Cell, trials_dir: Path) -> int:
    """Every probe point of every knob of the cell (bounds, (log-)midpoint, each choice; the other knobs unset)
    passes the config loader, before any trial: a range that does not fit the cell fails in one line. Returns the
    number of points checked."""
    checked = 0
    for name, knob in cell.all_knobs().items():
        for value in knob.points():
            try:
                trial_configs(suite, design, cell, {name: value}, trials_dir / "check")
            except ConfigError as error:
                raise ConfigError(f"search space of {cell.study_name}: {name}={value!r} does not fit the cell "
                                  f"({error}); narrow the knob's range for this model or task") from None
            checked += 1
    return checked


# ------------------------------------------------------------------------------------------------------- a trial

def eval_curve(run_dir: Path) -> list[float]:
    """A finished run's eval rewards in step order (its metrics.csv)."""
    frame = pd.read_csv(run_dir / "metrics.csv")
    return frame.loc[frame["eval_reward"].notna()].sort_values("step")["eval_reward"].tolist()


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


def claim_lock(storage_url: str):
    """A lock file beside a SQLite storage, held from Optuna's ``ask`` until the objective has claimed its trial, or
    None for a database server.

    Optuna pops a queued trial by reading its state and then writing RUNNING; SQLite gives no row lock between the two
    (PostgreSQL and MySQL do: ``SELECT ... FOR UPDATE``), so two workers that ask at the same moment can both pop one
    queued trial, both train into its run directory, and the loser's told state breaks the winner's trial ("Cannot
    tell a PRUNED trial", seen resuming a 2-worker tune). A SQLite file is one host's, so a host lock orders the pops.
    """
    from filelock import FileLock

    if not storage_url.startswith("sqlite:///"):
        return None
    return FileLock(storage_url[len("sqlite:///"):] + ".claim.lock")


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


# --------------------------------------------------------------------------------------------------- the studies

def default_storage(runs_dir: Path, suite: Suite, create: bool = True) -> str:
    """The SQLite file under ``runs_dir`` the trials go to (its folder made when ``create``)."""
    path = Path(runs_dir) / suite.name / "tuning" / "optuna.db"
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path.resolve()}"


def check_report_storage(url: str, suite: Suite) -> None:
    """``tune --report`` reads trials, never starts a storage: a SQLite file that does not exist is one line (opening
    it would create an empty database and report 0 trials for every cell)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)  # check_storage has refused what is no URL
    if parsed.drivername.startswith("sqlite") and parsed.database and not Path(parsed.database).is_file():
        raise ConfigError(f"--report: no tuning storage at {parsed.database}: no trial of {suite.name} ran there; run "
                          f"`flowzoo tune {suite.name}` with the same --runs first, or give its --storage URL")
    if parsed.drivername.startswith("sqlite") and parsed.database:
        check_sqlite_storage(Path(parsed.database))


#: tables every Optuna storage holds (optuna/storages/_rdb/models.py); a file without them is no tuning storage
OPTUNA_TABLES = {"studies", "trials", "version_info"}


def check_sqlite_storage(path: Path) -> None:
    """``--report`` reads a SQLite file without changing it: an empty file, another program's database or no
    database at all is one line (opening it through Optuna would write Optuna's tables into it)."""
    import sqlite3

    if path.stat().st_size == 0:
        raise ConfigError(f"--report: {path} is an empty file, not a tuning storage (flowzoo tune writes one)")
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as error:
        raise ConfigError(f"--report: {path} is not a SQLite database ({error}); give the tuning's storage") from None
    finally:
        connection = None
    missing = OPTUNA_TABLES - tables
    if missing:
        raise ConfigError(f"--report: {path} is a SQLite database without Optuna's tables ({', '.join(sorted(missing))} "
                          f"missing): another program's, not a tuning storage; nothing was written to it")


#: query and keyword/value parameters that carry a password in the URLs and connection strings libpq, MySQL drivers
#: and SQLAlchemy accept
PASSWORD_KEYS = ("password", "passwd", "pwd", "sslpassword")


def shown_url(url: str) -> str:
    """A storage URL as every line prints it: its password masked in each form libpq accepts, the userinfo
    (``postgresql://user:***@host/db``, the password running to the last ``@``, so a ``/`` or ``@`` in it is masked
    too) and the parameters (``...?password=***``, ``host=h password=***``)."""
    text = str(url)
    head, mark, query = text.partition("?")
    scheme = head.find("://")
    if scheme >= 0 and "@" in head[scheme + 3:]:
        userinfo, _, rest = head[scheme + 3:].rpartition("@")
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        head = f"{head[:scheme + 3]}{userinfo}@{rest}"
    keys = "|".join(PASSWORD_KEYS)
    masked = re.sub(rf"(?i)(^|[?&;\s])({keys})(\s*=\s*)('[^']*'|[^&;\s]*)", r"\1\2\3***", head + mark + query)
    return masked


#: what a tune job receives in place of a storage URL that holds a password: the path of a file only its owner reads
SECRET_FILE = "flowzoo-secret-file:"


def storage_for_jobs(url: str, folder: Path) -> str:
    """The storage as the scheduler's jobs receive it: ``url`` itself when it holds no password, else a reference to
    ``folder/storage.url`` (written with 0600 rights), so that neither submitit's pickled job nor jobs.json nor a log
    holds the password."""
    if shown_url(url) == url:
        return url
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "storage.url"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as f:
        f.write(url)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
    return SECRET_FILE + str(path.resolve())


def resolve_storage(value: str) -> str:
    """A job's storage: the URL, or the one the referenced secret file holds (``storage_for_jobs``)."""
    if not value.startswith(SECRET_FILE):
        return value
    path = value[len(SECRET_FILE):]
    try:
        return Path(path).read_text().strip()
    except OSError as error:
        raise ConfigError(f"the tune job's storage file {path} cannot be read ({error.strerror})") from None


#: seconds a database server may take to accept a connection before the tune command fails in one line
CONNECT_TIMEOUT_S = 30


def engine_kwargs(url: str) -> dict:
    """SQLAlchemy engine arguments by database: SQLite waits up to 120 s for another worker's write lock; a server
    (PostgreSQL, MySQL) must answer within ``CONNECT_TIMEOUT_S`` (their drivers' default is to wait for the OS, minutes
    on an unroutable host)."""
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 120}}
    if url.startswith(("postgresql", "postgres", "mysql", "mariadb")):
        return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    return {}


def sqlite_file(url: str) -> str | None:
    """The file of a SQLite storage URL; None for a database server, an in-memory SQLite or what is no URL."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return None
    if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def schema_ready(path: str) -> bool:
    """Whether the SQLite file holds Optuna's schema, stamped (``alembic_version``, the last thing Optuna writes when
    it makes a storage); a read-only look, False for a missing, unreadable or half-made file."""
    import sqlite3
    from urllib.parse import quote

    if not Path(path).is_file():
        return False
    connection = None
    try:
        connection = sqlite3.connect(f"file:{quote(str(Path(path).resolve()))}?mode=ro", uri=True)
        return connection.execute("SELECT 1 FROM alembic_version").fetchone() is not None
    except sqlite3.Error:
        return False
    finally:
        if connection is not None:
            connection.close()


def schema_lock(url: str):
    """A lock file beside a SQLite storage whose schema is not made yet (``optuna.db.schema.lock``), held while Optuna
    makes it; a no-op for a made one or a database server.

    Optuna makes a new storage's tables, then reads that no schema version is stamped and stamps one; two processes
    opening one new SQLite file at once both read "none" and the second stamp fails (``IntegrityError`` on
    ``alembic_version``, or "table ... already exists"): three ``flowzoo tune`` commands started at once on a fresh
    storage lost one about half the time. Under the lock the first makes the schema and the others find it made."""
    from contextlib import nullcontext

    from filelock import FileLock

    path = sqlite_file(url)
    if path is None or schema_ready(path):
        return nullcontext()
    return FileLock(f"{path}.schema.lock")


def open_storage(url: str):
    """An Optuna RDB storage with heartbeats (a dead process's trial is failed and re-run)."""
    import optuna

    import warnings

    kwargs = engine_kwargs(url)
    try:
        with schema_lock(url), warnings.catch_warnings():  # heartbeats are "experimental" in Optuna 5; we rely on them
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=GRACE_S, heartbeat_stale_trial_callback=_retry)
    except Exception as error:  # sqlalchemy's errors: a bad URL, an unreachable server
        raise ConfigError(f"--storage {shown_url(url)}: {type(error).__name__}: {str(error).splitlines()[0]}") from None


def design_record(design: TuningDesign, cell: Cell) -> str:
    """What a study is bound to: the objective, steps, seeds, sampler, pruner and the cell's space."""
    from dataclasses import asdict

    record = {k: v for k, v in asdict(design).items() if k not in ("trials", "cells")}
    record["space"] = {name: repr(knob) for name, knob in cell.all_knobs().items()}
    return json.dumps(record, sort_keys=True, default=str)


def open_study(storage, suite: Suite, design: TuningDesign, cell: Cell, trial_seed: int = 0):
    import optuna

    pruner = make_pruner(design.pruner.name, design.pruner.startup_trials, design.pruner.warmup_evaluations)
    study = optuna.create_study(storage=storage, study_name=f"{suite.name}/{cell.study_name}", direction="maximize",
                                pruner=pruner, sampler=make_sampler(design, trial_seed), load_if_exists=True)
    if check_design(study, design, cell) is None:
        study.set_user_attr("design", design_record(design, cell))
    return study


def check_design(study, design: TuningDesign, cell: Cell) -> str | None:
    """The design ``study`` was tuned under (None for a study no tune has bound yet); a one-line ConfigError when it
    is not ``design``'s for ``cell``: trials of other seeds, steps or space must neither resume nor report as this
    design's."""
    stored = study.user_attrs.get("design")
    if stored is not None and stored != design_record(design, cell):
        raise ConfigError(f"study {study.study_name} in the storage was tuned under another design (objective, steps, "
                          f"seeds, sampler, pruner or space changed); give another --storage or --runs")
    return stored


#: how far apart the sampler seeds of two workers start (more trials than this in one cell would be needed to collide)
WORKER_SEED_STRIDE = 7919


def drawn(study) -> int:
    """The trials that stand for a draw of the sampler: every trial but the failed ones (a trial stopped by Ctrl-C or a
    dead process is failed and re-run with its values, so its re-run stands for it). Seeding by this count makes an
    interrupted and resumed tune draw the values an uninterrupted one draws."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state.name != "FAIL")


def make_sampler(design: TuningDesign, trial_seed: int):
    """The design's TPE sampler, seeded for the next trial (seed + trials so far: a serial study is reproducible)."""
    import optuna

    return optuna.samplers.TPESampler(seed=design.sampler.seed + trial_seed, multivariate=design.sampler.multivariate,
                                      n_startup_trials=design.sampler.startup_trials, constant_liar=True)


def progress_line(suite: Suite, cell: Cell, study, trial, budget: int, seconds: float) -> str:
    from optuna.trial import TrialState

    params = " ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
    value = "-" if trial.value is None else f"{trial.value:.4f}"
    state = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned"}.get(trial.state, trial.state.name.lower())
    return (f"tune {suite.name} {cell.study_name} trial {trial.number} ({counted(study)}/{budget}): {params} "
            f"-> objective {value} {state} {seconds:.1f} s")


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


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


def load_tuning(suite_ref: str) -> tuple[Suite, TuningDesign]:
    from flowzoo.benchmark.experiments.suite import evaluation_seeds

    suite = load_suite(suite_ref)
    if suite.tuning is None:
        raise ConfigError(f"suite {suite.name} has no `tuning:` section; fix its tuning design there before tuning "
                          f"(docs/tuning.md)")
    return suite, read_design(suite.name, suite.tuning, evaluation_seeds(suite))


def check_storage(url: str, executor_kind: str = "local") -> str | None:
    """Refuse a storage the workers cannot share; returns a note to print (SQLite under SLURM jobs), or None.

    An in-memory SQLite database lives and dies with one process: no worker, job or ``--report`` would see another's
    trials. SLURM jobs run on other nodes: a SQLite file under a node-local directory (/tmp, /var/tmp, /dev/shm,
    $TMPDIR) is refused; elsewhere the file must be on a file system every node mounts, and SQLite's locking over a
    network file system is only fit for a few jobs: for many nodes a database server (``postgresql://...``)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as error:  # not a URL, or a port that is no number
        raise ConfigError(f"--storage {shown_url(url)}: not a database URL ({str(error).splitlines()[0]}); e.g. "
                          f"sqlite:////shared/tune.db or postgresql://host/db") from None
    if not parsed.drivername.startswith("sqlite"):
        return None
    if parsed.database in (None, "", ":memory:"):
        raise ConfigError(f"--storage {shown_url(url)}: an in-memory SQLite database lives in one process, so workers, jobs and "
                          f"--report would not share its trials; give a file (sqlite:////path/tune.db) or a server URL")
    from flowzoo.models.shipped import refuse_shipped

    refuse_shipped(parsed.database, "--storage")  # the SQLite file is written
    if executor_kind != "slurm":
        return None
    path = Path(parsed.database).resolve()
    local = [Path(d).resolve() for d in ("/tmp", "/var/tmp", "/dev/shm", os.environ.get("TMPDIR") or "/tmp")]
    under = next((d for d in local if path == d or d in path.parents), None)
    if under is not None:
        raise ConfigError(f"--storage {shown_url(url)}: {path} is under {under}, a node-local directory SLURM jobs on other nodes "
                          f"do not see; put the database on a shared file system (--runs or --storage "
                          f"sqlite:////shared/dir/tune.db) or give a server URL (postgresql://host/db)")
    return (f"SQLite storage {path}: every job must see it on a shared file system; for jobs on many nodes give a "
            f"database server (--storage postgresql://host/db)")


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
    from flowzoo.benchmark.experiments.suite import task_resources

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
    from flowzoo.benchmark.experiments.executors import GridJob
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


#: local tune workers per CPU at most: each is a training process, and beyond a few per core they only contend (and
#: hundreds meet the process limit)
LOCAL_WORKERS_PER_CPU = 4


def worker_death(suite: Suite, cells: list[Cell], url: str, budget: int, workers: int, death) -> str:
    """The one line for a local worker that died (:class:`benchmark.tuning.local_workers.Death`), naming the trial it
    was running, which is failed and queued again with its values here (so the storage holds no trial running)."""
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
            for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                if str(trial.user_attrs.get("worker", "")).startswith(prefix):
                    where.append(f"trial {trial.number} of {cell.study_name}")
                    _fail(study, trial, trial.params)
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


def tune(suite_ref: str, runs_dir: Path, workers: int = 1, trials: int | None = None, tasks: str | None = None,
         algorithms: str | None = None, storage: str | None = None,
         executor=None) -> tuple[Suite, TuningDesign, list[Cell], str]:
    """Run every cell's trials (``workers`` processes sharing the storage, or with ``executor``, a
    :class:`benchmark.experiments.executors.SubmititGrid`, ``workers`` scheduler jobs); returns what the report
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
