"""The CLI and the runner end to end on the toy tier: run directories, determinism, resume, clear errors."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.loading import load_config
from flowzoo.benchmark.run.runner import TIMING_COLUMNS, Runner

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
FAST = ["train.steps=4", "train.prompts_per_step=4", "train.eval_every=2", "train.eval_samples_per_prompt=8",
        "train.save_samples=false", "algorithm.group_size=4"]


def _train(tmp_path: Path, name: str, *extra: str) -> Path:
    run_dir = tmp_path / name
    assert main(["train", str(CONFIG), *FAST, f"run_dir={run_dir}", "--quiet", *extra]) == 0
    return run_dir


def _deterministic(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame])


def test_train_writes_run_directory(tmp_path):
    run_dir = _train(tmp_path, "a", "train.save_samples=true")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["algorithm"]["name"] == "flow_grpo" and config["algorithm"]["clip_range"] == 0.2
    assert config["algorithm"]["noise_level"] == 0.7  # fully resolved: defaults written out
    metrics = pd.read_csv(run_dir / "metrics.csv")
    assert list(metrics.columns[:9]) == ["step", "nfe", "wall_s", "reward_mean", "reward_std", "eval_reward",
                                         "clip_frac", "approx_kl", "kl"]
    assert metrics["step"].tolist() == [0, 1, 2, 3, 4]
    assert metrics["eval_reward"].notna().tolist() == [True, False, True, False, True]
    # 16 samples x 10 sampling steps; the default recompute-free update (reuse_rollout_graph auto) adds no forward
    assert (metrics["nfe"].diff().dropna() == 16 * 10).all()
    assert (run_dir / "done.json").is_file() and (run_dir / "checkpoint.pt").is_file()
    assert (run_dir / "samples" / "step_4.png").is_file()


def test_same_seed_same_metrics_different_seed_differs(tmp_path):
    a = pd.read_csv(_train(tmp_path, "a") / "metrics.csv")
    b = pd.read_csv(_train(tmp_path, "b") / "metrics.csv")
    c = pd.read_csv(_train(tmp_path, "c", "seed=1") / "metrics.csv")
    pd.testing.assert_frame_equal(_deterministic(a), _deterministic(b))
    assert not a["reward_mean"].equals(c["reward_mean"])


def test_resume_after_kill_gives_identical_metrics(tmp_path):
    full = pd.read_csv(_train(tmp_path, "full", "train.checkpoint_every=2") / "metrics.csv")
    # simulate a run killed after step 3: only its step-2 checkpoint survives
    partial = tmp_path / "partial"
    cfg = load_config(CONFIG, [*FAST, f"run_dir={partial}", "train.checkpoint_every=2", "train.steps=4"])
    runner = Runner(cfg, progress=False)
    cfg.train.steps = 2  # stop early: the checkpoint at step 2 is what a killed run leaves
    runner.run()
    (partial / "done.json").unlink()
    cfg_full = load_config(CONFIG, [*FAST, f"run_dir={partial}", "train.checkpoint_every=2"])
    # the stored config says steps=2: a resume with a different config is refused ...
    assert main(["train", str(CONFIG), *FAST, f"run_dir={partial}", "train.checkpoint_every=2", "--quiet"]) == 2
    # ... so write the full config back, as a run killed at step 3 of 4 would have it (its checkpoint sealed for it)
    import torch

    from flowzoo.benchmark.run.checkpoints import seal

    state = torch.load(partial / "checkpoint.pt", weights_only=False)
    torch.save(seal(state, cfg_full), partial / "checkpoint.pt")
    (partial / "config.yaml").write_text(yaml.safe_dump(__import__("flowzoo.benchmark.config.schema").benchmark.config.schema.resolved_dict(cfg_full), sort_keys=False))
    assert main(["train", str(CONFIG), *FAST, f"run_dir={partial}", "train.checkpoint_every=2", "--quiet"]) == 0
    resumed = pd.read_csv(partial / "metrics.csv")
    pd.testing.assert_frame_equal(_deterministic(full), _deterministic(resumed))


def test_finished_run_is_not_rerun(tmp_path):
    run_dir = _train(tmp_path, "a")
    before = (run_dir / "metrics.csv").stat().st_mtime_ns
    _train(tmp_path, "a")
    assert (run_dir / "metrics.csv").stat().st_mtime_ns == before


@pytest.mark.parametrize(
    "args,message",
    [
        (["missing.yaml"], "config file not found: missing.yaml"),
        ([str(CONFIG), "algorithm.name=flow_grpoo"], "unknown algorithm 'flow_grpoo'; known: "),
        ([str(CONFIG), "model.name=toy3d"], "unknown model 'toy3d'; known: "),
        ([str(CONFIG), "reward=toy_mood"], "unknown reward 'toy_mood'; known: "),
        ([str(CONFIG), "algorithm.group_size=0"], "algorithm.group_size must be a positive integer, got 0"),
        ([str(CONFIG), "algorithm.group_size=-3"], "algorithm.group_size must be a positive integer, got -3"),
        ([str(CONFIG), "train.stepz=3"], "unknown key 'stepz' (did you mean 'steps'?)"),
        ([str(CONFIG), "model.args.width=3"], "model 'toy2d': unknown argument 'width'; valid: "),
        ([str(CONFIG), "prompts.source=laion"], "unknown prompt source 'laion'; known: "),
    ],
)
def test_bad_input_is_one_line_nonzero_and_writes_nothing(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    assert main(["train", *args, f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flowzoo: error: ")
    assert message in lines[0]
    assert not run_dir.exists() and list(tmp_path.iterdir()) == []


def test_bad_input_from_the_shell_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "flowzoo", "train", str(CONFIG), "algorithm.name=flow_grpoo"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "unknown algorithm 'flow_grpoo'; known: " in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_list_prints_registries(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "algorithms:" in out and "flow_grpo" in out and "toy2d" in out and "toy_mode" in out
    lines = {}
    for line in out.splitlines():  # a name's first section (toy2d is a model and a prompt source)
        if line.startswith("  "):
            lines.setdefault(line.split()[0], line)
    # each entry with its one-line description (the class's own docstring) and, for algorithms, its family
    assert "OP-GRPO ablation: no truncation" in lines["op_grpo_no_truncation"]
    assert "family op_grpo; ablation of op_grpo" in lines["op_grpo_no_truncation"]
    assert "(family diffusion_nft)" in lines["diffusion_nft"]
    assert "class-conditioned flow on R^2" in lines["toy2d"] and "Sparse: 1 inside" in lines["toy_target"]
    assert all(len(line) < 200 for line in lines.values())


def test_list_one_entry_shows_its_parameters_with_defaults(capsys):
    assert main(["list", "op_grpo_no_truncation"]) == 0
    out = capsys.readouterr().out
    assert "preset {'t_off': None}" in out and "  t_off = None" in out and "  group_size = 8" in out
    assert main(["list", "toy2d"]) == 0
    assert "  layout = 'overlapping'" in capsys.readouterr().out
    assert main(["list", "toy_mode"]) == 0
    assert "reward_args.toy_mode" in (out := capsys.readouterr().out) and "  scale = 0.5" in out
    assert main(["list", "op-grpo-study"]) == 0
    assert "replication: [100," in capsys.readouterr().out
    assert main(["list", "nope"]) == 2
    assert "nothing registered as 'nope'; known: awm, " in capsys.readouterr().err


def test_uniform_order_is_seeded_and_balanced():
    from flowzoo.algorithms.prompt_samplers.base import uniform_order

    a = uniform_order(4, 0, 1, 8)
    assert a == uniform_order(4, 0, 1, 8)
    assert a != uniform_order(4, 0, 2, 8)
    assert sorted(a) == sorted(list(range(4)) * 2)


def test_bench_smoke_suite_runs_and_skips_finished(tmp_path):
    assert main(["bench", "smoke", "--runs", str(tmp_path), "--workers", "1"]) == 0
    runs = sorted(p.parent for p in tmp_path.rglob("done.json"))
    assert [r.name for r in runs] == ["s0", "s1"]
    stamp = (runs[0] / "metrics.csv").stat().st_mtime_ns
    assert main(["bench", "smoke", "--runs", str(tmp_path), "--workers", "1"]) == 0
    assert (runs[0] / "metrics.csv").stat().st_mtime_ns == stamp


def test_a_task_can_run_a_subset_of_algorithms_and_its_own_seeds(tmp_path):
    from flowzoo.benchmark.run.suite import Suite, expand

    suite = Suite(name="s", algorithms=["flow_grpo", "op_grpo"], seeds=[0, 1, 2], tasks={
        "all": {"reward": "toy_mode"},
        "some": {"reward": "toy_target", "algorithms": ["op_grpo"], "seeds": [7]},
    })
    runs = sorted((c.task, c.algorithm_name, c.seed) for c in expand(suite, tmp_path))
    assert runs == [("all", "flow_grpo", 0), ("all", "flow_grpo", 1), ("all", "flow_grpo", 2),
                    ("all", "op_grpo", 0), ("all", "op_grpo", 1), ("all", "op_grpo", 2), ("some", "op_grpo", 7)]
    suite.tasks["some"]["algorithms"] = ["dance_grpo"]
    with pytest.raises(Exception, match="names algorithms \\['dance_grpo'\\] that the suite does not run"):
        expand(suite, tmp_path)


def test_trackers_receive_every_row_and_bad_trackers_fail_first(tmp_path, monkeypatch, capsys):
    from accelerate import tracking

    import flowzoo.benchmark.run.tracking

    received = []

    class FakeTracker(tracking.GeneralTracker):  # a custom tracker as accelerate's register_tracker_class takes it
        name, requires_logging_directory, main_process_only = "fake", True, False

        def __init__(self, run_name, logging_dir):
            super().__init__()
            self.run_name, self.logging_dir = run_name, logging_dir

        @property
        def tracker(self):
            return self

        def store_init_configuration(self, values):
            received.append(("config", values["algorithm"]["name"], self.run_name, self.logging_dir))

        def log(self, values, step, **kwargs):
            received.append((step, values.get("eval_reward")))

        def finish(self):
            received.append(("finish", None))

    monkeypatch.setitem(tracking.LOGGER_TYPE_TO_CLASS, "fake", FakeTracker)  # what register_tracker_class does
    monkeypatch.setattr(flowzoo.benchmark.run.tracking, "check_trackers", lambda names: None)  # "fake" is no LoggerType
    run_dir = _train(tmp_path, "tracked", "train.trackers=[fake]")
    assert received[0][:2] == ("config", "flow_grpo") and received[-1] == ("finish", None)
    assert received[0][2].endswith("/flow_grpo/s0") and Path(received[0][3]) == run_dir / "trackers"
    assert [r[0] for r in received[1:-1]] == [0, 1, 2, 3, 4]
    assert received[1][1] is not None and received[2][1] is None  # evaluation rows carry eval_reward

    monkeypatch.undo()
    monkeypatch.setattr(flowzoo.benchmark.run.tracking, "available_trackers", lambda: [])  # as without the trackers extra
    capsys.readouterr()
    assert main(["train", str(CONFIG), "train.trackers=[tensorboard]", f"run_dir={tmp_path / 'x'}"]) == 2
    assert "tracker 'tensorboard' is not installed" in capsys.readouterr().err
    assert main(["train", str(CONFIG), "train.trackers=[tensorbored]", f"run_dir={tmp_path / 'y'}"]) == 2
    assert "unknown tracker 'tensorbored'; known: " in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_thread_count_is_no_part_of_a_runs_identity(tmp_path):
    """A grid run with several workers runs each config at threads 1; a rerun with another worker count (threads
    unset) must find it finished, not refuse it as a run of another config."""
    from flowzoo.benchmark.run.runner import holds_other_config, is_finished

    run_dir = _train(tmp_path, "a", "train.threads=1")
    again = load_config(CONFIG, [*FAST, f"run_dir={run_dir}"])
    assert again.train.threads is None
    assert is_finished(run_dir, again) and not holds_other_config(run_dir, again)
    other = load_config(CONFIG, [*FAST, f"run_dir={run_dir}", "seed=1"])
    assert holds_other_config(run_dir, other)
