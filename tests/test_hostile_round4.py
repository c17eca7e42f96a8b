"""Round 4 of hostile inputs (the models' part): a guidance that is no CFG scale, and an adapter pointed at another
model's pipeline folder, each one line before anything loads or is written."""

from __future__ import annotations

import pytest

from flowzoo.benchmark.cli import main
from flowzoo.errors import ConfigError

pytest.importorskip("diffusers")


@pytest.mark.parametrize("value,expected", [("-3", "algorithm.guidance must be a finite number >= 0"),
                                            ("-0.5", "algorithm.guidance must be a finite number >= 0"),
                                            ("nan", "algorithm.guidance: bad value 'nan'")])
def test_a_negative_or_non_finite_guidance_is_refused_in_one_line(tmp_path, capsys, value, expected):
    run = tmp_path / "run"
    code = main(["train", "benchmark/configs/toy_flow_grpo.yaml", f"algorithm.guidance={value}", f"run_dir={run}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert expected in err and not run.exists()


def test_an_adapter_pointed_at_another_models_pipeline_names_the_right_adapter(tmp_path):
    from flowzoo.models.qwen_image import QwenImageModel
    from tests import tiny_pipelines as tiny

    (tmp_path / "tok").mkdir()
    flux = tiny.build_tiny_flux(tmp_path / "flux", tmp_path / "tok")
    with pytest.raises(ConfigError) as err:
        QwenImageModel(path=flux)
    message = str(err.value)
    assert "\n" not in message
    assert message == (f"model 'qwen_image': {str(flux)!r} holds a FluxPipeline (model_index.json _class_name), not "
                       f"the QwenImagePipeline this adapter loads; the adapter for it: flux")


@pytest.mark.parametrize("workers,trials,cpus,expected", [
    (9, 10, 2, "--workers 9: at most 8 local worker processes on this machine's 2 CPU(s) (4 per CPU); use "
               "--executor slurm for more"),
    (200, 1, 64, "--workers 200: the tuning has"),
])
def test_tune_workers_beyond_the_trials_or_the_cpus_are_refused_before_anything_is_written(
        tmp_path, capsys, monkeypatch, workers, trials, cpus, expected):
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    runs = tmp_path / "runs"
    code = main(["tune", "op-grpo-study", "--workers", str(workers), "--trials", str(trials), "--runs", str(runs)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert expected in err and not runs.exists()


@pytest.mark.parametrize("where", ["runs", "storage"])
def test_tune_never_writes_into_the_shipped_weights(tmp_path, capsys, where):
    from flowzoo.models.shipped import weights_dir

    before = sorted(p.name for p in weights_dir().iterdir())
    target = weights_dir() / "x"
    args = ["--runs", str(target)] if where == "runs" else ["--runs", str(tmp_path / "runs"),
                                                            "--storage", f"sqlite:///{weights_dir() / 'x.db'}"]
    code = main(["tune", "op-grpo-study", "--trials", "1", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "is inside the shipped weights directory" in err and f"--{where}" in err
    assert sorted(p.name for p in weights_dir().iterdir()) == before


def _tuned_copy(tmp_path, edit=None):
    """The committed toy-study tuning's chosen files, copied, with ``edit(data)`` applied to the dense task's
    flow_grpo file."""
    import shutil

    import yaml

    tuned = tmp_path / "tuned"
    shutil.copytree("reports/example-op-grpo-study-tuning/tuned", tuned)
    if edit:
        path = tuned / "toy2d_sep64_dense" / "flow_grpo.yaml"
        data = yaml.safe_load(path.read_text())
        edit(data)
        path.write_text(yaml.safe_dump(data))
    return tuned


@pytest.mark.parametrize("edit,seeds,expected", [
    (lambda d: d["algorithm_keys"].update(name="op_grpo"), None,
     "algorithm_keys.name 'op_grpo': a tuned file holds the tuned knobs of the algorithm it was found for"),
    (lambda d: d.update(suite="tiny-counting-study"), None,
     "chosen for suite 'tiny-counting-study', but found for suite 'op-grpo-study'"),
    (lambda d: d.update(task="toy2d_sep64_sparse"), None,
     "chosen for task 'toy2d_sep64_sparse', but found for task 'toy2d_sep64_dense'"),
    (None, [1000], "seed 1000: "),
])
def test_bench_tuned_refuses_a_file_of_another_cell_or_a_tuning_seed(tmp_path, edit, seeds, expected):
    from flowzoo.benchmark.run.suite import expand, load_suite

    suite = load_suite("op-grpo-study")
    suite.tuned = str(_tuned_copy(tmp_path, edit))
    suite.tasks = {"toy2d_sep64_dense": suite.tasks["toy2d_sep64_dense"]}
    suite.seed_sets, suite.seeds = {}, seeds or [0]
    with pytest.raises(ConfigError) as err:
        expand(suite, tmp_path / "runs")
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_bench_tuned_takes_the_committed_tuning_as_written(tmp_path):
    from flowzoo.benchmark.run.suite import expand, load_suite

    suite = load_suite("op-grpo-study")
    suite.tuned = str(_tuned_copy(tmp_path))
    suite.tasks = {"toy2d_sep64_dense": suite.tasks["toy2d_sep64_dense"]}
    suite.seed_sets, suite.seeds = {}, [0]
    configs = expand(suite, tmp_path / "runs")
    assert {"flow_grpo", "op_grpo", "awm", "diffusion_nft"} <= {c.algorithm_name for c in configs}


def test_study_save_metrics_never_replaces_another_runs_files(tmp_path, capsys):
    """--save-metrics B where B holds other runs at the same relative paths cut their metrics.csv to the study's
    columns and replaced their config.yaml; an earlier copy of the same runs is still refreshed."""
    from flowzoo.benchmark.study.verdicts import main as study_main
    from tests.test_hostile_round3 import _write_run

    runs, other = tmp_path / "runs", tmp_path / "other"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
        _write_run(runs, "op_grpo", seed, [0.0, 0.2, 0.3, 0.4, 0.5 + 0.01 * seed])
        _write_run(other, "op_grpo", seed, [0.0, 0.3, 0.3, 0.3, 0.3])
    theirs = (other / "t" / "op_grpo" / "s0" / "config.yaml").read_text().replace("seed: 0", "seed: 0\nnote: mine")
    (other / "t" / "op_grpo" / "s0" / "config.yaml").write_text(theirs)
    before = {p: p.read_bytes() for p in other.rglob("*") if p.is_file()}
    args = [str(runs), "--out", str(tmp_path / "study"), "--resamples", "200"]
    assert study_main([*args, "--save-metrics", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds another run" in err and "give another directory" in err
    assert {p: p.read_bytes() for p in other.rglob("*") if p.is_file()} == before  # nothing of theirs touched
    assert study_main([*args, "--save-metrics", str(tmp_path / "saved")]) == 0
    assert study_main([*args, "--save-metrics", str(tmp_path / "saved")]) == 0  # its own earlier copies: refreshed


def test_recipe_compare_refuses_to_write_over_its_own_input(tmp_path, capsys):
    import shutil

    from flowzoo.benchmark.study.recipe_compare import main as compare_main

    shared, tuned = tmp_path / "shared", tmp_path / "tuned"
    for folder in (shared, tuned):
        folder.mkdir()
        shutil.copy("reports/example-op-grpo-study/claims.csv", folder / "claims.csv")
    before = (shared / "claims.csv").read_bytes()
    assert compare_main([str(shared), str(tuned), "--out", str(shared / "claims.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is the command's input" in err
    assert (shared / "claims.csv").read_bytes() == before
    assert compare_main([str(shared), str(tuned), "--out", str(tmp_path / "compare.md")]) == 0


@pytest.mark.parametrize("url,shown", [
    ("postgresql://u:Pw/x@host/db", "postgresql://u:***@host/db"),
    ("postgresql://u:p@ss@host:5432/db", "postgresql://u:***@host:5432/db"),
    ("postgresql://u@host/db?password=X&sslmode=require", "postgresql://u@host/db?password=***&sslmode=require"),
    ("postgresql://host/db?user=u&PASSWORD=y", "postgresql://host/db?user=u&PASSWORD=***"),
    ("mysql+pymysql://root:secret@h/db?charset=utf8", "mysql+pymysql://root:***@h/db?charset=utf8"),
    ("host=h dbname=d password=abc user=u", "host=h dbname=d password=*** user=u"),
    ("sqlite:////shared/tune.db", "sqlite:////shared/tune.db"),
])
def test_every_form_of_a_storage_password_is_masked(url, shown):
    from flowzoo.benchmark.tuning.tune import shown_url

    assert shown_url(url) == shown


def test_tune_jobs_receive_a_storage_password_through_a_private_file(tmp_path, monkeypatch, capsys):
    """Under --executor slurm|submitit-local the URL went in plain into the job's pickle, jobs.json and every log."""
    import os
    import pickle
    import stat

    from flowzoo.benchmark.tuning import jobs
    from flowzoo.benchmark.tuning import tune as tuning

    url = "postgresql://ana:s3/cret@db.example/tune"
    reference = tuning.storage_for_jobs(url, tmp_path / "jobs")
    assert "s3/cret" not in reference and reference.startswith(tuning.SECRET_FILE)
    secret = tmp_path / "jobs" / "storage.url"
    assert secret.read_text() == url and stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert tuning.storage_for_jobs("sqlite:////shared/t.db", tmp_path / "jobs") == "sqlite:////shared/t.db"

    seen = []
    monkeypatch.setattr(jobs, "_worker", lambda *args: seen.append(args))  # where TuneJob finds it
    monkeypatch.chdir(tmp_path)  # the job changes into its cwd; restored after the test
    job = tuning.TuneJob(("suite", None, None, 2, reference, "trials"), 3, 1, "key", cwd=str(tmp_path))
    assert b"s3/cret" not in pickle.dumps(job)  # what submitit stores
    assert job() == ("key", None)
    assert seen == [("suite", None, None, 2, url, "trials", 3, 1)]  # the worker opens the real URL
    printed = capsys.readouterr().out
    assert "s3/cret" not in printed and "postgresql://ana:***@db.example/tune" in printed


@pytest.mark.parametrize("values,expected", [
    (["a=0-1", "a=100-101"], "--seed-sets 'a=100-101': set 'a' is given twice; give each set once"),
    (["a=0-1,exploration"], "is not a seed or a range a-b"),
    (["huge=0-1000000000000"], "--seed-sets 'huge=0-1000000000000': more than 10,000 seeds in one set"),
])
def test_study_seed_sets_refuse_a_set_given_twice_or_a_huge_range(values, expected):
    from flowzoo.benchmark.study.seed_sets import parse_seed_sets

    with pytest.raises(ConfigError) as err:
        parse_seed_sets(values)
    assert expected in str(err.value)
    assert parse_seed_sets(["a=0-1", "b=100,102"]) == {"a": [0, 1], "b": [100, 102]}


@pytest.mark.parametrize("extra,expected", [
    ({"steps": 0}, "tuning.steps must be a positive integer, got 0"),
    ({"sampler": {"seed": -1}}, "tuning.sampler.seed must be >= 0, got -1"),
])
def test_tuning_designs_refuse_steps_0_and_a_negative_sampler_seed(extra, expected):
    from flowzoo.benchmark.config.tuning_design import read_design

    section = {"objective": "auc", "trials": 4, "seeds": [1000], "validation": {"eval_seed": 7}, **extra}
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        read_design("s", section, [0, 1])
    assert read_design("s", {**section, "steps": 10**12, "sampler": {}}, [0, 1]).steps == 10**12


def test_the_evaluation_count_of_a_huge_run_is_computed_not_enumerated():
    """tuning.steps 10^12 built a set of every step before training (the machine ran out of memory)."""
    from flowzoo.benchmark.tuning.tune import evaluations_per_run

    assert evaluations_per_run(10**12, 50) == 1 + 2 * 10**10 and evaluations_per_run(7, 0) == 2
    assert [evaluations_per_run(s, 3) for s in (3, 4, 6, 7)] == [2, 3, 3, 4]  # step 0, multiples of 3, the last


def test_tune_report_refuses_a_trial_count_below_1(tmp_path, capsys):
    code = main(["tune", "op-grpo-study", "--report", "--trials", "-1", "--out", str(tmp_path / "out"),
                 "--runs", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--trials -1: give a positive number" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


def test_report_check_fails_a_folder_without_a_readable_page_in_one_line(tmp_path, capsys):
    """An empty folder or a binary index.md was a traceback; --screenshots naming a file is the usage error."""
    from flowzoo.benchmark.render.report_check import main as check_main

    empty, binary = tmp_path / "empty", tmp_path / "binary"
    empty.mkdir()
    binary.mkdir()
    (binary / "index.md").write_bytes(bytes(range(128, 256)) * 3)
    assert check_main([str(empty), str(binary)]) == 1
    out = capsys.readouterr().out
    assert f"{empty}: FAIL: {empty} holds no index.html, README.md or index.md" in out
    assert f"{binary}: FAIL: its page is not UTF-8 text" in out and "report-check: 0 passed, 2 failed" in out
    assert sorted(p.name for p in binary.iterdir()) == ["index.md"]  # no temporary page left behind
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exit_:
        check_main([str(empty), "--screenshots", str(tmp_path / "file")])
    assert exit_.value.code == 2 and "is a file, not a folder to write the screenshots into" in capsys.readouterr().err


def test_a_fingerprint_with_nothing_to_compare_is_not_called_fresh(tmp_path):
    """freshness with `cells: {}` or a cell with `rows: []` reported "fresh" having compared nothing."""
    import json

    from flowzoo.benchmark.render import freshness

    path = tmp_path / freshness.FINGERPRINT_FILE
    path.write_text(json.dumps({"steps": 3, "columns": [], "cells": {}}))
    with pytest.raises(ConfigError, match="no cells to compare"):
        freshness.read_fingerprint(tmp_path)
    path.write_text(json.dumps({"steps": 3, "columns": [], "cells": {"t/a": {"seed": 0, "config": {}, "rows": []}}}))
    with pytest.raises(ConfigError, match="cell 't/a': no rows to compare"):
        freshness.read_fingerprint(tmp_path)


# ---- round 4, left from earlier sessions: sbatch names, --vs's name, negative tuning seeds

@pytest.mark.parametrize("value", ["gpu\nmalicious", "a b", "tab\there"])
def test_a_slurm_name_with_a_newline_or_space_is_refused(tmp_path, value):
    from flowzoo.benchmark.run.executors import load_cluster

    with pytest.raises(ConfigError, match=r"--slurm-partition .*: a SLURM name is one word"):
        load_cluster(None, value)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"account: {value!r}\n".replace("'", '"'))
    with pytest.raises(ConfigError, match=r"cluster file cluster.yaml: account .*one word"):
        load_cluster(cluster)


def test_negative_tuning_seeds_are_named_as_such():
    from flowzoo.benchmark.config.tuning_design import read_design

    section = {"objective": "auc", "trials": 2, "seeds": [-1], "validation": {"eval_seed": 7}}
    with pytest.raises(ConfigError, match=r"tuning.seeds: -1 is no seed; seeds are integers in \[0, 2\*\*63\)"):
        read_design("s", section, [0])
    with pytest.raises(ConfigError, match=r"confirmation.seeds: -5 is no seed"):
        read_design("s", {**section, "seeds": [1000], "confirmation": {"seeds": [-5, 2000]}}, [0])


def test_report_refuses_a_foreign_or_empty_sqlite_file_and_writes_nothing_into_it(tmp_path):
    import hashlib
    import sqlite3

    from flowzoo.benchmark.tuning.tune import check_sqlite_storage

    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(ConfigError, match="is an empty file, not a tuning storage"):
        check_sqlite_storage(empty)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as connection:
        connection.execute("CREATE TABLE people (name TEXT)")
    before = hashlib.sha256(foreign.read_bytes()).hexdigest()
    with pytest.raises(ConfigError, match="without Optuna's tables .*another program's"):
        check_sqlite_storage(foreign)
    assert hashlib.sha256(foreign.read_bytes()).hexdigest() == before
    text = tmp_path / "notes.db"
    text.write_text("not a database at all, just some words that fill more than a header page" * 20)
    with pytest.raises(ConfigError, match="is not a SQLite database"):
        check_sqlite_storage(text)


@pytest.mark.parametrize("rows, message", [
    ("0,t/flow_grpo,t,flow_grpo,1.0\n0,t/op_grpo,t,op_grpo,1.2\n0,t/op_grpo,t,op_grpo,1.2\n",
     "cell t/op_grpo has repeat 0 2 times; each repeat measures each cell once"),
    ("0,u/flow_grpo,u,flow_grpo,1.0\n0,u/op_grpo,u,op_grpo,1.2\n",
     "none of its cells (u/flow_grpo, u/op_grpo) pairs with a cell of these runs"),
])
def test_a_timing_file_with_a_repeated_row_or_other_cells_is_one_line(tmp_path, capsys, rows, message):
    """A copied timing row counted as a second repeat; a timing file of other cells gave an empty wall-clock table,
    exit 0. Both are one line now, nothing written."""
    from flowzoo.benchmark.study.verdicts import main as study_main
    from tests.test_hostile_round3 import _one_error_line, _write_run

    runs = tmp_path / "runs"
    for seed in range(2):
        _write_run(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.01 * seed])
        _write_run(runs, "op_grpo", seed, [0.0, 0.2, 0.3, 0.4, 0.5 + 0.01 * seed])
    timing = tmp_path / "timing.csv"
    timing.write_text("repeat,cell,task,algorithm,s_per_step\n" + rows)
    assert study_main([str(runs), "--out", str(tmp_path / "study"), "--resamples", "200", "--timing", str(timing)]) == 2
    assert message in _one_error_line(capsys) and not (tmp_path / "study").exists()
