"""flowzoo export-results (benchmark/analysis/results_dataset.py): runs as a Parquet dataset that ``datasets`` loads;
a claim's estimate recomputed from it equals the study page's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from flowzoo.benchmark.analysis.results_dataset import export_results
from flowzoo.benchmark.cli import main

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "reports" / "example-op-grpo-study"
SPARSE = "op-grpo-study/toy2d_sep64_sparse"
CLAIM = "op_grpo_naive_is - op_grpo: off-policy clip (sparse)"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The exploration runs of two cells of the committed OP-GRPO study, exported and loaded back with datasets."""
    import datasets

    tmp = tmp_path_factory.mktemp("results")
    runs = tmp / "runs"
    for algorithm in ("op_grpo", "op_grpo_naive_is"):
        for seed in range(10):
            relative = Path(SPARSE) / algorithm / f"s{seed}"
            shutil.copytree(STUDY / "run-metrics" / relative, runs / relative)
    out = export_results(runs, tmp / "dataset", rows_per_shard=3000)
    table = datasets.load_dataset("parquet", data_dir=str(out), split="train").to_pandas()
    return out, table


def test_a_claim_recomputed_from_the_dataset_equals_the_page(exported):
    """The off-policy clip-rate claim: the mean over runs of each run's mean clip_frac_off, naive IS minus OP-GRPO, on
    the exploration seeds, as claim_estimates.csv states it."""
    _, table = exported
    per_run = table.groupby(["algorithm", "run"])["clip_frac_off"].mean().groupby("algorithm").mean()
    page = pd.read_csv(STUDY / "claim_estimates.csv")
    stated = page[(page["label"] == CLAIM) & (page["seed_set"] == "exploration")]["estimate"].iloc[0]
    assert per_run["op_grpo_naive_is"] - per_run["op_grpo"] == pytest.approx(stated, rel=1e-9)


def test_rows_keys_and_config_columns(exported):
    out, table = exported
    assert len(list((out / "data").glob("train-*-of-*.parquet"))) == 3  # 20 runs x 401 rows in 3000-row shards
    assert table["run"].nunique() == 20 and len(table) == 20 * 401
    assert set(table["seed_set"]) == {"exploration"} and set(table["suite"]) == {"op-grpo-study"}
    assert table["config.algorithm.lr"].dtype.kind == "f" and table["config.train.steps"].iloc[0] == 400
    assert set(table.loc[table["algorithm"] == "op_grpo", "config.algorithm.replay_prompts"]) == {"buffer"}
    assert table.loc[table["step"] == 0, "eval_reward"].notna().all()
    card = (out / "README.md").read_text()
    assert card.startswith("---\nconfigs:") and "op-grpo-study" in card and "exploration: [0, 1" in card
    assert "toy2d_sep64_sparse / op_grpo: 10" in card and "pandas " in card


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["export-results", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "no runs under" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert main(["export-results", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    assert "is not a directory of runs" in capsys.readouterr().err
