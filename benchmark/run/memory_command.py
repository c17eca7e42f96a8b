"""``flowzoo memory``: each cell's per-GPU memory estimate, by parts, and whether it fits (run/memory_table.py)."""

from __future__ import annotations

import argparse
import math

from flowzoo.command_line import MAX_BATCH, at_most
from flowzoo.errors import FlowZooError

DESCRIPTION = ("Resolves every cell of SUITE as bench does (no prompt file or weight is read) and prints a table of "
               "its\nper-GPU peak estimate in GiB (docs/perf.md, \"Memory at the paper recipes\"): weights, "
               "trainable state,\nbatch, kept rollout graphs, and the peak rollout, decode and update calls. "
               "train and bench refuse a\nrun whose estimate exceeds its GPU (torch's total_memory, or "
               "FLOWZOO_DEVICE_MEMORY_GIB), naming the\nknobs to change; --no-memory-check launches anyway. "
               "Exit 0 when every cell fits, 1 when one does not.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", help="suite name (see `flowzoo list`) or path to a suite YAML")
    parser.add_argument("overrides", nargs="*", default=[], help="key=value overrides applied to every cell, e.g. "
                        "algorithm.micro_batch=2")
    parser.add_argument("--gpus", type=at_most(MAX_BATCH), default=None, metavar="N",
                        help="GPUs (one process each) the global batch is split over (default: the suite's "
                             "released_gpus, 8 for the paper suites; else 1)")
    parser.add_argument("--device-memory", type=float, default=None, metavar="GIB",
                        help="memory of one GPU in GiB (default: 79.6, an H100 80 GB's)")
    parser.add_argument("--tasks", default=None, metavar="T,T", help="comma-separated subset of the suite's tasks")
    parser.add_argument("--algorithms", default=None, metavar="A,B", help="comma-separated subset of its algorithms")


def run(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.run.memory_table import report
    from flowzoo.benchmark.run.suite import load_suite, select

    if args.device_memory is not None and not (math.isfinite(args.device_memory) and args.device_memory > 0):
        raise FlowZooError(f"--device-memory {args.device_memory}: give the device's memory in GiB, a number > 0")
    if args.gpus is not None and args.gpus < 1:
        raise FlowZooError(f"--gpus {args.gpus}: give at least 1 (default: the suite's released_gpus)")
    suite = select(load_suite(args.suite), args.algorithms, None, args.tasks)
    kwargs = {} if args.device_memory is None else {"budget_gib": args.device_memory}
    text, every_fit = report(suite, args.gpus, overrides=tuple(args.overrides), **kwargs)
    print(text)
    return 0 if every_fit else 1
