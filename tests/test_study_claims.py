"""The OP-GRPO study's claims table, wall-clock-to-target estimate and interleaved timing (benchmark/study*.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from benchmark.study import analyze_study, main as study_main, wall_clock_ratios
from benchmark.study_claims import claims_table
from benchmark.study_timing import cell_configs, main as timing_main, measure
from flowzoo.errors import ConfigError

STEPS = [0, 10, 20, 30, 40, 50]


def _write(root, task, algorithm, seed, rewards, extra=None):
    run = root / task / algorithm / f"s{seed}"
    run.mkdir(parents=True)
    run.joinpath("config.yaml").write_text(yaml.safe_dump(
        {"task": task, "seed": seed, "algorithm": {"name": algorithm}, "train": {"steps": STEPS[-1]}}))
    frame = pd.DataFrame({"step": STEPS, "nfe": np.asarray(STEPS) * 10, "wall_s": np.asarray(STEPS) * 0.5,
                          "eval_reward": rewards, **(extra or {})})
    frame.to_csv(run / "metrics.csv", index=False)


def _study(tmp_path, op_rewards, no_reuse_rewards, naive_clip, late_ratio):
    """flow_grpo reaches 0.5 at step 50; op_grpo / controls as given; 6 seeds with a small seed-dependent wobble."""
    sparse, dense = "toy2d_sparse64", "toy2d_dense64"
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
    table, effects, _ = analyze_study(tmp_path, smooth=1, also_vs=("op_grpo",))
    return table, effects, claims_table(table, effects).set_index("claim")["verdict"]


def _verdict(verdicts, start):
    return next(v for claim, v in verdicts.items() if claim.startswith(start) or start in claim)


def test_verdicts_follow_their_rules(tmp_path):
    # op_grpo reaches flow_grpo's final (0.5) at step 20 = 40% of 50 steps: the CI (all seeds equal) is ~[0.4, 0.4]
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
    # op_grpo reaches 0.5 at step 10 on half the seeds and step 20 on the others: ratio 0.3 with a CI around it
    for seed in range(8):
        _write(tmp_path, "toy2d_sparse64", "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
        hit = 1 if seed % 2 else 2
        rewards = [0.0] + [0.6 if i >= hit else 0.1 for i in range(1, 6)]
        _write(tmp_path, "toy2d_sparse64", "op_grpo", seed, rewards)
    table, effects, _ = analyze_study(tmp_path, smooth=1, also_vs=("op_grpo",))
    row = effects[(effects["algorithm"] == "op_grpo") & (effects["metric"] == "steps_to_final")].iloc[0]
    assert row["ratio"] == pytest.approx(15 / 50) and row["ratio_low"] <= 0.342 <= row["ratio_high"]
    verdicts = claims_table(table, effects).set_index("claim")["verdict"]
    assert _verdict(verdicts, "(sparse binary reward") == "reproduced"
    assert _verdict(verdicts, "removing the sequence correction") == "not tested"


def test_wall_clock_is_steps_ratio_times_the_median_cost_ratio(tmp_path):
    table = pd.DataFrame({"task": ["t"] * 8, "algorithm": ["flow_grpo"] * 4 + ["op_grpo"] * 4,
                          "seed": list(range(4)) * 2, "steps_to_target": [40.0] * 4 + [20.0] * 4,
                          "steps_to_final": [50.0] * 4 + [40.0] * 4})
    timing = pd.DataFrame({"repeat": [0, 0, 1, 1, 2, 2], "cell": ["t/flow_grpo", "t/op_grpo"] * 3,
                           "task": "t", "algorithm": ["flow_grpo", "op_grpo"] * 3,
                           "s_per_step": [0.1, 0.12, 0.2, 0.26, 0.1, 0.125]})
    wall = wall_clock_ratios(table, timing, "flow_grpo").set_index("metric")
    assert list(wall["algorithm"]) == ["op_grpo", "op_grpo"]  # the baseline gets no row of its own
    assert wall.loc["wall_to_target", "cost_ratio"] == pytest.approx(1.25)  # median of 1.2, 1.3, 1.25
    assert wall.loc["wall_to_target", "ratio"] == pytest.approx(0.5 * 1.25)
    assert wall.loc["wall_to_final", "ratio"] == pytest.approx(0.8 * 1.25)
    assert wall.loc["wall_to_target", "ratio_low"] <= 0.625 <= wall.loc["wall_to_target", "ratio_high"]
    assert 1.2 * 0.5 <= wall.loc["wall_to_target", "ratio_low"]  # zero spread over seeds: only the repeats vary


def test_study_cli_writes_claims_and_wall_clock(tmp_path, capsys):
    fast = [0.0, 0.3, 0.51, 0.52, 0.53, 0.54]
    _study(tmp_path / "runs", fast, fast, 0.14, 1)
    timing = pd.DataFrame({"repeat": [0, 0], "cell": ["toy2d_sparse64/flow_grpo", "toy2d_sparse64/op_grpo"],
                           "task": "toy2d_sparse64", "algorithm": ["flow_grpo", "op_grpo"], "s_per_step": [0.1, 0.2]})
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
    with pytest.raises(ConfigError, match=r"--cells toy2d_sparse64/nope: not in suite op-grpo-study; cells: "):
        cell_configs("op-grpo-study", ["toy2d_sparse64/nope"], 2, tmp_path)
    assert timing_main(["op-grpo-study", "--cells", "flow_grpo", "--out", str(tmp_path / "x.csv")]) == 2
    assert "TASK/ALGORITHM" in capsys.readouterr().err


def test_timing_measures_every_cell_in_every_repeat():
    table = measure("op-grpo-study", ["toy2d_sparse64/flow_grpo", "toy2d_sparse64/op_grpo"], steps=2, repeats=2)
    assert len(table) == 4 and set(table["repeat"]) == {0, 1}
    assert (table["s_per_step"] > 0).all() and (table["steps"] == 2).all()
    reference = table[table["cell"] == "toy2d_sparse64/flow_grpo"]
    assert (reference["ratio"] == 1.0).all()
    op = table[table["cell"] == "toy2d_sparse64/op_grpo"].set_index("repeat")
    ref = reference.set_index("repeat")
    assert np.allclose(op["ratio"], op["s_per_step"] / ref["s_per_step"])


def test_trimmed_metrics_give_the_same_study(tmp_path):
    from benchmark.study import save_trimmed_metrics

    fast = [0.0, 0.3, 0.51, 0.52, 0.53, 0.54]
    _study(tmp_path / "runs", fast, [0.0, 0.1, 0.2, 0.3, 0.4, 0.51], 0.4, 10)
    for run in (tmp_path / "runs").rglob("metrics.csv"):  # a column the study does not read is dropped
        pd.read_csv(run).assign(unread=1.0).to_csv(run, index=False)
    assert save_trimmed_metrics(tmp_path / "runs", tmp_path / "kept") == 42
    kept = next((tmp_path / "kept").rglob("op_grpo_no_truncation/s0/metrics.csv"))
    assert "unread" not in pd.read_csv(kept).columns and "abs_log_ratio_t9" in pd.read_csv(kept).columns
    full = analyze_study(tmp_path / "runs", also_vs=("op_grpo",))[1]
    trimmed = analyze_study(tmp_path / "kept", also_vs=("op_grpo",))[1]
    pd.testing.assert_frame_equal(full, trimmed, rtol=1e-5)
