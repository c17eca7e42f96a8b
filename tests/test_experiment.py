"""benchmark/run/experiment.py: the experiment is built in one place and every check runs before a run directory exists;
a fresh run that fails before its first checkpoint leaves no run directory behind."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest
import yaml

from flowzoo import algorithms
from flowzoo.algorithms.engine.base import Algorithm, AlgorithmConfig
from flowzoo.algorithms.engine.distributed import SingleProcess
from flowzoo.benchmark.run import experiment
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.loading import load_config
from flowzoo.errors import ConfigError

CONFIG = "benchmark/configs/toy_flow_grpo.yaml"
SMALL = ["model.args.pretrain_steps=30", "model.args.hidden=32", "train.eval_every=0", "train.save_samples=false",
         "train.eval_samples_per_prompt=2", "train.prompts_per_step=2", "algorithm.group_size=4", "train.steps=1"]
TOY = ["train", CONFIG, "--quiet", *SMALL]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("bad, fixed, message", [
    # MixGRPO's window bounds are checked by its constructor: at load, on a stand-in with the model's T
    (["algorithm.name=mix_grpo", "algorithm.window_size=9"], ["algorithm.name=mix_grpo"],
     "algorithm.window_size 9 needs num_steps >= 11 (window_bound released), got 10"),
    (["algorithm.name=mix_grpo", "algorithm.window_strategy=fixed", "algorithm.window_start=5"],
     ["algorithm.name=mix_grpo", "algorithm.window_strategy=fixed", "algorithm.window_start=4"],
     "algorithm.window_start 5 is past the last start 4 (T = 10, window_size = 4, window_bound = released)"),
    (["reward_args={toy_mode: {sclae: 2.0}}"], ["reward_args={toy_mode: {scale: 2.0}}"],
     "reward 'toy_mode': unknown argument 'sclae'; valid: scale"),
    (["reward_args={toy_mode: {scale: [2]}}"], ["reward_args={toy_mode: {scale: 2}}"],
     "reward_args.toy_mode.scale: expected a number, got [2]"),
])
def test_refused_in_one_line_without_a_run_dir_and_the_corrected_rerun_trains(tmp_path, capsys, bad, fixed, message):
    run = tmp_path / "runs" / "run"
    assert main([*TOY, *bad, f"run_dir={run}"]) == 2
    assert _one_error_line(capsys) == f"flowzoo: error: {message}"
    assert not (tmp_path / "runs").exists()
    assert main([*TOY, *fixed, f"run_dir={run}"]) == 0
    assert (run / "done.json").is_file()


def test_the_dry_check_loads_no_model(monkeypatch):
    import flowzoo.models.toy2d

    def never(*args, **kwargs):
        raise AssertionError("the dry check built the model")

    monkeypatch.setattr(flowzoo.models.toy2d.Toy2DModel, "__init__", never)
    with pytest.raises(ConfigError, match="window_size 9 needs num_steps >= 11"):
        load_config(CONFIG, ["algorithm.name=mix_grpo", "algorithm.window_size=9"])
    load_config(CONFIG, ["algorithm.name=mix_grpo"])


def test_bench_refuses_a_grid_with_one_bad_run_before_any_run_starts(tmp_path, capsys):
    suite = tmp_path / "grid.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "grid", "algorithms": ["mix_grpo"], "seeds": [0],
        "defaults": {"model": {"name": "toy2d", "args": {"pretrain_steps": 30, "hidden": 32}},
                     "train": {"steps": 1, "eval_every": 0, "save_samples": False, "eval_samples_per_prompt": 2,
                               "prompts_per_step": 2}, "algorithm": {"group_size": 4}},
        "tasks": {"good": {}, "short": {"algorithm": {"num_steps": 5}}},  # a window of 4 needs 6 steps
    }))
    assert main(["bench", str(suite), "--runs", str(tmp_path / "runs"), "--workers", "1"]) == 2
    assert "algorithm.window_size 4 needs num_steps >= 6" in _one_error_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_the_algorithm_config_is_resolved_once(monkeypatch):
    """Presets are applied once, at load (Algorithm.typed_config): building the experiment parses no algorithm config
    again."""
    import flowzoo.algorithms.engine.base

    config = load_config(CONFIG, [*SMALL, "algorithm.name=op_grpo_no_correction"])
    calls = []
    original = flowzoo.algorithms.engine.base.from_mapping

    def counting(cls, data, *args, **kwargs):
        if isinstance(cls, type) and issubclass(cls, AlgorithmConfig):
            calls.append(cls)
        return original(cls, data, *args, **kwargs)

    monkeypatch.setattr(flowzoo.algorithms.engine.base, "from_mapping", counting)
    built = experiment.build(config)
    assert calls == []
    assert built.algorithm.config.correction == "none" and config.algorithm["correction"] == "none"
    assert built.algorithm.config is not config.algorithm_config()  # each user gets its own copy
    config.algorithm["lr"] = 0.5  # a changed mapping is resolved again
    assert config.algorithm_config().lr == 0.5 and len(calls) == 1


@dataclass
class _Config(AlgorithmConfig):
    pass


class _RecordsWorld(Algorithm):
    name = "test_records_world"
    Config = _Config

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.world_at_init = self.dist.world_size


class _TwoProcesses(SingleProcess):
    world_size = 2


def test_the_algorithm_constructor_gets_the_data_parallel_context():
    algorithms.REGISTRY.add(_RecordsWorld.name, _RecordsWorld)
    try:
        config = load_config(CONFIG, [*SMALL, f"algorithm.name={_RecordsWorld.name}"])
        dist = _TwoProcesses()
        built = experiment.build(config, dist)
        assert built.algorithm.dist is dist and built.algorithm.world_at_init == 2
        assert experiment.build(config).algorithm.world_at_init == 1
    finally:
        algorithms.REGISTRY._entries.pop(_RecordsWorld.name)


# ---- a fresh run that fails before its first checkpoint leaves nothing behind -------------------------------------
def _fail_at_step(monkeypatch, step: int, error: BaseException):
    original = Algorithm.step

    def step_or_fail(self, *args, **kwargs):
        if self.iteration + 1 == step:
            raise error
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Algorithm, "step", step_or_fail)


def test_out_of_memory_at_step_one_removes_what_the_run_created(tmp_path, capsys, monkeypatch):
    _fail_at_step(monkeypatch, 1, MemoryError())
    run = tmp_path / "a" / "b" / "run"
    assert main([*TOY, f"run_dir={run}"]) == 2
    assert "out of memory" in _one_error_line(capsys)
    assert not (tmp_path / "a").exists()  # the run directory and the parents this invocation made
    # an existing directory keeps what it held; only the run's own files go
    run.mkdir(parents=True)
    (run / "notes.txt").write_text("mine")
    assert main([*TOY, f"run_dir={run}"]) == 2
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]


def test_a_run_with_a_checkpoint_keeps_its_directory(tmp_path, capsys, monkeypatch):
    _fail_at_step(monkeypatch, 2, MemoryError())
    run = tmp_path / "run"
    assert main([*TOY, "train.steps=3", "train.checkpoint_every=1", f"run_dir={run}"]) == 2
    assert {"config.yaml", "metrics.csv", "checkpoint.pt"} <= {p.name for p in run.iterdir()}
    monkeypatch.undo()
    assert main([*TOY, "train.steps=3", "train.checkpoint_every=1", f"run_dir={run}"]) == 0  # resumes


def test_huge_group_that_runs_out_of_memory_at_step_one_leaves_no_run_dir(tmp_path):
    """A real allocation failure: 2 x 10^8 samples pass every check and the step-0 evaluation, and fail in the first
    rollout under a 1.5 GB data limit (it fails fast: one step of T = 1)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_DATA, (1_500_000_000, 1_500_000_000))

    run = tmp_path / "run"
    args = [*TOY[1:], "algorithm.num_steps=1", "algorithm.group_size=100000000", f"run_dir={run}"]
    done = subprocess.run([sys.executable, "-m", "flowzoo", "train", *args], capture_output=True, text=True,
                          preexec_fn=limit, timeout=300)
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1 and "out of memory" in err, err
    assert not run.exists()


class _ReadsTheModel(Algorithm):
    name = "test_reads_the_model"
    Config = _Config

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.latent_size = self.model.latent_shape  # more than the stand-in of the dry check knows


def test_an_algorithm_that_reads_more_of_the_model_is_checked_on_the_built_one():
    algorithms.REGISTRY.add(_ReadsTheModel.name, _ReadsTheModel)
    try:
        config = load_config(CONFIG, [*SMALL, f"algorithm.name={_ReadsTheModel.name}"])  # the dry check steps aside
        assert experiment.build(config).algorithm.latent_size == (2,)
    finally:
        algorithms.REGISTRY._entries.pop(_ReadsTheModel.name)
