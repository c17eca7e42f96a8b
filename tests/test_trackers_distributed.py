"""Trackers under a 2-process launch: only the main process logs, and finishing them leaves the runner's process
group alone (accelerate's ``end_training`` would destroy it before the final barrier)."""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
ACCELERATE = shutil.which("accelerate") or str(Path(sys.executable).with_name("accelerate"))
SMALL = ["train.steps=2", "train.prompts_per_step=2", "algorithm.group_size=2", "train.eval_every=0",
         "train.eval_samples_per_prompt=1", "train.save_samples=false", "train.checkpoint_every=0", "train.threads=1",
         "model.args.hidden=32", "model.args.pretrain_steps=50", "train.trackers=[fake]"]


@pytest.mark.slow
def test_two_processes_log_once_from_the_main_process_and_finish_cleanly(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", "--main_process_port", str(port), str(ROOT / "tests" / "tracked_launch.py"),
           "train", str(CONFIG), *SMALL, f"run_dir={tmp_path / 'run'}", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "done.json").is_file()
    lines = (tmp_path / "run" / "trackers" / "fake.log").read_text().splitlines()
    assert lines == ["config rank=0", "log 0 rank=0", "log 1 rank=0", "log 2 rank=0", "finish rank=0"]
