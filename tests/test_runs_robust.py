"""Run directories survive kills, corruption and concurrent writers."""

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.runner import TIMING_COLUMNS
from flowzoo.errors import RunError
from flowzoo.io import exclusive_lock

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
ARGS = ["train.steps=60", "train.prompts_per_step=4", "train.eval_every=20", "train.eval_samples_per_prompt=8",
        "train.save_samples=false", "train.checkpoint_every=5", "algorithm.group_size=4"]


def _metrics(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(run_dir / "metrics.csv")
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame])


def _train_quietly(args: list[str]) -> None:
    """``flowzoo train ARGS`` in a forked process (its imports already done), its output discarded."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os._exit(main(["train", *args]))


def test_sigkill_mid_training_then_resume_matches_uninterrupted_run(tmp_path):
    killed = tmp_path / "killed"
    # the run to kill is a process of its own, forked from this one (no interpreter start-up to wait for)
    proc = multiprocessing.get_context("fork").Process(
        target=_train_quietly, args=([str(CONFIG), *ARGS, f"run_dir={killed}", "--quiet"],))
    proc.start()
    deadline = time.time() + 120
    while not (killed / "checkpoint.pt").exists() and time.time() < deadline and proc.exitcode is None:
        time.sleep(0.005)
    time.sleep(0.05)  # let it run past the checkpoint: metrics.csv then holds rows the checkpoint does not
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert not (killed / "done.json").exists(), "the run finished before it could be killed; make it longer"
    assert main(["train", str(CONFIG), *ARGS, f"run_dir={killed}", "--quiet"]) == 0
    reference = tmp_path / "reference"
    assert main(["train", str(CONFIG), *ARGS, f"run_dir={reference}", "--quiet"]) == 0
    pd.testing.assert_frame_equal(_metrics(killed), _metrics(reference))


def test_truncated_checkpoint_is_a_clear_error(tmp_path, capsys):
    run_dir = tmp_path / "run"
    short = [a for a in ARGS if not a.startswith("train.steps")] + ["train.steps=5"]
    assert main(["train", str(CONFIG), *short, f"run_dir={run_dir}", "--quiet"]) == 0
    (run_dir / "done.json").unlink()
    data = (run_dir / "checkpoint.pt").read_bytes()
    (run_dir / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    assert main(["train", str(CONFIG), *short, f"run_dir={run_dir}", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is corrupt or truncated" in err and "delete it" in err


def test_a_run_directory_has_one_writer(tmp_path, capsys):
    run_dir = tmp_path / "run"
    with exclusive_lock(run_dir / ".lock", what="run"):
        assert main(["train", str(CONFIG), *ARGS, f"run_dir={run_dir}", "--quiet"]) == 2
    assert "is being written by another process" in capsys.readouterr().err
    assert not (run_dir / "metrics.csv").exists()
    with exclusive_lock(tmp_path / "x.lock"):
        with pytest.raises(RunError):
            with exclusive_lock(tmp_path / "x.lock"):
                pass


def test_two_suites_share_a_results_directory_without_clobbering(tmp_path):
    other = tmp_path / "other.yaml"
    smoke = (ROOT / "benchmark" / "suites" / "smoke.yaml").read_text()
    other.write_text(smoke.replace("name: smoke", "name: other").replace("seeds: [0, 1]", "seeds: [0]"))
    runs = tmp_path / "runs"
    assert main(["bench", "smoke", "--runs", str(runs), "--workers", "1"]) == 0
    before = {p: p.read_bytes() for p in (runs / "smoke").rglob("metrics.csv")}
    assert main(["bench", str(other), "--runs", str(runs), "--workers", "1"]) == 0
    assert sorted(p.name for p in runs.iterdir()) == ["other", "smoke"]
    assert {p: p.read_bytes() for p in (runs / "smoke").rglob("metrics.csv")} == before
    assert len(list((runs / "other").rglob("done.json"))) == 1


def test_atomic_writes_get_the_permissions_of_a_plain_open(tmp_path):
    import os

    from flowzoo.io import atomic_write_text

    (tmp_path / "plain.txt").write_text("x")
    atomic_write_text(tmp_path / "atomic.txt", "x")
    mode = lambda name: os.stat(tmp_path / name).st_mode & 0o777  # noqa: E731
    assert mode("atomic.txt") == mode("plain.txt") and (tmp_path / "atomic.txt").read_text() == "x"
