"""Tiny edit triples written as edit-pair files (benchmark/prompts/tiny_edit_files.py) and the rare edit task's file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flowzoo.benchmark.prompts.files import read_prompts
from flowzoo.benchmark import cli
from flowzoo.benchmark.prompts.tiny_edit_files import write_edit_pairs
from flowzoo.errors import ConfigError
from flowzoo.models.tiny_data import TRAIN_PROMPT_SEED
from flowzoo.models.tiny_edit import source_pixels
from flowzoo.models.tiny_edit_data import edit_prompt_set
from flowzoo.source_images import SOURCE_IMAGE

ROOT = Path(__file__).resolve().parents[1]


def test_written_pairs_read_back_as_the_source_s_prompts_and_exact_pixels(tmp_path):
    """The files source reads the instruction, kind and a PNG whose pixels are the tiny_edit source's tensor exactly."""
    path = write_edit_pairs(tmp_path, "train", 12, [3, 0, 7], "few")
    expected = edit_prompt_set(12, TRAIN_PROMPT_SEED)
    rows = read_prompts(str(path), "train")
    assert [p for p, _ in rows] == [expected[i][0] for i in (3, 0, 7)]
    for (text, meta), i in zip(rows, (3, 0, 7)):
        assert meta["tag"] == expected[i][1]["tag"] and meta["index"] == i and meta["stream_seed"] == TRAIN_PROMPT_SEED
        from_file = source_pixels(text, meta, (3, 32, 32), "test")
        from_tensor = source_pixels(text, expected[i][1], (3, 32, 32), "test")
        assert torch.equal(from_file, from_tensor)
        assert Path(meta[SOURCE_IMAGE]).parent == tmp_path / "few"


def test_bad_arguments_are_one_line_errors_and_write_nothing(tmp_path, capsys):
    for kwargs, words in (({"split": "dev"}, "train, test, validation"), ({"count": 0}, "at least 1"),
                          ({"count": 4, "indices": [4]}, "[0, 3]"), ({"count": 4, "indices": [1, 1]}, "distinct"),
                          ({"name": "a/b"}, "plain file name")):
        with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
            write_edit_pairs(tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["edit-pairs", "--out", str(tmp_path / "o"), "--indices", "1,x"])
    assert exit_.value.code == 2 and "comma-separated integers, got '1,x'" in capsys.readouterr().err
    assert cli.main(["edit-pairs", "--out", str(tmp_path / "o"), "--count", "3", "--indices", "5"]) == 2
    assert "[0, 2]" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert cli.main(["edit-pairs", "--out", str(tmp_path / "o"), "--count", "2", "--name", "two"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "o" / "two.jsonl")
    assert len((tmp_path / "o" / "two.jsonl").read_text().splitlines()) == 2


def test_the_rare_edit_task_file_is_what_its_command_writes(tmp_path):
    """benchmark/prompts/tiny_edit_rare.jsonl and its PNGs are the triples 6, 40, 44, 64 of the first 96 training ones
    (docs/tiny.md, the rare edit task): rewriting them gives the same bytes."""
    write_edit_pairs(tmp_path, "train", 96, [6, 40, 44, 64], "tiny_edit_rare")
    shipped = ROOT / "benchmark" / "prompts"
    assert (tmp_path / "tiny_edit_rare.jsonl").read_text() == (shipped / "tiny_edit_rare.jsonl").read_text()
    for line in (shipped / "tiny_edit_rare.jsonl").read_text().splitlines():
        image = json.loads(line)["image"]
        assert (tmp_path / image).read_bytes() == (shipped / image).read_bytes()


def test_the_committed_scan_picks_the_shipped_rare_edits():
    """The rule fixed before the scan, applied to its committed per-candidate table (reports/example-edit-pilots/scan.csv):
    the 4 lowest means among the candidates with a sample above 0.5 (ties by index) are the shipped task's triples."""
    import csv

    with open(ROOT / "reports" / "example-edit-pilots" / "scan.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f)]
    assert len(rows) == 96 and {int(r["samples"]) for r in rows} == {16}
    eligible = sorted((float(r["mean"]), int(r["index"])) for r in rows if float(r["highest"]) > 0.5)
    picked = sorted(index for _, index in eligible[:4])
    shipped = [json.loads(line)["index"] for line in (ROOT / "benchmark" / "prompts" / "tiny_edit_rare.jsonl")
               .read_text().splitlines()]
    assert picked == shipped == [6, 40, 44, 64]


def test_the_edit_pilot_tables_are_what_their_kept_runs_give():
    """reports/example-edit-pilots: flowzoo pilot-table on the kept run copies gives the committed CSVs' rows."""
    import pandas as pd

    from flowzoo.benchmark.render.pilot_table import pilot_rows

    pilots = ROOT / "reports" / "example-edit-pilots"
    for group, reference, table in (("all-edits", "tiny_edit_flow_grpo.yaml", "all_edits_runs.csv"),
                                    ("rare", "tiny_edit_rare_flow_grpo.yaml", "rare_runs.csv")):
        rows = pilot_rows(str(pilots / "run-metrics" / group), str(ROOT / "benchmark" / "configs" / reference), 3)
        committed = pd.read_csv(pilots / table)
        assert len(rows) == len(committed) and list(rows["variant"]) == list(committed["variant"])
        assert rows["gain"].round(4).tolist() == committed["gain"].round(4).tolist()
