"""Round 5 of hostile inputs (the wrong-result cases): a command refuses in one line rather than write a result that
mixes designs, exports or splits, and what an export counts is what is on disk after the write."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowzoo.benchmark.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ------------------------------------------------------------------------------------------- tune --report (item 6)

def test_tune_report_of_a_storage_tuned_under_other_seeds_is_refused(tmp_path, capsys):
    """Item 6: --report of a storage tuned under other tuning seeds wrote tuned files naming the new seeds (the
    design guard `tune` applies was bypassed)."""
    from flowzoo.benchmark.tuning import tune as tuning
    from tests.test_tuning import write_suite

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    path, runs = write_suite(tmp_path / "a"), tmp_path / "runs"
    tuning.tune(str(path), runs, trials=1, tasks="toy2d_mode", algorithms="flow_grpo")
    storage = f"sqlite:///{(runs / 'mini' / 'tuning' / 'optuna.db').resolve()}"
    reseeded = write_suite(tmp_path / "b", **{"tuning.seeds": [2000]})
    report = tmp_path / "report"
    code = main(["tune", str(reseeded), "--report", "--trials", "1", "--storage", storage, "--out", str(report),
                 "--tasks", "toy2d_mode", "--algorithms", "flow_grpo"])
    assert code == 2
    assert "another design" in _one_line(capsys)
    assert not report.exists()
    # the design it was tuned under still reports
    assert main(["tune", str(path), "--report", "--trials", "1", "--storage", storage, "--out", str(report),
                 "--tasks", "toy2d_mode", "--algorithms", "flow_grpo"]) == 0
    assert "1000" in (report / "tuned" / "toy2d_mode" / "flow_grpo.yaml").read_text()


# ------------------------------------------------------------------------------------- export-results (items 7, 9)

STUDY = ROOT / "reports" / "example-op-grpo-study"
SUITE_RUNS = STUDY / "run-metrics" / "op-grpo-study"
CELL = Path("toy2d_sep64_sparse") / "op_grpo"


def _copy_runs(runs: Path, seeds) -> Path:
    import shutil

    for seed in seeds:
        shutil.copytree(SUITE_RUNS / CELL / f"s{seed}", runs / "op-grpo-study" / CELL / f"s{seed}")
    return runs


def test_a_second_export_into_one_folder_holds_only_its_runs(tmp_path):
    """Item 7: exporting twice into one --out kept the first export's shards: the dataset loaded rows of runs the
    second export did not include, while its card counted only the new ones."""
    import datasets

    from flowzoo.benchmark.analysis.results_dataset import export_results

    out = tmp_path / "dataset"
    export_results(_copy_runs(tmp_path / "first", [0, 1, 2]), out, rows_per_shard=500)  # 3 x 401 rows: 3 shards
    assert len(list((out / "data").glob("*.parquet"))) == 3
    export_results(_copy_runs(tmp_path / "second", [100]), out)
    table = datasets.load_dataset("parquet", data_dir=str(out), split="train").to_pandas()
    assert sorted(table["run"].unique()) == ["op-grpo-study/toy2d_sep64_sparse/op_grpo/s100"]
    assert sorted(p.name for p in (out / "data").iterdir()) == ["train-00000-of-00001.parquet"]
    card = (out / "README.md").read_text()
    assert f"1 runs, {len(table)} rows" in card and "1 Parquet shard(s)" in card


def test_export_refuses_a_folder_holding_parquet_files_of_its_own(tmp_path, capsys):
    """Item 7's other half: a Parquet file in --out that no export wrote would load with the dataset's rows."""
    out = tmp_path / "dataset"
    (out / "data").mkdir(parents=True)
    (out / "data" / "mine.parquet").write_bytes(b"PAR1")
    code = main(["export-results", str(_copy_runs(tmp_path / "runs", [0])), "--out", str(out)])
    assert code == 2
    assert "mine.parquet" in _one_line(capsys)
    assert sorted(p.name for p in out.rglob("*")) == ["data", "mine.parquet"]


def test_export_of_a_suites_folder_names_its_suite_and_seed_sets(tmp_path):
    """Item 9: `export-results runs/op-grpo-study` (a suite's folder) left suite and seed_set empty and labelled a
    replication seed as outside the suite's seed sets."""
    import pyarrow.parquet as pq

    from flowzoo.benchmark.analysis.results_dataset import OUTSIDE, export_results

    runs = _copy_runs(tmp_path / "runs", [0, 100])
    out = export_results(runs / "op-grpo-study", tmp_path / "dataset")
    table = pq.read_table(out / "data").to_pandas().drop_duplicates("run").set_index("seed")
    assert set(table["suite"]) == {"op-grpo-study"}
    assert table.loc[0, "seed_set"] == "exploration" and table.loc[100, "seed_set"] == "replication"
    assert table.loc[100, "run"] == "toy2d_sep64_sparse/op_grpo/s100"
    card = (out / "README.md").read_text()
    assert OUTSIDE not in card and "replication: [100]" in card and "`op-grpo-study`" in card
    # the same runs exported from the runs directory above carry the same keys
    above = export_results(runs, tmp_path / "above")
    keys = pq.read_table(above / "data").to_pandas().drop_duplicates("run").set_index("seed")
    assert keys[["suite", "seed_set"]].equals(table[["suite", "seed_set"]])


# ------------------------------------------------------------------------------------- prompt datasets (item 8)

def _hub_folder(folder: Path, splits: dict[str, list[str]]) -> Path:
    import pandas as pd

    folder.mkdir()
    for split, prompts in splits.items():
        pd.DataFrame({"prompt": prompts}).to_parquet(folder / f"{split}-00000-of-00001.parquet")
    return folder


def test_a_hub_layout_folder_gives_each_split_its_own_files(tmp_path):
    """Item 8: a folder in the Hugging Face Hub layout given as both prompts.train and prompts.test read both files
    for both splits (the test prompts were trained on)."""
    from flowzoo.benchmark.prompts.local_datasets import DatasetSpec, read_dataset_prompts

    folder = _hub_folder(tmp_path / "hub", {"train": ["a cat", "a dog"], "test": ["a red cube"]})
    assert [p for p, _ in read_dataset_prompts(str(folder), "train", DatasetSpec())] == ["a cat", "a dog"]
    assert [p for p, _ in read_dataset_prompts(str(folder), "test", DatasetSpec())] == ["a red cube"]
    # the split names of prompts.dataset pick the files, as they pick a DatasetDict's split
    spec = DatasetSpec(test_split="train")
    assert [p for p, _ in read_dataset_prompts(str(folder), "test", spec)] == ["a cat", "a dog"]


def test_a_folder_naming_other_splits_or_mixing_names_is_refused(tmp_path):
    from flowzoo.benchmark.prompts.local_datasets import DatasetSpec, read_dataset_prompts
    from flowzoo.errors import ConfigError

    folder = _hub_folder(tmp_path / "hub", {"train": ["a cat"], "validation": ["a red cube"]})
    with pytest.raises(ConfigError, match=r"'test'.*train, validation") as error:
        read_dataset_prompts(str(folder), "test", DatasetSpec())
    assert len(str(error.value).splitlines()) == 1
    mixed = _hub_folder(tmp_path / "mixed", {"train": ["a cat"], "extra": ["a red cube"]})
    with pytest.raises(ConfigError, match="extra-00000-of-00001.parquet"):
        read_dataset_prompts(str(mixed), "train", DatasetSpec())
    # a folder whose files name no split is still one dataset, read whole for either split
    plain = _hub_folder(tmp_path / "plain", {"part": ["a cat"], "more": ["a dog"]})
    assert sorted(p for p, _ in read_dataset_prompts(str(plain), "test", DatasetSpec())) == ["a cat", "a dog"]
