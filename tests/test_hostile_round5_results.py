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
