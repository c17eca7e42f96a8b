"""The OP-GRPO study: the many-condition toy task (models/toy2d.py ``classes``), its prompt source, and the analysis
(benchmark/study.py: steps to target with censoring, paired effects, minimum detectable effect)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from scipy import stats as sps

from benchmark.prompts import PromptSection, load_prompts
from benchmark.study import analyze_study, mean_curves, minimum_detectable_effect, steps_to_target
from flowzoo.errors import ConfigError
from models.toy2d import (MANY_TARGET_OFFSET, MANY_TARGET_SIZE, MODE_STD, RADIUS, Toy2DModel, class_metadata,
                          prompt_set, sample_data)
from rewards.toy import ToyTargetReward


def test_default_four_class_prompts_are_unchanged():
    prompts = prompt_set()
    assert [p for p, _ in prompts] == ["class 0", "class 1", "class 2", "class 3"]
    # class 1's minority mode is mode 3 of 8 on the circle of radius 2, its disc at radius 2.4
    angle = 2 * math.pi * 3 / 8
    assert prompts[1][1]["mode_target"] == pytest.approx([2 * math.cos(angle), 2 * math.sin(angle)])
    assert prompts[1][1]["hard_target"] == pytest.approx([2.4 * math.cos(angle), 2.4 * math.sin(angle)])
    assert "classes" not in prompts[1][1]


def test_many_condition_targets_sit_at_the_offset_in_distinct_directions():
    prompts = prompt_set(64)
    assert len(prompts) == 64 and prompts[63][0] == "class 63"
    directions = []
    for c, (_, meta) in enumerate(prompts):
        center = torch.tensor([RADIUS * math.cos(2 * math.pi * c / 64), RADIUS * math.sin(2 * math.pi * c / 64)])
        offset = torch.tensor(meta["hard_target"]) - center
        assert offset.norm().item() == pytest.approx(MANY_TARGET_OFFSET)
        assert meta["hard_radius"] == MANY_TARGET_SIZE and meta["classes"] == 64
        directions.append(math.atan2(offset[1].item(), offset[0].item()))
    # neighbouring classes point in unrelated directions: no two of 64 within 2 degrees of each other
    gaps = np.diff(np.sort(np.mod(directions, 2 * math.pi)))
    assert gaps.min() > math.radians(2)


def test_many_condition_base_success_matches_the_gaussian_disc_probability():
    """Data of the many-condition layout hit their class's disc with P = ncx2.cdf((r/s)^2, 2, (d/s)^2)."""
    n = 100_000
    x, classes = sample_data(n, torch.Generator().manual_seed(0), 64)
    per_class = [meta for _, meta in prompt_set(64)]
    meta = [per_class[c] for c in classes.tolist()]
    success = ToyTargetReward().score(x, [""] * n, meta).score.mean().item()
    expected = sps.ncx2.cdf((MANY_TARGET_SIZE / MODE_STD) ** 2, 2, (MANY_TARGET_OFFSET / MODE_STD) ** 2)
    assert 0.015 < expected < 0.03  # the sparse regime the study needs (<= 3% per sample)
    assert success == pytest.approx(expected, abs=4 * math.sqrt(expected / n))


@pytest.mark.parametrize("bad", [5, 0, "64", True])
def test_bad_class_counts_are_one_line_errors(bad):
    with pytest.raises(ConfigError, match=r"classes must be 4 .* or an int >= 8.*got") as error:
        prompt_set(bad)
    assert "\n" not in str(error.value)


def test_model_checks_prompts_against_its_class_count():
    model = Toy2DModel(classes=64, pretrain_steps=0)
    cond = model.encode(["class 63", "class 0"], [class_metadata(63, 64), class_metadata(0, 64)])
    assert cond.tensors["class"].tolist() == [63, 0]
    assert model.null_condition(2).tensors["class"].tolist() == [64, 64]
    with pytest.raises(ConfigError, match=r"unknown prompt 'class 64'; valid: 'class 0' .. 'class 63'"):
        model.encode(["class 64"])
    with pytest.raises(ConfigError, match=r"metadata for 4 classes, but the model has classes: 64"):
        model.encode(["class 1"], [class_metadata(1)])


def test_prompt_source_classes():
    train, test = load_prompts(PromptSection(source="toy2d", classes=64))
    assert len(train) == len(test) == 64 and train[5] == ("class 5", class_metadata(5, 64))
    assert load_prompts(PromptSection(source="toy2d"))[0] == prompt_set()
    with pytest.raises(ConfigError, match="prompts.classes is only used by the 'toy2d' source"):
        load_prompts(PromptSection(source="tiny_shapes", classes=64))
    with pytest.raises(ConfigError, match="got 6"):
        load_prompts(PromptSection(source="toy2d", classes=6))


@pytest.mark.parametrize("n", [5, 10, 30])
def test_minimum_detectable_effect_has_80_percent_power(n):
    """At the MDE a two-sided paired t-test at 0.05 rejects with probability ~0.8 (noncentral t, exact power)."""
    sd = 2.0
    mde = minimum_detectable_effect(sd, n)
    df, crit = n - 1, sps.t.ppf(0.975, n - 1)
    nc = mde * math.sqrt(n) / sd
    power = sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc)
    assert power == pytest.approx(0.80, abs=0.01)
    assert math.isnan(minimum_detectable_effect(sd, 1))


def test_steps_to_target_first_hit_or_censored():
    assert steps_to_target([0, 10, 20, 30], [0.0, 0.2, 0.5, 0.4], 0.45, 30) == (20.0, True)
    assert steps_to_target([0, 10, 20], [0.0, 0.2, 0.3], 0.45, 25) == (25.0, False)


def _write_run(root, algorithm, seed, steps, rewards, extra=None, task="t"):
    run = root / task / algorithm / f"s{seed}"
    run.mkdir(parents=True)
    run.joinpath("config.yaml").write_text(yaml.safe_dump(
        {"task": task, "seed": seed, "algorithm": {"name": algorithm}, "train": {"steps": int(steps[-1])}}))
    frame = pd.DataFrame({"step": steps, "nfe": np.asarray(steps) * 10, "wall_s": np.asarray(steps) * 0.5,
                          "eval_reward": rewards, **(extra or {})})
    frame.to_csv(run / "metrics.csv", index=False)


def test_paired_effects_on_synthetic_runs(tmp_path):
    steps = [0, 10, 20, 30, 40]
    # baseline: linear to 0.4 on every seed; the algorithm gets there one eval earlier and ends 0.1 + 0.01 s higher
    for seed in range(4):
        _write_run(tmp_path, "flow_grpo", seed, steps, [0.0, 0.1, 0.2, 0.3, 0.4])
        _write_run(tmp_path, "op_grpo", seed, steps, [0.0, 0.2, 0.3, 0.4, 0.5 + 0.01 * seed],
                   {"zero_std_frac": [np.nan, 0.9, 0.5, 0.4, 0.3]})
    _write_run(tmp_path, "op_grpo_no_correction", 0, steps, [0.0, 0.0, 0.0, 0.0, 0.0])
    # a control task "t@ctl" is the cell op_grpo@ctl of task t, paired with t's baseline
    _write_run(tmp_path, "op_grpo", 1, steps, [0.0, 0.1, 0.2, 0.3, 0.6], task="t@ctl")
    table, effects, targets = analyze_study(tmp_path, fraction=1.0, smooth=1, also_vs=("op_grpo",))
    vs_op = effects[effects["reference"] == "op_grpo"].set_index(["algorithm", "metric"])
    assert vs_op.loc[("flow_grpo", "final_reward"), "diff"] == pytest.approx(-(0.1 + 0.01 * 1.5))
    effects = effects[effects["reference"] == "flow_grpo"]
    assert targets == {"t": pytest.approx(0.4)}
    op = effects[effects["algorithm"] == "op_grpo"].set_index("metric")
    assert op.loc["steps_to_target", "diff"] == pytest.approx(-10.0)  # 30 vs 40 on every seed
    assert op.loc["steps_to_target", "censored_alg"] == 0
    assert op.loc["steps_to_target", "ratio"] == pytest.approx(30 / 40)  # the papers' "share of the steps" form
    assert op.loc["nfe_to_target", "diff"] == pytest.approx(-100.0)  # nfe = 10 x step in the synthetic logs
    assert op.loc["final_reward", "diff"] == pytest.approx(0.1 + 0.01 * 1.5)
    low, high = op.loc["final_reward", ["ci_low", "ci_high"]]
    assert 0.1 <= low <= op.loc["final_reward", "diff"] <= high <= 0.13
    sd = np.std([0.1, 0.11, 0.12, 0.13], ddof=1)
    assert op.loc["final_reward", "mde"] == pytest.approx(minimum_detectable_effect(sd, 4))
    # AUC: mean over the 5 evals of per-eval differences 0, .1, .1, .1, .1 + .01 seed, averaged over seeds 0..3
    assert op.loc["auc", "diff"] == pytest.approx((0.4 + 0.01 * 1.5) / 5)
    # a never-reaching run is censored at its last step, paired on the one seed it ran
    nc = effects[effects["algorithm"] == "op_grpo_no_correction"].set_index("metric")
    assert nc.loc["steps_to_target", ["n", "diff", "censored_alg"]].tolist() == [1, 0.0, 1]
    ctl = effects[effects["algorithm"] == "op_grpo@ctl"].set_index("metric")
    assert set(effects["task"]) == {"t"} and ctl.loc["final_reward", ["n", "diff"]].tolist() == [1, pytest.approx(0.2)]
    curves = mean_curves(tmp_path, every=20)
    assert curves.loc[("t", "op_grpo"), 40] == pytest.approx(0.5 + 0.01 * 1.5)  # mean over seeds 0..3
    assert curves.loc[("t", "op_grpo@ctl"), 20] == pytest.approx(0.2)
    early = table.set_index(["algorithm", "seed"]).loc[("op_grpo", 0), "zero_std_frac_early"]
    assert early == pytest.approx((0.9 + 0.5 + 0.4 + 0.3) / 4)  # training steps only (step 0 has no rollout)


def test_missing_baseline_or_reference_is_one_line(tmp_path):
    _write_run(tmp_path, "op_grpo", 0, [0, 10], [0.0, 0.1])
    with pytest.raises(ConfigError, match="baseline 'flow_grpo' has no runs .*; algorithms: op_grpo"):
        analyze_study(tmp_path)
    _write_run(tmp_path, "flow_grpo", 0, [0, 10], [0.0, 0.1])
    with pytest.raises(ConfigError, match="--also-vs op_grpo@x: no such cell; cells: flow_grpo, op_grpo$"):
        analyze_study(tmp_path, also_vs=("op_grpo@x",))


def test_seed_list_compresses_consecutive_seeds():
    from benchmark.study import _seed_list

    assert _seed_list([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8"
