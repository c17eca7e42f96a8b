"""The OP-GRPO study's claims table (benchmark/study/claim_sets/op_grpo_paper.py), wall-clock-to-target estimate
and interleaved timing (benchmark/analysis/study*.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from flowzoo.benchmark.study.verdicts import analyze_study, main as study_main, wall_clock_ratios
from flowzoo.benchmark.study.claims import claims_table
from flowzoo.benchmark.perf.cell_timing import cell_configs, main as timing_main, measure
from flowzoo.errors import ConfigError
from tests.synthetic_runs import write_run

STEPS = [0, 10, 20, 30, 40, 50]


def _write(root, task, algorithm, seed, rewards, extra=None):
    write_run(root, task, algorithm, seed, STEPS, rewards, extra)


def _study(tmp_path, op_rewards, no_reuse_rewards, naive_clip, late_ratio):
    """flow_grpo reaches 0.5 at step 50; op_grpo / controls as given; 6 seeds with a small seed-dependent wobble."""
    sparse, dense = "toy2d_sep64_sparse", "toy2d_sep64_dense"
    for seed in range(6):
        wobble = 0.001 * seed
        _write(tmp_path, sparse, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5 + wobble])
        clip = {"clip_frac_off": [np.nan] + [0.14] * 5}
        _write(tmp_path, sparse, "op_grpo", seed, [r + wobble for r in op_rewards], clip)
        _write(tmp_path, f"{sparse}@no_reuse", "op_grpo", seed, [r + wobble for r in no_reuse_rewards])
        _write(tmp_path, sparse, "op_grpo_naive_is", seed, [r + wobble for r in op_rewards],
               {"clip_frac_off": [np.nan] + [naive_clip + 0.002 * seed] * 5})
        per_step = {f"abs_log_ratio_t{k}": [np.nan] + [0.05 * (late_ratio if k >= 8 else 1) + 0.001 * seed] * 5
                    for k in range(10)}
        _write(tmp_path, sparse, "op_grpo_no_truncation", seed, [r + wobble for r in op_rewards], per_step)
        _write(tmp_path, dense, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5 + wobble])
        _write(tmp_path, dense, "op_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5 + wobble])
    table, effects, seed_sets, _ = analyze_study(tmp_path, smooth=1, also_vs=("op_grpo",), resamples=500)
    return table, effects, claims_table(table, effects, seed_sets, "op-grpo-toy").set_index("claim")["verdict all"]


def _verdict(verdicts, start):
    return next(v for claim, v in verdicts.items() if claim.startswith(start) or start in claim)


def test_verdicts_follow_their_rules(tmp_path):
    # target: 80% of flow_grpo's gain, 0.8 x 0.5025 = 0.402, which flow_grpo reaches at step 50 and op_grpo at step 20:
    # 40% of the steps, and the CI (all seeds equal) is ~[0.4, 0.4]
    fast = [0.0, 0.3, 0.51, 0.52, 0.53, 0.54]
    table, effects, verdicts = _study(tmp_path, fast, no_reuse_rewards=[0.0, 0.1, 0.2, 0.3, 0.4, 0.51],
                                      naive_clip=0.4, late_ratio=10)
    sparse = _verdict(verdicts, "OP-GRPO needs 34.2% of Flow-GRPO's steps to reach its final performance (sparse")
    assert sparse.startswith("contradicted (saves steps")  # 0.4 with a zero-width CI excludes 0.342
    dense = _verdict(verdicts, "OP-GRPO needs 34.2% of Flow-GRPO's steps to reach its final performance (dense")
    assert dense.startswith("contradicted (no saving)")  # ratio 1
    # no_reuse needs 50 steps vs op_grpo's 20: reuse explains all of the 30-step saving
    assert _verdict(verdicts, "the saving comes from reusing") == "reproduced"
    assert _verdict(verdicts, "sequence-level correction keeps").startswith("reproduced")
    assert _verdict(verdicts, "late (low-noise)") == "reproduced"
    assert _verdict(verdicts, "video") == "not tested"


def test_verdicts_flip_with_the_data(tmp_path):
    # op_grpo and the no-reuse control reach the final at the same step; naive IS clips no more; late steps smaller
    fast = [0.0, 0.3, 0.51, 0.52, 0.53, 0.54]
    _, _, verdicts = _study(tmp_path, fast, no_reuse_rewards=fast, naive_clip=0.14, late_ratio=0.5)
    assert _verdict(verdicts, "the saving comes from reusing").startswith("contradicted")
    assert _verdict(verdicts, "sequence-level correction keeps") == "contradicted"
    assert _verdict(verdicts, "late (low-noise)") == "contradicted"


def test_steps_claim_reproduced_when_the_ratio_ci_holds_0342(tmp_path):
    # flow_grpo reaches 80% of its gain (0.4) at step 40; op_grpo reaches it at step 10 on half the seeds and step 20
    # on the others: ratio 15 / 40 with a CI around it
    for seed in range(8):
        _write(tmp_path, "toy2d_sep64_sparse", "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
        hit = 1 if seed % 2 else 2
        rewards = [0.0] + [0.6 if i >= hit else 0.1 for i in range(1, 6)]
        _write(tmp_path, "toy2d_sep64_sparse", "op_grpo", seed, rewards)
    table, effects, seed_sets, _ = analyze_study(tmp_path, smooth=1, also_vs=("op_grpo",), resamples=2000)
    row = effects[(effects["algorithm"] == "op_grpo") & (effects["metric"] == "steps_to_80")].iloc[0]
    assert row["ratio"] == pytest.approx(15 / 40) and row["ratio_low"] <= 0.342 <= row["ratio_high"]
    verdicts = claims_table(table, effects, seed_sets, "op-grpo-toy").set_index("claim")["verdict all"]
    assert _verdict(verdicts, "(sparse binary reward") == "reproduced"
    assert _verdict(verdicts, "removing the sequence correction") == "not tested"


def test_wall_clock_is_steps_ratio_times_the_median_cost_ratio():
    effect_rows = pd.DataFrame({
        "seed_set": "all", "task": "t", "reference": ["flow_grpo", "flow_grpo", "op_grpo"],
        "algorithm": ["op_grpo", "op_grpo", "flow_grpo"], "metric": ["steps_to_50", "steps_to_80", "steps_to_50"],
        "ratio": [0.5, 0.8, 2.0], "ratio_low": [0.5, 0.7, 1.5], "ratio_high": [0.5, 0.9, 2.5]})
    timing = pd.DataFrame({"repeat": [0, 0, 1, 1, 2, 2], "cell": ["t/flow_grpo", "t/op_grpo"] * 3,
                           "task": "t", "algorithm": ["flow_grpo", "op_grpo"] * 3,
                           "s_per_step": [0.1, 0.12, 0.2, 0.26, 0.1, 0.125]})
    wall = wall_clock_ratios(effect_rows, timing, "flow_grpo").set_index("metric")
    assert list(wall["algorithm"]) == ["op_grpo", "op_grpo"]  # only effects vs the baseline
    assert wall.loc["wall_to_50", "cost_ratio"] == pytest.approx(1.25)  # median of 1.2, 1.3, 1.25
    assert wall.loc["wall_to_50", "ratio"] == pytest.approx(0.5 * 1.25)
    assert wall.loc["wall_to_80", "ratio"] == pytest.approx(0.8 * 1.25)
    # zero spread of the steps ratio: only the repeats' spread of the cost ratio (1.2 .. 1.3) widens the interval
    assert 0.5 * 1.2 <= wall.loc["wall_to_50", "ratio_low"] <= 0.625 <= wall.loc["wall_to_50", "ratio_high"] <= 0.65
    assert wall.loc["wall_to_80", "ratio_low"] == pytest.approx(0.7 * 1.2) or wall.loc["wall_to_80", "ratio_low"] < 0.8


def test_claims_replicate_only_when_both_seed_sets_agree(tmp_path):
    """Exploration seeds 0-3 where OP-GRPO saves steps, replication seeds 10-13 where it saves none: the steps claim
    is contradicted on both (different sides), the reuse claim reproduced on one set only: not replicated."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "s", "tasks": {"toy2d_sep64_sparse": {}},
                                     "seed_sets": {"exploration": [0, 1, 2, 3], "replication": [10, 11, 12, 13]}}))
    for seed in (0, 1, 2, 3, 10, 11, 12, 13):
        wobble = 0.001 * (seed % 10)
        _write(tmp_path / "runs", "toy2d_sep64_sparse", "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5 + wobble])
        op = ([r + wobble for r in [0.0, 0.3, 0.51, 0.52, 0.53, 0.54]] if seed < 10
              else [0.0, 0.1, 0.2, 0.3, 0.4, 0.5 + wobble])  # replication: the same curve as flow_grpo
        _write(tmp_path / "runs", "toy2d_sep64_sparse", "op_grpo", seed, op)
        _write(tmp_path / "runs", "toy2d_sep64_sparse@no_reuse", "op_grpo", seed,
               [0.0, 0.1, 0.2, 0.3, 0.4, 0.51 + wobble])
    table, effects, seed_sets, _ = analyze_study(tmp_path / "runs", smooth=1, also_vs=("op_grpo",), suite=str(suite),
                                                 resamples=500)
    assert seed_sets == {"exploration": [0, 1, 2, 3], "replication": [10, 11, 12, 13],
                         "all": [0, 1, 2, 3, 10, 11, 12, 13]}
    # each set's target comes from its own baseline runs
    targets = effects[effects["metric"] == "steps_to_80"].groupby("seed_set")["target"].first()
    assert targets["exploration"] == pytest.approx(0.8 * 0.5015) and targets["replication"] == pytest.approx(0.8 * 0.5015)
    claims = claims_table(table, effects, seed_sets, "op-grpo-toy").set_index("claim")
    steps = claims.loc[claims.index.str.contains("sparse binary")].iloc[0]
    assert steps["verdict exploration"].startswith("contradicted (saves steps")
    assert steps["verdict replication"].startswith("contradicted (no saving)")
    assert steps["replication"] == "replicated: contradicted"
    reuse = claims.loc[claims.index.str.startswith("the saving comes from reusing")].iloc[0]
    assert reuse["verdict exploration"] == "reproduced"
    assert reuse["verdict replication"].startswith("contradicted")
    assert reuse["replication"] == "not replicated"


def test_study_cli_writes_claims_and_wall_clock(tmp_path, capsys):
    fast = [0.0, 0.3, 0.51, 0.52, 0.53, 0.54]
    _study(tmp_path / "runs", fast, fast, 0.14, 1)
    timing = pd.DataFrame({"repeat": [0, 0], "cell": ["toy2d_sep64_sparse/flow_grpo", "toy2d_sep64_sparse/op_grpo"],
                           "task": "toy2d_sep64_sparse", "algorithm": ["flow_grpo", "op_grpo"], "s_per_step": [0.1, 0.2]})
    timing.to_csv(tmp_path / "timing.csv", index=False)
    out = tmp_path / "report"
    assert study_main([str(tmp_path / "runs"), "--out", str(out), "--also-vs", "op_grpo", "--claims",
                       "--timing", str(tmp_path / "timing.csv")]) == 0
    text = (out / "README.md").read_text()
    assert "## The paper's claims" in text and "## Wall-clock to target (estimated)" in text
    assert {"claims.csv", "timing.csv", "wall_clock.csv"} <= {p.name for p in out.iterdir()}
    assert study_main([str(tmp_path / "runs"), "--out", str(out), "--claims"]) == 2
    assert "--claims needs --also-vs op_grpo" in capsys.readouterr().err
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    assert study_main([str(tmp_path / "runs"), "--out", str(out), "--timing", str(tmp_path / "bad.csv")]) == 2
    assert "missing columns" in capsys.readouterr().err


def test_timing_rejects_unknown_cells_in_one_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"--cells toy2d_sep64_sparse/nope: not in suite op-grpo-study; cells: "):
        cell_configs("op-grpo-study", ["toy2d_sep64_sparse/nope"], 2, tmp_path)
    assert timing_main(["op-grpo-study", "--cells", "flow_grpo", "--out", str(tmp_path / "x.csv")]) == 2
    assert "TASK/ALGORITHM" in capsys.readouterr().err


def test_timing_measures_every_cell_in_every_repeat():
    table = measure("op-grpo-study", ["toy2d_sep64_sparse/flow_grpo", "toy2d_sep64_sparse/op_grpo"], steps=2, repeats=2)
    assert len(table) == 4 and set(table["repeat"]) == {0, 1}
    assert (table["s_per_step"] > 0).all() and (table["steps"] == 2).all()
    reference = table[table["cell"] == "toy2d_sep64_sparse/flow_grpo"]
    assert (reference["ratio"] == 1.0).all()
    op = table[table["cell"] == "toy2d_sep64_sparse/op_grpo"].set_index("repeat")
    ref = reference.set_index("repeat")
    assert np.allclose(op["ratio"], op["s_per_step"] / ref["s_per_step"])


def test_trimmed_metrics_give_the_same_study(tmp_path):
    from flowzoo.benchmark.study.verdicts import save_trimmed_metrics

    fast = [0.0, 0.3, 0.51, 0.52, 0.53, 0.54]
    _study(tmp_path / "runs", fast, [0.0, 0.1, 0.2, 0.3, 0.4, 0.51], 0.4, 10)
    for run in (tmp_path / "runs").rglob("metrics.csv"):  # a column the study does not read is dropped
        pd.read_csv(run).assign(unread=1.0).to_csv(run, index=False)
        config = run.parent / "config.yaml"  # as a run writes it: this machine's absolute directory
        config.write_text(config.read_text() + f"run_dir: {run.parent}\n")
    assert save_trimmed_metrics(tmp_path / "runs", tmp_path / "kept") == 42
    kept = next((tmp_path / "kept").rglob("op_grpo_no_truncation/s0/metrics.csv"))
    assert "unread" not in pd.read_csv(kept).columns and "abs_log_ratio_t9" in pd.read_csv(kept).columns
    # this machine's absolute run directory does not travel with the copy: the run's place in the copied tree does
    copied = (kept.parent / "config.yaml").read_text()
    assert str(tmp_path) not in copied
    assert f"run_dir: {kept.parent.relative_to(tmp_path / 'kept').as_posix()}\n" in copied
    full = analyze_study(tmp_path / "runs", also_vs=("op_grpo",), resamples=300)[1]
    trimmed = analyze_study(tmp_path / "kept", also_vs=("op_grpo",), resamples=300)[1]
    pd.testing.assert_frame_equal(full, trimmed, rtol=1e-5)


def test_decoupled_claims_follow_the_several_fold_rule(tmp_path):
    """DiffusionNFT reaching the 80% target at step 10 vs Flow-GRPO's 50 (ratio 0.2, CI below 1/3): reproduced; AWM
    at step 30 (0.6): contradicted, fewer steps but not several-fold."""
    for seed in range(6):
        wobble = 0.001 * seed
        _write(tmp_path, "toy2d_sep64_sparse", "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5 + wobble])
        _write(tmp_path, "toy2d_sep64_sparse", "op_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5 + wobble])
        _write(tmp_path, "toy2d_sep64_sparse", "diffusion_nft", seed, [0.0, 0.6, 0.6, 0.6, 0.6, 0.6])
        _write(tmp_path, "toy2d_sep64_sparse", "awm", seed, [0.0, 0.1, 0.2, 0.6, 0.6, 0.6])
    table, effects, seed_sets, _ = analyze_study(tmp_path, smooth=1, also_vs=("op_grpo",), resamples=500)
    verdicts = claims_table(table, effects, seed_sets, "op-grpo-toy").set_index("claim")["verdict all"]
    assert _verdict(verdicts, "DiffusionNFT (paper: 3-25x more efficient than FlowGRPO) reaches Flow-GRPO's level in "
                              "several-fold fewer steps (sparse)") == "reproduced"
    assert _verdict(verdicts, "AWM (paper: up to 24x speedup over Flow-GRPO) reaches Flow-GRPO's level in several-fold "
                              "fewer steps (sparse)") == "contradicted (fewer steps, not several-fold)"
    assert _verdict(verdicts, "AWM (paper: up to 24x speedup over Flow-GRPO) reaches Flow-GRPO's level in several-fold "
                              "fewer steps (dense)") == "not tested"


@pytest.mark.parametrize("suite, task, label", [
    ("op-grpo-tiny-counting", "tiny_counting_sparse", "(tiny text-to-image, strict counting)"),
    ("op-grpo-tiny-rare-counting", "tiny_counting_rare", "(tiny text-to-image, strict counting, rare prompts)"),
])
def test_tiny_study_claims_read_the_tiny_task(tmp_path, suite, task, label):
    """Each tiny study's claim set judges the same rules on its own task: OP-GRPO at step 20 vs Flow-GRPO's 50 and the
    buffer-prompt control at 50 (reuse saves on top); the toy claims are not in it."""
    from flowzoo.benchmark.study.claims import claim_set, match_claim_set

    for seed in range(6):
        wobble = 0.001 * seed
        _write(tmp_path, task, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5 + wobble])
        _write(tmp_path, task, "op_grpo", seed, [0.0, 0.3, 0.51, 0.52, 0.53, 0.54 + wobble])
        _write(tmp_path, f"{task}@buffer_prompts", "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5 + wobble])
    table, effects, seed_sets, _ = analyze_study(tmp_path, smooth=1, also_vs=("op_grpo", "flow_grpo@buffer_prompts"),
                                                 resamples=500)
    assert match_claim_set(table["task"]).name == suite  # runs without a named claim set: matched by their task
    verdicts = claims_table(table, effects, seed_sets, claim_set(suite).claims).set_index("claim")["verdict all"]
    assert _verdict(verdicts, f"OP-GRPO needs 34.2% of Flow-GRPO's steps to reach its final performance {label}"
                    ).startswith("contradicted (saves steps")
    assert _verdict(verdicts, f"OP-GRPO's off-policy reuse saves steps on top of its choice of prompts {label}"
                    ) == "reproduced"
    assert _verdict(verdicts, "DAPO's dynamic sampling, needs no more steps") == "not tested"
    assert not any("sparse binary reward" in claim or "video" in claim for claim in verdicts.index)
    with pytest.raises(ConfigError, match="--claims 'quick': no such claim set; claim sets: edit-replay, "
                                          "op-grpo-tiny-counting, op-grpo-tiny-rare-counting, op-grpo-toy"):
        claim_set("quick")


def test_a_baseline_that_does_not_improve_gives_no_target_and_no_verdict(tmp_path):
    """On a seed set where Flow-GRPO ends below its base, the target is undefined: every run is censored at the
    budget and the ratio of 1 compares nothing, so the claims say 'not tested (no target)', the effects table 'no
    target', and the wall-clock table leaves the set out."""
    from flowzoo.benchmark.analysis.effects import NO_TARGET
    from flowzoo.benchmark.study.verdicts import verdict as effect_verdict
    from flowzoo.benchmark.study.claims import claim_set

    task = "tiny_counting_sparse"
    for seed in range(6):
        wobble = 0.001 * seed
        _write(tmp_path, task, "flow_grpo", seed, [0.2, 0.2, 0.1, 0.1, 0.1, 0.1 + wobble])
        _write(tmp_path, task, "op_grpo", seed, [0.2, 0.3, 0.5, 0.5, 0.5, 0.5 + wobble])
    table, effects, seed_sets, _ = analyze_study(tmp_path, smooth=1, also_vs=("op_grpo",), resamples=300)
    verdicts = claims_table(table, effects, seed_sets, claim_set("op-grpo-tiny-counting").claims).set_index("claim")
    row = verdicts.loc[next(c for c in verdicts.index if c.startswith("OP-GRPO needs 34.2%"))]
    assert row["verdict all"] == "not tested (no target)" and "no target" in row["measured all"]
    # the forest plot still draws the claim's row (its zones, the paper's value, the verdict) with no estimate
    from flowzoo.benchmark.study.claims import judge

    drawn = judge(table, effects, seed_sets, claim_set("op-grpo-tiny-counting").claims)[1]
    steps_row = drawn[drawn["label"] == "op_grpo / flow_grpo: steps (sparse)"].iloc[0]
    assert steps_row["verdict"] == "not tested (no target)" and np.isnan(steps_row["estimate"])
    assert steps_row["paper"] == pytest.approx(0.342)
    steps = effects[(effects["metric"] == "steps_to_80") & (effects["reference"] == "flow_grpo")].iloc[0]
    assert effect_verdict(steps) == NO_TARGET
    final = effects[(effects["metric"] == "final_reward") & (effects["reference"] == "flow_grpo")].iloc[0]
    assert effect_verdict(final) == "better"  # values need no target
    timing = pd.DataFrame({"repeat": [0, 0], "cell": [f"{task}/flow_grpo", f"{task}/op_grpo"],
                           "s_per_step": [1.0, 1.2]})
    assert wall_clock_ratios(effects, timing, "flow_grpo").empty


def test_gains_say_whether_the_baseline_learns_on_each_seed_set(tmp_path):
    """The gain over the base per seed set, with its bootstrap CI: a baseline that gains on every seed makes
    well-conditioned targets, one whose gains straddle 0 weak ones, one that never gains none."""
    from flowzoo.benchmark.study.verdicts import conditioning, gains, seed_sets_of

    task = "tiny_counting_sparse"
    learns = [0.10, 0.12, 0.08, 0.11, 0.09]  # seeds 0-4: every run gains
    straddles = [0.20, -0.10, 0.15, -0.12, 0.01]  # seeds 10-14: mean +0.028, CI through 0
    for seed, gain in zip(range(5), learns):
        _write(tmp_path, task, "flow_grpo", seed, [0.2, 0.2, 0.2, 0.2, 0.2 + gain, 0.2 + gain])
        _write(tmp_path, task, "op_grpo", seed, [0.2, 0.2, 0.2, 0.2, 0.1, 0.1])
    for seed, gain in zip(range(10, 15), straddles):
        _write(tmp_path, task, "flow_grpo", seed, [0.2, 0.2, 0.2, 0.2, 0.2 + gain, 0.2 + gain])
        _write(tmp_path, task, "op_grpo", seed, [0.2, 0.2, 0.2, 0.2, 0.1, 0.1])
    table, _, _, _ = analyze_study(tmp_path, smooth=1, also_vs=("op_grpo",), resamples=200)
    sets = {"exploration": [0, 1, 2, 3, 4], "replication": [10, 11, 12, 13, 14]}
    sets = {**sets, "all": seed_sets_of(None, table["seed"])["all"]}
    rows = gains(table, sets).set_index(["seed_set", "algorithm"])
    first = rows.loc[("exploration", "flow_grpo")]
    assert first["n"] == 5 and first["gain"] == pytest.approx(np.mean(learns)) and first["gained"] == 5
    assert 0.08 <= first["ci_low"] < first["gain"] < first["ci_high"] <= 0.12
    assert conditioning(first).startswith("learns")
    second = rows.loc[("replication", "flow_grpo")]
    assert second["gain"] == pytest.approx(np.mean(straddles)) and second["gained"] == 3
    assert second["ci_low"] < 0 < second["ci_high"] and conditioning(second) == "gain CI reaches 0: targets weak"
    never = rows.loc[("exploration", "op_grpo")]
    assert never["gain"] == pytest.approx(-0.1) and never["gained"] == 0 and conditioning(never) == "no gain: no target"
    assert rows.loc[("all", "flow_grpo"), "n"] == 10


def test_study_cli_writes_the_gain_table(tmp_path):
    fast = [0.0, 0.3, 0.51, 0.52, 0.53, 0.54]
    _study(tmp_path / "runs", fast, fast, 0.14, 1)
    out = tmp_path / "report"
    assert study_main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    written = pd.read_csv(out / "gains.csv")
    assert set(written["algorithm"]) >= {"flow_grpo", "op_grpo"} and (written["seed_set"] == "all").all()
    text = (out / "README.md").read_text()
    assert "## Gain over the base model" in text  # final = mean of the last 3 evals: 0.4 + mean wobble / 3
    assert "| all | toy2d_sep64_sparse | flow_grpo | 6 | 0.0000 | 0.4008 | +0.4008 [" in text
    assert "learns: targets well-conditioned" in text
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_the_report_opens_with_its_answer(tmp_path):
    """The README leads with the baseline's gain per seed set and the claims' verdicts, decisive replicated ones
    first, before the definitions and tables."""
    from flowzoo.benchmark.study.verdicts import gains, render

    fast = [0.0, 0.3, 0.51, 0.52, 0.53, 0.54]
    _study(tmp_path, fast, fast, 0.14, 1)
    table, effects, seed_sets, _ = analyze_study(tmp_path, smooth=1, also_vs=("op_grpo",), resamples=200)
    verdicts = {"exploration": ["contradicted", "inconclusive", "reproduced"],
                "replication": ["inconclusive", "inconclusive", "reproduced"]}
    claims = pd.DataFrame({"claim": ["claim A", "claim B", "claim C"], "rule": "r",
                           **{f"measured {s}": "m" for s in verdicts},
                           **{f"verdict {s}": v for s, v in verdicts.items()},
                           "replication": ["not replicated", "replicated: inconclusive", "replicated: reproduced"]})
    text = render(table, effects, seed_sets, "flow_grpo", 1, claims=claims, gain_rows=gains(table, seed_sets))
    answer = text[text.index("## Answer"):text.index("Metrics fixed before the runs")]
    assert text.index("## Answer") < text.index("## The paper's claims")
    assert "* `flow_grpo` gain over the base on `toy2d_sep64_sparse`: all +0.50" in answer
    assert "(learns: targets well-conditioned)" in answer
    order = [answer.index(f"claim {c}") for c in "CBA"]
    assert order == sorted(order)
    assert "* **replicated: reproduced**: claim C (exploration: reproduced; replication: reproduced)." in answer
    assert "* **not replicated**: claim A (exploration: contradicted; replication: inconclusive)." in answer
    # without seed sets (one set, no replication column) each claim's single verdict is listed in table order
    single = pd.DataFrame({"claim": ["claim A", "claim B"], "rule": "r", "measured": "m",
                           "verdict": ["contradicted", "reproduced"]})
    text = render(table, effects, seed_sets, "flow_grpo", 1, claims=single)
    answer = text[text.index("## Answer"):text.index("Metrics fixed before the runs")]
    assert "* **contradicted**: claim A.\n* **reproduced**: claim B." in answer and "gain over the base" not in answer
