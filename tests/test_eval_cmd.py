"""`flowzoo eval` on the toy tier: a run's checkpoint and a config's untrained model give the evaluations the run
logged, nothing is written into the run, and bad input is one line (exit 2) before any work."""

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.eval_command import (_TagRecorder, clustered_interval, clustered_mean,
                                                fixed_conditions_interval)
from flowzoo.errors import ConfigError
from flowzoo.rewards.base import RewardOutput

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
FAST = ["train.steps=2", "train.prompts_per_step=2", "train.eval_every=0", "train.eval_samples_per_prompt=4",
        "train.save_samples=true", "algorithm.group_size=4"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    assert main(["train", str(CONFIG), *FAST, f"run_dir={run_dir}", "--quiet"]) == 0
    return run_dir


def _files(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_mtime_ns for p in directory.rglob("*") if p.is_file()}


def test_a_run_is_evaluated_at_its_final_checkpoint_as_the_runner_did(run, tmp_path, capsys):
    before = _files(run)
    out = tmp_path / "eval.json"
    assert main(["eval", str(run), "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    record = json.loads(out.read_text())
    samples = record.pop("samples")  # the file keeps every sample's score; the printed line does not
    assert printed == record
    assert len(samples["scores"]) == len(samples["conditions"]) == record["prompts"] * 4
    mean = sum(samples["scores"]) / len(samples["scores"])
    assert mean == pytest.approx(record["eval_reward"], abs=1e-6)  # the record's mean is float32
    metrics = pd.read_csv(run / "metrics.csv")
    assert record["step"] == 2 and record["finished"] is True
    assert record["checkpoint"] == str(run / "checkpoint.pt")
    assert record["eval_reward"] == pytest.approx(metrics["eval_reward"].iloc[-1], abs=1e-12)
    assert record["samples_per_prompt"] == 4 and record["num_steps"] == 20  # the toy model's default ODE steps
    assert _files(run) == before  # nothing written, no sample grid, no checkpoint touched


def test_a_config_is_evaluated_untrained_as_the_runs_step_0(run, capsys):
    assert main(["eval", str(CONFIG), *FAST]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    metrics = pd.read_csv(run / "metrics.csv")
    assert record["step"] == 0 and record["checkpoint"] is None and record["finished"] is None
    assert record["eval_reward"] == pytest.approx(metrics["eval_reward"].iloc[0], abs=1e-12)
    assert record["eval_reward"] != pytest.approx(metrics["eval_reward"].iloc[-1], abs=1e-9)  # training moved it


def test_steps_and_samples_change_the_evaluation(run, capsys):
    assert main(["eval", str(run), "--steps", "3", "--samples", "1"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["num_steps"] == 3 and record["samples_per_prompt"] == 1


def _no_checkpoint(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "young"
    copy.mkdir()
    shutil.copy(run / "config.yaml", copy / "config.yaml")
    return copy


@pytest.mark.parametrize("args, message", [
    (lambda run, tmp: [str(tmp / "nope")], "does not exist; give a config file, a run directory or a suite's cell"),
    (lambda run, tmp: [str(tmp)], "is not a run directory (it has no config.yaml)"),
    (lambda run, tmp: [str(_no_checkpoint(run, tmp))], "has no checkpoint.pt yet"),
    (lambda run, tmp: [str(run), "algorithm.guidance=3"], "key=value overrides (algorithm.guidance=3) apply to a "
                                                          "config file"),
    (lambda run, tmp: [str(run), "--samples", "0"], "--samples must be a positive integer, got 0"),
    (lambda run, tmp: [str(run), "--steps", "-1"], "--steps must be a positive integer, got -1"),
    (lambda run, tmp: [str(run), "--out", str(tmp / "missing" / "x.json")], "need a file path in an existing"),
    (lambda run, tmp: [str(CONFIG), "algorithm.name=flow_grpoo"], "unknown algorithm 'flow_grpoo'; known: "),
])
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys, args, message):
    argv = args(run, tmp_path)
    before = _files(tmp_path)
    assert main(["eval", *argv, "--out", str(tmp_path / "eval.json")] if "--out" not in argv else ["eval", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flowzoo: error: ") and message in lines[0]
    assert _files(tmp_path) == before


def test_a_corrupt_checkpoint_is_refused_by_the_runners_loader(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    state = torch.load(copy / "checkpoint.pt", weights_only=False)
    state["step"] = 1  # contents no longer match the seal
    torch.save(state, copy / "checkpoint.pt")
    assert main(["eval", str(copy)]) == 2
    assert "is corrupt" in capsys.readouterr().err


class _Scores:
    name = "fake"

    def __call__(self, samples, prompts, metadata):
        score = samples.sum(dim=1)
        return RewardOutput(score=score, components={"hit": (score > 1).float()})


def test_per_tag_means():
    recorder = _TagRecorder(_Scores())
    recorder(torch.tensor([[1.0, 1.0], [0.0, 0.5]]), ["a", "b"], [{"tag": "x"}, {"tag": "y"}])
    recorder(torch.tensor([[0.0, 0.0]]), ["c"], [{"tag": "x"}])
    assert recorder.name == "fake"
    assert recorder.by_tag() == {"x": {"eval_reward": 1.0, "eval/hit": 0.5}, "y": {"eval_reward": 0.5, "eval/hit": 0.0}}
    untagged = _TagRecorder(_Scores())
    untagged(torch.ones(1, 2), ["a"], [{}])
    assert untagged.by_tag() == {}


def test_interval_is_the_prompt_clustered_standard_error():
    recorder = _TagRecorder(_Scores())
    # scores (row sums): prompt a 2, 2 (listed twice), prompt b 0.5, 1 -> mean 1.375, cluster sums of deviations
    # +1.25 and -1.25: se = sqrt(2 / 1 * (1.25^2 + 1.25^2)) / 4 = 0.625
    recorder(torch.tensor([[1.0, 1.0], [0.0, 0.5]]), ["a", "b"], [{}, {}])
    recorder(torch.tensor([[1.0, 1.0], [0.5, 0.5]]), ["a", "b"], [{}, {}])
    out = recorder.interval()
    assert out["eval_reward_se"] == pytest.approx(0.625)
    # two prompts: Student's t on 1 degree of freedom, 12.706
    assert out["eval_reward_ci95"] == pytest.approx([1.375 - 12.7062 * 0.625, 1.375 + 12.7062 * 0.625], rel=1e-5)
    one_prompt = _TagRecorder(_Scores())
    one_prompt(torch.ones(2, 2), ["a", "a"], [{}, {}])
    assert all(v != v for v in one_prompt.interval()["eval_reward_ci95"])  # NaN: no spread between prompts to use


def test_an_edit_instruction_on_two_sources_is_two_clusters():
    """Edit prompts cluster by instruction and source (condition_key): the same instruction on two source images is
    two conditions, so the interval exists (clustering by text alone would see one prompt and give NaN)."""
    recorder = _TagRecorder(_Scores())
    sources = [{"source_image": torch.zeros(3, 2, 2)}, {"source_image": torch.ones(3, 2, 2)}]
    recorder(torch.tensor([[1.0, 1.0], [0.0, 0.5]]), ["remove the square"] * 2, sources)
    recorder(torch.tensor([[1.0, 1.0], [0.5, 0.5]]), ["remove the square"] * 2, sources)
    assert recorder.interval()["eval_reward_se"] == pytest.approx(0.625)  # the two-prompt case above


def test_an_evaluation_pairs_with_an_earlier_one_of_the_same_samples(run, tmp_path, capsys):
    """The base model's --out, then the trained run --paired-with it: the mean per-sample difference is the
    difference of the means, its prompt-clustered interval is finite, and pairing with itself gives exactly 0."""
    base, trained = tmp_path / "base.json", tmp_path / "trained.json"
    assert main(["eval", str(CONFIG), *FAST, "--out", str(base)]) == 0
    assert main(["eval", str(run), "--out", str(trained), "--paired-with", str(base)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    a, b = json.loads(trained.read_text()), json.loads(base.read_text())
    paired = printed["paired"]
    assert paired["diff"] == pytest.approx(a["eval_reward"] - b["eval_reward"], abs=1e-6)
    assert paired["ci95"][0] < paired["diff"] < paired["ci95"][1] and paired["se"] > 0
    fixed = paired["ci95_fixed_conditions"]
    assert paired["clusters"] >= 2 and (math.isnan(paired["se_fixed_conditions"]) or fixed[0] <= paired["diff"] <= fixed[1])
    assert paired["better"] + paired["worse"] <= paired["samples"] == len(a["samples"]["scores"])
    assert main(["eval", str(run), "--paired-with", str(trained)]) == 0
    same = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["paired"]
    assert same["diff"] == 0 and same["se"] == 0 and same["better"] == same["worse"] == 0
    assert same["with"] == str(trained)


def test_a_pairing_that_cannot_pair_is_one_line(run, tmp_path, capsys, monkeypatch):
    base = tmp_path / "base.json"
    assert main(["eval", str(CONFIG), *FAST, "--out", str(base)]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--samples", "2", "--paired-with", str(base)]) == 2
    assert "--paired-with " in (err := capsys.readouterr().err) and "do not pair with these (16 vs 8 samples" in err
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"eval_reward": 0.5}))
    from flowzoo.benchmark.run import runner

    def no_work(*args, **kwargs):
        raise AssertionError("a file that keeps no samples is refused before the evaluation")

    monkeypatch.setattr(runner.Runner, "build", no_work)
    assert main(["eval", str(run), "--paired-with", str(bare)]) == 2
    assert "keeps no per-sample scores" in capsys.readouterr().err
    assert main(["eval", str(run), "--paired-with", str(tmp_path / "missing.json")]) == 2
    assert "not a readable `flowzoo eval --out` file" in capsys.readouterr().err


def test_the_clustered_standard_error_follows_its_formula():
    """Two prompts of two samples: mean 3, cluster sums -2 and +2, C / (C - 1) * 8 / N^2 = 1."""
    assert clustered_mean(["a", "a", "b", "b"], [1.0, 3.0, 2.0, 6.0]) == (3.0, 1.0)
    mean, se = clustered_mean(["a", "a"], [1.0, 2.0])
    assert mean == 1.5 and math.isnan(se)  # one cluster: no standard error



def test_the_interval_takes_student_s_t_on_clusters_minus_one():
    """4 clusters: t(3) = 3.1824, not the normal 1.96 (a clustered SE of few clusters is itself noisy); 256: 1.9693."""
    conditions = [c for c in "abcd" for _ in range(3)]
    values = [0.0, 1.0, 2.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 0.0, 0.0, 3.0]
    mean, se, ci = clustered_interval(conditions, values)
    assert (mean, se) == clustered_mean(conditions, values)
    assert ci == pytest.approx([mean - 3.18245 * se, mean + 3.18245 * se], rel=1e-5)
    many = [str(i) for i in range(256) for _ in range(2)]
    m, s, c = clustered_interval(many, [float(i % 5) for i in range(512)])
    assert (c[1] - m) / s == pytest.approx(1.96932, rel=1e-5)


def test_the_fixed_conditions_interval_follows_its_formula():
    """Two conditions of two values: a (1, 3) mean 2 variance 2, b (2, 6) mean 4 variance 8; N 4:
    se^2 = (1/2)^2 * 2/2 + (1/2)^2 * 8/2 = 1.25; t on N - C = 2 degrees of freedom, 4.3027."""
    se, ci = fixed_conditions_interval(["a", "a", "b", "b"], [1.0, 3.0, 2.0, 6.0])
    assert se == pytest.approx(math.sqrt(1.25))
    assert ci == pytest.approx([3 - 4.30265 * se, 3 + 4.30265 * se], rel=1e-5)
    # a between-condition difference does not widen it (it is not a source of uncertainty for fixed conditions),
    # where the clustered interval of the same values is wide
    shifted = [1.0, 1.1, 5.0, 5.1]
    assert fixed_conditions_interval(["a", "a", "b", "b"], shifted)[0] == pytest.approx(math.sqrt(0.00125))
    assert clustered_mean(["a", "a", "b", "b"], shifted)[1] > 1
    assert math.isnan(fixed_conditions_interval(["a", "a", "b"], [1.0, 2.0, 3.0])[0])  # b has one value


def test_an_edit_pair_file_pairs_across_checkouts_by_its_image_bytes(tmp_path):
    """Two copies of one source image in two folders give one condition key (no path in it); another image with the
    same name and instruction another key; a tensor source keeps condition_key's digest."""
    from flowzoo.source_images import condition_key, portable_condition_key

    for folder, value in (("a", b"\x89PNG same"), ("b", b"\x89PNG same"), ("c", b"\x89PNG other")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "0006.png").write_bytes(value)
    keys = [portable_condition_key("add a red circle", {"source_image": str(tmp_path / f / "0006.png")})
            for f in "abc"]
    assert keys[0] == keys[1] != keys[2] and str(tmp_path) not in keys[0]
    tensor = {"source_image": torch.zeros(3, 2, 2)}
    assert portable_condition_key("x", tensor) == condition_key("x", tensor)
    assert portable_condition_key("x", {}) == "x"
    with pytest.raises(ConfigError, match="cannot be read"):
        portable_condition_key("x", {"source_image": str(tmp_path / "missing.png")})
