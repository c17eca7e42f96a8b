"""flowzoo.benchmark.render.report end to end on a synthetic runs directory: 2 algorithms x 3 seeds x 2 tasks."""

import html
import re
from pathlib import Path

import numpy as np
import torch
import pandas as pd
import pytest
import yaml

from flowzoo.benchmark.render import report
from flowzoo.benchmark.analysis import stats, targets
from flowzoo.errors import ConfigError

TRAIN_STEPS = 20
EVAL_EVERY = 5
LOG_RATIO_STEPS = 4


def baseline_curve(step, seed):
    return 0.1 + 0.04 * step + 0.01 * seed


def fast_curve(step, seed):
    return min(1.0, 0.1 + 0.09 * step + 0.01 * seed)


def flat_curve(step, seed):
    return 0.2 + 0.01 * seed


def write_run(run_dir, *, task, algorithm, seed, curve, nfe_per_step, wall_per_step, last_step=TRAIN_STEPS,
              sample_steps=()):
    run_dir.mkdir(parents=True)
    config = {"task": task, "seed": seed, "algorithm": {"name": algorithm}, "train": {"steps": TRAIN_STEPS}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    steps = np.arange(last_step + 1)
    metrics = pd.DataFrame({
        "step": steps,
        "nfe": steps * nfe_per_step,
        "wall_s": steps * wall_per_step * (1 + 0.05 * seed),
        "reward_mean": [curve(s, seed) for s in steps],
        "reward_std": 0.1,
        "eval_reward": [curve(s, seed) if s % EVAL_EVERY == 0 else np.nan for s in steps],
        "clip_frac": 0.1,
        "approx_kl": 0.01,
        "kl": 0.02,
    })
    if algorithm.startswith("op_grpo"):
        metrics["clip_frac_on"] = 0.1
        metrics["clip_frac_off"] = 0.12 + 0.01 * seed
        for k in range(LOG_RATIO_STEPS):
            metrics[f"abs_log_ratio_t{k}"] = 0.01 * (k + 1)
    metrics.to_csv(run_dir / "metrics.csv", index=False)
    for step in sample_steps:
        import matplotlib.pyplot as plt

        (run_dir / "samples").mkdir(exist_ok=True)
        plt.imsave(run_dir / "samples" / f"step_{step}.png", np.full((4, 4), step, dtype=float), vmin=0, vmax=20)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    """toy_a: op_grpo is faster (seed 2 unfinished at step 15); toy_b: op_grpo never reaches the target."""
    root = tmp_path_factory.mktemp("runs")
    for task, op_curve in (("toy_a", fast_curve), ("toy_b", flat_curve)):
        for seed in range(3):
            samples = (0, 10, 20) if seed == 0 else ()
            write_run(root / "suite" / f"{task}_flow_grpo_s{seed}", task=task, algorithm="flow_grpo", seed=seed,
                      curve=baseline_curve, nfe_per_step=100, wall_per_step=1.0, sample_steps=samples)
            unfinished = task == "toy_a" and seed == 2
            write_run(root / "suite" / f"{task}_op_grpo_s{seed}", task=task, algorithm="op_grpo", seed=seed,
                      curve=op_curve, nfe_per_step=80, wall_per_step=1.2, last_step=15 if unfinished else TRAIN_STEPS,
                      sample_steps=samples if task == "toy_a" else (0, 20))
    return root


@pytest.fixture(scope="module")
def written(runs_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    index = report.write_report(runs_dir, out, baseline="flow_grpo")
    return out, index, index.read_text(), (out / "index.html").read_text()


def section(markdown, title):
    """The text of the section whose heading is ``title`` up to the next heading of the same level."""
    match = re.search(rf"^(#+) {re.escape(title)}\n(.*?)(?=^\1 |\Z)", markdown, flags=re.M | re.S)
    assert match, f"no section {title!r}"
    return match[2]


def test_all_files_exist(written):
    out, index, _, _ = written
    assert index == out / "index.md"
    expected = ["index.md", "index.html", "fingerprint.json", "tables/toy_a_final.tex", "tables/toy_b_final.tex",
                "tables/toy_a_ablation.tex"]
    for task in ("toy_a", "toy_b"):
        for x in ("step", "nfe", "wall_s"):
            expected += [f"figures/{task}_reward_vs_{x}.{ext}" for ext in ("png", "svg")]
        expected += [f"figures/{task}_diagnostics.{ext}" for ext in ("png", "svg")]
        expected += [f"figures/{task}_abs_log_ratio.{ext}" for ext in ("png", "svg")]
    expected += [f"samples/toy_a/{alg}_seed0_step_{s}.png" for alg in ("flow_grpo", "op_grpo") for s in (0, 10, 20)]
    missing = [p for p in expected if not (out / p).is_file() or (out / p).stat().st_size == 0]
    assert not missing
    assert not list(out.rglob("*.tmp"))  # atomic writes leave no temporaries


def test_every_referenced_file_exists(written):
    out, _, markdown, page = written
    targets = re.findall(r"\]\(([^)]+)\)", markdown)
    assert len(targets) > 20
    files = [t for t in targets if not t.startswith("#")]
    assert all((out / t).is_file() for t in files)
    ids = set(re.findall(r' id="([^"]+)"', page))
    anchors = [t[1:] for t in targets if t.startswith("#")]
    assert len(anchors) >= 9 and all(a in ids for a in anchors)  # the contents line and the headline's links


COSTS_TITLE = "Cost to the target: every algorithm"


def test_headline_exact_numbers_for_faster_algorithm(written):
    """Default target: 90% of flow_grpo's gain. Base (step 0) = 0.1 + 0.01 * mean seed = 0.11; flow_grpo's final
    reward (mean of its evals at 10, 15, 20) = 0.7 + 0.01 * mean seed = 0.71; target 0.11 + 0.9 * 0.6 = 0.65.
    flow_grpo's smoothed curve first reaches 0.65 at step 20 in every seed (0.5 + 0.01 s at 15); op_grpo's at 15
    ((0.55 + 1 + 1) / 3). Steps 15/20, NFE 15*80 / (20*100), wall 15*1.2*mean(1, 1.05, 1.1) / (20*mean(...)) = 0.9."""
    _, _, markdown, _ = written
    toy_a = section(section(markdown, "Headline: cost to reach the target, relative to the baseline"), "`toy_a`")
    assert ("Target: eval reward >= 0.650 (base model (`flow_grpo` at step 0) 0.110, `flow_grpo`'s final reward "
            "0.710).") in toy_a
    assert ("**`flow_grpo` reaches the target in all 3 seeds; steps or NFE ratios whose 95% CI excludes 100%: "
            "`op_grpo` (steps, NFE below 100%).**") in toy_a
    # the compact table: steps and NFE only, after the forest plot; then the curves
    assert "| `op_grpo` | 3/3 | 75.0% [75.0%, 75.0%] | 60.0% [60.0%, 60.0%] | exact |" in toy_a
    assert toy_a.index("figures/toy_a_forest.png") < toy_a.index("| algorithm |") < toy_a.index(
        "figures/toy_a_reward_vs_step.png")
    details = section(section(markdown, COSTS_TITLE), "`toy_a`")
    assert ("`op_grpo` reaches 90% of `flow_grpo`'s gain in 75.0% [75.0%, 75.0%] of its steps / "
            "60.0% [60.0%, 60.0%] of its NFE (3/3 seeds)") in details
    # wall-clock is in the full table (load-dependent) but no verdict rests on it
    assert "| 75.0% [75.0%, 75.0%] | 60.0% [60.0%, 60.0%] | 90.0% [" in details and "(load-dependent)" in details


def _headline(runs, target=None) -> str:
    """The headline (verdicts, compact tables) and the per-algorithm sentences with the full cost table (no
    figures: fast)."""
    analysis = stats.analyze(runs, target=target)
    return "\n".join(report.headline_section(analysis) + report.cost_details_section(analysis))


def test_relative_target_keeps_the_final_reward_phrase(runs_dir):
    headline = _headline(runs_dir, targets.Target("relative", 1.0))
    top, details = headline.split(f"## {COSTS_TITLE}")
    toy_a = section(top, "`toy_a`") + section(details, "`toy_a`")
    # target 0.71: op_grpo's smoothed curve reaches it at 15 (0.85), flow_grpo's at 20 in seeds 1, 2 only
    # (0.70 + 0.01 s)
    assert "`op_grpo` reaches `flow_grpo`'s final reward in 75.0% [75.0%, 75.0%] of its steps" in toy_a
    assert "`flow_grpo` reaches the target in only 2 of 3 seeds" in toy_a


def test_algorithm_that_never_reaches_is_reported_honestly(written):
    _, _, markdown, _ = written
    toy_b = section(section(markdown, COSTS_TITLE), "`toy_b`")
    assert "`op_grpo` does not reach 90% of `flow_grpo`'s gain (target 0.650) in any of its 3 seeds" in toy_b
    assert "`op_grpo` reaches" not in toy_b
    # censored at step 20 like flow_grpo's step 20: the ratio is exactly 1, a lower bound
    assert "| `op_grpo` | 0/3 | 3/3 | 100.0% [100.0%, 100.0%] |" in toy_b and "lower bound" in toy_b


def test_aggregate_across_tasks_exact(written):
    """Normalized finals (final - 0.11) / 0.6: flow_grpo 0.99, 1, 1.01 per task -> IQM 1.0. op_grpo on toy_a: seeds
    0, 1 end at 1.0 (smoothed 1, 1, 1), seed 2 (unfinished at 15) at (0.57 + 1 + 1) / 3; on toy_b 0.2 + 0.01 s."""
    _, _, markdown, _ = written
    agg = section(markdown, "Across tasks: IQM, probability of improvement, performance profiles")
    assert re.search(r"\| `flow_grpo` \| `toy_a`, `toy_b` \| 6 \| 1\.000 \[0\.98\d, 1\.01\d\] \| \(baseline\) \|", agg)
    # op_grpo pooled: 1.4833, 1.4833, 1.2444 (toy_a) and 0.15, 0.1667, 0.1833 (toy_b); IQM drops one at each end:
    # mean(0.1667, 0.1833, 1.2444, 1.4833) = 0.7694. P(op > flow): toy_a 1 (every op seed above every flow seed),
    # toy_b 0, in every resample too -> 0.50 [0.50, 0.50]
    assert re.search(r"\| `op_grpo` \| `toy_a`, `toy_b` \| 6 \| 0\.769 \[[\d.]+, [\d.]+\] \| "
                     r"0\.50 \[0\.50, 0\.50\] \|", agg)
    assert "figures/performance_profiles.png" in agg


def test_tables_in_markdown(written):
    _, _, markdown, _ = written
    final = section(markdown, "Final reward")
    assert "| algorithm | seeds | mean | mean 95% CI | IQM | IQM 95% CI |" in final
    assert re.search(r"\| `flow_grpo` \| 3 \| 0\.\d{3} \| \[0\.\d{3}, 0\.\d{3}\] \|", final)
    assert "seeds vs baseline" not in final
    ablation = section(markdown, "OP-GRPO ablations")
    assert "| variant |" in ablation and "`op_grpo`" in ablation and "`flow_grpo`" not in ablation
    assert "0.130" in ablation  # off-policy clip fraction: mean over seeds of 0.12 + 0.01 * seed


def test_unfinished_run_is_marked(written):
    _, _, markdown, _ = written
    assert "toy_a_op_grpo_s2" in section(markdown, "Runs")
    assert "15/20 steps" in markdown
    final_toy_a = section(section(markdown, "Final reward"), "`toy_a`")
    assert "| `op_grpo` † | 3 (1 unfinished) |" in final_toy_a
    final_toy_b = section(section(markdown, "Final reward"), "`toy_b`")
    assert "†" not in final_toy_b


def test_header_records_facts(written):
    _, _, markdown, _ = written
    header = markdown.split("## ")[0]
    assert "- Runs: 12 (2 tasks, 2 algorithms); unfinished: 1" in header
    assert "`flow_grpo`'s final eval reward" in header
    assert re.search(r"\| `toy_a` \| `op_grpo` \| 3 \| 0, 1, 2 \| 2/3 \| 20 \|", markdown)


def _markdown_rows(markdown):
    rows = [line for line in markdown.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return [[re.sub(r"!\[([^\]]*)\]\([^)]*\)", "", cell).replace("`", "").replace("*", "").strip()
             for cell in line.strip().strip("|").split("|")] for line in rows]


def _html_rows(page):
    rows = re.findall(r"<tr>(.*?)</tr>", page, re.S)
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in re.findall(r"<t[hd]>(.*?)</t[hd]>", row, re.S)]
            for row in rows]


def test_html_has_the_same_table_rows(written):
    _, _, markdown, page = written
    md_rows = _markdown_rows(markdown)
    assert len(md_rows) > 15
    assert _html_rows(page) == md_rows
    assert page.count("<table>") == sum(1 for line in markdown.splitlines() if line.startswith("|---"))
    assert "<script" not in page and "http" not in page.replace('lang="en"', "")
    assert page.count("<img ") == markdown.count("![")


def test_latex_table_is_booktabs(written):
    out, _, _, _ = written
    tex = (out / "tables" / "toy_a_final.tex").read_text()
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert r"flow\_grpo" in tex and r"op\_grpo $^\dagger$" in tex
    assert tex.count(r" \\") == 1 + 2  # header + two algorithms


def test_report_is_byte_reproducible(tmp_path):
    runs = tmp_path / "runs"
    for seed in range(2):  # wall-clock differs per seed, so the wall-clock curves are interpolated
        write_run(runs / f"b{seed}", task="t", algorithm="flow_grpo", seed=seed, curve=baseline_curve,
                  nfe_per_step=10, wall_per_step=1.0)
        write_run(runs / f"o{seed}", task="t", algorithm="op_grpo", seed=seed, curve=fast_curve, nfe_per_step=10,
                  wall_per_step=1.0)
    first, second = report.write_report(runs, tmp_path / "a").parent, report.write_report(runs, tmp_path / "b").parent
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert len(files) > 10 and any(p.suffix == ".svg" for p in files)
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    for name in files:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_bad_baseline_and_empty_runs_dir(runs_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"'nope'.*\['flow_grpo', 'op_grpo'\]"):
        report.write_report(runs_dir, tmp_path / "out", baseline="nope")
    with pytest.raises(ConfigError, match="no runs found"):
        report.write_report(tmp_path, tmp_path / "out")


def test_single_seed_report_says_n_lt_2(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs / "b", task="solo", algorithm="flow_grpo", seed=0, curve=baseline_curve, nfe_per_step=10,
              wall_per_step=1.0)
    write_run(runs / "x", task="solo", algorithm="dance_grpo", seed=0, curve=fast_curve, nfe_per_step=10,
              wall_per_step=1.0)
    markdown = report.write_report(runs, tmp_path / "out").read_text()
    assert "| `flow_grpo` | 1 | 0.700 | n<2 | 0.700 | n<2 |" in markdown
    assert "No runs of ablations (algorithms that declare `ablation_of`) or of the methods they ablate." in markdown
    assert "No run logged" in markdown
    # base 0.1, final 0.7, target 0.1 + 0.9 * 0.6 = 0.64: smoothed flow_grpo reaches it at step 20, dance_grpo at 15
    assert "`dance_grpo` reaches 90% of `flow_grpo`'s gain in 75.0% n<2 of its steps" in markdown


def _efficiency_row(**changes):
    row = {"algorithm": "op_grpo", "n": 3, "reached": 3, "baseline_n": 3, "baseline_reached": 3, "bound": "exact",
           "target": 0.5}
    for cost in ("step", "nfe", "wall_s"):
        row.update({f"{cost}_ratio": 0.5, f"{cost}_lo": 0.4, f"{cost}_hi": 0.6})
    return pd.Series({**row, **changes})


def test_headline_sentence_partial_and_censored_baseline():
    partial = report.headline_sentence(_efficiency_row(reached=2, bound="lower bound"), "flow_grpo", "X")
    assert partial.startswith("`op_grpo` reaches X in only 2 of 3 seeds;")
    assert "at least 50.0% [40.0%, 60.0%] of its steps" in partial
    upper = report.headline_sentence(_efficiency_row(baseline_reached=1, bound="upper bound"), "flow_grpo", "X")
    assert "`flow_grpo` itself reaches the target in 1 of 3 seeds" in upper and "an upper bound" in upper
    none = report.headline_sentence(_efficiency_row(baseline_n=0, step_ratio=float("nan")), "flow_grpo", "X")
    assert "no comparison" in none


# ------------------------------------------------------------------------------------------------------- bad input


def _small_runs(root, **changes):
    for seed in range(2):
        write_run(root / f"b{seed}", task="t", algorithm="flow_grpo", seed=seed, curve=baseline_curve,
                  nfe_per_step=10, wall_per_step=1.0)
        write_run(root / f"o{seed}", task="t", algorithm="op_grpo", seed=seed, curve=fast_curve, nfe_per_step=10,
                  wall_per_step=1.0)
    return root


def test_mixed_budgets_in_one_cell_are_an_error_naming_the_runs(tmp_path):
    runs = _small_runs(tmp_path / "runs")
    short = runs / "short"
    write_run(short, task="t", algorithm="op_grpo", seed=5, curve=fast_curve, nfe_per_step=10, wall_per_step=1.0,
              last_step=4)
    config = yaml.safe_load((short / "config.yaml").read_text())
    config["train"]["steps"] = 4
    (short / "config.yaml").write_text(yaml.safe_dump(config))
    budgets = r"'op_grpo' mixes run budgets \(train.steps 4: short; train.steps 20: o0, o1\)"
    with pytest.raises(ConfigError, match=budgets):
        report.write_report(runs, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN%", "infx", "0.9y", "0gain", "-10%"])
def test_invalid_command_line_target_is_one_line_before_any_output(tmp_path, capsys, text):
    from flowzoo.benchmark.cli import main

    runs = _small_runs(tmp_path / "runs")
    code = main(["report", str(runs), "--out", str(tmp_path / "out"), f"--target={text}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"target {text.strip()!r} is not valid" in err and "0.9gain" in err
    assert not (tmp_path / "out").exists()


def test_non_finite_targets_are_refused_in_python_too():
    with pytest.raises(ConfigError, match="not a finite number"):
        targets.Target("absolute", float("nan"))
    with pytest.raises(ConfigError, match="task 't'"):
        targets.as_target({"t": float("inf")})


def test_corrupt_runs_are_skipped_and_listed(tmp_path, caplog):
    runs = _small_runs(tmp_path / "runs")
    bad = {"empty": ("metrics.csv", b""), "binary": ("metrics.csv", bytes(range(256)) * 4),
           "badyaml": ("config.yaml", b"task: [unclosed\n"),
           "textsteps": ("metrics.csv", b"step,nfe,wall_s,eval_reward\nx,1,1,0.5\n"),
           "infinite": ("metrics.csv", b"step,nfe,wall_s,eval_reward\n0,0,0,0.1\n1,8,1,inf\n")}
    for name, (file, content) in bad.items():
        write_run(runs / name, task="t", algorithm="op_grpo", seed=9, curve=fast_curve, nfe_per_step=10,
                  wall_per_step=1.0)
        (runs / name / file).write_bytes(content)
    with caplog.at_level("WARNING", logger="flowzoo.report"):
        markdown = report.write_report(runs, tmp_path / "out").read_text()
    for name, (file, _) in bad.items():
        assert any(str(runs / name / file) in r.getMessage() for r in caplog.records), name
    skipped = section(markdown, "Skipped runs")
    assert [line.split("`")[1] for line in skipped.splitlines() if line.startswith("- ")] == sorted(bad)
    assert "EmptyDataError" in skipped and "holds values that are not numbers" in skipped
    assert "skipped (unreadable): 5" in markdown and "infinite values in ['eval_reward']" in skipped
    # the good runs are all there and unchanged: 2 seeds each, the same headline as without the bad runs
    assert "- Runs: 4 (1 tasks, 2 algorithms)" in markdown
    details = section(markdown, COSTS_TITLE)
    assert details.strip() in _headline(_small_runs(tmp_path / "clean"))


def test_only_unreadable_runs_is_one_error(tmp_path):
    write_run(tmp_path / "r", task="t", algorithm="flow_grpo", seed=0, curve=baseline_curve, nfe_per_step=1,
              wall_per_step=1.0)
    (tmp_path / "r" / "metrics.csv").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"no readable runs .* all 1 were skipped \(first: .*metrics.csv"):
        report.write_report(tmp_path, tmp_path / "out")


def test_no_target_when_the_baseline_does_not_improve(tmp_path):
    runs = tmp_path / "runs"
    for seed in range(2):
        write_run(runs / f"b{seed}", task="flat", algorithm="flow_grpo", seed=seed, curve=flat_curve,
                  nfe_per_step=10, wall_per_step=1.0)
        write_run(runs / f"o{seed}", task="flat", algorithm="op_grpo", seed=seed, curve=fast_curve,
                  nfe_per_step=10, wall_per_step=1.0)
    analysis = stats.analyze(runs)
    headline = "\n".join(report.headline_section(analysis) + report.cost_details_section(analysis))
    assert "No target on this task" in headline and "did not improve on the base model" in headline
    aggregate = "\n".join(report.aggregate_section(analysis, tmp_path / "out"))
    assert "Left out (the baseline does not improve on the base model there" in aggregate
    assert "No task where the aggregates are defined." in aggregate


def test_figures_group_families_and_panels():
    from flowzoo.benchmark.render import figures

    quick = ["flow_grpo", "flow_grpo_fast", "dance_grpo", "mix_grpo", "mix_grpo_flash", "mix_grpo_flash_star",
             "op_grpo", "op_grpo_no_correction", "op_grpo_naive_is", "op_grpo_no_truncation", "op_grpo_no_decay"]
    panels = figures.panels(quick, "flow_grpo")
    assert panels == [
        ("methods", ["flow_grpo", "dance_grpo", "mix_grpo", "op_grpo"]),
        ("variants", ["flow_grpo", "flow_grpo_fast", "mix_grpo_flash", "mix_grpo_flash_star"]),
        ("OP-GRPO ablations", ["flow_grpo", "op_grpo", "op_grpo_naive_is", "op_grpo_no_correction",
                               "op_grpo_no_decay", "op_grpo_no_truncation"]),
    ]
    assert all(len(members) <= figures.MAX_LINES for _, members in panels)
    style = figures.styles(quick)
    assert len({style[a] for a in quick}) == len(quick)  # every algorithm its own colour and line style
    assert figures.family("mix_grpo_flash_star") == "mix_grpo" and figures.family("other_algo") is None
    many = figures.panels(["flow_grpo"] + [f"x{i}" for i in range(7)], "flow_grpo")
    assert [len(m) for _, m in many] == [6, 3] and all(m[0] == "flow_grpo" for _, m in many)


def test_task_verdict_reads_censoring_correctly():
    faster = _efficiency_row(algorithm="a")  # 50% [40%, 60%], exact
    # censored seeds of b: a lower bound, so its NFE / wall-clock CIs below 100% say nothing; its steps' CI above does
    slower_censored = _efficiency_row(algorithm="b", reached=1, bound="lower bound", step_ratio=1.5, step_lo=1.2,
                                      step_hi=1.8)
    unknown = _efficiency_row(algorithm="c", bound="unknown direction")  # below 100%, but censoring hides the side
    text = report.task_verdict(pd.DataFrame([faster, slower_censored, unknown]), "flow_grpo")
    assert text == ("`flow_grpo` reaches the target in all 3 seeds; steps or NFE ratios whose 95% CI excludes 100%: "
                    "`a` (steps, NFE below 100%); `b` (steps above 100%).")
    none = report.task_verdict(pd.DataFrame([_efficiency_row(step_lo=0.9, step_hi=1.1, nfe_lo=0.9, nfe_hi=1.1,
                                                             wall_s_lo=0.9, wall_s_hi=1.1, baseline_reached=2)]),
                               "flow_grpo")
    assert none.startswith("`flow_grpo` reaches the target in only 2 of 3 seeds")
    assert "no steps or NFE ratio's 95% CI excludes 100%" in none


# ---------------------------------------------------------------------------------------- the answer-first layout


def test_forest_plot_leads_each_task_and_definitions_and_runs_come_last(written):
    out, _, markdown, page = written
    assert (out / "figures" / "toy_a_forest.png").is_file() and (out / "figures" / "toy_b_forest.svg").is_file()
    order = [markdown.index(f"## {title}") for title in (
        "Headline: cost to reach the target, relative to the baseline", "Final reward", COSTS_TITLE,
        "Methods and definitions", "Runs")]
    assert order == sorted(order)
    # the answer table before the first section, then each task's forest plot before its table
    assert markdown.index("| algorithm | `toy_a`: steps |") < markdown.index("\n## ") < markdown.index("![")
    assert page.index("<table>") < page.index("<h2") < page.index("<img ")


def test_the_answer_table_holds_each_tasks_headline_ratios(written):
    _, _, markdown, _ = written
    answer = markdown[markdown.index("**The answer**"):markdown.index("\n## ")]
    rows = {line.split(" | ")[0].strip("| `"): line.strip("|").split(" | ")[1:]
            for line in answer.splitlines() if line.startswith("| `")}
    for i, task in enumerate(("toy_a", "toy_b")):
        headline = section(markdown, f"`{task}`")
        ratios = headline[headline.index("| algorithm | seeds reaching |"):]
        for line in ratios[:ratios.index("\n\n")].splitlines():
            if line.startswith("| `"):
                cells = line.strip("|").split(" | ")
                algorithm = cells[0].strip(" `")
                mine = [c.strip(" *").removeprefix("≥ ").removeprefix("≤ ").removeprefix("~ ")
                        for c in rows[algorithm][2 * i:2 * i + 2]]
                assert mine == [cells[2].strip(), cells[3].strip()], (task, algorithm)


def test_columns_that_cannot_tell_algorithms_apart_are_named():
    headers = ["variant", "seeds", "final", "clip"]
    rows = [["`a`", "5", "0.9", "0.000"], ["`b` †", "5", "0.8", "0.000"]]
    assert report.indistinct_note(headers, rows, [2, 3], what="variants") == [
        "Cannot tell these variants apart: *clip* is 0.000 for every row.", ""]
    assert report.indistinct_note(headers, rows, [2]) == []
    assert report.indistinct_note(headers, rows[:1], [3]) == []


def test_ablation_table_says_when_a_column_is_the_same_for_every_variant(written):
    _, _, markdown, _ = written
    # op_grpo alone in the ablation table of toy_a: one row, nothing to tell apart; the synthetic headline's
    # seeds-reaching column is 3/3 for op_grpo only
    assert "Cannot tell these" not in section(markdown, "OP-GRPO ablations")


def _toy_run(run_dir, algorithm, seed, points, prompts, reward="toy_target"):
    write_run(run_dir, task="toy", algorithm=algorithm, seed=seed, curve=baseline_curve, nfe_per_step=10,
              wall_per_step=1.0, sample_steps=(0, 20))
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config.update(reward=reward, reward_args={}, prompts={"source": "toy2d"})
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    for step in (0, 20):
        sidecar = {"kind": "points", "prompts": prompts, "points": points}
        (run_dir / "samples" / f"step_{step}.json").write_text(__import__("json").dumps(sidecar))


def test_toy_samples_are_redrawn_with_rewards_regions_and_points_outside_the_axes(tmp_path):
    from flowzoo.models.toy2d import class_metadata

    hit = class_metadata(0)["hard_target"]
    points, prompts = [hit, [0.0, 0.0], [10.0, 0.0], ["nan", "0"]], ["class 0", "class 0", "class 1", "class 1"]
    runs = tmp_path / "runs"
    for algorithm in ("flow_grpo", "op_grpo"):
        _toy_run(runs / algorithm, algorithm, 0, points, prompts)
    scorer = report.PointScorer(runs / "flow_grpo")
    assert scorer.score(np.array(points[:3], dtype=float), prompts[:3]).tolist() == [1.0, 0.0, 0.0]
    assert set(scorer.regions(prompts)) == {"class 0", "class 1"}
    out = tmp_path / "out"
    markdown = report.write_report(runs, out).read_text()
    samples = section(markdown, "Samples at matched steps")
    assert "figures/toy_samples_step_0.png" in samples and "figures/toy_samples_step_20.png" in samples
    assert "rewarded region" in samples and not (out / "samples").exists()
    assert (out / "figures" / "toy_samples_step_20.png").stat().st_size > 10_000


def test_image_grids_are_shown_an_algorithm_a_row_with_their_prompts(written):
    _, _, markdown, _ = written
    samples = section(section(markdown, "Samples at matched steps"), "`toy_a`")
    assert "| algorithm | step 0 | step 10 | step 20 |" in samples
    assert "saved without their prompts" in samples  # the synthetic grids have no sidecar


def test_rescored_samples_equal_the_runs_logged_evaluation(tmp_path):
    """The sidecar's points and prompts, scored by PointScorer, give the eval_reward the run logged."""
    from flowzoo.benchmark.cli import main

    run = tmp_path / "run"
    config = Path(__file__).resolve().parents[1] / "benchmark" / "configs" / "toy_flow_grpo.yaml"
    assert main(["train", str(config), "train.steps=2", "train.eval_every=2", "train.prompts_per_step=2",
                 "algorithm.group_size=2", "train.eval_samples_per_prompt=3", "model.args.hidden=32",
                 "model.args.pretrain_steps=50", "train.threads=1", f"run_dir={run}", "--quiet"]) == 0
    metrics = pd.read_csv(run / "metrics.csv").set_index("step")
    scorer = report.PointScorer(run)
    for step in (0, 2):
        sidecar = report.grid_sidecar(run / "samples" / f"step_{step}.png")
        rewards = scorer.score(np.array(sidecar["points"], dtype=float), sidecar["prompts"])
        assert len(rewards) == 4 * 3
        assert rewards.mean() == pytest.approx(metrics.loc[step, "eval_reward"], rel=1e-5, abs=1e-6)
        recorded = np.array(sidecar["rewards"], dtype=float)  # the evaluation's own per-sample rewards
        assert recorded == pytest.approx(rewards, abs=1e-5)


def test_image_grids_list_each_sample_s_reward_or_say_none_was_recorded(tmp_path):
    from flowzoo.benchmark.run.sample_pictures import save_samples

    images = torch.rand(3, 3, 8, 8)
    old, new = tmp_path / "old.png", tmp_path / "new.png"
    save_samples(images, "image", old, ["a cat", "a dog", "two cats"])
    save_samples(images, "image", new, ["a cat", "a dog", "two cats"], rewards=[0.5, 1.0, 0.25])
    assert report.grid_sidecar(new)["rewards"] == [0.5, 1.0, 0.25]
    lines = "\n".join(report._grid_rewards({"flow_grpo": (0, {10: new}, tmp_path)}, ["flow_grpo"], [10]))
    assert "| `flow_grpo` (seed 0) | 10 | 1: 0.500, 2: 1.000, 3: 0.250 |" in lines
    lines = "\n".join(report._grid_rewards({"flow_grpo": (0, {10: old}, tmp_path)}, ["flow_grpo"], [10]))
    assert "recorded no per-sample reward" in lines


def test_ablation_columns_are_the_ablated_methods_declared_diagnostics():
    columns = report.ablation_columns(["op_grpo", "op_grpo_no_correction", "op_grpo_naive_is"])
    assert set(columns) == {"clip_frac_on", "clip_frac_off"}  # OP-GRPO's declaration; per-step columns left out
    assert "11.8%" in columns["clip_frac_off"]
    assert set(report.ablation_columns(["flow_grpo"])) == {"clip_frac_pos_adv", "clip_frac_neg_adv"}  # logs_clip_sides
