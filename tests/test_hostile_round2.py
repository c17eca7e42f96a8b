"""The second hostile-input probe (issue 33): each case it found mishandled, from the command line.

Every case ends in one line on stderr and exit 2, writes nothing (and never into the shipped weights), or does the
right thing. The shipped weights are a scratch copy here (``shipped`` fixture), so that a regression overwrites the
copy, never the real files.
"""

from __future__ import annotations

import hashlib
import shutil

import pytest
import yaml

from flowzoo.benchmark.cli import main
from flowzoo.errors import ConfigError

CONFIG = "benchmark/configs/toy_flow_grpo.yaml"
TOY = ["train", CONFIG, "--quiet", "model.args.pretrain_steps=30", "model.args.hidden=32", "train.eval_every=0",
       "train.save_samples=false", "train.eval_samples_per_prompt=2", "train.prompts_per_step=2",
       "algorithm.group_size=4", "train.steps=2"]
PRETRAIN = ["pretrain", "tiny", "--data", "glyphs", "--steps", "1", "--batch", "2", "--threads", "1", "--quiet"]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("flowzoo: error: "), err
    return err


def _tree(path) -> dict:
    """Every file under ``path`` with its content's digest."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A scratch copy of models/weights/ that the code takes for the shipped directory."""
    import flowzoo.models.tiny as tiny

    weights = tmp_path / "weights"
    shutil.copytree(tiny.WEIGHTS_DIR, weights)
    monkeypatch.setattr(tiny, "WEIGHTS_DIR", weights)
    return weights


# ---- data loss: nothing lands in the shipped weights directory -------------------------------------------------
@pytest.mark.parametrize("args", [
    ["--run-dir", "{w}"],  # the case found: wrote tiny_glyphs.safetensors, checkpoint.pt, pretrain.json there
    ["--run-dir", "{w}/sub"],
    ["--run-dir", "{w}/../weights"],
    ["--run-dir", "{tmp}/pre", "--out", "{w}/new.safetensors"],
    ["--run-dir", "{w}", "--out", "{w}/tiny_glyphs.safetensors"],
])
def test_pretrain_never_writes_into_the_shipped_directory(tmp_path, shipped, capsys, args):
    before = _tree(shipped)
    args = [a.format(w=shipped, tmp=tmp_path) for a in args]
    assert main([*PRETRAIN, *args]) == 2
    assert "inside the shipped weights directory" in _one_error_line(capsys)
    assert _tree(shipped) == before and not (tmp_path / "pre").exists()


def test_pretrain_out_naming_a_shipped_file_exactly_is_still_allowed(tmp_path, shipped, monkeypatch):
    """The one way to retrain the shipped weights on purpose is checked, not refused (stopped before training)."""
    import flowzoo.models.tiny_pretrain as tiny_pretrain

    class Checked(Exception):
        """Raised in place of training: the checks before it passed."""

    def stop(*args, **kwargs):
        raise Checked

    monkeypatch.setattr(tiny_pretrain, "build_networks", stop)
    with pytest.raises(Checked):
        main([*PRETRAIN, "--run-dir", str(tmp_path / "pre"), "--out", str(shipped / "tiny_glyphs.safetensors")])


@pytest.mark.parametrize("run_dir", ["{w}", "{w}/toy", "{w}/../weights/toy"])
def test_train_refuses_a_run_dir_in_the_shipped_directory(shipped, capsys, run_dir):
    before = _tree(shipped)
    assert main([*TOY, f"run_dir={run_dir.format(w=shipped)}"]) == 2
    assert "run_dir" in (line := _one_error_line(capsys)) and "inside the shipped weights directory" in line
    assert _tree(shipped) == before


def test_bench_eval_export_report_recipes_refuse_the_shipped_directory(tmp_path, shipped, capsys):
    before = _tree(shipped)
    commands = [
        ["bench", "smoke", "--runs", str(shipped), "--algorithms", "flow_grpo", "--seeds", "0"],
        ["bench", "smoke", "--runs", str(tmp_path / "runs"), "--out", str(shipped / "report")],
        ["eval", CONFIG, "--out", str(shipped / "tiny_glyphs.json")],
        ["export", str(tmp_path), "--out", str(shipped)],
        ["report", str(tmp_path), "--out", str(shipped)],
        ["recipes", "--out", str(shipped / "recipes.md")],
    ]
    for command in commands:
        assert main(command) == 2, command
        assert "inside the shipped weights directory" in _one_error_line(capsys)
    assert _tree(shipped) == before and not (tmp_path / "runs").exists()


# ---- tracebacks for user errors -----------------------------------------------------------------------------
def test_deeply_nested_yaml_is_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.yaml"
    deep.write_text("task: " + "[" * 5000 + "]" * 5000 + "\n")
    assert main(["train", str(deep), f"run_dir={tmp_path / 'run'}"]) == 2
    assert "nested deeper than 64 levels" in _one_error_line(capsys)
    assert main([*TOY, "reward_args=" + "[" * 5000 + "]" * 5000, f"run_dir={tmp_path / 'run'}"]) == 2
    assert "nested deeper than 64 levels" in _one_error_line(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, key", [
    ("task=a\x00b", "task"), ("run_dir={tmp}/x\x00y", "run_dir"), ("model.args.weights=a\x00b", "model.args.weights"),
    ("prompts.source=toy\x002d", "prompts.source"),
])
def test_nul_byte_in_a_string_value_is_one_line(tmp_path, capsys, override, key):
    run_dir = [] if key == "run_dir" else [f"run_dir={tmp_path / 'run'}"]
    assert main([*TOY, override.format(tmp=tmp_path), *run_dir]) == 2  # was a ValueError from mkdir
    line = _one_error_line(capsys)
    assert f"{key}: " in line and "NUL byte" in line
    assert list(tmp_path.iterdir()) == []


def test_nul_byte_in_a_config_file_is_one_line(tmp_path, capsys):
    config = tmp_path / "nul.yaml"
    config.write_text(yaml.safe_dump({"task": "toy\x00", "run_dir": str(tmp_path / "run")}))
    assert main(["train", str(config)]) == 2
    assert "task: 'toy\\x00' holds a NUL byte" in _one_error_line(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, message", [
    ("model.args.hidden=-5", "model.args.hidden must be >= 1, got -5"),
    ("model.args.layers=0", "model.args.layers must be >= 1, got 0"),
    ("model.args.hidden=0", "model.args.hidden must be >= 1, got 0"),  # trained a zero-width network silently
    ("model.args.pretrain_steps=-1", "model.args.pretrain_steps must be >= 0, got -1"),
    ("model.args.classes=5", "model.args.classes: classes must be 4"),
])
def test_model_args_out_of_range_fail_at_load(tmp_path, capsys, override, message):
    assert main([*TOY, override, f"run_dir={tmp_path / 'run'}"]) == 2
    assert message in _one_error_line(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, message", [
    (["model.name=tiny", "reward=ocr", "prompts.source=tiny_glyphs", "reward_args={ocr: {upscale: 0}}"],
     "reward_args.ocr.upscale must be >= 1, got 0"),
    (["model.name=tiny", "reward=ocr", "prompts.source=tiny_glyphs", "reward_args={ocr: {pad: -1}}"],
     "reward_args.ocr.pad must be >= 0, got -1"),
    (["model.name=tiny", "reward=shapes_geneval", "prompts.source=tiny_shapes",
      "reward_args={shapes_geneval: {min_area: 2}}"], "reward_args.shapes_geneval.min_area must be in [0, 1], got 2"),
    (["model.name=tiny", "model.args.lora_rank=0"], "model.args.lora_rank must be >= 1, got 0"),
    (["model.name=tiny", "model.args.lora_alpha=0"], "model.args.lora_alpha must be > 0, got 0"),
    (["model.name=sd3", "reward=jpeg_compressibility", "model.args.dtype=float99"],
     "model.args.dtype: unknown dtype 'float99'; valid: float32, float16, bfloat16"),
    (["model.name=wan", "reward=video_ocr", "model.args.height=0"], "model.args.height must be >= 1, got 0"),
])
def test_model_and_reward_arguments_are_range_checked_at_load(args, message):
    from flowzoo.benchmark.run.loading import load_config
    with pytest.raises(ConfigError) as error:
        load_config(CONFIG, ["task=t", *args])
    assert message in str(error.value)


def test_tiny_arch_sizes_are_range_checked():
    from flowzoo.models.tiny import TinyArch

    with pytest.raises(ConfigError, match=r"tiny: arch\.layers must be an integer >= 1, got 0"):
        TinyArch.from_dict({"layers": 0})
    with pytest.raises(ConfigError, match=r"tiny: arch\.heads must be an integer >= 1, got -2"):
        TinyArch.from_dict({"heads": -2})


def test_a_device_this_build_lacks_is_refused_at_load(monkeypatch):
    import torch

    from flowzoo.benchmark.run.loading import load_config
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"model\.args\.device: 'cuda' asks for CUDA, which torch .* cannot use "
                                          r"here; valid: cpu"):
        load_config(CONFIG, ["model.name=tiny", "model.args.device=cuda"])
    with pytest.raises(ConfigError, match=r"model\.args\.device: 'nonsense' is not a torch device"):
        load_config(CONFIG, ["model.name=tiny", "model.args.device=nonsense"])


def test_pretrain_into_a_train_runs_directory_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TOY, f"run_dir={run}"]) == 0
    before = _tree(run)
    capsys.readouterr()
    assert main([*PRETRAIN, "--run-dir", str(run)]) == 2  # was KeyError: 'settings' from its checkpoint
    assert "holds a training run" in _one_error_line(capsys)
    foreign = tmp_path / "foreign"  # a train run's checkpoint alone
    foreign.mkdir()
    shutil.copy(run / "checkpoint.pt", foreign / "checkpoint.pt")
    assert main([*PRETRAIN, "--run-dir", str(foreign)]) == 2
    assert "is not a pretrain checkpoint" in _one_error_line(capsys)
    (foreign / "checkpoint.pt").write_bytes(b"\x00garbage")
    assert main([*PRETRAIN, "--run-dir", str(foreign)]) == 2
    assert "is corrupt or truncated" in _one_error_line(capsys)
    assert _tree(run) == before and sorted(p.name for p in foreign.iterdir()) == ["checkpoint.pt"]


@pytest.mark.parametrize("args, message", [
    (["--prompts", "0"], "perf: --prompts 0 must be >= 1"),  # was an IndexError
    (["--lora-rank", "0"], "perf: --lora-rank 0 must be >= 1"),
    (["--device", "cuda"], "perf: --device: 'cuda' asks for CUDA"),  # was an AssertionError on a CPU-only build
    (["--device", "cuda", "--gpu-check"], "perf: --device: 'cuda' asks for CUDA"),
    (["--device", "bogus"], "perf: --device: 'bogus' is not a torch device"),
    (["x=[unclosed"], "algorithm: unknown key 'x'"),  # was a YAML traceback
    (["clip_range=.nan"], "algorithm.clip_range: expected a finite number, got nan"),
])
def test_perf_arguments_are_one_line_before_any_model_is_built(capsys, monkeypatch, args, message):
    import torch

    # patched where `flowzoo perf` calls it: command.py binds the name at its import, so patching measure.load_model
    # while command.py is first imported would leave the stand-in there for every later test of the process
    from flowzoo.benchmark.perf import command as perf

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(perf, "load_model", lambda *a: pytest.fail("built a model for a bad argument"))
    assert main(["perf", "--repeats", "1", *args]) == 2
    assert message in _one_error_line(capsys)


# ---- silent wrong results -------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", ["", "\n\n", "# only a comment\n", "---\n"])
def test_an_empty_config_file_is_refused_naming_it(tmp_path, capsys, content):
    config = tmp_path / "empty.yaml"
    config.write_text(content)
    assert main(["train", str(config), f"run_dir={tmp_path / 'run'}"]) == 2  # trained a 30-step default run
    assert f"{config}: the file is empty" in _one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_key_given_twice_is_refused_naming_the_file_and_line(tmp_path, capsys):
    config = tmp_path / "twice.yaml"
    config.write_text("task: t\nseed: 1\ntrain:\n  steps: 2\n  steps: 3\n")
    assert main(["train", str(config), f"run_dir={tmp_path / 'run'}"]) == 2
    assert f"{config}: the key 'steps' is given twice (line 5)" in _one_error_line(capsys)
    assert main([*TOY, "reward={toy_mode: 1, toy_mode: 2}", f"run_dir={tmp_path / 'run'}"]) == 2
    assert "the key 'toy_mode' is given twice" in _one_error_line(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text, message", [
    ("seed: 010\n", "'010' (line 2) is 8 in YAML 1.1 but not in YAML 1.2"),  # PyYAML trained seed 8
    ("train:\n  steps: 1:30\n", "'1:30' (line 3) is 90 in YAML 1.1"),  # base 60
    ("algorithm: {name: flow_grpo, lr: 1:30.5}\n", "'1:30.5' (line 2) is 90.5 in YAML 1.1 (base 60)"),
])
def test_numbers_yaml_versions_read_differently_are_refused(tmp_path, capsys, text, message):
    config = tmp_path / "ambiguous.yaml"
    config.write_text("task: t\n" + text)
    assert main(["train", str(config), f"run_dir={tmp_path / 'run'}"]) == 2
    assert f"{config}: {message}" in _one_error_line(capsys)
    assert not (tmp_path / "run").exists()
    assert main([*TOY, "seed=010", f"run_dir={tmp_path / 'run'}"]) == 2  # the same on the command line
    assert "override seed: '010' (line 1) is 8 in YAML 1.1" in _one_error_line(capsys)


@pytest.mark.parametrize("override, message", [
    ("algorithm.minibatches=100", "algorithm.minibatches 100 exceeds the 8 samples of a training batch "
                                  "(train.prompts_per_step x algorithm.group_size = 2 x 4); valid: 1..4, 8"),
    ("algorithm.minibatches=6", "algorithm.minibatches 6 would split the 8 samples of a training batch "
                                "(train.prompts_per_step x algorithm.group_size = 2 x 4) into 4 minibatches of up to "
                                "2; valid: 1..4, 8"),
    ("algorithm.adv_clip=0", "algorithm.adv_clip must be > 0, got 0.0 (every advantage would be 0"),
    ("algorithm.clip_range=0", "algorithm.clip_range must be > 0, got 0.0"),
    ("algorithm.lr=0", "algorithm.lr must be > 0, got 0.0 (the policy would never change)"),
])
def test_update_knobs_that_train_nothing_or_other_than_recorded_are_refused(tmp_path, capsys, override, message):
    assert main([*TOY, override, f"run_dir={tmp_path / 'run'}"]) == 2
    assert message in _one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_valid_minibatch_counts_are_exactly_the_splits_torch_chunk_makes():
    import torch

    from flowzoo.benchmark.run.experiment import minibatch_counts

    for samples in (1, 2, 7, 8, 32, 64, 96):
        assert minibatch_counts(samples) == [k for k in range(1, samples + 1)
                                             if len(torch.arange(samples).chunk(k)) == k]


@pytest.mark.parametrize("args, message", [
    (["--ema", "1.5"], "pretrain: --ema must be a decay in [0, 1), got 1.5"),
    (["--ema", "1"], "pretrain: --ema must be a decay in [0, 1), got 1.0"),
    (["--threads", "0"], "pretrain: --threads must be an integer >= 1, got 0"),
    (["--lr", "0"], "pretrain: --lr must be a finite number > 0, got 0.0"),
    (["--steps", "0"], "pretrain: --steps must be an integer >= 1, got 0"),
    (["--seed", "-1"], "pretrain: --seed must be an integer in [0, 2**63), got -1"),
])
def test_pretrain_options_out_of_range_are_refused_before_writing(tmp_path, capsys, args, message):
    assert main([*PRETRAIN, "--run-dir", str(tmp_path / "pre"), *args]) == 2
    assert message in _one_error_line(capsys)
    assert not (tmp_path / "pre").exists()


# ---- minor ------------------------------------------------------------------------------------------------------
def test_a_config_path_that_is_no_file_says_what_it_is(tmp_path, capsys):
    assert main(["train", "/dev/null"]) == 2
    assert "/dev/null is not a regular file" in _one_error_line(capsys)
    assert main(["train", str(tmp_path)]) == 2
    assert f"{tmp_path} is a directory; give a YAML config file" in _one_error_line(capsys)
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in _one_error_line(capsys)


@pytest.mark.parametrize("command", ["train", "eval", "grad-snr"])
def test_usage_does_not_list_overrides_as_required(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([command])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "the following arguments are required:" in err and "overrides" not in \
        err.splitlines()[-1]


def test_eval_out_into_an_unwritable_directory_fails_before_evaluating(tmp_path, capsys, monkeypatch):
    import os

    from flowzoo.benchmark.run import eval_command as eval_cmd
    from flowzoo.benchmark.run.runner import Runner

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(eval_cmd.os, "access", lambda p, mode: False if str(p) == str(locked) else real_access(p, mode))
    monkeypatch.setattr(Runner, "build", lambda self: pytest.fail("evaluated before checking --out"))
    assert main(["eval", CONFIG, "--out", str(locked / "result.json")]) == 2
    assert "its directory is not writable" in _one_error_line(capsys)


# ---- principles -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["a/b", "..", ".", "a\\b", "tab\there", "", " "])
def test_task_is_a_label_not_a_path(task):
    from flowzoo.benchmark.run.loading import load_config
    with pytest.raises(ConfigError, match=r"^(config\.)?task: "):
        load_config(None, [f"task={task}"])


def test_task_label_errors_from_the_command_line(tmp_path, capsys):
    assert main([*TOY, "task=../escape"]) == 2
    assert "task: '../escape' would leave its directory" in _one_error_line(capsys)


def test_a_finished_run_is_bound_to_its_config(tmp_path, capsys):
    """An edited config.yaml does not make another config's finished run pass for this one's: the rerun is refused
    by the checkpoint seal instead of skipped, and eval/export see it as no finished run of that config."""
    from flowzoo.benchmark.config.schema import resolved_dict
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.benchmark.run.runner import finished_summary, is_finished

    run = tmp_path / "run"
    assert main([*TOY, f"run_dir={run}"]) == 0
    mine = load_config(CONFIG, [*TOY[3:], f"run_dir={run}"])
    other = load_config(CONFIG, [*TOY[3:], f"run_dir={run}", "algorithm.lr=0.002"])
    assert is_finished(run, mine) and finished_summary(run, mine)["config_digest"]
    (run / "config.yaml").write_text(yaml.safe_dump(resolved_dict(other), sort_keys=False))  # the edit
    assert not is_finished(run, other) and finished_summary(run, other) is None
    capsys.readouterr()
    assert main([*TOY, f"run_dir={run}", "algorithm.lr=0.002"]) == 2  # was skipped as finished
    assert "was written by a run of another config" in _one_error_line(capsys)
    assert main(["eval", str(run)]) == 2  # evaluating it under the edited config is refused the same way
    assert "was written by a run of another config" in _one_error_line(capsys)


def test_leftovers_of_a_run_killed_before_its_first_checkpoint_do_not_block_the_directory(tmp_path, capsys):
    """kill -9 before the first checkpoint leaves config.yaml, metrics.csv, samples/ and .lock: nothing to resume,
    so a run of another config may use the directory, and starts clean there."""
    import pandas as pd

    run = tmp_path / "run"
    assert main([*TOY, f"run_dir={run}", "train.save_samples=true", "train.eval_every=1"]) == 0
    for name in ("checkpoint.pt", "done.json"):  # what a run killed before its first checkpoint has not written
        (run / name).unlink()
    assert {p.name for p in run.iterdir()} == {".lock", "config.yaml", "metrics.csv", "samples"}
    assert main([*TOY, f"run_dir={run}", "seed=1", "train.steps=1"]) == 0  # was "holds a run of a different config"
    assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == 1
    assert pd.read_csv(run / "metrics.csv")["step"].tolist() == [0, 1]
    assert not (run / "samples").exists()  # the killed run's grids are gone, this run saves none


def test_a_config_yaml_the_runner_did_not_write_still_blocks_the_directory(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").touch()
    (run / "config.yaml").write_text("task: mine\nseed: 0\nalgorithm: flow_grpo\n")  # a user's own file
    assert main([*TOY, f"run_dir={run}"]) == 2
    assert "holds a run of a different config" in _one_error_line(capsys)
    assert (run / "config.yaml").read_text() == "task: mine\nseed: 0\nalgorithm: flow_grpo\n"


def test_train_into_a_pretrain_directory_is_refused_without_asking_to_delete_its_checkpoint(tmp_path, capsys):
    import torch

    pre = tmp_path / "pre"
    pre.mkdir()
    torch.save({"settings": {}, "nets": {}, "ema": {}, "optimizer": {}, "step": 3}, pre / "checkpoint.pt")
    before = _tree(pre)
    assert main([*TOY, f"run_dir={pre}"]) == 2
    line = _one_error_line(capsys)
    assert "is a `flowzoo pretrain` checkpoint, not a training run's; choose another run_dir" in line
    assert "delete" not in line and _tree(pre) == before and {p.name for p in pre.iterdir()} == {"checkpoint.pt"}
    torch.save([1, 2], pre / "checkpoint.pt")  # not a dict at all
    assert main([*TOY, f"run_dir={pre}"]) == 2
    assert "holds a list, not a training run's state" in _one_error_line(capsys)


@pytest.mark.parametrize("argv", [
    ["pretrain", "tiny", "--batch", "99999999999999999999"],
    ["eval", "benchmark/configs/toy_flow_grpo.yaml", "--samples", "99999999999999999999"],
    ["eval", "benchmark/configs/toy_flow_grpo.yaml", "--steps", "99999999999999999999"],
    ["perf", "--prompts", "99999999999999999999"],
    ["perf", "--repeats", "99999999999999999999"],
    ["perf", "--lora-rank", "99999999999999999999"],
    ["grad-snr", "benchmark/configs/toy_flow_grpo.yaml", "--batches", "99999999999999999999"],
])
def test_counts_past_any_machine_are_refused_with_the_usage(argv, capsys):
    """A sample count of 10^20 used to be accepted by eval and allocated until the kernel killed the process (the
    command-line fuzz drew it once in CI-like runs); every count option has an upper bound that argparse enforces."""
    from flowzoo.benchmark.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "is above the maximum" in capsys.readouterr().err
