"""Trackers under a 2-process run: only the main process logs, and finishing them leaves the runner's process group
alone (accelerate's ``end_training`` would destroy it before the final barrier). The two ranks are forked from this
process with the launcher's environment (tests/test_fsdp.py's ``_two_processes``; tests/test_distributed.py runs
``accelerate launch`` itself)."""

import pytest
import torch
from accelerate import tracking

import flowzoo.benchmark.run.tracking
from tests.test_distributed import CONFIG
from tests.test_fsdp import _two_processes
from tests.tracked_launch import FakeTracker

SMALL = ["train.steps=2", "train.prompts_per_step=2", "algorithm.group_size=2", "train.eval_every=0",
         "train.eval_samples_per_prompt=1", "train.save_samples=false", "train.checkpoint_every=0", "train.threads=1",
         "model.args.hidden=32", "model.args.pretrain_steps=50", "train.trackers=[fake]"]


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_two_processes_log_once_from_the_main_process_and_finish_cleanly(tmp_path, monkeypatch):
    monkeypatch.setitem(tracking.LOGGER_TYPE_TO_CLASS, "fake", FakeTracker)  # inherited by the forked ranks
    monkeypatch.setattr(flowzoo.benchmark.run.tracking, "check_trackers", lambda names: None)  # no LoggerType
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _two_processes([*SMALL, f"run_dir={tmp_path / 'run'}"], config=CONFIG) == [0, 0]
    assert (tmp_path / "run" / "done.json").is_file()
    lines = (tmp_path / "run" / "trackers" / "fake.log").read_text().splitlines()
    assert lines == ["config rank=0", "log 0 rank=0", "log 1 rank=0", "log 2 rank=0", "finish rank=0"]
