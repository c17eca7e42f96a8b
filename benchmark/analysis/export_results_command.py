"""``flowzoo export-results``: runs' configs and per-step metrics as a Hugging Face dataset
(analysis/results_dataset.py)."""

from __future__ import annotations

import argparse

DESCRIPTION = ("Reads RUNS_OR_REPORT (a runs directory, or a study page with run-metrics/) and writes\n"
               "DIR/data/train-*.parquet (one row per run and logged step; the run's config keys as config.* "
               "columns)\nand DIR/README.md; load it with datasets.load_dataset(\"parquet\", data_dir=DIR).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="RUNS_OR_REPORT",
                        help="a runs directory or a study page holding run-metrics/")
    parser.add_argument("--out", required=True, metavar="DIR", help="the dataset's folder (written all or nothing)")


def run(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.analysis.results_dataset import export_results
    from flowzoo.models.shipped import refuse_shipped

    refuse_shipped(args.out, "--out")
    out = export_results(args.source, args.out)
    print(f"results dataset written to {out} (datasets.load_dataset(\"parquet\", data_dir=\"{out}\"))")
    return 0
