"""The run-directory lock across processes: a second writer is refused with one line; a killed holder frees it."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flowzoo.benchmark.cli import main
from flowzoo.errors import RunError
from flowzoo.io import exclusive_lock

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
HOLD = "import sys, time; from flowzoo.io import exclusive_lock\nwith exclusive_lock(sys.argv[1]):\n" \
       "    print('held', flush=True); time.sleep(120)\n"


def test_another_process_holding_the_lock_refuses_the_run_and_a_killed_holder_frees_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir / ".lock")], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert main(["train", str(CONFIG), "train.steps=1", f"run_dir={run_dir}", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err == f"flowzoo: error: run {run_dir} is being written by another process (lock {run_dir / '.lock'})\n"
        assert not (run_dir / "config.yaml").exists() and not (run_dir / "metrics.csv").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with exclusive_lock(run_dir / ".lock"):  # the kernel dropped the dead holder's lock
        with pytest.raises(RunError):
            with exclusive_lock(run_dir / ".lock"):
                pass
    with exclusive_lock(run_dir / ".lock"):  # released on leaving the block
        pass
