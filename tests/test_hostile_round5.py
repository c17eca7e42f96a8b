"""Round 5 of hostile inputs (the data-loss and secret cases): a command refuses in one line, before anything is
written, an output that would replace what another input or run holds, and every message naming a storage masks
its password."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flowzoo.benchmark.cli import main

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "reports" / "example-op-grpo-study"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ------------------------------------------------------------------------------------ tune --report (items 1, 2)

@pytest.fixture(scope="module")
def tuned_report(tmp_path_factory):
    """The mini suite of tests/test_tuning.py tuned for one cell (1 trial) and its report: (suite file, runs, report)."""
    from tests.test_tuning import tuned_mini_report

    path, runs, report = tuned_mini_report(tmp_path_factory.mktemp("tuned"), trials=1)
    assert (report / "tuned" / "toy2d_mode" / "flow_grpo.yaml").is_file()
    return path, runs, report


def test_tune_report_from_another_suites_storage_keeps_the_report(tuned_report, tmp_path, capsys):
    """Item 1: --storage of another suite's optuna.db deleted the report's tuned picks and emptied its trial tables."""
    import optuna

    from flowzoo.benchmark.tuning.tune import open_storage

    path, _, report = tuned_report
    other = tmp_path / "optuna.db"
    optuna.create_study(storage=open_storage(f"sqlite:///{other}"), study_name="other-suite/toy2d_mode/flow_grpo")
    before = _snapshot(report)
    capsys.readouterr()
    code = main(["tune", str(path), "--report", "--trials", "1", "--storage", f"sqlite:///{other}",
                 "--out", str(report), "--tasks", "toy2d_mode", "--algorithms", "flow_grpo"])
    err = _one_line(capsys)
    assert code == 2
    assert f"sqlite:///{other} holds no study of suite mini's cells (toy2d_mode/flow_grpo)" in err
    assert "other-suite/toy2d_mode/flow_grpo" in err  # what it does hold
    assert _snapshot(report) == before


def test_tune_report_from_trials_of_other_cells_keeps_the_report(tuned_report, tmp_path, capsys):
    """Item 2: --from-trials OTHER whose trials/ holds no table of the suite's cells emptied the report the same way."""
    path, _, report = tuned_report
    other = tmp_path / "other"
    (other / "trials" / "elsewhere").mkdir(parents=True)
    (other / "trials" / "elsewhere" / "flow_grpo.csv").write_text("trial,state,objective\n0,complete,0.5\n")
    before = _snapshot(report)
    capsys.readouterr()
    code = main(["tune", str(path), "--report", "--trials", "1", "--from-trials", str(other), "--out", str(report),
                 "--tasks", "toy2d_mode", "--algorithms", "flow_grpo"])
    err = _one_line(capsys)
    assert code == 2
    assert f"--from-trials {other}: {other / 'trials'} holds no table of suite mini's cells (toy2d_mode/flow_grpo)" in err
    assert _snapshot(report) == before
    # the report's own tables still rewrite it in place, unchanged
    assert main(["tune", str(path), "--report", "--trials", "1", "--from-trials", str(report), "--out", str(report),
                 "--tasks", "toy2d_mode", "--algorithms", "flow_grpo"]) == 0
    assert _snapshot(report) == before


# ---------------------------------------------------------------------------------- export-results (item 3)

def _page(tmp_path: Path) -> Path:
    """A study page: its README.md and two runs' metrics under run-metrics/."""
    page = tmp_path / "page"
    relative = Path("op-grpo-study/toy2d_sep64_sparse/op_grpo")
    for seed in ("s0", "s1"):
        shutil.copytree(STUDY / "run-metrics" / relative / seed, page / "run-metrics" / relative / seed)
    (page / "README.md").write_text("# The study page\n\nWritten by flowzoo study.\n")
    return page


@pytest.mark.parametrize("where", ["page", "run-metrics", "above"])
def test_export_results_never_writes_over_its_source(tmp_path, capsys, where):
    """Item 3: export-results PAGE --out PAGE replaced the page's README.md with the dataset card."""
    page = _page(tmp_path)
    out = {"page": page, "run-metrics": page / "run-metrics", "above": tmp_path}[where]
    before = _snapshot(tmp_path)
    code = main(["export-results", str(page), "--out", str(out)])
    err = _one_line(capsys)
    assert code == 2 and f"--out {out}" in err and "would" in err, err
    assert _snapshot(tmp_path) == before


def test_export_results_refuses_a_folder_whose_readme_is_no_dataset_card(tmp_path, capsys):
    page, other = _page(tmp_path), tmp_path / "other-page"
    other.mkdir()
    (other / "README.md").write_text("# Another study\n")
    code = main(["export-results", str(page), "--out", str(other)])
    err = _one_line(capsys)
    assert code == 2 and f"--out {other}: its README.md is no dataset card" in err
    assert (other / "README.md").read_text() == "# Another study\n" and not (other / "data").exists()
    # a dataset exported there before is replaced as ever
    assert main(["export-results", str(page), "--out", str(tmp_path / "dataset")]) == 0
    assert main(["export-results", str(page), "--out", str(tmp_path / "dataset")]) == 0


# ---------------------------------------------------------------------------------------- eval --out (item 4)

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    from tests.test_eval_cmd import CONFIG, FAST

    tmp = tmp_path_factory.mktemp("eval5")
    for name in ("a", "b"):
        assert main(["train", str(CONFIG), *FAST, f"run_dir={tmp / name}", "--quiet"]) == 0
    return tmp / "a", tmp / "b"


@pytest.mark.parametrize("target,out", [("a", "b/metrics.csv"), ("a", "a/done.json"), ("a", "b/new.json"),
                                        ("config", "config")])
def test_eval_out_never_replaces_a_runs_files_or_its_input(two_runs, tmp_path, capsys, target, out):
    """Item 4: eval RUN_A --out RUN_B/metrics.csv (or RUN_A/done.json) overwrote a run's files."""
    run_a, run_b = two_runs
    config = tmp_path / "config.yaml"
    shutil.copy(run_a / "config.yaml", config)
    paths = {"a": run_a, "config": config}
    out_path = config if out == "config" else run_a.parent / out
    before = {d: _snapshot(d) for d in (run_a, run_b)}
    text = config.read_text()
    code = main(["eval", str(paths[target]), "--out", str(out_path)])
    err = _one_line(capsys)
    assert code == 2 and f"--out {str(out_path)!r}" in err, err
    assert ("is the file it evaluates" if out == "config" else "is inside the run directory") in err
    assert {d: _snapshot(d) for d in (run_a, run_b)} == before and config.read_text() == text


# ---------------------------------------------------------------------------------------------- secrets (item 5)

@pytest.mark.parametrize("url,kind,expected", [
    ("sqlite:///?password=PW", "local", "--storage sqlite:///?password=***: an in-memory SQLite database"),
    ("sqlite+pysqlcipher://:PW@//tmp/tune.db?cipher=aes-256-cfb", "slurm",
     "--storage sqlite+pysqlcipher://:***@//tmp/tune.db?cipher=aes-256-cfb: /tmp/tune.db is under /tmp"),
])
def test_storage_errors_mask_the_password(url, kind, expected, monkeypatch):
    """Item 5: the in-memory and the node-local refusals printed the URL, password and all."""
    from flowzoo.benchmark.tuning.tune import check_storage
    from flowzoo.errors import ConfigError

    monkeypatch.delenv("TMPDIR", raising=False)
    with pytest.raises(ConfigError) as err:
        check_storage(url, kind)
    message = str(err.value)
    assert "PW" not in message and "\n" not in message and expected in message, message


def test_tune_with_an_in_memory_storage_password_prints_it_nowhere(tmp_path, capsys):
    code = main(["tune", "op-grpo-study", "--trials", "1", "--runs", str(tmp_path / "runs"),
                 "--storage", "sqlite:///?password=PW"])
    captured = capsys.readouterr()
    assert code == 2 and "PW" not in captured.err + captured.out and "password=***" in captured.err
