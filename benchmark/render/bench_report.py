"""The report of a bench grid's selected runs (``flowzoo bench --out DIR``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from flowzoo.benchmark.render import report
from flowzoo.benchmark.analysis.runs import find_run_dirs
from flowzoo.benchmark.run.suite import Suite, grid_run_dirs
from flowzoo.errors import ConfigError


def write_suite_report(suite: Suite, runs_dir: Path, out: Path) -> Path:
    """The report of the runs of this (selected) grid, into ``out``; returns its ``index.md``.

    Runs under ``RUNS/<suite>/`` that the grid does not hold (other algorithms, tasks or seeds of an earlier, wider
    bench) are left out: the report then reads a temporary view of the selected run directories (links to their
    files, the same relative paths), so its run names and bytes are those of ``flowzoo report`` on exactly those
    runs. When every run there is selected, the suite's directory is reported as it is.

    The baseline is ``flow_grpo`` when the grid runs it, else the grid's first algorithm (a paper suite of the models
    Flow-GRPO was not released on, e.g. ``paper-flux-hpsv2``), said in one line."""
    baseline = report.DEFAULT_BASELINE if report.DEFAULT_BASELINE in suite.algorithms else suite.algorithms[0]
    if baseline != report.DEFAULT_BASELINE:
        print(f"suite {suite.name} runs no {report.DEFAULT_BASELINE}: the report compares against {baseline}")
    root = Path(runs_dir) / suite.name
    selected = {d.resolve(): d for d in grid_run_dirs(suite, runs_dir)}
    on_disk = find_run_dirs(root) if root.is_dir() else []
    others = [d for d in on_disk if d.resolve() not in selected]
    if not others:
        return report.write_report(root, out, baseline=baseline)
    present = [d for d in on_disk if d.resolve() in selected]
    print(f"report of the {len(present)} selected run(s); {len(others)} other run(s) under {root} left out")
    with tempfile.TemporaryDirectory(prefix="flowzoo-selected-runs-") as tmp:
        view = Path(tmp)
        for run in present:
            linked = view / run.relative_to(root)
            linked.mkdir(parents=True)
            for entry in run.iterdir():
                if entry.name != ".lock":
                    (linked / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
        try:
            return report.write_report(view, out, baseline=baseline)
        except ConfigError as error:  # name the runs as the user knows them, not the temporary view
            raise ConfigError(str(error).replace(str(view), f"the selected runs of {root}")) from None
