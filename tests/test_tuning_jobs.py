"""flowzoo tune --executor slurm|submitit-local (benchmark/tuning/tune.py tune_as_jobs): one scheduler job per
worker against the shared storage, tried for real with submitit's local executor (the jobs are subprocesses, as
tests/test_executors.py does for bench), and the storage and option checks before any job.

Tests that need submitit (the `slurm` extra: pip install -e '.[slurm]') are skipped with that reason without it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from flowzoo.benchmark.cli import main
from flowzoo.benchmark.tuning import jobs
from flowzoo.benchmark.tuning import tune as tuning
from flowzoo.benchmark.run.executors import Resources
from tests.test_tuning import studies, write_suite

NEEDS_EXTRA = "the slurm extra (submitit) is not installed: pip install -e '.[slurm]'"


def _one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flowzoo: error: "), lines
    return lines[0]


def _cluster(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"poll_s": 0.2, "signal_delay_s": 10}))
    return path


def _tune(suite_file: Path, runs: Path, *extra: str) -> list[str]:
    return ["tune", str(suite_file), "--runs", str(runs), "--tasks", "toy2d_mode", "--algorithms", "flow_grpo",
            *extra]


def test_two_jobs_on_one_study_never_run_the_same_trial_and_spend_the_budget(tmp_path, capsys):
    pytest.importorskip("submitit", reason=NEEDS_EXTRA)
    suite_file = write_suite(tmp_path, **{"tuning.trials": 4, "tuning.pruner.name": "none", "defaults.model.args":
                                          {"hidden": 32, "pretrain_steps": 30}})
    runs = tmp_path / "runs"
    argv = _tune(suite_file, runs, "--workers", "2", "--executor", "submitit-local", "--cluster",
                 str(_cluster(tmp_path)))
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    printed = capsys.readouterr().out
    assert printed.count(": submitted (submitit-local; 0 GPU(s), 1 CPU(s)") == 2, printed
    trials = studies(runs)["mini/toy2d_mode/flow_grpo"].get_trials(deepcopy=False)
    counted = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(counted) == 4 and len({t.number for t in counted}) == 4  # the budget exactly, each trial once
    assert len({tuple(sorted(t.params.items())) for t in counted}) == 4  # no two jobs drew the same values
    assert all(t.user_attrs.get("over_budget") for t in trials if t.state.name == "FAIL")
    assert all(t.user_attrs["worker"].split(":")[1] != str(os.getpid()) for t in counted)  # run in the jobs
    trial_dirs = sorted(p.name for p in (runs / "mini" / "tuning" / "toy2d_mode" / "flow_grpo").glob("trial*"))
    assert trial_dirs == sorted(f"trial{t.number}" for t in counted)
    # one progress line per trial here, as the storage shows them; each job is one worker index, as local workers
    assert sum(" trial " in line and " -> objective " in line for line in printed.splitlines()) == 4
    logs = "".join(p.read_text() for p in (runs / ".submitit" / "mini" / "tune").glob("*_log.out"))
    assert "flowzoo tune job: worker 0 on sqlite" in logs and "flowzoo tune job: worker 1 on sqlite" in logs


def test_a_job_is_seeded_as_the_local_worker_of_its_index(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(jobs, "_worker", lambda *args: seen.append(args))  # where TuneJob finds it
    monkeypatch.chdir(tmp_path)  # the job changes into its cwd: restored after the test, not left to later tests
    job = tuning.TuneJob(("suite", None, None, 2, "sqlite:///x.db", "trials"), 3, 1, "key", cwd=str(tmp_path))
    assert job() == ("key", None)
    assert seen == [("suite", None, None, 2, "sqlite:///x.db", "trials", 3, 1)]  # threads, worker index 1
    pytest.importorskip("submitit", reason=NEEDS_EXTRA)
    again = job.checkpoint().function  # preempted or out of time: requeued as the same worker
    assert (again.worker_index, again.threads, again.args, again.key, again.cwd) == (1, 3, job.args, "key", job.cwd)


def test_a_job_asks_for_the_largest_of_its_cells_tasks_resources():
    from flowzoo.benchmark.run.suite import Suite

    suite = Suite(name="s", tasks={"a": {"resources": {"gpus": 4, "cpus": 8}}, "b": {"resources": {"mem_gb": 64}}},
                  resources={"time_min": 90})
    cells = [tuning.Cell("a", "flow_grpo", {}, None, {}), tuning.Cell("b", "flow_grpo", {}, None, {})]
    res = tuning.worker_resources(suite, cells, {"cpus": 2})
    assert res == Resources(gpus=1, cpus=8, mem_gb=64, time_min=90)  # a trial trains on one process, one GPU
    assert res.threads == 8


def test_storages_the_workers_cannot_share_are_refused_in_one_line(tmp_path, capsys, monkeypatch):
    suite_file = write_suite(tmp_path)
    runs = tmp_path / "runs"
    for url in ("sqlite://", "sqlite:///:memory:"):
        assert main(_tune(suite_file, runs, "--storage", url)) == 2
        assert "in-memory SQLite database lives in one process" in _one_error_line(capsys)
    assert main(_tune(suite_file, runs, "--storage", "not a url")) == 2
    assert "--storage not a url: not a database URL" in _one_error_line(capsys)
    assert main(_tune(suite_file, runs, "--executor", "sge")) == 2
    assert "--executor 'sge': valid: local, submitit-local, slurm" in _one_error_line(capsys)
    assert main(_tune(suite_file, runs, "--report", "--out", str(tmp_path / "o"), "--executor", "slurm")) == 2
    assert "--report runs no trial" in _one_error_line(capsys)
    assert tuning.check_storage("postgresql://host/db", "slurm") is None  # passed to the jobs as it is
    note = tuning.check_storage("sqlite:////shared/tune.db", "slurm")
    assert "shared file system" in note and "postgresql://" in note
    assert not list(runs.rglob("*.db")) and not (runs / ".submitit").exists()
    pytest.importorskip("submitit", reason=NEEDS_EXTRA)
    for tool in ("sbatch", "srun"):  # a login node, as far as the checks can tell; nothing is submitted
        (tmp_path / tool).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{Path(sys.executable).parent}")
    assert main(_tune(suite_file, runs, "--executor", "slurm", "--storage", "sqlite:////dev/shm/t.db")) == 2
    assert "/dev/shm/t.db is under /dev/shm, a node-local directory" in _one_error_line(capsys)
    assert not Path("/dev/shm/t.db").exists()
