"""Command-line gotchas met by following the README: bench --out reports only the selected runs, a run directory of
another config says how to get out, a finished train says it trained nothing, the README's examples do not overwrite
each other's outputs and export's directory is git-ignored."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from flowzoo.benchmark.cli import main

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
FAST = ["train.steps=2", "train.prompts_per_step=4", "train.eval_every=2", "train.eval_samples_per_prompt=4",
        "train.save_samples=false", "algorithm.group_size=4", "model.args.pretrain_steps=30", "model.args.hidden=32"]
SMOKE = ["model.args.pretrain_steps=30", "model.args.hidden=32", "train.eval_samples_per_prompt=2"]


def _one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flowzoo: error: "), lines
    return lines[0]


def test_bench_out_reports_only_the_selected_runs(tmp_path, capsys):
    runs = tmp_path / "runs"
    bench = ["bench", "smoke", "--runs", str(runs), "--workers", "1", *SMOKE]
    assert main([*bench, "--seeds", "0,1"]) == 0
    assert main([*bench, "--seeds", "0", "--out", str(tmp_path / "cut")]) == 0
    out = capsys.readouterr().out
    assert "report of the 1 selected run(s); 1 other run(s) under" in out
    index = (tmp_path / "cut" / "index.md").read_text()
    assert "- Runs: 1 (1 tasks, 1 algorithms)" in index
    assert "| `toy2d_mode` | `flow_grpo` | 1 | 0 | 1/1 | 4 |" in index
    # the same bytes as `flowzoo report` on a directory holding that run alone
    alone = tmp_path / "alone"
    shutil.copytree(runs / "smoke" / "toy2d_mode" / "flow_grpo" / "s0", alone / "toy2d_mode" / "flow_grpo" / "s0")
    assert main(["report", str(alone), "--out", str(tmp_path / "direct")]) == 0
    assert (tmp_path / "direct" / "index.md").read_text() == index
    # the whole grid selected: the suite's directory, both seeds
    assert main([*bench, "--out", str(tmp_path / "all")]) == 0
    assert "| `toy2d_mode` | `flow_grpo` | 2 | 0, 1 | 2/2 | 4 |" in (tmp_path / "all" / "index.md").read_text()
    assert not list((runs / "smoke").rglob("*.tmp"))


def test_bench_refuses_a_run_dir_override(tmp_path, capsys):
    assert main(["bench", "smoke", "--runs", str(tmp_path / "runs"), f"run_dir={tmp_path / 'one'}"]) == 2
    line = _one_error_line(capsys)
    assert "bench places each run at RUNS/<suite>/<task>/<algorithm>/s<seed>" in line and "--runs" in line
    assert list(tmp_path.iterdir()) == []


def test_a_run_directory_of_another_config_names_the_keys_and_run_dir_as_the_way_out(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", str(CONFIG), *FAST, f"run_dir={run}", "--quiet"]) == 0
    before = (run / "metrics.csv").read_bytes()
    capsys.readouterr()
    assert main(["train", str(CONFIG), *FAST, f"run_dir={run}", "seed=3", "train.steps=3", "--quiet"]) == 2
    line = _one_error_line(capsys)
    assert f"run directory {run} holds a run of a different config (differs in seed, train.steps)" in line
    assert "run_dir=DIR" in line and f"delete {run}" in line
    assert (run / "metrics.csv").read_bytes() == before
    # the way out works
    assert main(["train", str(CONFIG), *FAST, f"run_dir={tmp_path / 'other'}", "seed=3", "--quiet"]) == 0


def test_bench_into_runs_of_another_config_names_the_keys_and_runs_as_the_way_out(tmp_path, capsys):
    bench = ["bench", "smoke", "--runs", str(tmp_path), "--seeds", "0", *SMOKE]
    assert main([*bench, "train.steps=1"]) == 0
    capsys.readouterr()
    assert main([*bench, "train.steps=2"]) == 2
    line = _one_error_line(capsys)
    assert "hold runs of a different config" in line and "differs in train.steps" in line
    assert "give another --runs DIR" in line


def test_rerunning_a_finished_train_says_it_trained_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", str(CONFIG), *FAST, f"run_dir={run}", "--quiet"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"run written to {run}"
    stamp = (run / "metrics.csv").stat().st_mtime_ns
    assert main(["train", str(CONFIG), *FAST, f"run_dir={run}", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "run written to" not in out
    assert out.strip() == (f"run already finished in {run} (its done.json); nothing trained. Give run_dir=DIR to "
                           f"train it again elsewhere")
    assert (run / "metrics.csv").stat().st_mtime_ns == stamp


def test_the_readme_report_example_does_not_overwrite_make_benchs_report():
    bench_out = re.search(r"flowzoo bench quick --runs runs --out (\S+)", (ROOT / "Makefile").read_text())[1]
    readme = (ROOT / "README.md").read_text()
    outs = re.findall(r"flowzoo report \S+ --out (\S+)", readme)
    assert outs, "the README shows a report command"
    assert all(out.rstrip("/") != bench_out.rstrip("/") for out in outs), outs


def test_the_readme_states_cpu_time_beside_every_wall_time_of_make():
    readme = (ROOT / "README.md").read_text()
    for line in readme.splitlines():
        if re.search(r"make test.*\bmin\b|~3 min", line):
            assert "CPU-min" in line, line
    assert "5.8 CPU-minutes" in readme  # make bench's measured time


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_readme_export_directory_is_git_ignored():
    assert ".venv/bin/flowzoo export runs/tiny_shapes/flow_grpo/s0 --out lora/" in (ROOT / "README.md").read_text()
    ignored = subprocess.run(["git", "check-ignore", "-q", "lora/pytorch_lora_weights.safetensors"], cwd=ROOT)
    assert ignored.returncode == 0, "lora/ is not git-ignored"


def test_bench_out_of_a_grid_without_flow_grpo_compares_against_its_first_algorithm(tmp_path, capsys):
    """A paper suite of a model Flow-GRPO was not released on (paper-flux-hpsv2: dance_grpo, mix_grpo, ...) reports
    against its first algorithm instead of failing on the default baseline."""
    suite = yaml.safe_load((ROOT / "benchmark" / "suites" / "smoke.yaml").read_text())
    suite.update(name="no-flow-grpo", seeds=[0], algorithms=["dance_grpo", "mix_grpo"])
    path = tmp_path / "no-flow-grpo.yaml"
    path.write_text(yaml.safe_dump(suite))
    out = tmp_path / "report"
    assert main(["bench", str(path), "--runs", str(tmp_path / "runs"), "--workers", "1", "--out", str(out), *SMOKE,
                 "train.steps=2"]) == 0
    assert "suite no-flow-grpo runs no flow_grpo: the report compares against dance_grpo" in capsys.readouterr().out
    assert "- Baseline: `dance_grpo`" in (out / "index.md").read_text()
