"""Hostile inputs: each case here once lost data, ran on silently with a wrong result, or wrote files before failing.

Every case must end in one line (a FlowZooError, exit 2 from the CLI) or do the right thing, and must not touch the
shipped weights or leave a run directory behind when the config is refused.
"""

from __future__ import annotations

import hashlib
import math
import shutil

import pytest
import torch

from flowzoo.benchmark.cli import main
from flowzoo.errors import ConfigError, FlowZooError


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- data loss: pretrain never replaces the shipped weights by default ------------------------------------------
@pytest.fixture
def shipped_copy(tmp_path, monkeypatch):
    """The shipped glyph weights copied into a scratch weights directory that stands in for models/weights/ (so a
    regression overwrites the copy, never the real file)."""
    import flowzoo.models.tiny as tiny

    weights = tmp_path / "weights"
    weights.mkdir()
    for name in ("tiny_glyphs.safetensors", "tiny_shapes.safetensors"):
        shutil.copy(tiny.WEIGHTS_DIR / name, weights / name)
    monkeypatch.setattr(tiny, "WEIGHTS_DIR", weights)
    return weights / "tiny_glyphs.safetensors"


PRETRAIN = ["pretrain", "tiny", "--data", "glyphs", "--batch", "2", "--threads", "1", "--quiet"]


def test_pretrain_zero_minutes_writes_under_its_run_dir_not_over_the_shipped_weights(tmp_path, shipped_copy, capsys):
    before = _digest(shipped_copy)
    run_dir = tmp_path / "pre"
    assert main([*PRETRAIN, "--minutes", "0", "--run-dir", str(run_dir)]) == 0
    assert _digest(shipped_copy) == before
    assert (run_dir / "tiny_glyphs.safetensors").is_file()
    assert str(run_dir / "tiny_glyphs.safetensors") in capsys.readouterr().out


def test_pretrain_refuses_untrained_weights_over_a_named_shipped_file(tmp_path, shipped_copy, capsys):
    before = _digest(shipped_copy)
    rc = main([*PRETRAIN, "--minutes", "0", "--out", str(shipped_copy), "--run-dir", str(tmp_path / "pre")])
    err = capsys.readouterr().err
    assert rc == 2 and "trains nothing" in err and len(err.strip().splitlines()) == 1
    assert _digest(shipped_copy) == before


def test_pretrain_rejects_nan_minutes(tmp_path, shipped_copy, capsys):
    assert main([*PRETRAIN, "--minutes", "nan", "--run-dir", str(tmp_path / "pre")]) == 2
    assert "minutes must be a finite number" in capsys.readouterr().err
    assert not (tmp_path / "pre").exists()


# ---- divergence: one line naming the step and the quantity, never the reward ----------------------------------
TOY = ["train", "benchmark/configs/toy_flow_grpo.yaml", "--quiet", "model.args.pretrain_steps=30",
       "model.args.hidden=32", "train.eval_every=0", "train.save_samples=false", "train.eval_samples_per_prompt=2",
       "train.prompts_per_step=2", "algorithm.group_size=4"]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_lr_one_diverges_with_one_line_naming_the_policy_not_the_reward(tmp_path, capsys):
    import pandas as pd

    rc = main([*TOY, "algorithm.lr=1", "train.steps=8", "train.checkpoint_every=1", f"run_dir={tmp_path}"])
    err = _one_error_line(capsys)
    assert rc == 2 and "training diverged at step" in err and "lr=1.0" in err
    assert "decoded samples are not finite" in err and "returned non-finite scores" not in err
    step = int(err.split("training diverged at step ")[1].split(":")[0])
    assert f"the last good checkpoint is step {step - 1}" in err
    assert list(pd.read_csv(tmp_path / "metrics.csv")["step"]) == list(range(step))  # the failing step wrote nothing


def test_guard_names_a_non_finite_gradient_norm_loss_or_parameter():
    from flowzoo.algorithms.engine.base import AlgorithmConfig, StepStats
    from flowzoo.benchmark.measures.divergence import DivergenceError, DivergenceGuard

    def stats(loss=0.1, grad_norm=1.0):
        return StepStats(0.5, 0.1, 0.0, 0.0, 0.0, 1.0, loss, grad_norm, 1, 1, 0.0, 0.0, 0.0)

    guard = DivergenceGuard(AlgorithmConfig(lr=3e-4), last_good=None)
    fine = [torch.ones(3), torch.zeros(2)]
    guard.check(1, stats(), fine)
    guard.saved(5)
    with pytest.raises(DivergenceError, match=r"step 7: the gradient norm is not finite \(inf\) \(lr=0.0003, .*"
                                              r"the last good checkpoint is step 5"):
        guard.check(7, stats(grad_norm=math.inf), fine)
    with pytest.raises(DivergenceError, match="step 7: the loss is not finite"):
        guard.check(7, stats(loss=math.nan), fine)
    with pytest.raises(DivergenceError, match=r"step 8: the trainable parameters are not finite \(1 tensors"):
        guard.check(8, stats(), [torch.ones(3), torch.tensor([0.0, math.nan])])
    assert issubclass(DivergenceError, FlowZooError)


def _finished_toy_run(tmp_path, *extra):
    args = [*TOY, "train.steps=2", f"run_dir={tmp_path}", *extra]
    assert main(args) == 0
    (tmp_path / "done.json").unlink()  # as if killed after its last checkpoint
    return args


@pytest.mark.parametrize("flip", ["exponent", "mantissa"])
def test_checkpoint_with_flipped_bits_is_refused_on_resume(tmp_path, capsys, flip):
    args = _finished_toy_run(tmp_path)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    tensor = next(iter(state["algorithm"]["model"].values()))
    bits = tensor.view(-1)[:1].view(torch.int32)
    if flip == "exponent":
        bits |= 0x7F800000  # every exponent bit set: inf or NaN
    else:
        bits ^= 0x1  # the lowest mantissa bit: a silently different number
    torch.save(state, tmp_path / "checkpoint.pt")
    capsys.readouterr()
    assert main(args) == 2
    assert "do not match the checksum" in _one_error_line(capsys)
    if flip == "exponent":  # a checkpoint without a checksum (older runs) is still refused, by its values
        del state["seal"]
        torch.save(state, tmp_path / "checkpoint.pt")
        assert main(args) == 2
        assert "holds non-finite parameters" in _one_error_line(capsys)


@pytest.mark.parametrize("algorithm", ["flow_grpo", "op_grpo"])
def test_resume_with_another_config_after_deleting_config_yaml_is_refused(tmp_path, capsys, algorithm):
    args = _finished_toy_run(tmp_path, f"algorithm.name={algorithm}")
    (tmp_path / "config.yaml").unlink()
    capsys.readouterr()
    assert main([*args, "seed=1", "algorithm.lr=0.01"]) == 2
    assert "was written by a run of another config" in _one_error_line(capsys)
    assert not (tmp_path / "config.yaml").exists()  # refused before writing
    assert main(args) == 0  # the run's own config resumes


def test_a_reward_that_raises_in_training_is_one_line_naming_it(toy_model, toy_prompts):
    from flowzoo import algorithms
    from flowzoo.rewards.base import Reward
    from flowzoo.rewards.errors import RewardError

    class Broken(Reward):
        name = "broken"
        accepts = ("points",)

        def score(self, samples, prompts, metadata):
            raise ZeroDivisionError("no judge")

    prompts, metadata = toy_prompts
    alg = algorithms.get("flow_grpo")(toy_model, Broken(), {"group_size": 2, "num_steps": 2})
    with pytest.raises(RewardError, match="reward 'broken' failed in training: ZeroDivisionError: no judge"):
        alg.step(prompts[:2], metadata[:2])


def test_non_finite_samples_are_not_blamed_on_the_reward_in_evaluation():
    from flowzoo.rewards.errors import NonFiniteSamplesError
    from flowzoo.rewards.pool import RewardPool
    from flowzoo.rewards.toy import ToyModeReward

    samples = torch.tensor([[0.0, 1.0], [math.nan, 0.0]])
    with RewardPool(ToyModeReward()) as pool, pytest.raises(NonFiniteSamplesError, match=r"\(1 of 2\)"):
        pool.submit(samples, ["a", "b"], [{"mode_target": [0, 0]}] * 2).result()


# ---- silent wrong results: NaN/inf and degenerate values are refused at load, naming the key -------------------
@pytest.mark.parametrize("override, message", [
    ("algorithm.clip_range=.nan", "algorithm.clip_range: expected a finite number, got nan"),
    ("algorithm.adv_clip=.nan", "algorithm.adv_clip: expected a finite number, got nan"),
    ("algorithm.lr=.inf", "algorithm.lr: expected a finite number, got inf"),
    ("algorithm.lr=1e999", "algorithm.lr: expected a finite number, got inf"),
    ("algorithm.shift=.nan", "algorithm.shift: expected a finite number, got nan"),
    ("algorithm.adv_clip=3.5e38", "algorithm.adv_clip: 3.5e+38 is beyond the float32 range"),
    ("reward={toy_mode: 0}", "every weight is 0"),
    ("reward={toy_mode: .nan}", "the weight of 'toy_mode' must be a finite number, got nan"),
    ("reward_args={toy_mode: {scale: .nan}}", "reward_args.toy_mode.scale: expected a finite number, got nan"),
    ("reward_args={toy_mode: {scale: abc}}", "reward_args.toy_mode.scale: expected a number, got 'abc'"),
    ("reward_args={toy_mode: 5}", "reward_args.toy_mode: expected a mapping"),
    ("model.args.hidden=abc", "model.args.hidden: expected an integer, got 'abc'"),
    ("seed=-1", "seed must be an integer in [0, 2**63), got -1"),
    ("seed=100000000000000000000", "seed: 100000000000000000000 does not fit in a 64-bit integer"),
    ("algorithm.group_size=9223372036854775808", "algorithm.group_size: 9223372036854775808 does not fit in a 64-bit"),
])
def test_bad_numbers_fail_at_load_naming_key_and_value(override, message):
    from flowzoo.benchmark.run.loading import load_config
    with pytest.raises(ConfigError) as error:
        load_config("benchmark/configs/toy_flow_grpo.yaml", [override])
    assert message in str(error.value)


def test_algorithm_config_range_checks_reject_nan_built_directly():
    from flowzoo.algorithms.engine.base import AlgorithmConfig

    for name in ("clip_range", "adv_clip", "lr", "max_grad_norm", "kl_beta", "noise_level", "adv_eps", "adam_eps",
                 "weight_decay"):
        with pytest.raises(ConfigError, match=f"algorithm.{name} must be a finite number, got nan"):
            AlgorithmConfig(**{name: math.nan})
    for name in ("adam_eps", "weight_decay"):  # found by the run fuzz: AdamW's own ValueError after config.yaml
        with pytest.raises(ConfigError, match=f"algorithm.{name} must be >= 0, got -1"):
            AlgorithmConfig(**{name: -1.0})
    for level in (0.0, 6e-186):  # found by the run fuzz: a deterministic sampler, the update had no gradient
        with pytest.raises(ConfigError, match="algorithm.noise_level must be >= 1e-6"):
            AlgorithmConfig(noise_level=level)


def test_non_utf8_config_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"seed: \xff\xfe\n")
    assert main(["train", str(bad), f"run_dir={tmp_path / 'run'}"]) == 2
    assert "not UTF-8 text" in _one_error_line(capsys)


def test_toy_reward_scale_zero_is_refused_before_anything_is_written(tmp_path, capsys):
    rc = main([*TOY, "reward_args={toy_mode: {scale: 0}}", f"run_dir={tmp_path / 'run'}"])
    assert rc == 2 and "scale must be a number > 0 whose square is finite" in _one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_empty_seed_or_algorithm_list_is_refused():
    from flowzoo.benchmark.run.suite import load_suite, select

    suite = load_suite("smoke")
    with pytest.raises(ConfigError, match="--seeds: no seed in ','"):
        select(suite, None, ",")
    with pytest.raises(ConfigError, match="--algorithms: no algorithm named in ' , '"):
        select(suite, " , ", None)


# ---- model-dependent checks run before the run directory is written --------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["algorithm.name=flow_grpo_fast", "algorithm.sde_window_size=8"], "sde_window_size 8 does not fit"),
    (["algorithm.name=dance_grpo", "algorithm.num_steps=1"], "dance_grpo needs num_steps >= 2"),
])
def test_step_checks_fail_at_load_and_the_corrected_rerun_is_accepted(tmp_path, capsys, overrides, message):
    run = tmp_path / "run"
    assert main([*TOY, *overrides, f"run_dir={run}", "train.steps=1"]) == 2
    assert message in _one_error_line(capsys)
    assert not run.exists()
    fixed = [o for o in overrides if o.startswith("algorithm.name")]
    assert main([*TOY, *fixed, f"run_dir={run}", "train.steps=1"]) == 0


def test_runner_runs_the_step_plan_before_writing(tmp_path):
    """A check the config load cannot see still fails before the run directory is created: the runner builds the
    algorithm and its step plan first."""
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.benchmark.run.runner import Runner

    config = load_config("benchmark/configs/toy_flow_grpo.yaml",
                         [*TOY[3:], "algorithm.name=flow_grpo_fast", f"run_dir={tmp_path / 'run'}"])
    config.algorithm["sde_window_size"] = 8  # past the load-time check
    with pytest.raises(ConfigError, match="sde_window_size 8 does not fit"):
        Runner(config, progress=False).run()
    assert not (tmp_path / "run").exists()


# ---- OS errors: one line naming the path ----------------------------------------------------------------------
def test_run_dir_under_a_file_is_one_line_naming_the_path(tmp_path, capsys):
    (tmp_path / "plain").write_text("not a directory")
    assert main([*TOY, "train.steps=1", f"run_dir={tmp_path / 'plain' / 'run'}"]) == 2
    assert str(tmp_path / "plain" / "run") in _one_error_line(capsys)


def test_full_disk_is_one_line_naming_the_path(tmp_path, capsys, monkeypatch):
    import errno

    import flowzoo.benchmark.run.runner as runner

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(runner, "atomic_write_text", full)
    assert main([*TOY, "train.steps=1", f"run_dir={tmp_path / 'run'}"]) == 2
    assert _one_error_line(capsys) == f"flowzoo: error: {tmp_path / 'run' / 'config.yaml'}: No space left on device"


def test_out_of_memory_is_one_line(tmp_path, capsys, monkeypatch):
    """A group of 2**31 samples passes every check and is refused by the allocator: one line, exit 2."""
    import flowzoo.benchmark.run.runner as runner

    def allocate(self):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
                           "to allocate 42949672960 bytes.\nframe #0: ...")

    monkeypatch.setattr(runner.Runner, "build", allocate)
    assert main([*TOY, "algorithm.group_size=2147483648", f"run_dir={tmp_path / 'run'}"]) == 2
    line = _one_error_line(capsys)
    assert "out of memory" in line and "42949672960 bytes" in line and "algorithm.group_size" in line


# ---- bench and run directories holding something else -----------------------------------------------------------
@pytest.mark.parametrize("garbage", [b"\x00\xff\xfe binary", b"just a string", b"a: [unclosed"])
def test_garbage_config_yaml_in_the_run_dir_is_one_line(tmp_path, capsys, garbage):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_bytes(garbage)
    assert main([*TOY, "train.steps=1", f"run_dir={run}"]) == 2
    assert "holds a run of a different config" in _one_error_line(capsys)


def test_bench_into_runs_of_another_config_is_refused_before_any_run(tmp_path, capsys):
    bench = ["bench", "smoke", "--runs", str(tmp_path), "--algorithms", "flow_grpo", "--seeds", "0",
             "model.args.pretrain_steps=30", "model.args.hidden=32", "train.eval_samples_per_prompt=2"]
    assert main([*bench, "train.steps=1"]) == 0
    metrics = next(tmp_path.rglob("metrics.csv"))
    before = metrics.read_bytes()
    capsys.readouterr()
    assert main([*bench, "train.steps=2"]) == 2
    assert "hold runs of a different config" in _one_error_line(capsys)
    assert metrics.read_bytes() == before


def test_one_line_user_errors_are_the_same_for_one_process_and_a_rank():
    """The multi-process path (a failing rank) and the single-process CLI share one classification of user errors."""
    import errno

    from flowzoo.benchmark.cli import user_error

    assert user_error(ConfigError("algorithm.lr: expected a finite number, got nan")).startswith("algorithm.lr")
    assert user_error(OSError(errno.EROFS, "Read-only file system", "/runs/x")) == "/runs/x: Read-only file system"
    assert user_error(MemoryError()).startswith("out of memory (MemoryError)")
    assert user_error(RuntimeError("CUDA error: an illegal memory access")) is None  # a bug keeps its traceback
    assert user_error(OSError("no path")) is None
