"""Two CPU processes (gloo) give the metrics of one process with the same global batch and seed; a global batch that
does not split over the processes is refused before any work.

One case is launched by ``accelerate launch`` (the launcher a user runs, torchrun underneath), as are the uneven split
and the failing rank; the other cases fork their two ranks from this process with the launcher's environment
(tests/test_fsdp.py's ``_two_processes``), which runs the same ``flowzoo train`` in each rank without ~8-13 s of
imports per launch on the CI's 2 cores."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from flowzoo.algorithms.engine.distributed import SingleProcess
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.loading import load_config
from flowzoo.benchmark.run.runner import TIMING_COLUMNS, Runner
from flowzoo.errors import ConfigError
from tests.test_fsdp import _two_processes

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
# 3 prompts x G = 6: 18 samples, 9 per process, so the middle group spans both processes
TINY = ["train.steps=3", "train.prompts_per_step=3", "algorithm.group_size=6", "train.eval_every=2",
        "train.eval_samples_per_prompt=3", "train.save_samples=false", "train.checkpoint_every=0", "train.threads=1",
        "model.args.hidden=32", "model.args.pretrain_steps=200"]  # a small toy model: pretraining runs in each process
ALGORITHMS = {
    # two minibatches: the permutation over global sample indices splits each process's samples
    "flow_grpo": ["algorithm.name=flow_grpo", "algorithm.minibatches=2"],
    # one optimizer step: the default recompute-free update (each process back-propagates its kept rollout graphs)
    "flow_grpo_lean": ["algorithm.name=flow_grpo"],
    # the weight EMA: every rank keeps the same average and evaluates its shard of the evaluation with it
    "flow_grpo_ema": ["algorithm.name=flow_grpo", "algorithm.ema=true", "algorithm.ema_every=1"],
    # replay from step 2 on (every prompt repeats), truncated at t_off, self-normalised weights
    "op_grpo": ["algorithm.name=op_grpo", "algorithm.t_off=4", "algorithm.weight_self_normalize=true",
                "algorithm.off_policy_groups=1.0"],
    # a filtering sampler: extra rounds until 3 groups of intermediate pass rate (or 4 rounds); ranks then hold
    # different numbers of samples; the variance sampler: its estimates from the gathered outcomes on every rank
    "flow_grpo_difficulty": ["algorithm.name=flow_grpo", "train.prompt_sampler={name: difficulty, low: 0.3, high: 0.7, "
                             "success_threshold: 0.3}"],
    "flow_grpo_variance": ["algorithm.name=flow_grpo", "train.prompt_sampler=variance"],
    # buffer prompts: 1 or 2 of the 3 groups per step take a buffer prompt, with k = 2 replayed samples each
    "op_grpo_buffer": ["algorithm.name=op_grpo", "algorithm.t_off=4", "algorithm.replay_prompts=buffer",
                       "algorithm.off_policy_groups=0.5", "algorithm.replay_k=2"],
    # what a gain cost: the toy W2 gold on every rank's gathered samples, and conditions never trained on; a reward
    # as the judge, scored on each rank's shard and summed
    "flow_grpo_costs": ["algorithm.name=flow_grpo", "train.gold=toy_w2", "prompts.unseen_every=2"],
    "flow_grpo_judge": ["algorithm.name=flow_grpo", "train.gold={name: toy_target}"],
}
ACCELERATE = shutil.which("accelerate") or str(Path(sys.executable).with_name("accelerate"))
#: the case run under ``accelerate launch``; the others fork their ranks
LAUNCHED = "flow_grpo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(processes: int, *args: str) -> subprocess.CompletedProcess:
    """``accelerate launch`` of ``python -m flowzoo train`` on CPU (``--multi_gpu`` picks torchrun; ``--cpu`` would
    ask for mpirun)."""
    cmd = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
           "-m", "flowzoo", "train", str(CONFIG), *args, "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


ROUNDING_DIAGNOSTIC = "onpolicy_max_abs_log_ratio"


def _metrics(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(run_dir / "metrics.csv")
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame])


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_two_processes_give_the_metrics_of_one(tmp_path, monkeypatch, name):
    if name == LAUNCHED and not Path(ACCELERATE).exists():
        pytest.skip("accelerate is not installed")
    args = [*TINY, *ALGORITHMS[name]]
    single, double = tmp_path / "single", tmp_path / "double"
    assert main(["train", str(CONFIG), *args, f"run_dir={single}", "--quiet"]) == 0
    if name == LAUNCHED:
        proc = _launch(2, *args, f"run_dir={double}")
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        assert _two_processes([*args, f"run_dir={double}"], config=CONFIG) == [0, 0]
    one, two = _metrics(single), _metrics(double)
    assert list(one.columns) == list(two.columns) and len(one) == len(two) == 4
    if name.startswith("op_grpo"):
        assert (one["off_policy_frac"].fillna(0) > 0).any(), "no replayed samples: the test would not test the buffer"
    expected = {"flow_grpo_costs": ("eval_gold_distance", "eval_unseen_reward"), "flow_grpo_judge": ("eval_gold",)}
    for column in expected.get(name, ()):
        assert one[column].notna().sum() == 3, f"{column}: the test would not test it"
    for column in one.columns:
        a, b = one[column].to_numpy(float), two[column].to_numpy(float)
        if column == ROUNDING_DIAGNOSTIC:
            # the on-policy |log p_recomputed - log p_sampled| is float32 rounding itself (log-probs of size ~10: one
            # ulp ~1e-6): a rank recomputes in other batch shapes than one process, so it is ~1e-6 there and 0 here
            assert np.nanmax(np.abs(np.concatenate([a, b]))) < 1e-5, (a, b)
            continue
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=column)
    assert (one["nfe"] == two["nfe"]).all()
    assert (double / "done.json").is_file() and (double / "checkpoint.pt").is_file()


class _ThreeProcesses(SingleProcess):
    world_size = 3

    def all_gather_object(self, obj):
        raise AssertionError("no collective may run before the batch check")


def test_uneven_split_is_refused_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    config = load_config(CONFIG, [*TINY, "train.prompts_per_step=2", "algorithm.group_size=4", f"run_dir={run_dir}"])
    with pytest.raises(ConfigError) as err:
        Runner(config, progress=False, dist=_ThreeProcesses()).run()
    message = str(err.value)
    assert "\n" not in message and "2 x 4 = 8" in message and "3 processes" in message
    assert not run_dir.exists()


@pytest.mark.skipif(not Path(ACCELERATE).exists(), reason="accelerate is not installed")
def test_uneven_split_under_accelerate_launch_fails_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = _launch(2, *TINY, "train.prompts_per_step=3", "algorithm.group_size=3", f"run_dir={run_dir}")
    assert proc.returncode != 0
    assert "3 x 3 = 9 samples does not split evenly over 2 processes" in proc.stderr
    assert not run_dir.exists()


@pytest.mark.skipif(not Path(ACCELERATE).exists(), reason="accelerate is not installed")
def test_a_failing_rank_ends_every_rank_within_seconds_with_one_line(tmp_path):
    """Rank 1 raises in its second training step while rank 0 waits in a collective: both end within seconds, the
    failing rank says which rank failed and why in one line, the other says in one line that it was stopped."""
    stamp = tmp_path / "fault_time"
    cmd = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
           str(ROOT / "tests" / "distributed_fault.py"), "train", str(CONFIG), *TINY, f"run_dir={tmp_path / 'run'}",
           "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "FLOWZOO_TEST_FAIL_RANK": "1",
           "FLOWZOO_TEST_FAIL_STEP": "2", "FLOWZOO_TEST_FAIL_STAMP": str(stamp)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    ended = time.time()
    assert proc.returncode != 0
    assert stamp.is_file(), proc.stderr[-3000:]
    assert ended - float(stamp.read_text()) < 20, "the ranks did not end within seconds of the fault"
    lines = proc.stderr.splitlines()
    failed = [line for line in lines if line.startswith("flowzoo: error: rank 1 of 2 failed:")]
    assert failed == ["flowzoo: error: rank 1 of 2 failed: RuntimeError: injected fault in the training step"], \
        proc.stderr[-3000:]
    assert not any("terminate called" in line for line in lines), proc.stderr[-3000:]
    # rank 0, blocked in a collective with the failed rank, ends with one line of its own (stopped, or lost its peer)
    assert any(line.startswith("flowzoo: ") and "rank 0 of 2" in line for line in lines), proc.stderr[-3000:]
