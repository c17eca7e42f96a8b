"""The bench grid on a scheduler (benchmark/run/executors.py): resources per task, the cluster file, SLURM jobs' sbatch
options, and submitit's local executor for real (subprocess jobs, pickling, job states, a job preempted mid-run and
requeued, a job killed mid-run and resubmitted by a rerun), with metrics equal to `--workers 1`.

Tests that need submitit (the `slurm` extra: pip install -e '.[slurm]') are skipped with that reason without it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.executors import (ClusterConfig, Resources, RunJob, SubmititGrid, load_cluster, make_grid,
                                 resolve_resources, slurm_parameters)
from flowzoo.benchmark.run.runner import TIMING_COLUMNS
from flowzoo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
NEEDS_EXTRA = "the slurm extra (submitit) is not installed: pip install -e '.[slurm]'"
TOY = {"model": {"name": "toy2d", "args": {"pretrain_steps": 30, "hidden": 32}}, "reward": "toy_mode",
       "prompts": {"source": "toy2d"}}
TRAIN = {"steps": 4, "prompts_per_step": 4, "eval_every": 2, "eval_samples_per_prompt": 2, "checkpoint_every": 2,
         "save_samples": False}


def _submitit():
    return pytest.importorskip("submitit", reason=NEEDS_EXTRA)


def _suite(tmp_path: Path, train: dict = TRAIN, resources: dict | None = None, seeds=(0, 1)) -> Path:
    task = dict(TOY, **({"resources": resources} if resources else {}))
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "grid", "seeds": list(seeds), "algorithms": ["flow_grpo"],
                                    "defaults": {"train": train}, "tasks": {"toy2d_mode": task}}))
    return path


def _cluster(tmp_path: Path, **keys) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"poll_s": 0.2, "signal_delay_s": 10, **keys}))
    return path


def _metrics(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(run_dir / "metrics.csv")
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame])


def _one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flowzoo: error: "), lines
    return lines[0]


# ---- resources and the cluster file (no submitit needed) ---------------------------------------------------------
def test_resources_take_site_then_suite_then_task_and_refuse_what_no_scheduler_can_give():
    assert resolve_resources([]) == Resources()
    res = resolve_resources([("site", {"cpus": 8, "mem_gb": 32}), ("suite", {"gpus": 4, "time_min": 240}),
                             ("task", {"gpus": 8, "cpus": 16})])
    assert (res.gpus, res.cpus, res.mem_gb, res.time_min, res.num_processes, res.threads) == (8, 16, 32, 240, 8, 2)
    assert resolve_resources([("t", {"processes": 2, "cpus": 2})]).num_processes == 2  # CPU processes (gloo)
    bad = [
        ({"gpus": -1}, "task.gpus must be >= 0, got -1"),
        ({"processes": 0}, "task.processes must be >= 1, got 0"),
        ({"gpus": 8, "processes": 4, "cpus": 8}, "task.processes 4 with gpus 8: a run trains one process per GPU"),
        ({"gpus": 4}, "suite.cpus 1 is fewer than the run's 4 processes; give cpus >= 4"),
        ({"mem_gb": 0}, "task.mem_gb must be a positive number, got 0"),
        ({"time_min": -5}, "task.time_min must be a positive number, got -5"),
        ({"gpu": 1}, "task: unknown key 'gpu' (did you mean 'gpus'?)"),
        ({"cpus": "four"}, "task.cpus"),
    ]
    with pytest.raises(ConfigError, match=r"^resources.cpus \(the default\) 1 is fewer than the run's 2 processes"):
        resolve_resources([("task", {"gpus": 2})])
    for layer, message in bad:
        with pytest.raises(ConfigError) as error:
            resolve_resources([("suite", {"cpus": 1}), ("task", layer)])
        assert message in str(error.value) and "\n" not in str(error.value), (layer, str(error.value))


def test_a_bad_task_resource_fails_at_load_before_any_run(tmp_path, capsys):
    suite = _suite(tmp_path, resources={"gpus": 2, "cpus": 1})
    assert main(["bench", str(suite), "--runs", str(tmp_path / "runs")]) == 2
    assert "suite grid: tasks.toy2d_mode.resources.cpus 1 is fewer than the run's 2 processes" in _one_error_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_the_cluster_file_is_checked_and_the_options_fit_the_executor(tmp_path, capsys):
    cluster = load_cluster(_cluster(tmp_path, partition="gpu", resources={"cpus": 4}), partition="h100")
    assert cluster.partition == "h100" and cluster.resources == {"cpus": 4} and cluster.max_requeues == 3
    for keys, message in [({"max_requeues": -1}, "max_requeues must be >= 0"),
                          ({"signal_delay_s": 0}, "signal_delay_s must be >= 10"),
                          ({"partiton": "gpu"}, "unknown key 'partiton' (did you mean 'partition'?)"),
                          ({"resources": {"mem_gb": -1}}, "resources.mem_gb must be a positive number"),
                          ({"slurm_args": {"gres": ["gpu"]}}, "slurm_args.gres must be a string or a number")]:
        with pytest.raises(ConfigError, match=None) as error:
            load_cluster(_cluster(tmp_path, **keys))
        assert message in str(error.value), str(error.value)
    runs = tmp_path / "runs"
    assert main(["bench", "smoke", "--runs", str(runs), "--cluster", str(_cluster(tmp_path))]) == 2
    assert "--cluster and --slurm-partition apply to --executor slurm or submitit-local" in _one_error_line(capsys)
    assert main(["bench", "smoke", "--runs", str(runs), "--executor", "submitit-local", "--slurm-partition", "a"]) == 2
    assert "--slurm-partition applies to --executor slurm, not submitit-local" in _one_error_line(capsys)
    assert not runs.exists()


def test_the_documented_cluster_file_loads(tmp_path):
    text = (ROOT / "docs" / "harness.md").read_text()
    section = text[text.index("### On a cluster"):]
    block = section[section.index("```yaml\n") + 8:section.index("```\n", section.index("```yaml\n") + 8)]
    (tmp_path / "cluster.yaml").write_text(block)
    cluster = load_cluster(tmp_path / "cluster.yaml")
    assert cluster.partition == "gpu" and cluster.setup == ["module load cuda/12.4"]
    assert resolve_resources([("site", cluster.resources)]).num_processes == 8
    assert "flowzoo bench paper-sd3-ocr --executor slurm --cluster cluster.yaml" in (ROOT / "README.md").read_text()


def test_without_the_extra_a_submitit_executor_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` raises ImportError
    assert main(["bench", "smoke", "--runs", str(tmp_path / "runs"), "--executor", "slurm"]) == 2
    line = _one_error_line(capsys)
    assert "submitit, which is not installed; pip install -e '.[slurm]'" in line
    assert not (tmp_path / "runs").exists()


def test_slurm_without_a_scheduler_here_is_one_line(tmp_path, capsys, monkeypatch):
    _submitit()
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no srun
    assert main(["bench", "smoke", "--runs", str(tmp_path / "runs"), "--executor", "slurm"]) == 2
    line = _one_error_line(capsys)
    assert "--executor slurm: sbatch and srun are not on the PATH" in line and "submitit-local" in line
    assert not (tmp_path / "runs").exists()


# ---- SLURM jobs: what they ask for -------------------------------------------------------------------------------
def test_a_slurm_job_asks_for_its_tasks_resources_and_launches_one_process_per_gpu(tmp_path):
    _submitit()
    res = resolve_resources([("task", {"gpus": 8, "cpus": 32, "mem_gb": 256, "time_min": 239.5})])
    cluster = ClusterConfig(partition="gpu", account="lab", qos="high", constraint="h100",
                            setup=["module load cuda/12.4"], slurm_args={"exclude": "node07"}, signal_delay_s=180)
    from submitit.slurm import slurm

    params = slurm_parameters(res, cluster, "flowzoo-t-a-s0")
    assert set(params) <= slurm.SlurmExecutor._valid_parameters()  # names submitit knows
    # the sbatch file submitit writes for the job (SlurmExecutor itself needs srun on the PATH)
    text = slurm._make_sbatch_string(command="python -u -m submitit.core._submit x", folder=tmp_path, **params)
    for line in ["#SBATCH --gpus-per-node=8", "#SBATCH --cpus-per-task=32", "#SBATCH --mem=262144M",
                 "#SBATCH --time=240", "#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --qos=high",
                 "#SBATCH --constraint=h100", "#SBATCH --exclude=node07", "#SBATCH --signal=USR2@180",
                 "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --job-name=flowzoo-t-a-s0",
                 "module load cuda/12.4"]:
        assert line in text, line
    command = RunJob(None, res).command("run.yaml", 29500)
    assert command[1:4] == ["-m", "accelerate.commands.launch", "--multi_gpu"]
    assert command[command.index("--num_processes") + 1] == "8"
    assert command[-5:] == ["-m", "flowzoo", "train", "run.yaml", "--quiet"]
    cpu = slurm_parameters(Resources(), ClusterConfig(), "n")
    assert "gpus_per_node" not in cpu and "partition" not in cpu and cpu["time"] == 60


def test_the_checkpoint_hook_stops_a_launched_training_and_resubmits_the_same_run(tmp_path):
    _submitit()
    from flowzoo.benchmark.run.loading import load_config
    config = load_config(ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml", [f"run_dir={tmp_path / 'r'}"])
    job = RunJob(config, Resources(processes=2, cpus=2), cwd=str(tmp_path))
    job._child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    child = job._child
    delayed = job.checkpoint()
    assert child.poll() is not None, "the launched training still runs"
    again = delayed.function
    assert isinstance(again, RunJob) and again.config is config and again.resources == job.resources
    assert again.cwd == str(tmp_path) and delayed.args == () and delayed.kwargs == {}


def test_a_rerun_waits_for_a_live_slurm_job_instead_of_submitting_it_again(tmp_path, monkeypatch):
    _submitit()
    from flowzoo.benchmark.run.loading import load_config
    config = load_config(ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml", [f"run_dir={tmp_path / 'r'}"])
    grid = SubmititGrid("slurm", ClusterConfig(poll_s=0.01), tmp_path / "jobs")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "jobs.json").write_text(f'{{"{tmp_path / "r"}": "4242"}}')

    class LiveJob:  # what sacct would say of job 4242: running, then done
        def __init__(self, folder, job_id):
            self.job_id, self.polls = job_id, 0

        @property
        def state(self):
            self.polls += 1
            return "RUNNING" if self.polls < 3 else "COMPLETED"

        def done(self):
            return self.polls >= 3

        def result(self):
            return str(tmp_path / "r"), None

    monkeypatch.setattr(grid.submitit, "SlurmJob", LiveJob)
    monkeypatch.setattr(grid, "_executor", lambda *a: pytest.fail("a live job was submitted again"))
    outcomes = []
    assert grid.run([config], [Resources()], None, float("inf"), lambda *o: outcomes.append(o)) == []
    assert outcomes == [(str(tmp_path / "r"), None)]


# ---- submitit's local executor, for real ------------------------------------------------------------------------
def _lock_holder(lock: Path) -> int | None:
    """The process holding ``lock`` open (the run's writer), found through /proc."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == str(lock):
                    return int(pid)
            except OSError:
                continue
    return None


def _wait_for(predicate, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds a run's process through /proc")
def test_local_jobs_equal_workers_1_and_resume_after_preemption_and_after_a_kill(tmp_path, capsys):
    _submitit()
    train = dict(TRAIN, steps=150, checkpoint_every=10, eval_every=50)
    suite = _suite(tmp_path, train)
    assert main(["bench", str(suite), "--runs", str(tmp_path / "ref"), "--workers", "1"]) == 0
    runs = tmp_path / "runs"
    bench = [sys.executable, "-m", "flowzoo", "bench", str(suite), "--runs", str(runs), "--executor",
             "submitit-local", "--workers", "2", "--cluster", str(_cluster(tmp_path))]
    first = subprocess.Popen(bench, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    s0, s1 = (runs / "grid" / "toy2d_mode" / "flow_grpo" / s for s in ("s0", "s1"))
    try:
        _wait_for(lambda: (s0 / "checkpoint.pt").is_file() and (s1 / "checkpoint.pt").is_file(), 120,
                  "both runs' first checkpoint")
        preempted = _lock_holder((s0 / ".lock").resolve())
        killed = _lock_holder((s1 / ".lock").resolve())
        assert preempted and killed and preempted != killed
        before = pd.read_csv(s0 / "metrics.csv")
        os.kill(preempted, signal.SIGUSR2)  # what SLURM sends before a preemption or the time limit
        os.kill(killed, signal.SIGKILL)  # a node lost: no signal handler runs
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 1, err[-3000:]
    # job states as the bench saw them; the killed job is a failure naming its job, state and log
    assert out.count(": submitted (submitit-local; 0 GPU(s), 1 CPU(s)") == 2 and ": RUNNING" in out
    assert ": FINISHED" in out
    failed = [line for line in err.splitlines() if line.startswith("failed: ")]
    assert len(failed) == 1 and str(s1) in failed[0] and "rerun the same command to resume it" in failed[0], err
    # the preempted job was requeued by submitit and resumed its checkpoint (its first rows kept their timings)
    assert (s0 / "done.json").is_file() and not (s1 / "done.json").exists()
    log = "".join(p.read_text() for p in (runs / ".submitit" / "grid").glob("*_log.*"))
    assert "interrupted by the scheduler; handed back to submitit to requeue" in log and "Requeued job" in log
    assert f"run {s0} resumes from its checkpoint.pt" in log
    after = pd.read_csv(s0 / "metrics.csv")
    kept = before[before["step"] <= 10]
    pd.testing.assert_frame_equal(after[after["step"] <= 10], kept)  # wall_s too: not trained again
    # a rerun submits only the killed run, which resumes from its checkpoint (the same command, in this process: its
    # job is a process of its own all the same)
    capsys.readouterr()
    code = main(bench[3:])
    again = capsys.readouterr()
    assert code == 0, again.err[-3000:]
    assert "2 runs, 1 finished, 1 to run as submitit-local jobs" in again.out
    assert again.out.count(": submitted") == 1
    log = "".join(p.read_text() for p in (runs / ".submitit" / "grid").glob("*_log.out"))
    assert f"run {s1} resumes from its checkpoint.pt" in log
    for run in ("s0", "s1"):
        reference = tmp_path / "ref" / "grid" / "toy2d_mode" / "flow_grpo" / run
        pd.testing.assert_frame_equal(_metrics(runs / "grid" / "toy2d_mode" / "flow_grpo" / run), _metrics(reference))


def _job_process(folder: Path) -> int | None:
    """The submitit job process (not its controller, not its ranks) working on the jobs of ``folder``."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"submitit.core._submit" in words and str(folder).encode() in words:
            return int(pid)
    return None


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds a job's process through /proc")
def test_a_multi_process_job_under_accelerate_launch_is_preempted_resumes_and_trains_like_one_process(tmp_path):
    _submitit()
    train = dict(TRAIN, steps=150, checkpoint_every=10, eval_every=50)
    suite = _suite(tmp_path, train, resources={"processes": 2, "cpus": 2}, seeds=(0,))
    assert main(["bench", str(suite), "--runs", str(tmp_path / "ref"), "--workers", "1"]) == 0
    runs = tmp_path / "runs"
    folder = runs / ".submitit" / "grid"
    bench = subprocess.Popen([sys.executable, "-m", "flowzoo", "bench", str(suite), "--runs", str(runs),
                              "--executor", "submitit-local", "--cluster", str(_cluster(tmp_path))],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = runs / "grid" / "toy2d_mode" / "flow_grpo" / "s0"
    try:
        _wait_for(lambda: (run / "checkpoint.pt").is_file(), 120, "the run's first checkpoint")
        job = _job_process(folder.resolve())
        assert job is not None
        os.kill(job, signal.SIGUSR2)  # SLURM's signal to the job's process; the ranks ignore it
        out, err = bench.communicate(timeout=300)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 0, err[-3000:]
    assert ": submitted (submitit-local; 0 GPU(s), 2 CPU(s)" in out
    log = "".join(p.read_text() for p in sorted(folder.glob("*_log.*")))
    assert "starts (2 process(es))" in log and "resumes from its checkpoint.pt (2 process(es))" in log
    assert log.count("flowzoo job: -m accelerate.commands.launch --multi_gpu --num_processes 2 --num_machines 1") == 2
    assert "flowzoo: rank 0 of 2: interrupted" in log and "flowzoo: rank 1 of 2: interrupted" in log
    stamps = {}
    for line in log.splitlines():  # the launch stops within seconds of the signal, not after the kill timeout
        for event in ("Calling checkpoint method", "Requeued job"):
            if event in line:
                stamps[event] = time.mktime(time.strptime(line.split("(", 1)[1].split(",")[0], "%Y-%m-%d %H:%M:%S"))
    assert stamps["Requeued job"] - stamps["Calling checkpoint method"] < 30, stamps
    one = _metrics(tmp_path / "ref" / "grid" / "toy2d_mode" / "flow_grpo" / "s0")
    two = _metrics(run)
    assert list(one.columns) == list(two.columns) and len(one) == len(two) == 151
    for column in one.columns:  # equal to float rounding, as tests/test_distributed.py checks for 2 processes
        np.testing.assert_allclose(two[column].to_numpy(float), one[column].to_numpy(float), rtol=1e-5, atol=1e-6,
                                   equal_nan=True, err_msg=column)
    assert (run / "done.json").is_file()
