"""benchmark.report end to end on a synthetic runs directory: 2 algorithms x 3 seeds x 2 tasks."""

import html
import re

import numpy as np
import pandas as pd
import pytest
import yaml

from benchmark import report
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
    expected = ["index.md", "index.html", "tables/toy_a_final.tex", "tables/toy_b_final.tex",
                "tables/toy_a_ablation.tex"]
    for task in ("toy_a", "toy_b"):
        for x in ("step", "nfe", "wall_s"):
            expected += [f"figures/{task}_reward_vs_{x}.{ext}" for ext in ("png", "svg")]
        expected += [f"figures/{task}_clip_fraction.{ext}" for ext in ("png", "svg")]
        expected += [f"figures/{task}_abs_log_ratio.{ext}" for ext in ("png", "svg")]
    expected += [f"samples/toy_a/{alg}_seed0_step_{s}.png" for alg in ("flow_grpo", "op_grpo") for s in (0, 10, 20)]
    missing = [p for p in expected if not (out / p).is_file() or (out / p).stat().st_size == 0]
    assert not missing
    assert not list(out.rglob("*.tmp"))  # atomic writes leave no temporaries


def test_every_referenced_file_exists(written):
    out, _, markdown, _ = written
    targets = re.findall(r"\]\(([^)]+)\)", markdown)
    assert len(targets) > 20
    assert all((out / t).is_file() for t in targets)


def test_headline_sentence_for_faster_algorithm(written):
    _, _, markdown, _ = written
    toy_a = section(section(markdown, "Headline: cost to reach the target, relative to the baseline"), "`toy_a`")
    pattern = (r"`op_grpo` reaches `flow_grpo`'s final reward in (\d+\.\d)% \[[\d.]+%, [\d.]+%\] of its steps / "
               r"[\d.]+% \[[\d.]+%, [\d.]+%\] of its NFE / "
               r"[\d.]+% \[[\d.]+%, [\d.]+%\] of its wall-clock \(3/3 seeds\)\.")
    match = re.search(pattern, toy_a)
    assert match, toy_a
    # baseline (final ~0.9 smoothed) is reached by op_grpo at step 10 in every seed, by flow_grpo at ~15-20
    assert 40 < float(match[1]) < 80


def test_algorithm_that_never_reaches_is_reported_honestly(written):
    _, _, markdown, _ = written
    toy_b = section(section(markdown, "Headline: cost to reach the target, relative to the baseline"), "`toy_b`")
    assert "`op_grpo` does not reach `flow_grpo`'s final reward" in toy_b
    assert "in any of its 3 seeds" in toy_b
    assert "`op_grpo` reaches" not in toy_b
    assert "lower bound" in toy_b or "unknown direction" in toy_b


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
    header = markdown.split("## Runs")[0]
    assert "- Runs: 12 (2 tasks, 2 algorithms); unfinished: 1" in header
    assert "`flow_grpo`'s final eval reward" in header
    assert re.search(r"\| `toy_a` \| `op_grpo` \| 3 \| 0, 1, 2 \| 2/3 \| 20 \|", markdown)


def _markdown_rows(markdown):
    rows = [line for line in markdown.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return [[re.sub(r"!\[([^\]]*)\]\([^)]*\)", "", cell).replace("`", "").replace("*", "").strip()
             for cell in line.strip().strip("|").split("|")] for line in rows]


def _html_rows(page):
    rows = re.findall(r"<tr>(.*?)</tr>", page)
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in re.findall(r"<t[hd]>(.*?)</t[hd]>", row)]
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


def test_markdown_to_html_converts_the_subset():
    page = report.markdown_to_html("# T\n\npara `a_b` **bold** <x>\n\n- item [l](x.svg)\n\n| a | b |\n|---|---|\n"
                                   "| ![i](p.png) | 1 |\n")
    assert "<h1>T</h1>" in page
    assert "<p>para <code>a_b</code> <strong>bold</strong> &lt;x&gt;</p>" in page
    assert '<li>item <a href="x.svg">l</a></li>' in page
    assert '<td><img src="p.png" alt="i"></td><td>1</td>' in page


def test_single_seed_report_says_n_lt_2(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs / "b", task="solo", algorithm="flow_grpo", seed=0, curve=baseline_curve, nfe_per_step=10,
              wall_per_step=1.0)
    write_run(runs / "x", task="solo", algorithm="dance_grpo", seed=0, curve=fast_curve, nfe_per_step=10,
              wall_per_step=1.0)
    markdown = report.write_report(runs, tmp_path / "out").read_text()
    assert "| `flow_grpo` | 1 | 0.700 | n<2 | 0.700 | n<2 |" in markdown
    assert "No runs of algorithms named `op_grpo*`." in markdown
    assert "No run logged" in markdown
    # smoothed over 3 evaluations: flow_grpo reaches its final 0.7 at step 20, dance_grpo at step 15
    assert "`dance_grpo` reaches `flow_grpo`'s final reward in 75.0% n<2 of its steps" in markdown


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
