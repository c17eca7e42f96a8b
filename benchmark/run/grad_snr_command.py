"""``flowzoo grad-snr``: the gradient signal-to-noise of a config's training step at its start weights
(run/grad_snr.py)."""

from __future__ import annotations

import argparse

from flowzoo.command_line import MAX_REPEATS, at_most

DESCRIPTION = ("Takes K independent batches' update gradients at the same weights and prints their mean pairwise "
               "cosine\n(with its standard error), the share of coordinates with |z| > 3, the reward and seconds "
               "per batch.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="YAML config (see benchmark/configs/) or a suite's cell "
                        "SUITE:TASK/ALGORITHM")
    parser.add_argument("overrides", nargs="*", default=[], help="key=value overrides, e.g. train.prompts_per_step=16")
    parser.add_argument("--batches", type=at_most(MAX_REPEATS), default=16, help="independent batches to compare")
    parser.add_argument("--fixed-prompts", action="store_true",
                        help="the same prompts in every batch (only noise varies)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.run.grad_snr import measure
    from flowzoo.benchmark.run.run_source import load_run

    result = measure(load_run(args.config, args.overrides)[0], args.batches, args.fixed_prompts, not args.quiet)
    print(result.line())
    return 0
