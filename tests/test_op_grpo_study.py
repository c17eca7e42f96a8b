"""The OP-GRPO study: the many-condition toy task (models/toy2d.py ``classes``), its prompt source, and the analysis
(benchmark/study/verdicts.py: steps to target with censoring, paired effects, minimum detectable effect)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from scipy import stats as sps

from flowzoo.benchmark.prompts.sources import PromptSection, load_prompts
from flowzoo.benchmark.analysis.effects import minimum_detectable_effect
from flowzoo.benchmark.study.verdicts import analyze_study, mean_curves
from flowzoo.errors import ConfigError
from flowzoo.models.toy2d import (MANY_TARGET_OFFSET, MANY_TARGET_SIZE, MODE_STD, RADIUS, Toy2DModel, class_metadata,
                          prompt_set, sample_data)
from flowzoo.rewards.toy import ToyTargetReward
from tests.synthetic_runs import write_run


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
    with pytest.raises(ConfigError, match=r"classes must be 4 .* or an int in \[8, 1024\].*got") as error:
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


def _write_run(root, algorithm, seed, steps, rewards, extra=None, task="t"):
    write_run(root, task, algorithm, seed, steps, rewards, extra)


def test_paired_effects_on_synthetic_runs(tmp_path):
    steps = [0, 10, 20, 30, 40]
    # baseline: linear to 0.4 on every seed (targets: 50% of its gain 0.2, 80% 0.32); the algorithm gets there one
    # eval earlier and ends 0.1 + 0.01 s higher
    for seed in range(4):
        _write_run(tmp_path, "flow_grpo", seed, steps, [0.0, 0.1, 0.2, 0.3, 0.4])
        _write_run(tmp_path, "op_grpo", seed, steps, [0.0, 0.2, 0.3, 0.4, 0.5 + 0.01 * seed],
                   {"zero_std_frac": [np.nan, 0.9, 0.5, 0.4, 0.3]})
    _write_run(tmp_path, "op_grpo_no_correction", 0, steps, [0.0, 0.0, 0.0, 0.0, 0.0])
    # a control task "t@ctl" is the cell op_grpo@ctl of task t, paired with t's baseline
    _write_run(tmp_path, "op_grpo", 1, steps, [0.0, 0.1, 0.2, 0.3, 0.6], task="t@ctl")
    table, effects, seed_sets, runs = analyze_study(tmp_path, smooth=1, also_vs=("op_grpo",), resamples=1000)
    assert seed_sets == {"all": [0, 1, 2, 3]}
    vs_op = effects[effects["reference"] == "op_grpo"].set_index(["algorithm", "metric"])
    assert vs_op.loc[("flow_grpo", "final_reward"), "diff"] == pytest.approx(-(0.1 + 0.01 * 1.5))
    effects = effects[effects["reference"] == "flow_grpo"]
    op = effects[effects["algorithm"] == "op_grpo"].set_index("metric")
    assert op.loc["steps_to_80", "target"] == pytest.approx(0.32) and op.loc["steps_to_50", "target"] == 0.2
    assert op.loc["steps_to_80", "diff"] == pytest.approx(-10.0)  # 30 vs 40 on every seed
    assert op.loc["steps_to_50", "diff"] == pytest.approx(-10.0)  # 10 vs 20
    assert op.loc["steps_to_80", "reached"] == 4
    assert op.loc["steps_to_80", "ratio"] == pytest.approx(30 / 40)  # the papers' "share of the steps" form
    assert op.loc["nfe_to_80", "diff"] == pytest.approx(-100.0)  # nfe = 10 x step in the synthetic logs
    assert op.loc["final_reward", "diff"] == pytest.approx(0.1 + 0.01 * 1.5)
    low, high = op.loc["final_reward", ["ci_low", "ci_high"]]
    assert 0.1 <= low <= op.loc["final_reward", "diff"] <= high <= 0.13
    sd = np.std([0.1, 0.11, 0.12, 0.13], ddof=1)
    assert op.loc["final_reward", "mde"] == pytest.approx(minimum_detectable_effect(sd, 4))
    # AUC: mean over the 5 evals of per-eval differences 0, .1, .1, .1, .1 + .01 seed, averaged over seeds 0..3
    assert op.loc["auc", "diff"] == pytest.approx((0.4 + 0.01 * 1.5) / 5)
    # a never-reaching run is censored at its last step (not reached), paired on the one seed it ran
    nc = effects[effects["algorithm"] == "op_grpo_no_correction"].set_index("metric")
    assert nc.loc["steps_to_80", ["n", "diff", "reached"]].tolist() == [1, 0.0, 0]
    ctl = effects[effects["algorithm"] == "op_grpo@ctl"].set_index("metric")
    assert set(effects["task"]) == {"t"} and ctl.loc["final_reward", ["n", "diff"]].tolist() == [1, pytest.approx(0.2)]
    curves = mean_curves(runs, every=20)
    assert curves.loc[("t", "op_grpo"), 40] == pytest.approx(0.5 + 0.01 * 1.5)  # mean over seeds 0..3
    assert curves.loc[("t", "op_grpo@ctl"), 20] == pytest.approx(0.2)
    rows = table.set_index(["algorithm", "seed"])
    assert rows.loc[("op_grpo", 0), "zero_std_frac_early"] == pytest.approx((0.9 + 0.5 + 0.4 + 0.3) / 4)
    assert rows.loc[("op_grpo", 0), "steps_to_80"] == 30 and rows.loc[("op_grpo_no_correction", 0),
                                                                       "reached_steps_to_80"] == False  # noqa: E712


def test_a_run_counted_twice_is_refused(tmp_path):
    _write_run(tmp_path, "flow_grpo", 0, [0, 10], [0.0, 0.1])
    _write_run(tmp_path / "copy", "flow_grpo", 0, [0, 10], [0.0, 0.1])
    with pytest.raises(ConfigError, match="runs copy/t/flow_grpo/s0 and t/flow_grpo/s0 are both task 't', algorithm "
                                          "'flow_grpo', seed 0: a report counts each run once"):
        analyze_study(tmp_path)


def test_missing_baseline_or_reference_is_one_line(tmp_path):
    _write_run(tmp_path, "op_grpo", 0, [0, 10], [0.0, 0.1])
    with pytest.raises(ConfigError, match="baseline 'flow_grpo' has no runs .*; algorithms: op_grpo"):
        analyze_study(tmp_path)
    _write_run(tmp_path, "flow_grpo", 0, [0, 10], [0.0, 0.1])
    with pytest.raises(ConfigError, match="--vs op_grpo@x: no such cell; cells: flow_grpo, op_grpo$"):
        analyze_study(tmp_path, also_vs=("op_grpo@x",))  # flowzoo study's option
    with pytest.raises(ConfigError, match="--also-vs op_grpo@x: no such cell"):
        analyze_study(tmp_path, also_vs=("op_grpo@x",), vs_option="--also-vs")  # the older module's


def test_seed_list_compresses_consecutive_seeds():
    from flowzoo.benchmark.study.verdicts import _seed_list

    assert _seed_list([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8"


def test_separable_layout_modes_are_apart_and_targets_scale_with_the_mode_std():
    from flowzoo.models.toy2d import LAYOUTS, many_center

    layout = LAYOUTS["separable"]
    centres = torch.tensor([many_center(c, 64, "separable") for c in range(64)])
    gaps = torch.cdist(centres, centres) + torch.eye(64) * 1e9
    assert gaps.min() / layout.mode_std > 5  # 0.39 apart, 5.2 stds
    for c in (0, 17, 63):
        meta = class_metadata(c, 64, "separable")
        assert meta["layout"] == "separable" and meta["hard_radius"] == pytest.approx(1.5 * 0.075)
        offset = torch.tensor(meta["hard_target"]) - centres[c]
        assert offset.norm().item() == pytest.approx(3.2 * 0.075, rel=1e-6)
    # the default layout's metadata has no layout key: the first study's prompts are unchanged
    assert "layout" not in class_metadata(3, 64)


def test_separable_base_success_matches_the_gaussian_disc_probability():
    """Data of the separable layout hit their class's disc with the noncentral chi-square probability (~2.7%)."""
    n = 200_000
    x, classes = sample_data(n, torch.Generator().manual_seed(0), 64, "separable")
    per_class = [class_metadata(c, 64, "separable") for c in range(64)]
    meta = [per_class[c] for c in classes.tolist()]
    hit = ToyTargetReward()(x, [""] * n, meta).score.mean().item()
    expected = sps.ncx2.cdf(1.5 ** 2, 2, 3.2 ** 2)
    assert hit == pytest.approx(expected, abs=0.002) and 0.02 < expected < 0.035


def test_layout_is_checked_against_the_model_and_the_prompt_source():
    with pytest.raises(ConfigError, match=r"layout must be one of \['overlapping', 'separable'\], got 'tight'"):
        load_prompts(PromptSection(source="toy2d", classes=64, layout="tight"))
    with pytest.raises(ConfigError, match="layout 'separable' needs the many-condition variant"):
        load_prompts(PromptSection(source="toy2d", layout="separable"))
    with pytest.raises(ConfigError, match="prompts.layout is only used by the 'toy2d' source"):
        load_prompts(PromptSection(source="tiny_shapes", layout="separable"))
    model = Toy2DModel(classes=64, layout="separable", pretrain_steps=0)
    train, _ = load_prompts(PromptSection(source="toy2d", classes=64, layout="separable"))
    model.encode([train[0][0]], [train[0][1]])
    with pytest.raises(ConfigError, match="prompt metadata for layout 'overlapping', but the model has layout "
                                          "'separable'; set prompts.layout to model.args.layout"):
        model.encode(["class 0"], [class_metadata(0, 64)])


def test_study_suite_names_disjoint_seed_sets_and_cuts_by_task(tmp_path):
    from flowzoo.benchmark.run.suite import expand, load_suite, select

    suite = load_suite("op-grpo-study")
    assert set(suite.seed_sets) == {"exploration", "replication"} and len(suite.seed_sets["replication"]) >= 10
    assert not set(suite.seed_sets["exploration"]) & set(suite.seed_sets["replication"])
    assert suite.seeds == suite.seed_sets["exploration"] + suite.seed_sets["replication"]
    cut = select(suite, tasks_csv="toy2d_sep64_sparse@no_reuse", seed_set="replication")
    configs = expand(cut, tmp_path)
    assert [(c.task, c.algorithm_name, c.seed) for c in configs][:2] == [
        ("toy2d_sep64_sparse@no_reuse", "op_grpo", 100), ("toy2d_sep64_sparse@no_reuse", "op_grpo", 101)]
    assert len(configs) == 10 and configs[0].algorithm["t_off"] == 0
    with pytest.raises(ConfigError, match="--tasks: suite op-grpo-study has no task nope; tasks: toy2d_sep64_sparse"):
        select(suite, tasks_csv="nope")
    with pytest.raises(ConfigError, match="--seed-set: suite op-grpo-study has no seed set 'x'; sets: exploration, "
                                          "replication"):
        select(suite, seed_set="x")
    with pytest.raises(ConfigError, match=r"--seeds: repeated \[1\]"):
        select(suite, seeds_csv="1,2,1")


def test_seed_sets_must_be_disjoint(tmp_path):
    from flowzoo.benchmark.run.suite import load_suite

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "tasks": {"t": {}}, "seed_sets": {"a": [0, 1], "b": [1, 2]}}))
    with pytest.raises(ConfigError, match=r"seed_sets.b shares seeds \[1\] with another set"):
        load_suite(str(path))
    path.write_text(yaml.safe_dump({"name": "s", "tasks": {"t": {}}, "seeds": [0, 0]}))
    with pytest.raises(ConfigError, match=r"seeds: repeated \[0\]"):
        load_suite(str(path))


def test_a_suite_name_that_would_leave_the_runs_directory_is_refused(tmp_path):
    from flowzoo.benchmark.run.suite import load_suite

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "../elsewhere", "tasks": {"t": {}}}))
    with pytest.raises(ConfigError, match="suite name: '../elsewhere' would leave its directory"):
        load_suite(str(path))


def test_unseen_conditions_task_trains_on_56_conditions_and_evaluates_the_8_it_never_saw(tmp_path):
    """The held-out-conditions task (generalisation): every 8th condition is out of training and of the test prompts, and is
    the unseen set; its claims are part of the study's claim set (not tested until its runs exist)."""
    from flowzoo.benchmark.study.claim_sets.op_grpo_paper import UNSEEN_LABEL, UNSEEN_TASK, toy_claims
    from flowzoo.benchmark.prompts.sources import load_unseen
    from flowzoo.benchmark.run.suite import expand, load_suite, select

    cut = select(load_suite("op-grpo-study"), tasks_csv=f"{UNSEEN_TASK},{UNSEEN_TASK}@dynamic", seed_set="replication")
    configs = expand(cut, tmp_path)
    assert sorted({(c.task, c.algorithm_name) for c in configs}) == [
        (UNSEEN_TASK, "diffusion_nft"), (UNSEEN_TASK, "flow_grpo"), (UNSEEN_TASK, "op_grpo"),
        (f"{UNSEEN_TASK}@dynamic", "flow_grpo")]
    config = configs[0]
    assert config.algorithm["lr"] == pytest.approx(1e-4) and config.prompts.unseen_every == 8
    train, test = load_prompts(config.prompts)
    unseen = load_unseen(config.prompts, train)
    assert len(train) == len(test) == 56 and [m["class"] for _, m in unseen] == list(range(7, 64, 8))
    assert not {p for p, _ in unseen} & {p for p, _ in train}

    # the claim set judges them on the task's runs: synthetic ones where OP-GRPO loses 0.2 of the unseen reward that
    # Flow-GRPO keeps, DiffusionNFT keeps it and dynamic sampling's runs are missing
    steps = [0, 10, 20, 30, 40]
    unseen_curves = {"flow_grpo": [0.03] * 5, "op_grpo": [0.03, 0.0, 0.0, 0.0, -0.17], "diffusion_nft": [0.03] * 5}
    for algorithm, unseen_curve in unseen_curves.items():
        for seed in range(4):
            write_run(tmp_path, UNSEEN_TASK, algorithm, seed, steps, [0.03, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed],
                      {"eval_unseen_reward": [u + 0.001 * seed for u in unseen_curve]})
    table, effects, _, _ = analyze_study(tmp_path, smooth=1, also_vs=("op_grpo",), resamples=500)
    verdicts = {row["claim"]: row["verdict"] for row in toy_claims(table, effects) if UNSEEN_LABEL in row["claim"]}
    unseen = {claim.split(" generalises")[0]: verdict for claim, verdict in verdicts.items()
              if "never trained on as Flow-GRPO does" in claim}
    assert unseen == {"OP-GRPO": "contradicted", "DiffusionNFT": "reproduced",
                      "Flow-GRPO with DAPO's dynamic sampling": "not tested"}
    assert any("spread" in claim or "gold" in claim for claim in verdicts)  # its narrowing and gold claims too
