"""``flowzoo tune``: tune every algorithm of a suite with the same Optuna budget (tuning/tune.py), confirm the picks
(tuning/confirm.py) and write the tuning's report (tuning/report.py); ``--report`` writes the report alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from flowzoo.command_line import MAX_REPEATS, at_most
from flowzoo.errors import FlowZooError

DESCRIPTION = ("One study per (task, algorithm) of the suite's tuning: section (objective, trials, steps, tuning "
               "seeds,\nsampler, pruner; docs/tuning.md); a killed tune resumes where it stopped. --out writes the "
               "trial tables,\nthe chosen configurations (OUT/tuned, a suite's tuned: key), sensitivity figures "
               "and index.md;\na run at them (bench --tuned OUT/tuned) records the file and values in its "
               "config.yaml (recipe:),\nno part of its identity, and flowzoo report names its tuned cells. "
               "--executor slurm runs the\nworkers as SLURM jobs on the shared --storage (docs/tuning.md).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("suite", help="suite name (see `flowzoo list`) or path to a suite YAML with a tuning: section")
    add("--trials", type=at_most(MAX_REPEATS), default=None, metavar="N",
        help="trials per cell instead of the suite's (the same for every cell)")
    add("--workers", type=int, default=1, metavar="N",
        help="workers sharing the storage: processes here, or with a submitit executor, jobs")
    add("--executor", default="local", metavar="local|submitit-local|slurm",
        help="local: the workers are processes here; slurm: one SLURM job per worker through submitit (the largest "
             "of the cells' tasks' resources; requeued on preemption or timeout), waited for, then --out is written "
             "here; submitit-local: the same jobs as processes here (needs pip install -e '.[slurm]')")
    add("--cluster", default=None, metavar="FILE", help="YAML of the scheduler's settings, as for bench "
        "(docs/harness.md)")
    add("--slurm-partition", default=None, metavar="NAME", help="SLURM partition (wins over --cluster's)")
    add("--storage", default=None, metavar="URL",
        help="Optuna storage URL, passed to every worker as it is (default: sqlite:///RUNS/<suite>/tuning/optuna.db); "
             "SQLite needs a file every worker sees: with slurm, on a shared file system (one under /tmp is "
             "refused); for jobs on many nodes give a server, e.g. postgresql://host/db")
    add("--runs", default="runs", metavar="DIR", help="directory of the trials' run directories")
    add("--tasks", default=None, metavar="T,T", help="comma-separated subset of the design's tasks")
    add("--algorithms", default=None, metavar="A,B", help="comma-separated subset of its algorithms")
    add("--out", default=None, metavar="DIR", help="write the tuning's tables, tuned configurations and figures "
        "into DIR")
    add("--report", action="store_true", help="run no trial: only write --out from the storage")
    add("--from-trials", default=None, type=Path, metavar="DIR",
        help="with --report: write --out from the trial tables of an earlier report DIR (DIR/trials, e.g. a "
             "committed one whose storage is gone) instead of the storage; DIR may be --out")


def run(args: argparse.Namespace) -> int:
    from flowzoo.io import check_out_dir
    from flowzoo.models.shipped import refuse_shipped

    refuse_shipped(args.runs, "--runs")  # before the trials' folders or the default SQLite file are made there
    if args.trials is not None and args.trials < 1:  # --report too: it writes the budget as spent/trials
        raise FlowZooError(f"--trials {args.trials}: give a positive number of trials (the same for every cell)")
    if args.out:
        refuse_shipped(args.out, "--out")
        check_out_dir(args.out)  # an existing file: refused before any trial runs, not after
    if args.report:  # the outputs of the trials so far, none run
        suite, design, cells, url = _stored_cells(args)
    elif args.from_trials is not None:
        raise FlowZooError("--from-trials only writes a report from an earlier one's trial tables: add --report")
    else:
        suite, design, cells, url = _tune_and_confirm(args)
    if args.out:
        from flowzoo.benchmark.tuning.report import write_tuning_report

        out = write_tuning_report(suite.name, design, cells, url, Path(args.out), args.trials or design.trials,
                                  from_trials=args.from_trials)
        print(f"tuning report written to {out}")
    return 0


def _stored_cells(args: argparse.Namespace) -> tuple:
    """``--report``: the suite, its design, its cells and the storage to report from (None: ``--from-trials``), no
    trial run."""
    from flowzoo.benchmark.tuning.tune import (check_report_storage, check_storage, default_storage, load_tuning,
                                              tuning_cells)

    if args.executor != "local" or args.cluster is not None or args.slurm_partition is not None:
        raise FlowZooError("--report runs no trial: --executor, --cluster and --slurm-partition apply to the "
                           "trials; drop them")
    if not args.out:
        raise FlowZooError("--report writes the tuning's outputs: give --out DIR")
    suite, design = load_tuning(args.suite)
    cells = tuning_cells(suite, design, args.tasks, args.algorithms)
    if args.from_trials is None:
        url = args.storage or default_storage(Path(args.runs), suite, create=False)
        check_storage(url)
        check_report_storage(url, suite)
    elif args.storage is not None:
        raise FlowZooError("--from-trials reads an earlier report's trial tables, not a storage: drop --storage")
    else:
        url = None
    return suite, design, cells, url


def _tune_and_confirm(args: argparse.Namespace) -> tuple:
    """The trials of every cell, then the confirmation of their picks: the suite, its design, its cells, the storage."""
    from flowzoo.benchmark.run.executors import make_grid
    from flowzoo.benchmark.run.suite import load_suite
    from flowzoo.benchmark.tuning.confirm import confirm_cells
    from flowzoo.benchmark.tuning.tune import tune

    executor = make_grid(args.executor, args.cluster, args.slurm_partition, Path(args.runs),
                         f"{load_suite(args.suite).name}/tune")  # job files beside bench's, not mixed
    suite, design, cells, url = tune(args.suite, Path(args.runs), args.workers, args.trials, args.tasks,
                                     args.algorithms, args.storage, executor)
    confirm_cells(suite, design, cells, url, Path(args.runs) / suite.name / "tuning", args.trials or design.trials,
                  workers=args.workers if args.executor == "local" else None)
    return suite, design, cells, url
