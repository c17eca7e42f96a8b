"""The hostile-input probe of issue 17, scripted end to end through the CLI: each case the first probe found (a raw
traceback for a user error, a silent wrong result, files written before a failure) that no other test covers from the
command line. Each must exit 2 with one line on stderr, and leave no run directory behind (or do the right thing).

Covered elsewhere and not repeated here: pretrain over the shipped weights, lr=1 divergence after checkpoints,
flipped checkpoint bits, resume after config.yaml was deleted, NaN/inf/huge numbers at load, non-UTF-8 configs, the
Flow-GRPO-Fast and DanceGRPO step checks, full disk, a run dir under a file, garbage config.yaml in a run dir, bench
into runs of another config (tests/test_hostile_inputs.py); MixGRPO windows, wrong reward arguments, out of memory
at step 1 (tests/test_experiment.py); corrupt runs in a report (tests/test_report.py).
"""

from __future__ import annotations

import errno

import pytest

from flowzoo import rewards
from flowzoo.benchmark.cli import main, user_error
from flowzoo.rewards.toy import ToyModeReward

CONFIG = "benchmark/configs/toy_flow_grpo.yaml"
TOY = ["train", CONFIG, "--quiet", "model.args.pretrain_steps=30", "model.args.hidden=32", "train.eval_every=0",
       "train.save_samples=false", "train.eval_samples_per_prompt=2", "train.prompts_per_step=2",
       "algorithm.group_size=4", "train.steps=2"]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ---- refused before anything is written, from the command line -------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    # silent wrong results: t_off beyond T was clamped
    (["algorithm.name=op_grpo", "algorithm.t_off=11"], "algorithm.t_off must be in [0, T] = [0, 10]"),
    (["algorithm.shift=0"], "algorithm.shift must be a finite number > 0"),  # found by the config fuzz
    (["algorithm.shift=.nan"], "algorithm.shift: expected a finite number, got nan"),
    (["algorithm.name=op_grpo", "algorithm.num_steps=4", "algorithm.t_off=5"], "algorithm.t_off must be in [0, T] = [0, 4]"),
    (["algorithm.name=op_grpo_no_truncation", "algorithm.num_steps=3", "algorithm.replay_k=4"],
     "algorithm.replay_k must be in [0, group_size - 1] = [0, 3], got 4"),
    (["algorithm.clip_range=.nan"], "algorithm.clip_range: expected a finite number, got nan"),
    (["reward={toy_mode: 0}"], "every weight is 0"),
    (["reward_args={toy_mode: {scale: 0}}"], "scale must be a number > 0"),
    # tracebacks for user errors
    (["model.args.hidden=abc"], "model.args.hidden: expected an integer, got 'abc'"),
    (["reward_args={toy_mode: 5}"], "reward_args.toy_mode: expected a mapping"),
    (["seed=-1"], "seed must be an integer in [0, 2**63), got -1"),
    (["seed=100000000000000000000"], "seed: 100000000000000000000 does not fit in a 64-bit integer"),
    (["algorithm.group_size=1e9"], "algorithm.group_size: expected an integer, got '1e9'"),
    (["algorithm.group_size=1000000000000"], "GiB for its rollout latents alone"),  # a MemoryError once
    (["reward=jpeg_compressibility"], "makes points samples"),
    # errors after files were written: model-dependent checks
    (["algorithm.name=mix_grpo_flash", "algorithm.window_size=9"], "algorithm.window_size 9 needs num_steps >= 11"),
    (["algorithm.name=flow_grpo_fast", "algorithm.num_steps=3"], "sde_window_size 2 does not fit in the first 1 of 3"),
    (["train.threads=0"], "train.threads must be a positive integer or null, got 0"),
])
def test_refused_in_one_line_before_a_run_dir(tmp_path, capsys, overrides, message):
    run = tmp_path / "run"
    assert main([*TOY, *overrides, f"run_dir={run}"]) == 2
    assert message in _one_error_line(capsys)
    assert not run.exists()


# ---- failures during a fresh run before its first checkpoint: one line, nothing left ----------------------------
def test_divergence_before_the_first_checkpoint_leaves_no_run_dir_and_the_fix_trains(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TOY, "algorithm.lr=1e30", "algorithm.max_grad_norm=0", f"run_dir={run}"]) == 2
    line = _one_error_line(capsys)
    assert "training diverged at step" in line and "no checkpoint was written before it" in line
    assert "returned non-finite scores" not in line
    assert not run.exists()
    assert main([*TOY, "algorithm.max_grad_norm=0", f"run_dir={run}"]) == 0  # not refused as another config


class _FailsAfterEvaluation(ToyModeReward):
    """Scores the step-0 evaluation, then fails: a reward that raises in training, not in evaluation."""

    name = "test_fails_in_training"
    calls = 0

    def score(self, samples, prompts, metadata):
        type(self).calls += 1
        if type(self).calls > 1:
            raise ZeroDivisionError("judge crashed")
        return super().score(samples, prompts, metadata)


def test_a_reward_that_raises_in_training_is_one_line_and_leaves_no_run_dir(tmp_path, capsys):
    rewards.REGISTRY.add(_FailsAfterEvaluation.name, _FailsAfterEvaluation)
    try:
        run = tmp_path / "run"
        assert main([*TOY, f"reward={_FailsAfterEvaluation.name}", f"run_dir={run}"]) == 2
        line = _one_error_line(capsys)
        assert line == ("flowzoo: error: reward 'test_fails_in_training' failed in training: ZeroDivisionError: judge "
                        "crashed")
        assert _FailsAfterEvaluation.calls == 2 and not run.exists()
    finally:
        rewards.REGISTRY._entries.pop(_FailsAfterEvaluation.name)


def test_read_only_run_dir_is_one_line_naming_the_path(tmp_path, capsys, monkeypatch):
    import flowzoo.benchmark.run.runner as runner

    def read_only(path, what=""):  # what a read-only file system answers to the lock file's creation
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setattr(runner, "exclusive_lock", read_only)
    assert main([*TOY, f"run_dir={run}"]) == 2
    assert _one_error_line(capsys) == f"flowzoo: error: {run / '.lock'}: Read-only file system"
    assert list(run.iterdir()) == []


def test_cxx_allocation_failure_is_out_of_memory():
    """``ulimit -v`` makes torch's C++ allocations fail with std::bad_alloc: out of memory, not a bug."""
    assert user_error(RuntimeError("std::bad_alloc")).startswith("out of memory (std::bad_alloc)")


# ---- bench and report misuse -----------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--seeds", ","], "--seeds: no seed in ','"),
    (["--seeds", "a"], "--seeds: expected comma-separated integers, got 'a'"),
    (["--algorithms", " , "], "--algorithms: no algorithm named in ' , '"),
    (["--algorithms", "flow_grpo,nope"], "nope"),
])
def test_bench_selection_errors_are_one_line_and_run_nothing(tmp_path, capsys, args, message):
    assert main(["bench", "smoke", "--runs", str(tmp_path / "runs"), *args]) == 2
    assert message in _one_error_line(capsys)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name, content", [
    ("metrics.csv", b""), ("metrics.csv", bytes(range(256)) * 4), ("config.yaml", b"\x00\xff garbage: [")])
def test_report_on_only_unreadable_runs_is_one_line(tmp_path, capsys, name, content):
    run = tmp_path / "runs" / "task" / "flow_grpo" / "s0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("task: task\nseed: 0\nalgorithm: {name: flow_grpo}\n")
    (run / "metrics.csv").write_text("step,nfe,wall_s,reward_mean,eval_reward\n0,0,0.0,,0.1\n")
    (run / name).write_bytes(content)
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "report")]) == 2
    _one_error_line(capsys)
