"""``flowzoo recipes``: the table of every algorithm's recipe values with their sources (config/recipes.py), printed
or written to a file (docs/recipes.md)."""

from __future__ import annotations

import argparse

DESCRIPTION = "Reads benchmark/recipes/*.yaml and the registered algorithms' defaults."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None,
                        help="write the markdown here (e.g. docs/recipes.md) instead of printing it")


def run(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.config.recipes import recipe_table
    from flowzoo.io import atomic_write_text
    from flowzoo.models.shipped import refuse_shipped

    table = recipe_table()
    if args.out:
        refuse_shipped(args.out, "--out")
        atomic_write_text(args.out, table)  # whole or not at all; a full disk names the file
        print(f"recipes written to {args.out}")
    else:
        print(table, end="")
    return 0
