"""flowzoo.benchmark.analysis.stats on hand-made curves whose answers are known."""

import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import yaml

from flowzoo.benchmark.analysis import aggregate, runs as loading, stats, targets
from flowzoo.errors import ConfigError


def make_run(run, steps, rewards, *, task="t", algorithm="a", seed=0, train_steps=None, nfe_per_step=10.0,
             wall_per_step=2.0, eval_every=1):
    """A tidy run frame as load_runs returns it; ``rewards[i]`` is the eval reward at steps[i] if evaluated."""
    steps = np.asarray(steps)
    frame = pd.DataFrame({
        "step": steps,
        "nfe": steps * nfe_per_step,
        "wall_s": steps * wall_per_step,
        "eval_reward": [r if s % eval_every == 0 else np.nan for s, r in zip(steps, rewards)],
    })
    keys = {"run": run, "task": task, "algorithm": algorithm, "seed": seed,
            "train_steps": int(steps.max()) if train_steps is None else train_steps}
    keys["finished"] = bool(steps.max() >= keys["train_steps"])
    for position, (key, value) in enumerate(keys.items()):
        frame.insert(position, key, value)
    return frame


def write_run(run_dir, *, task="t", algorithm="a", seed=0, train_steps=3, rewards=(0.1, 0.2, 0.3, 0.4)):
    run_dir.mkdir(parents=True)
    config = {"task": task, "seed": seed, "algorithm": {"name": algorithm, "lr": 1e-4}, "train": {"steps": train_steps}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    steps = np.arange(len(rewards))
    pd.DataFrame({"step": steps, "nfe": steps * 4, "wall_s": steps * 0.5, "reward_mean": rewards,
                  "eval_reward": rewards}).to_csv(run_dir / "metrics.csv", index=False)


FINAL = targets.Target("relative", 1.0)  # the baseline's final reward


# ---------------------------------------------------------------------------------------------------- smoothing


def test_trailing_mean_uses_fewer_values_at_the_start():
    np.testing.assert_allclose(stats.smooth_trailing([1, 2, 3, 4], 2), [1.0, 1.5, 2.5, 3.5])
    np.testing.assert_allclose(stats.smooth_trailing([1, 2, 3, 4], 3), [1.0, 1.5, 2.0, 3.0])
    np.testing.assert_allclose(stats.smooth_trailing([1, 5, 2], 1), [1, 5, 2])


def test_final_reward_is_mean_of_last_k_evaluations():
    runs = make_run("r", [0, 1, 2, 3, 4], [0.0, 0.0, 0.3, 0.6, 0.9])
    finals = stats.final_rewards(stats.eval_curves(runs, smooth=3))
    assert finals["final_reward"].tolist() == pytest.approx([0.6])
    # evaluations only every other step: the last 3 evaluations are steps 0, 2, 4
    runs = make_run("r", [0, 1, 2, 3, 4], [0.0, 0.0, 0.3, 0.6, 0.9], eval_every=2)
    assert stats.final_rewards(stats.eval_curves(runs, smooth=3))["final_reward"].tolist() == pytest.approx([0.4])


# --------------------------------------------------------------------------------------------------- cost to target


def test_steps_nfe_wall_to_target_on_known_curve():
    runs = make_run("r", [0, 10, 20, 30], [0.0, 0.5, 0.8, 0.9], nfe_per_step=3, wall_per_step=0.5)
    raw = stats.costs_to_target(runs, stats.eval_curves(runs, smooth=1), {"t": 0.75})
    assert raw[["step", "nfe", "wall_s"]].iloc[0].tolist() == [20, 60, 10]
    assert raw["reached"].tolist() == [True]
    # smoothed over 2 evaluations the curve is [0, .25, .65, .85]: the target is first reached at step 30
    smoothed = stats.costs_to_target(runs, stats.eval_curves(runs, smooth=2), {"t": 0.75})
    assert smoothed["step"].tolist() == [30]


def test_target_reached_at_step_zero_costs_nothing():
    runs = make_run("r", [0, 1, 2], [0.9, 0.1, 0.1])
    costs = stats.costs_to_target(runs, stats.eval_curves(runs, smooth=1), {"t": 0.5})
    assert costs[["step", "nfe", "wall_s", "reached"]].iloc[0].tolist() == [0, 0, 0, True]


def test_run_that_never_reaches_is_censored_at_its_last_logged_step():
    # evaluated at 0, 2, 4 but trained (logged) up to step 5: censored cost is step 5, not the last evaluation
    runs = make_run("r", [0, 1, 2, 3, 4, 5], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], eval_every=2, train_steps=8)
    costs = stats.costs_to_target(runs, stats.eval_curves(runs, smooth=1), {"t": 0.99})
    assert costs[["step", "nfe", "wall_s", "reached"]].iloc[0].tolist() == [5, 50, 10, False]
    assert len(costs) == 1  # kept, not dropped
    assert costs["finished"].tolist() == [False]


def test_seed_sitting_on_the_seed_mean_reaches_it():
    value = 0.1
    target = float(np.mean([value] * 3))
    assert target != value  # float rounding: the mean of three 0.1 is not 0.1
    assert stats.reaches([value], target).tolist() == [True]
    assert stats.reaches([value - 1e-6], target).tolist() == [False]


def test_relative_and_absolute_targets():
    runs = pd.concat([
        make_run(f"b{s}", [0, 1], [0.0, final], algorithm="base", seed=s) for s, final in enumerate([0.8, 0.9, 1.0])
    ] + [make_run("x0", [0, 1], [0.0, 0.1], algorithm="x")])
    curves = stats.eval_curves(runs, smooth=1)
    finals = stats.final_rewards(curves)
    assert targets.task_targets(finals, "base", targets.Target("relative", 1.0))["t"] == pytest.approx(0.9)
    # the default: 90% of the way from the base (step 0: 0.0) to the final mean 0.9
    bases = targets.base_rewards(curves, "base")
    assert bases == {"t": 0.0}
    assert targets.task_targets(finals, "base", None, bases)["t"] == pytest.approx(0.81)
    assert targets.task_targets(finals, "base", targets.Target("gain", 0.5), {"t": 0.5})["t"] == pytest.approx(0.7)
    # no gain over the base: no target
    assert math.isnan(targets.task_targets(finals, "base", None, {"t": 0.95})["t"])
    assert math.isnan(targets.task_targets(finals, "base")["t"])  # a gain target without base rewards
    assert targets.task_targets(finals, "base", targets.Target("relative", 0.5))["t"] == pytest.approx(0.45)
    assert targets.task_targets(finals, "base", 0.3)["t"] == 0.3
    assert targets.task_targets(finals, "base", {"t": 0.7})["t"] == 0.7
    with pytest.raises(ConfigError, match="nope"):
        targets.task_targets(finals, "base", {"nope": 0.7})
    with pytest.raises(ConfigError, match="'zzz'.*'base', 'x'"):
        targets.check_baseline(runs, "zzz")


def test_parse_target_from_command_line():
    assert targets.parse_target(None) == targets.Target("gain", 0.9) == targets.Target()
    assert targets.parse_target("0.9x") == targets.Target("relative", 0.9)
    assert targets.parse_target("80%") == targets.Target("relative", 0.8)
    assert targets.parse_target("0.75") == targets.Target("absolute", 0.75)
    assert targets.parse_target("-0.5") == targets.Target("absolute", -0.5)
    assert targets.parse_target("0.8gain") == targets.Target("gain", 0.8)
    assert targets.parse_target("95%gain") == targets.Target("gain", 0.95)
    for bad in ("high", "nan", "inf", "-inf", "1e999", "nanx", "0%", "-0.5gain", "%", "gain"):
        with pytest.raises(ConfigError, match=f"target {bad!r} is not valid; use '0.9gain'"):
            targets.parse_target(bad)


# -------------------------------------------------------------------------------------------------------------- IQM


def test_iqm_known_values():
    # sorted: -100, 1, 2, 3, 4, 5, 6, 100 -> drop 2 at each end -> mean(2, 3, 4, 5)
    assert stats.iqm([1, 2, 3, 4, 100, -100, 5, 6]) == pytest.approx(3.5)
    assert stats.iqm([7.0]) == 7.0
    assert stats.iqm([1, 2, 3]) == pytest.approx(2.0)  # floor(3/4) = 0: nothing dropped


@pytest.mark.parametrize("n", [4, 5, 6, 7, 9, 10, 13])
def test_iqm_matches_the_trimmed_mean_definition(n):
    values = np.random.default_rng(n).normal(size=n) ** 3
    assert stats.iqm(values) == pytest.approx(scipy.stats.trim_mean(values, 0.25))
    rows = np.stack([values, values * 2])
    np.testing.assert_allclose(stats.iqm(rows, axis=-1), [stats.iqm(values), stats.iqm(values * 2)])


# -------------------------------------------------------------------------------------------------------- bootstrap


def test_bootstrap_ci_contains_estimate_and_is_reproducible():
    values = np.random.default_rng(1).normal(0.5, 0.1, size=8)
    lo, hi = stats.bootstrap_ci(values, np.mean, seed=3)
    assert lo < values.mean() < hi
    assert hi - lo < 0.2
    assert stats.bootstrap_ci(values, np.mean, seed=3) == (lo, hi)
    assert stats.bootstrap_ci(values, np.mean, seed=4) != (lo, hi)
    lo, hi = stats.bootstrap_ci(values, stats.iqm)
    assert lo <= stats.iqm(values) <= hi


def test_bootstrap_ci_needs_two_seeds():
    assert all(math.isnan(v) for v in stats.bootstrap_ci([0.3]))
    ratio, lo, hi = stats.ratio_ci([2.0], [4.0, 4.0])
    assert ratio == 0.5 and math.isnan(lo) and math.isnan(hi)


def test_ratio_of_algorithm_identical_to_baseline_is_one():
    costs = np.array([10.0, 14.0, 12.0, 20.0])
    ratio, lo, hi = stats.ratio_ci(costs, costs.copy())
    assert ratio == 1.0
    assert lo < 1.0 < hi


def test_ratio_ci_known_ratio_and_reproducible():
    ratio, lo, hi = stats.ratio_ci([1.0, 2.0, 3.0], [2.0, 4.0, 6.0], seed=7)
    assert ratio == pytest.approx(0.5)
    assert lo < 0.5 < hi
    assert stats.ratio_ci([1.0, 2.0, 3.0], [2.0, 4.0, 6.0], seed=7) == (ratio, lo, hi)
    # no spread in either group: the CI collapses onto the point estimate
    assert stats.ratio_ci([3.0, 3.0], [6.0, 6.0]) == (0.5, 0.5, 0.5)


def test_ratio_bound_names_the_direction_of_censoring():
    assert stats.ratio_bound(0, 0) == "exact"
    assert stats.ratio_bound(2, 0) == "lower bound"
    assert stats.ratio_bound(0, 1) == "upper bound"
    assert stats.ratio_bound(1, 1) == "unknown direction"


# ----------------------------------------------------------------------------------------------------------- tables


def _grid(curves_by_algorithm):
    return pd.concat([make_run(f"{alg}/{seed}", range(len(curve)), curve, algorithm=alg, seed=seed)
                      for alg, seeds in curves_by_algorithm.items() for seed, curve in enumerate(seeds)])


def test_efficiency_table_identical_algorithm_has_ratio_one():
    seeds = [[0.0, 0.2, 0.5, 0.9, 1.0], [0.0, 0.4, 0.8, 1.0, 1.0], [0.0, 0.1, 0.3, 0.6, 1.0]]
    runs = _grid({"base": seeds, "twin": seeds})
    curves = stats.eval_curves(runs, smooth=1)
    table = stats.efficiency_table(stats.task_data(runs, curves), "base", FINAL)
    assert table["algorithm"].tolist() == ["twin"]
    for cost in stats.COSTS:
        assert table[f"{cost}_ratio"].iloc[0] == 1.0
    assert table[["n", "reached", "bound"]].iloc[0].tolist() == [3, 3, "exact"]


def test_efficiency_table_faster_and_censored_algorithms():
    base = [[0.0, 0.25, 0.5, 0.75, 1.0]] * 2                   # target 1.0 reached at step 4
    fast = [[0.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.5, 1.0, 1.0, 1.0]]  # steps 1 and 2: ratio 1.5 / 4
    never = [[0.0, 0.1, 0.1, 0.1, 0.1]] * 2                     # censored at step 4: ratio 1, lower bound
    runs = _grid({"base": base, "fast": fast, "never": never})
    curves = stats.eval_curves(runs, smooth=1)
    table = stats.efficiency_table(stats.task_data(runs, curves), "base", FINAL).set_index("algorithm")
    assert table.loc["fast", "step_ratio"] == pytest.approx(1.5 / 4)
    assert table.loc["fast", "bound"] == "exact"
    assert table.loc["never", "step_ratio"] == pytest.approx(1.0)
    assert table.loc["never", ["reached", "bound"]].tolist() == [0, "lower bound"]


def test_final_reward_table_mean_iqm_ci_and_unfinished():
    runs = pd.concat([make_run(f"r{s}", [0, 1], [0.0, v], seed=s) for s, v in enumerate([0.2, 0.4, 0.6, 0.8])]
                     + [make_run("u", [0, 1], [0.0, 0.5], algorithm="b", train_steps=5)])
    table = stats.final_reward_table(stats.final_rewards(stats.eval_curves(runs, smooth=1))).set_index("algorithm")
    assert table.loc["a", "mean"] == pytest.approx(0.5)
    assert table.loc["a", "iqm"] == pytest.approx(0.5)
    assert table.loc["a", "mean_lo"] < 0.5 < table.loc["a", "mean_hi"]
    assert table.loc["a", "unfinished"] == 0
    assert table.loc["b", "unfinished"] == 1 and table.loc["b", "n"] == 1
    assert math.isnan(table.loc["b", "mean_lo"])


# ---------------------------------------------------------------------------------------------------------- loading


def test_load_runs_finds_nested_runs_and_marks_unfinished(tmp_path):
    write_run(tmp_path / "suite" / "a_s0", seed=0, train_steps=3)
    write_run(tmp_path / "b_s1", algorithm="b", seed=1, train_steps=10)
    (tmp_path / "not_a_run").mkdir()
    (tmp_path / "not_a_run" / "config.yaml").write_text("task: t\n")  # no metrics.csv: ignored
    runs = loading.load_runs(tmp_path)
    summary = loading.run_summary(runs).set_index("run")
    assert sorted(summary.index) == ["b_s1", "suite/a_s0"]
    assert summary.loc["suite/a_s0", ["algorithm", "seed", "finished", "last_step"]].tolist() == ["a", 0, True, 3]
    assert summary.loc["b_s1", "finished"] == False  # noqa: E712  (3 of 10 steps)
    assert {"reward_mean", "eval_reward", "nfe"} <= set(runs.columns)


def test_load_runs_rejects_bad_input(tmp_path):
    with pytest.raises(ConfigError, match="no runs found"):
        loading.load_runs(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        loading.load_runs(tmp_path / "missing")
    write_run(tmp_path / "r")
    (tmp_path / "r" / "config.yaml").write_text("task: t\nseed: 0\nalgorithm: {name: a}\n")
    with pytest.raises(ConfigError, match="train.steps"):
        loading.load_runs(tmp_path)


def test_load_run_keeps_relogged_steps_last_and_refuses_a_task_that_is_not_a_name(tmp_path):
    write_run(tmp_path / "r", rewards=(0.1, 0.2, 0.3, 0.4))
    metrics = pd.read_csv(tmp_path / "r" / "metrics.csv")
    resumed = metrics.iloc[[2]].assign(eval_reward=0.9)  # step 2 logged again after a resume
    pd.concat([metrics, resumed]).to_csv(tmp_path / "r" / "metrics.csv", index=False)
    run = loading.load_run(tmp_path / "r", tmp_path)
    assert run["step"].tolist() == [0, 1, 2, 3]
    assert run["eval_reward"].tolist() == pytest.approx([0.1, 0.2, 0.9, 0.4])
    config = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    config["task"] = {"name": "shapes", "reward": "count"}  # a form no run writes: refused, not guessed at
    (tmp_path / "r" / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match="task and algorithm.name must be names"):
        loading.load_run(tmp_path / "r", tmp_path)


# ------------------------------------------------------------------------------------------ across tasks (rliable)

# a small fixed table: 2 tasks x 4 seeds for X, 2 tasks x 3 seeds for Y
X = [np.array([0.1, 0.9, 0.5, 0.3]), np.array([1.0, 0.2, 0.6, 0.8])]
Y = [np.array([0.5, 0.2, 0.4]), np.array([0.6, 0.9, 0.1])]


def test_aggregate_iqm_by_hand():
    # pooled sorted: .1 .2 .3 .5 .6 .8 .9 1.0 -> drop 2 at each end -> mean(.3, .5, .6, .8) = 0.55
    assert aggregate.aggregate_iqm(X) == pytest.approx(0.55)
    # 6 values: drop floor(6/4) = 1 at each end: sorted Y .1 .2 .4 .5 .6 .9 -> mean(.2 .4 .5 .6) = 0.425
    assert aggregate.aggregate_iqm(Y) == pytest.approx(0.425)
    assert aggregate.aggregate_iqm(X) == pytest.approx(scipy.stats.trim_mean(np.concatenate(X), 0.25))


def test_probability_of_improvement_by_hand():
    # task 0: pairs (x > y) of x in {.1 .9 .5 .3} vs y in {.5 .2 .4}: .1 -> 0, .9 -> 3, .5 -> 2 + tie(.5) 0.5,
    # .3 -> 1: (0 + 3 + 2.5 + 1) / 12 = 6.5 / 12; task 1: x {1 .2 .6 .8} vs y {.6 .9 .1}: 1 -> 3, .2 -> 1,
    # .6 -> 1 + tie 0.5, .8 -> 2: 7.5 / 12. Mean: 7 / 12.
    assert aggregate.probability_of_improvement(X, Y) == pytest.approx(7 / 12)
    assert aggregate.probability_of_improvement(Y, X) == pytest.approx(1 - 7 / 12)
    assert aggregate.probability_of_improvement(X, X) == pytest.approx(0.5)
    # the Mann-Whitney U statistic per task gives the same (rliable's computation)
    u = [scipy.stats.mannwhitneyu(x, y, alternative="greater").statistic / (x.size * y.size) for x, y in zip(X, Y)]
    assert aggregate.probability_of_improvement(X, Y) == pytest.approx(np.mean(u))


def test_performance_profile_by_hand():
    profile = aggregate.performance_profile(X, [0.0, 0.5, 0.85, 1.0])
    np.testing.assert_allclose(profile, [8 / 8, 4 / 8, 2 / 8, 0 / 8])  # strictly above tau


def test_stratified_bootstrap_resamples_within_each_task():
    rng = np.random.default_rng(0)
    tasks = [np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0])]
    first, second = aggregate.stratified_resample(tasks, 500, rng)
    assert first.shape == (500, 3) and second.shape == (500, 2)
    assert set(np.unique(first)) <= {1.0, 2.0, 3.0} and set(np.unique(second)) <= {10.0, 20.0}


def test_aggregate_cis_contain_the_estimate_and_are_reproducible():
    point, lo, hi = aggregate.aggregate_iqm_ci(X, 0.95, 2000, 0)
    assert point == pytest.approx(0.55) and lo < point < hi
    assert aggregate.aggregate_iqm_ci(X, 0.95, 2000, 0) == (point, lo, hi)
    p, plo, phi = aggregate.probability_of_improvement_ci(X, Y, 0.95, 2000, 0)
    assert p == pytest.approx(7 / 12) and 0 <= plo < p < phi <= 1
    # no spread at all: the CI collapses onto the estimate
    same = [np.full(3, 0.2), np.full(3, 0.4)]
    assert aggregate.probability_of_improvement_ci(same, [np.full(2, 0.1), np.full(2, 0.5)], 0.95, 500, 0) == (
        0.5, 0.5, 0.5)
    profile, plo, phi = aggregate.performance_profile_ci(X, [0.5], 0.95, 2000, 0)
    assert profile[0] == 0.5 and plo[0] < 0.5 < phi[0]
    # one seed per task: no interval
    assert all(math.isnan(v) for v in aggregate.aggregate_iqm_ci([np.array([1.0])], 0.95, 100, 0)[1:])


def test_aggregate_table_normalizes_by_the_baseline_gain():
    # base 0.2 at step 0 on both tasks; baseline finals 0.6, 1.0 (mean 0.8) on t1 and 0.4 on t2 -> gains 0.6, 0.2
    runs = pd.concat([
        make_run("b0", [0, 1], [0.2, 0.6], algorithm="base", task="t1", seed=0),
        make_run("b1", [0, 1], [0.2, 1.0], algorithm="base", task="t1", seed=1),
        make_run("b2", [0, 1], [0.2, 0.4], algorithm="base", task="t2", seed=0),
        make_run("x0", [0, 1], [0.2, 0.5], algorithm="x", task="t1", seed=0),
        make_run("x1", [0, 1], [0.2, 0.8], algorithm="x", task="t1", seed=1),
        make_run("x2", [0, 1], [0.2, 0.5], algorithm="x", task="t2", seed=0),
        make_run("f0", [0, 1], [0.7, 0.1], algorithm="base", task="flat", seed=0),  # no gain: left out
        make_run("f1", [0, 1], [0.7, 0.9], algorithm="x", task="flat", seed=0),
    ])
    curves = stats.eval_curves(runs, smooth=1)
    finals = stats.final_rewards(curves)
    bases, tops = targets.base_rewards(curves, "base"), targets.baseline_finals(finals, "base")
    normalized = stats.normalized_finals(finals, bases, tops).set_index("run")["normalized"]
    # x: (0.5 - 0.2) / 0.6 = 0.5, (0.8 - 0.2) / 0.6 = 1.0 on t1; (0.5 - 0.2) / 0.2 = 1.5 on t2
    assert normalized[["x0", "x1", "x2"]].tolist() == pytest.approx([0.5, 1.0, 1.5])
    assert math.isnan(normalized["f1"])
    table = stats.aggregate_table(stats.normalized_finals(finals, bases, tops), "base", resamples=500)
    row = table.set_index("algorithm").loc["x"]
    assert row["tasks"] == ["t1", "t2"] and row["n"] == 3
    assert row["iqm"] == pytest.approx(1.0)  # 3 values, nothing trimmed: mean(0.5, 1.0, 1.5)
    # P(x > base): t1: 0.5 vs {0.6, 1.0} -> 0, 0.8 vs {0.6, 1.0} -> 1/2 -> 1/4; t2: 0.5 > 0.4 -> 1; mean 5/8
    assert row["poi"] == pytest.approx(5 / 8)
    assert math.isnan(table.set_index("algorithm").loc["base", "poi"])


def test_mixed_budgets_and_bad_metrics(tmp_path):
    write_run(tmp_path / "a", seed=0, train_steps=3)
    write_run(tmp_path / "b", seed=1, train_steps=5)
    runs = loading.load_runs(tmp_path)
    with pytest.raises(ConfigError, match=r"task 't', algorithm 'a' mixes run budgets \(train.steps 3: a; "
                                          r"train.steps 5: b\)"):
        loading.check_budgets(runs)
    (tmp_path / "b" / "metrics.csv").write_bytes(b"\x00\xff\xfe binary \x00" * 50)
    skipped = []
    runs = loading.load_runs(tmp_path, skipped)
    loading.check_budgets(runs)  # one budget left
    assert [s.run for s in skipped] == ["b"] and str(tmp_path / "b" / "metrics.csv") in skipped[0].cause


def test_report_refuses_copies_and_differing_configs(tmp_path):
    """Three copies of one seed's run are one seed, not three; runs of one cell whose configs differ in anything but
    the seed are not pooled (each named, with the differing keys)."""
    import shutil

    write_run(tmp_path / "a", seed=0)
    shutil.copytree(tmp_path / "a", tmp_path / "copy_of_a")
    with pytest.raises(ConfigError, match="runs a and copy_of_a are both task 't', algorithm 'a', seed 0: a report "
                                          "counts each run once"):
        loading.load_runs(tmp_path)
    shutil.rmtree(tmp_path / "copy_of_a")
    write_run(tmp_path / "b", seed=1)
    config = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())
    config["algorithm"]["lr"] = 0.5
    (tmp_path / "b" / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match="runs a and b of task 't', algorithm 'a' differ in algorithm.lr: a report "
                                          "pools only seeds of one config"):
        loading.load_runs(tmp_path)


def test_a_finished_run_whose_config_was_edited_is_skipped(tmp_path):
    """done.json carries the digest of the config that wrote it: a report skips a run whose config.yaml was edited
    afterwards (as train's skip, eval and export refuse it), naming the cause."""
    from flowzoo.benchmark.cli import main

    run = tmp_path / "runs" / "r"
    assert main(["train", "benchmark/configs/toy_flow_grpo.yaml", f"run_dir={run}", "train.steps=2",
                 "train.eval_every=2", "--quiet"]) == 0
    assert len(loading.load_runs(tmp_path / "runs")) > 0
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["algorithm"]["lr"] = 0.5
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    skipped = []
    with pytest.raises(ConfigError, match="no readable runs"):
        loading.load_runs(tmp_path / "runs", skipped)
    assert "written by a run of another config than its config.yaml" in skipped[0].cause
