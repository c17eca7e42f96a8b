"""``flowzoo bench``: run a suite's grid of algorithm x task x seed, then (--out) write the report of its runs; here,
above the runs and the report page (render/bench_report.py), as the floors ask."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from flowzoo.benchmark.run.train_command import add_memory_check_option, apply_memory_check_option
from flowzoo.command_line import DeprecatedAlias
from flowzoo.errors import FlowZooError

DESCRIPTION = ("Runs go to RUNS/<suite>/<task>/<algorithm>/s<seed>/; finished runs are skipped, killed ones "
               "resume.\n--algorithms cuts every task to the selected algorithms (a task left with none is "
               "skipped); --tasks keeps the named tasks; --seeds or --seed-set replaces the seeds.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("suite", help="suite name (see `flowzoo list`) or path to a suite YAML")
    add("overrides", nargs="*", default=[], help="key=value overrides applied to every run")
    add("--runs", default="runs", metavar="DIR", help="directory of run directories")
    add("--tuned", default=None, metavar="DIR", help="run each cell at its algorithm's tuned recipe from "
        "DIR/<task>/<algorithm>.yaml (`flowzoo tune --out OUT` writes OUT/tuned; replaces the suite's tuned: key; "
        "each run's config.yaml records it as recipe:); give it its own --runs")
    add("--workers", type=int, default=None, metavar="N", help="parallel runs (default: number of CPUs); with a "
        "submitit executor, jobs at once (default: no limit on slurm)")
    add("--executor", default="local", choices=["local", "submitit-local", "slurm"],
        help="local: worker processes here; slurm: one SLURM job per run through submitit, with its task's "
             "resources, requeued on preemption or timeout; submitit-local: the same jobs as processes here (needs "
             "pip install -e '.[slurm]')")
    add("--cluster", default=None, metavar="FILE", help="YAML of the scheduler's settings: partition, account, qos, "
        "constraint, setup, slurm_args, resources, max_requeues, ... (docs/harness.md)")
    add("--slurm-partition", default=None, metavar="NAME", help="SLURM partition (wins over --cluster's)")
    add("--algorithms", default=None, metavar="A,B", help="comma-separated subset of the suite's algorithms "
        "(default: all)")
    add("--seeds", default=None, metavar="S,S",
        help="comma-separated seeds for every task, instead of the suite's and the tasks' own")
    add("--seed-set", default=None, metavar="NAME",
        help="one of the suite's named seed sets (e.g. replication) as the seeds of every task")
    add("--tasks", default=None, metavar="T,T", help="comma-separated subset of the suite's tasks, control cells "
        "included (e.g. toy2d_sep64_sparse,toy2d_sep64_sparse@no_reuse; default: all)")
    add("--budget-minutes", type=float, default=None, metavar="M",
        help="start no run after this many minutes (default: no limit)")
    add("--out", default=None, metavar="DIR", help="when done, write the report of this command's runs (the "
        "selected tasks, algorithms and seeds; other runs under RUNS/SUITE are left out) into DIR")
    add("--report", dest="out", action=DeprecatedAlias, new="--out", metavar="DIR")
    add_memory_check_option(parser, "launch runs")


def run(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.render.bench_report import write_suite_report
    from flowzoo.benchmark.run.executors import make_grid
    from flowzoo.benchmark.run.suite import load_suite, run_suite, select
    from flowzoo.io import check_out_dir
    from flowzoo.models.shipped import refuse_shipped

    if args.workers is not None and args.workers < 1:
        raise FlowZooError(f"--workers {args.workers}: give at least 1 (default: the number of CPUs)")
    if args.budget_minutes is not None and not (math.isfinite(args.budget_minutes) and args.budget_minutes > 0):
        raise FlowZooError(f"--budget-minutes {args.budget_minutes}: give a positive number of minutes (default: "
                           f"no limit)")
    apply_memory_check_option(args)
    if args.out:
        refuse_shipped(args.out, "--out")
        check_out_dir(args.out)  # an existing file: refused before the grid runs, not after
    refuse_shipped(args.runs, "--runs")
    suite = select(load_suite(args.suite), args.algorithms, args.seeds, args.tasks, args.seed_set)
    if args.tuned is not None:  # every cell at its algorithm's tuned recipe (checked where the cells expand)
        suite.tuned = args.tuned
    executor = make_grid(args.executor, args.cluster, args.slurm_partition, Path(args.runs), suite.name)
    failures = run_suite(suite, Path(args.runs), args.workers, args.overrides, args.budget_minutes, executor)
    for failure in failures:
        print(f"failed: {failure}", file=sys.stderr)
    if args.out:
        out = write_suite_report(suite, Path(args.runs), Path(args.out))
        print(f"report written to {out}")
    return 1 if failures else 0
