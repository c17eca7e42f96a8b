"""Gold measures (benchmark/measures/gold.py) and unseen prompts on samples with a known answer, and the runner's
columns: the toy W2 is 0 for the ideal density, the shift for a shifted one, sqrt(2) mode_std for a policy collapsed
onto the target; a reward judge is its mean score; eval_unseen_reward scores prompts never trained on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from flowzoo.benchmark.measures import gold
from flowzoo.benchmark.measures.gold import gaussian_w2
from flowzoo.errors import ConfigError

TOY_CONFIG = Path(__file__).resolve().parents[1] / "benchmark" / "configs" / "toy_flow_grpo.yaml"
SMALL = ["model.args.hidden=32", "model.args.pretrain_steps=50", "train.save_samples=false"]


def _gaussian(n: int, std: float, seed: int, dim: int = 2) -> torch.Tensor:
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * std


def test_w2_is_zero_for_the_ideal_density_the_shift_when_moved_and_sqrt2_std_when_collapsed():
    std, target = 0.075, [1.0, -2.0]
    ideal = _gaussian(200_000, std, 0) + torch.tensor(target, dtype=torch.float64)
    assert gaussian_w2(ideal, target, std) < 0.002
    assert gaussian_w2(ideal + torch.tensor([0.3, 0.4], dtype=torch.float64), target, std) == pytest.approx(0.5, abs=2e-3)
    collapsed = torch.tensor([target] * 16, dtype=torch.float64)
    assert gaussian_w2(collapsed, target, std) == pytest.approx(math.sqrt(2) * std, rel=1e-9)


def test_w2_of_an_anisotropic_fit_is_the_closed_form():
    """Points with exact mean 0 and covariance diag(a^2, b^2): W2^2 = (a - s)^2 + (b - s)^2 against N(0, s^2 I)."""
    a, b, s = 0.3, 0.05, 0.1
    base = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
    points = base * torch.tensor([a, b], dtype=torch.float64) * math.sqrt(3 / 2)  # sample covariance (n - 1) = diag
    assert gaussian_w2(points, [0.0, 0.0], s) == pytest.approx(math.sqrt((a - s) ** 2 + (b - s) ** 2), rel=1e-9)
    with pytest.raises(ValueError, match="n >= 2"):
        gaussian_w2(points[:1], [0.0, 0.0], s)


def test_the_toy_measure_reads_each_conditions_target_and_mode_std():
    from flowzoo.models.toy2d import LAYOUTS, prompt_set

    prompts = prompt_set(64, "separable")[:3]
    std = LAYOUTS["separable"].mode_std
    per = 4000
    samples = torch.cat([_gaussian(per, std, c) + torch.tensor(m["hard_target"], dtype=torch.float64)
                         for c, (_, m) in enumerate(prompts)])
    metadata = [m for _, m in prompts for _ in range(per)]
    measure = gold.build("toy_w2", ["toy_target"], per, "points")
    assert measure.column == "eval_gold_distance"
    assert measure.measure(samples, metadata, per) < 0.01
    moved = samples + torch.tensor([0.0, 0.24], dtype=torch.float64)
    assert measure.measure(moved, metadata, per) == pytest.approx(0.24, abs=0.01)


def test_gold_specs_are_checked_with_one_line_errors():
    assert gold.check(None, ["toy_target"], 8, "points") is None
    assert gold.check("toy_w2", ["toy_mode"], 8, "points") == {"name": "toy_w2", "target": "mode_target"}
    assert gold.check({"name": "shapes_geneval", "score": "partial"}, ["shapes_geneval"], 4, "image") == {
        "name": "shapes_geneval", "score": "partial"}
    cases = [("no_such_judge", ["toy_mode"], 8, "points", "unknown gold measure 'no_such_judge'"),
             ("toy_w2", ["shapes_geneval"], 8, "image", "toy tier's 2-D points"),
             ("toy_w2", ["toy_mode"], 1, "points", "eval_samples_per_prompt must be >= 2"),
             ({"name": "toy_w2", "target": "elsewhere"}, ["toy_mode"], 8, "points", "target must be one of"),
             ({"name": "toy_w2", "radius": 1}, ["toy_mode"], 8, "points", "unknown argument 'radius'"),
             ("toy_mode", ["toy_mode"], 8, "points", "the reward the run trains on"),
             ("toy_mode", ["toy_target"], 8, "image", "scores points samples"),
             (["toy_w2"], ["toy_mode"], 8, "points", "give a gold measure")]
    for value, rewards, per, kind, message in cases:
        with pytest.raises(ConfigError, match=message):
            gold.check(value, rewards, per, kind)


def test_a_bad_gold_reward_argument_fails_the_dry_run():
    from flowzoo.benchmark.run import experiment
    from flowzoo.benchmark.run.loading import load_config

    with pytest.raises(ConfigError, match="gold 'toy_mode': unknown argument 'width'; valid: scale"):
        load_config(TOY_CONFIG, ["train.gold={name: toy_mode, width: 2}"])
    config = load_config(TOY_CONFIG, ["train.gold={name: toy_mode, scale: 0.3}"])  # toy_mode at another scale
    config.train.gold = {"name": "toy_mode", "scale": "wide"}
    with pytest.raises(ConfigError, match="train.gold"):
        experiment.check(config)


def _runner(tmp_path, overrides):
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.benchmark.run.runner import Runner

    runner = Runner(load_config(TOY_CONFIG, SMALL + [f"run_dir={tmp_path}", *overrides]), progress=False)
    runner.build()
    seen = []
    original = runner._score_samples

    def keep(prompts, metadata, sampler):
        scores, outputs, samples = original(prompts, metadata, sampler)
        seen.append((torch.cat(samples), list(metadata), scores))
        return scores, outputs, samples

    runner._score_samples = keep
    return runner, seen


def test_every_evaluation_logs_the_gold_of_the_samples_the_reward_reads(tmp_path):
    runner, seen = _runner(tmp_path / "w2", ["train.eval_samples_per_prompt=8", "train.gold=toy_w2"])
    result = runner.evaluate(0)
    samples, metadata, _ = seen[0]
    assert result["eval_gold_distance"] == pytest.approx(gold.ToyW2("mode_target").measure(samples, metadata, 8))
    assert result["eval_gold_distance"] > 0 and "eval_gold" not in result
    # a reward of the registry as the judge: its mean score on the same samples (toy_mode at another scale)
    judge, seen = _runner(tmp_path / "judge", ["train.eval_samples_per_prompt=4",
                                                "train.gold={name: toy_target}"])
    result = judge.evaluate(0)
    samples, metadata, _ = seen[0]
    expected = judge.gold.scores(samples, [""] * len(metadata), metadata).mean()
    assert result["eval_gold"] == pytest.approx(float(expected))
    plain, _ = _runner(tmp_path / "none", ["train.eval_samples_per_prompt=4"])
    assert not {"eval_gold", "eval_gold_distance", "eval_unseen_reward"} & set(plain.evaluate(0))


def _prompt_file(path: Path, prompts: list[str]) -> str:
    path.write_text("".join(json.dumps({"prompt": p, "tag": "counting"}) + "\n" for p in prompts))
    return str(path)


def test_unseen_prompts_are_scored_beside_the_test_prompts(tmp_path):
    """prompts.unseen: scored at every evaluation with the same sampler as eval_unseen_reward; refused when it shares
    a prompt with the training file or with a source that has no files."""
    from flowzoo.benchmark.prompts.sources import PromptSection, check_source, load_prompts, load_unseen

    train = _prompt_file(tmp_path / "train.jsonl", ["two blue circles", "one red square"])
    unseen = _prompt_file(tmp_path / "unseen.jsonl", ["three green circles"])
    section = PromptSection(source="files", train=train, test=train, unseen=unseen)
    check_source(section)
    trained, _ = load_prompts(section)
    assert [p for p, _ in load_unseen(section, trained)] == ["three green circles"]
    overlapping = PromptSection(source="files", train=train, test=train, unseen=train)
    with pytest.raises(ConfigError, match="shares 2 prompt"):
        load_unseen(overlapping, trained)
    with pytest.raises(ConfigError, match="prompts.unseen is a prompt file of the 'files' source"):
        check_source(PromptSection(source="toy2d", unseen=unseen))
    with pytest.raises(ConfigError, match="does not exist"):
        check_source(PromptSection(source="files", train=train, test=train, unseen=str(tmp_path / "missing.jsonl")))


def test_the_runner_logs_the_unseen_prompts_reward(tmp_path):
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.benchmark.run.runner import Runner

    toy = tmp_path / "toy"
    toy.mkdir()
    metadata = [{"class": c, "mode_target": [float(c), 0.0], "hard_target": [float(c), 0.0], "hard_radius": 0.3}
                for c in range(4)]
    (toy / "train.jsonl").write_text("".join(json.dumps({"prompt": f"class {c}", **metadata[c]}) + "\n"
                                             for c in (0, 1)))
    (toy / "unseen.jsonl").write_text("".join(json.dumps({"prompt": f"class {c}", **metadata[c]}) + "\n"
                                              for c in (2, 3)))
    files = [f"prompts.source=files", f"prompts.train={toy / 'train.jsonl'}", f"prompts.test={toy / 'train.jsonl'}",
             f"prompts.unseen={toy / 'unseen.jsonl'}"]
    runner = Runner(load_config(TOY_CONFIG, SMALL + files + [f"run_dir={tmp_path / 'run'}",
                                                             "train.eval_samples_per_prompt=4"]), progress=False)
    runner.build()
    calls = []
    original = runner._score_samples

    def keep(prompts, metadata, sampler):
        scores, outputs, samples = original(prompts, metadata, sampler)
        calls.append((prompts, scores))
        return scores, outputs, samples

    runner._score_samples = keep
    result = runner.evaluate(0)
    assert calls[1][0] == ["class 2"] * 4 + ["class 3"] * 4
    assert result["eval_unseen_reward"] == pytest.approx(float(calls[1][1].mean()))
    assert result["eval_reward"] == pytest.approx(float(calls[0][1].mean()))


def test_toy_conditions_held_out_from_training_are_the_unseen_prompts(tmp_path):
    """prompts.unseen_every K: every K-th toy condition is in neither the training nor the test prompts and is
    scored as eval_unseen_reward."""
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.benchmark.prompts.sources import PromptSection, check_source, load_prompts, load_unseen
    from flowzoo.benchmark.run.runner import Runner

    section = PromptSection(source="toy2d", classes=16, layout="separable", unseen_every=4)
    check_source(section)
    train, test = load_prompts(section)
    unseen = load_unseen(section, train)
    assert [m["class"] for _, m in unseen] == [3, 7, 11, 15]
    assert [m["class"] for _, m in train] == [m["class"] for _, m in test] == [c for c in range(16) if c % 4 != 3]
    for bad, message in ((PromptSection(source="toy2d", unseen_every=1), "int >= 2"),
                         (PromptSection(source="files", train="a.txt", test="a.txt", unseen_every=2), "'toy2d' source")):
        with pytest.raises(ConfigError, match=message):
            check_source(bad)
    with pytest.raises(ConfigError, match="holds out none of the 4 conditions"):
        load_unseen(PromptSection(source="toy2d", unseen_every=9), train)
    runner = Runner(load_config(TOY_CONFIG, SMALL + [f"run_dir={tmp_path}", "prompts.unseen_every=2",
                                                     "train.eval_samples_per_prompt=4"]), progress=False)
    runner.build()
    assert [p for p, _ in runner.train_prompts] == ["class 0", "class 2"]
    assert "eval_unseen_reward" in runner.evaluate(0)
