"""A study page names the machines its runs were made on (each run's done.json ``machine``): float results of the same
code differ between CPUs, so a page gathering runs from several sessions says which machine made each run, in
runs.csv and in one line; the trimmed copies `--save-metrics` keeps carry it, so a page rebuilt from them says the
same. A page of runs that name no machine reads as before (no column, no line)."""

from __future__ import annotations

import json

import pandas as pd

from flowzoo.benchmark.analysis.runs import machine_line, run_machine
from flowzoo.benchmark.cli import main
from tests.synthetic_runs import write_run

TASK = "toy2d_sep64_sparse"
STEPS = [0, 10, 20, 30]
FAST = ["--suite", "op-grpo-study", "--smooth", "1", "--resamples", "200", "--claims", "none"]
EPYC = {"cpu": "AMD EPYC", "accelerator": None, "python": "3.11.9", "torch": "2.13.0", "diffusers": None}


def _runs(root, machines):
    """flow_grpo and op_grpo on seeds 0-3; ``machines[seed]``: the done.json machine of both runs of that seed (None:
    a done.json without one, as runs made before machines were recorded)."""
    for seed, machine in enumerate(machines):
        for algorithm, slope in (("flow_grpo", 0.1), ("op_grpo", 0.15)):
            metrics = write_run(root, TASK, algorithm, seed, STEPS, [slope * i + 0.01 * seed for i in range(4)])
            summary = {"steps": 30, **({"machine": machine} if machine else {})}
            (metrics.parent / "done.json").write_text(json.dumps(summary))


def test_run_machine_reads_the_cpu_and_accelerator_and_none_when_absent(tmp_path):
    (tmp_path / "done.json").write_text(json.dumps({"machine": {**EPYC, "accelerator": "NVIDIA H200"}}))
    assert run_machine(tmp_path) == "AMD EPYC + NVIDIA H200"
    (tmp_path / "done.json").write_text(json.dumps({"steps": 3}))
    assert run_machine(tmp_path) is None
    (tmp_path / "done.json").write_text("{cut")
    assert run_machine(tmp_path) is None
    assert run_machine(tmp_path / "no-run") is None


def test_machine_line_counts_each_machine_and_the_runs_that_name_none():
    assert machine_line({"a": None, "b": None}) == ""
    one = machine_line({"a": "AMD EPYC", "b": "AMD EPYC"})
    assert one == "Machines (each run's done.json `machine`): `AMD EPYC` (2 runs)."
    mixed = machine_line({"a": "AMD EPYC", "b": "Intel Xeon", "c": "AMD EPYC", "d": None})
    assert "`AMD EPYC` (2 runs), `Intel Xeon` (1 run); 1 run names none" in mixed
    assert "differ between CPUs" in mixed and "differ between CPUs" not in one


def test_the_page_and_runs_csv_name_each_runs_machine_also_when_rebuilt_from_the_saved_copies(tmp_path):
    xeon = {**EPYC, "cpu": "Intel Xeon"}
    _runs(tmp_path / "runs", [EPYC, EPYC, xeon, None])
    out, saved = tmp_path / "page", tmp_path / "saved"
    assert main(["study", str(tmp_path / "runs"), "--out", str(out), "--save-metrics", str(saved), *FAST]) == 0
    table = pd.read_csv(out / "runs.csv")
    by_seed = table[table["algorithm"] == "op_grpo"].set_index("seed")["machine"]
    assert by_seed[0] == by_seed[1] == "AMD EPYC" and by_seed[2] == "Intel Xeon" and pd.isna(by_seed[3])
    line = "`AMD EPYC` (4 runs), `Intel Xeon` (2 runs); 2 runs name none"
    assert line in (out / "README.md").read_text()
    assert json.loads((saved / TASK / "op_grpo" / "s2" / "done.json").read_text())["machine"] == xeon
    again = tmp_path / "again"
    assert main(["study", str(saved), "--out", str(again), *FAST]) == 0
    assert line in (again / "README.md").read_text()
    assert pd.read_csv(again / "runs.csv")["machine"].equals(table["machine"])


def test_a_page_of_runs_that_name_no_machine_has_no_machine_column_or_line(tmp_path):
    _runs(tmp_path / "runs", [None] * 4)
    out = tmp_path / "page"
    assert main(["study", str(tmp_path / "runs"), "--out", str(out), *FAST]) == 0
    assert "machine" not in pd.read_csv(out / "runs.csv").columns
    assert "Machines (" not in (out / "README.md").read_text()
