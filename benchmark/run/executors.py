"""Where a bench grid's runs execute: this machine's worker processes (``local``, :func:`benchmark.run.suite.run_suite`)
or one scheduler job per run through submitit (``slurm``; ``submitit-local``: the same jobs as subprocesses of this
machine, for trying a grid's jobs without a cluster).

A job asks for the resources of its task (:class:`Resources`: GPUs, CPUs, memory, time), trains its run in the job's
own process, or under ``accelerate launch`` with one process per GPU when it has several, and is requeued when the
scheduler preempts it or its time runs out: submitit catches the scheduler's signal, calls :meth:`RunJob.checkpoint`
(which stops a launched training and resubmits the same job) and requeues it; the requeued job resumes the run from
its ``checkpoint.pt`` (the steps since the last checkpoint, ``train.checkpoint_every``, are trained again, to the same
values). Finished runs are skipped before anything is submitted, as with the local executor, and the run directories
are the same, so reports read them alike.

submitit is an optional dependency (``pip install -e '.[slurm]'``); nothing here imports it until a job is submitted.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowzoo.errors import ConfigError
from flowzoo.io import atomic_write_text
from flowzoo.schema import from_mapping

#: ``flowzoo bench --executor`` choices
EXECUTORS = ("local", "submitit-local", "slurm")
EXTRA_HINT = "pip install -e '.[slurm]'"
#: submitit's own words for a job that is still queued or running (a rerun of bench waits for it, not a resubmission)
LIVE_STATES = {"READY", "PENDING", "RUNNING", "REQUEUED", "COMPLETING", "PREEMPTED", "CONFIGURING", "RESIZING",
               "SUSPENDED"}


@dataclass
class Resources:
    """What one run's job asks the scheduler for. A suite gives them as ``resources:`` (for every task) and a task as
    its own ``resources:``; a cluster file's ``resources:`` are the site's defaults beneath both."""

    gpus: int = 0  # GPUs of the job; more than 1: one training process per GPU under accelerate launch
    processes: int | None = None  # training processes (accelerate launch); default: one per GPU, or 1 without GPUs
    cpus: int = 1  # CPU cores of the job (SLURM cpus-per-task), shared by its processes: torch threads each
    mem_gb: float = 4.0  # memory of the job, in GB
    time_min: float = 60.0  # wall-clock limit of one job, in minutes; a job that reaches it is requeued and resumes

    @property
    def num_processes(self) -> int:
        return self.processes or max(self.gpus, 1)

    @property
    def threads(self) -> int:
        """torch threads of each training process."""
        return max(1, self.cpus // self.num_processes)


def resolve_resources(layers: list[tuple[str, Any]]) -> Resources:
    """The run's resources: ``layers`` (where, mapping) from lowest to highest precedence over the defaults, each key
    checked (types by the schema, ranges here) with one line naming the layer that set it and the valid values."""
    merged: dict = {}
    origin: dict[str, str] = {}
    for where, layer in layers:
        if layer is None:
            continue
        checked = from_mapping(Resources, layer, where=where)  # unknown keys and types, named by their layer
        for key in layer:
            merged[key], origin[key] = getattr(checked, key), where
    res = Resources(**merged)

    def named(key: str) -> str:
        return f"{origin[key]}.{key}" if key in origin else f"resources.{key} (the default)"

    if res.gpus < 0:
        raise ConfigError(f"{named('gpus')} must be >= 0, got {res.gpus}")
    if res.processes is not None and res.processes < 1:
        raise ConfigError(f"{named('processes')} must be >= 1, got {res.processes}")
    if res.gpus > 0 and res.processes not in (None, res.gpus):
        raise ConfigError(f"{named('processes')} {res.processes} with gpus {res.gpus}: a run trains one process per "
                          f"GPU; leave processes out or set it to {res.gpus}")
    if res.cpus < res.num_processes:
        raise ConfigError(f"{named('cpus')} {res.cpus} is fewer than the run's {res.num_processes} processes; give "
                          f"cpus >= {res.num_processes}")
    for key in ("mem_gb", "time_min"):
        value = getattr(res, key)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{named(key)} must be a positive number, got {value!r}")
    return res


@dataclass
class ClusterConfig:
    """``flowzoo bench --cluster FILE``: how this site's scheduler is used (docs/harness.md, "On a cluster")."""

    partition: str | None = None  # SLURM partition (``--slurm-partition`` overrides it)
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None  # e.g. a GPU type: "a100"
    setup: list[str] = field(default_factory=list)  # shell lines each job runs first (module load, source a venv)
    slurm_args: dict = field(default_factory=dict)  # further sbatch options, e.g. {exclude: "node07"}
    resources: dict = field(default_factory=dict)  # the site's defaults, beneath the suite's and the tasks' own
    max_requeues: int = 3  # how often a job may time out and be requeued (preemptions are not counted)
    signal_delay_s: int = 120  # the scheduler signals a job this long before its time limit, to requeue it
    poll_s: float = 10.0  # seconds between two looks at the jobs' states
    python: str | None = None  # the interpreter on the nodes (default: this one, for a shared file system)
    jobs_dir: str | None = None  # submitit's folder of job files and logs (default RUNS/.submitit/<suite>)


def load_cluster(path: str | Path | None, partition: str | None = None) -> ClusterConfig:
    """The cluster file (or the defaults), checked; ``partition`` from the command line wins over the file's."""
    from flowzoo.benchmark.config.schema import read_yaml

    where = f"cluster file {Path(path).name}" if path is not None else "cluster"
    cluster = from_mapping(ClusterConfig, read_yaml(path) if path is not None else {}, where=where)
    if partition is not None:
        if not partition.strip():
            raise ConfigError("--slurm-partition: give a partition name")
        cluster.partition = partition
    for key in ("partition", "account", "qos", "constraint"):  # one sbatch line each: a newline would break the script
        value = getattr(cluster, key)
        if value is not None and (not isinstance(value, str) or any(c.isspace() or not c.isprintable() for c in value)):
            option = "--slurm-partition" if key == "partition" and partition is not None else f"{where}: {key}"
            raise ConfigError(f"{option} {value!r}: a SLURM name is one word without spaces, newlines or control "
                              f"characters (its sbatch line would break)")
    if cluster.max_requeues < 0:
        raise ConfigError(f"{where}: max_requeues must be >= 0, got {cluster.max_requeues}")
    if cluster.signal_delay_s < 10:
        raise ConfigError(f"{where}: signal_delay_s must be >= 10 (time for a run to stop), got "
                          f"{cluster.signal_delay_s}")
    if not (math.isfinite(cluster.poll_s) and cluster.poll_s > 0):
        raise ConfigError(f"{where}: poll_s must be a positive number, got {cluster.poll_s!r}")
    for line in cluster.setup:
        if not isinstance(line, str):
            raise ConfigError(f"{where}: setup must be a list of shell lines, got {line!r}")
    for key, value in cluster.slurm_args.items():  # each one ``#SBATCH --key=value`` line of the job's script
        if not isinstance(key, str) or not key or not all(c.isalnum() or c in "-_" for c in key):
            raise ConfigError(f"{where}: slurm_args key {key!r} is no sbatch option name (letters, digits, - and _; "
                              f"its sbatch line would break)")
        if not isinstance(value, (str, int, float, bool)):
            raise ConfigError(f"{where}: slurm_args.{key} must be a string or a number, got {value!r}")
        if isinstance(value, str) and not value.isprintable():
            raise ConfigError(f"{where}: slurm_args.{key} {value!r}: an sbatch value is one line without newlines or "
                              f"control characters (it would add a line to the job's script)")
    resolve_resources([(f"{where}: resources", cluster.resources)])
    return cluster


def import_submitit():
    try:
        import submitit
    except ImportError:
        raise ConfigError(f"this executor runs jobs through submitit, which is not installed; {EXTRA_HINT}") from None
    return submitit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunJob:
    """One run as a submitit job (pickled to the job's process). ``checkpoint`` is submitit's hook on preemption and
    timeout: it stops a launched training and resubmits this job unchanged; the runner resumes from checkpoint.pt."""

    def __init__(self, config, resources: Resources, cwd: str | None = None):
        self.config = config
        self.resources = resources
        self.cwd = cwd or os.getcwd()  # run directories may be relative to where bench was started
        self._child: subprocess.Popen | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_child": None}

    def command(self, config_file: str, port: int) -> list[str]:
        """``accelerate launch`` of ``flowzoo train`` with one process per GPU (gloo on CPU without GPUs)."""
        return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                "--num_processes", str(self.resources.num_processes), "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
                "-m", "flowzoo", "train", config_file, "--quiet"]

    def __call__(self) -> tuple[str, str | None]:
        from flowzoo.benchmark.run.runner import run_quietly

        os.chdir(self.cwd)
        run_dir = self.config.resolved_run_dir()
        started = "resumes from its checkpoint.pt" if (run_dir / "checkpoint.pt").is_file() else "starts"
        print(f"flowzoo job: run {run_dir} {started} ({self.resources.num_processes} process(es))", flush=True)
        if self.resources.num_processes == 1:
            return run_quietly(self.config)
        return self._launch(run_dir)

    def _launch(self, run_dir: Path) -> tuple[str, str | None]:
        import yaml

        from flowzoo.benchmark.run.runner import is_finished
        from flowzoo.schema import to_mapping

        # the config as the ranks read it: a private file (0600) on this node, removed when the launch ends
        fd, config_file = tempfile.mkstemp(prefix="flowzoo-run-", suffix=".yaml")
        env = {**os.environ, "OMP_NUM_THREADS": str(self.resources.threads)}
        if not self.resources.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""
        errors = tempfile.TemporaryFile("w+")  # the ranks' stderr: copied into the job's log at the end
        try:
            with os.fdopen(fd, "w") as f:
                yaml.safe_dump(to_mapping(self.config), f, sort_keys=False)

            def ignore_preemption_signal():  # only the job's process answers the scheduler's signal
                signal.signal(signal.SIGUSR2, signal.SIG_IGN)

            command = self.command(config_file, _free_port())
            print(f"flowzoo job: {' '.join(command[1:])}", flush=True)
            self._child = child = subprocess.Popen(command, env=env, stderr=errors, start_new_session=True,
                                                   preexec_fn=ignore_preemption_signal)
            # poll, not wait(): a blocking wait would hold the child's wait lock while the scheduler's signal handler
            # (checkpoint -> _stop_child) waits for the same child, which it could then never reap
            while child.poll() is None:
                time.sleep(0.5)
            code = child.returncode
        finally:
            self._stop_child()
            os.unlink(config_file)
            errors.seek(0)
            stderr = errors.read()
            errors.close()
            sys.stderr.write(stderr)
        if code == 0 and is_finished(run_dir, self.config):
            return str(run_dir), None
        lines = [line for line in stderr.strip().splitlines() if line.startswith("flowzoo")]
        return str(run_dir), (lines[-1] if lines else f"accelerate launch exited with {code}: {stderr.strip()[-2000:]}")

    def _stop_child(self, wait_s: float = 60.0) -> None:
        """Interrupt a launched training as Ctrl-C would (SIGINT to the launcher's process group; torchrun passes it
        to its ranks, which end as an interrupted run ends); kill the launcher if it lingers."""
        child, self._child = self._child, None
        if child is None or child.poll() is not None:
            return
        for sig, wait in ((signal.SIGINT, wait_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(child.pid, sig)
            except ProcessLookupError:
                return
            try:
                child.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def checkpoint(self, *args, **kwargs):
        """submitit's preemption/timeout hook: the run's state is its checkpoint.pt; resubmit this job as it is."""
        import submitit

        self._stop_child()
        print(f"flowzoo job: run {self.config.resolved_run_dir()} interrupted by the scheduler; handed back to "
              f"submitit to requeue, to resume from its checkpoint.pt", flush=True)
        return submitit.helpers.DelayedSubmission(RunJob(self.config, self.resources, self.cwd), *args, **kwargs)


def slurm_parameters(resources: Resources, cluster: ClusterConfig, name: str) -> dict:
    """submitit's SlurmExecutor parameters (sbatch options) of one run's job."""
    params: dict[str, Any] = {
        "job_name": name, "nodes": 1, "ntasks_per_node": 1, "cpus_per_task": resources.cpus,
        "mem": f"{math.ceil(resources.mem_gb * 1024)}M", "time": max(1, math.ceil(resources.time_min)),
        "signal_delay_s": cluster.signal_delay_s,
    }
    if resources.gpus:
        params["gpus_per_node"] = resources.gpus
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(cluster, key):
            params[key] = getattr(cluster, key)
    if cluster.setup:
        params["setup"] = list(cluster.setup)
    if cluster.slurm_args:
        params["additional_parameters"] = dict(cluster.slurm_args)
    return params


@dataclass
class GridJob:
    """One job of a :class:`SubmititGrid`: ``key`` is what ``jobs.json`` records its job id under (a run directory, a
    tune worker's name), ``label`` names it in progress lines, ``function`` (picklable) runs in the job and returns
    ``(key, error or None)``."""

    key: str
    label: str
    function: Any
    resources: Resources


class SubmititGrid:
    """Submits each run of a grid as one job (``slurm`` or ``submitit-local``), at most ``workers`` at once, waits
    for them, prints each job's state changes and returns the failures as ``run_dir: cause`` lines."""

    def __init__(self, kind: str, cluster: ClusterConfig, folder: Path):
        if kind not in ("slurm", "submitit-local"):
            raise ConfigError(f"--executor {kind!r}: valid: {', '.join(EXECUTORS)}")
        self.kind, self.cluster, self.folder = kind, cluster, Path(folder)
        self.submitit = import_submitit()
        self.record_path = self.folder / "jobs.json"  # run directory -> its last job id (a rerun waits for live ones)

    def check(self, resources: list[Resources]) -> None:
        """Refuse, before any job, a time limit within the signal delay (the job would be signalled at its start)."""
        for res in resources:
            if res.time_min * 60 <= self.cluster.signal_delay_s:
                raise ConfigError(f"resources.time_min {res.time_min:g} is within the cluster's signal_delay_s "
                                  f"{self.cluster.signal_delay_s}: give a longer time_min or a shorter delay")

    def _executor(self, res: Resources, name: str):
        s = self.submitit
        if self.kind == "slurm":
            executor = s.SlurmExecutor(self.folder, max_num_timeout=self.cluster.max_requeues,
                                       python=self.cluster.python)
            executor.update_parameters(**slurm_parameters(res, self.cluster, name))
        else:
            executor = s.LocalExecutor(self.folder, max_num_timeout=self.cluster.max_requeues,
                                       python=self.cluster.python)
            executor.update_parameters(timeout_min=res.time_min, gpus_per_node=res.gpus, tasks_per_node=1,
                                       signal_delay_s=self.cluster.signal_delay_s, setup=list(self.cluster.setup))
        return executor

    def _read_record(self) -> dict:
        try:
            record = json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def _live_job(self, run_dir: str, record: dict):
        """The still queued or running SLURM job of an earlier bench for this run, or None."""
        job_id = record.get(run_dir)
        if self.kind != "slurm" or not isinstance(job_id, str):
            return None
        job = self.submitit.SlurmJob(self.folder, job_id)
        return job if job.state in LIVE_STATES else None

    def run(self, todo: list, resources: list[Resources], workers: int | None, deadline: float, record) -> list[str]:
        """Run ``todo`` (configs) with their ``resources``; ``record(run_dir, error)`` gets each outcome; returns the
        run directories left unsubmitted when the deadline passed."""
        jobs = [GridJob(str(config.resolved_run_dir()), self._label(config), RunJob(config, res), res)
                for config, res in zip(todo, resources)]
        return self.run_jobs(jobs, workers, deadline, record)

    def run_jobs(self, todo: list[GridJob], workers: int | None, deadline: float, record,
                 on_poll=None) -> list[str]:
        """Submit ``todo`` (at most ``workers`` at once), wait for them; ``record(key, error)`` gets each outcome,
        ``on_poll()`` is called at every look at the jobs; returns the keys left unsubmitted when the deadline
        passed. A job an earlier command submitted under the same key and that is still live is waited for."""
        cap = workers or (math.inf if self.kind == "slurm" else (os.cpu_count() or 1))
        jobs_record = self._read_record()
        pending = list(todo)
        running: dict[Any, GridJob] = {}  # submitit job -> ours
        states: dict[str, str] = {}
        for item in list(pending):
            job = self._live_job(item.key, jobs_record)
            if job is not None:
                print(f"job {job.job_id} [{item.label}]: still {job.state} from an earlier command; waiting for it")
                running[job] = item
                pending.remove(item)
        try:
            while pending or running:
                while pending and len(running) < cap and time.monotonic() <= deadline:
                    item = pending.pop(0)
                    res = item.resources
                    name = f"flowzoo-{item.label.replace('/', '-')}"
                    job = self._executor(res, name).submit(item.function)
                    running[job] = item
                    jobs_record[item.key] = str(job.job_id)
                    atomic_write_text(self.record_path, json.dumps(jobs_record, indent=1, sort_keys=True) + "\n")
                    print(f"job {job.job_id} [{item.label}]: submitted ({self.kind}; {res.gpus} GPU(s), "
                          f"{res.cpus} CPU(s), {res.mem_gb:g} GB, {res.time_min:g} min; log {job.paths.stdout})")
                if not running:
                    break
                finished = []
                for job, item in running.items():
                    state = job.state
                    if states.get(job.job_id) != state:
                        states[job.job_id] = state
                        print(f"job {job.job_id} [{item.label}]: {state}")
                    if job.done():
                        finished.append(job)
                if on_poll is not None:
                    on_poll()
                for job in finished:
                    record(*self._outcome(job, running.pop(job)))
                if not finished:
                    time.sleep(self.cluster.poll_s)
        except BaseException:
            if self.kind == "submitit-local":  # local jobs end with this command
                for job in running:
                    job.cancel(check=False)
            elif running:
                ids = ", ".join(str(job.job_id) for job in running)
                print(f"flowzoo: the scheduler keeps jobs {ids} running; rerun the same command to wait for them "
                      f"(they are not submitted twice)", file=sys.stderr)
            raise
        return [item.key for item in pending]

    @staticmethod
    def _label(config) -> str:
        return f"{config.task}/{config.algorithm_name}/s{config.seed}"

    def _outcome(self, job, item: GridJob) -> tuple[str, str | None]:
        try:
            return tuple(job.result())
        except Exception as error:  # the job itself failed: killed, out of memory, timed out too often, ...
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            why = (f"job {job.job_id} ended {job.state}: {first}; log {job.paths.stderr}; rerun the same command to "
                   f"resume it from its checkpoint")
            return item.key, why


def make_grid(kind: str, cluster_file: str | None, partition: str | None, runs_dir: Path, suite_name: str):
    """The executor of ``flowzoo bench|tune --executor KIND``: None for ``local`` (worker processes here), else a
    :class:`SubmititGrid` with its cluster file read (every check before any run); its job files and logs go to the
    cluster file's ``jobs_dir`` or ``RUNS/.submitit/<suite_name>``."""
    if kind not in EXECUTORS:
        raise ConfigError(f"--executor {kind!r}: valid: {', '.join(EXECUTORS)}")
    if kind == "local":
        if cluster_file is not None or partition is not None:
            raise ConfigError("--cluster and --slurm-partition apply to --executor slurm or submitit-local; "
                              "the local executor runs here")
        return None
    if partition is not None and kind != "slurm":
        raise ConfigError(f"--slurm-partition applies to --executor slurm, not {kind}")
    import_submitit()  # the missing extra is named before anything else
    if kind == "slurm" and not (shutil.which("sbatch") and shutil.which("srun")):
        raise ConfigError("--executor slurm: sbatch and srun are not on the PATH (no SLURM here); run the command "
                          "where jobs are submitted (a login node), or try the jobs here with --executor "
                          "submitit-local")
    cluster = load_cluster(cluster_file, partition)
    folder = Path(cluster.jobs_dir) if cluster.jobs_dir else Path(runs_dir) / ".submitit" / suite_name
    from flowzoo.models.shipped import refuse_shipped

    refuse_shipped(folder, "jobs_dir")
    return SubmititGrid(kind, cluster, folder)
