"""``flowzoo report``: tables and figures from a directory of runs (render/report.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = ("Writes DIR/index.md and index.html, tables/*.tex and figures/*.png|svg; the same runs give the "
               "same bytes.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs_dir", help="directory searched for run directories (e.g. runs/quick)")
    parser.add_argument("--out", required=True, metavar="DIR", help="report directory")
    parser.add_argument("--baseline", default="flow_grpo", help="the algorithm others are compared against")
    parser.add_argument("--target", default=None,
                        help="reward target: '0.9gain' or '90%%gain' of the way from the base model to the "
                             "baseline's final reward (default 0.9gain), '0.9x' or '90%%' of the baseline's final "
                             "reward, or an absolute value '0.8'")


def run(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.analysis.targets import parse_target
    from flowzoo.benchmark.render.report import write_report
    from flowzoo.models.shipped import refuse_shipped

    target = parse_target(args.target) if args.target else None
    refuse_shipped(args.out, "--out")
    out = write_report(Path(args.runs_dir), Path(args.out), baseline=args.baseline, target=target)
    print(f"report written to {out}")
    return 0
