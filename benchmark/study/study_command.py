"""``flowzoo study``: a study's page, its paired effects and the claims' verdicts on every seed set
(study/verdicts.py's ``write_study``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from flowzoo.command_line import RegistryNames, at_most

DESCRIPTION = ("Reads every run under RUNS_DIR and writes DIR/README.md and index.html: the claims' forest plots, "
               "the\nverdicts, each task's eval-reward curves of every cell against steps and NFE, then the tables; "
               "with\nruns.csv, effects.csv, gains.csv, curves.csv, claims.csv and claim_estimates.csv. Each seed "
               "set (the\nsuite's seed_sets that ran, the seeds run outside them as 'other', or --seed-sets) is "
               "judged apart,\nwith its own target. A hand-written DIR/ANSWER.md is kept and shown under the "
               "title.\nExit 0 when written; 2 for a bad option, suite, claim set or seed set, or unreadable runs "
               "(one line,\nnothing written).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("runs_dir", metavar="RUNS_DIR", help="the suite's runs (e.g. runs/op-grpo-study)")
    add("--suite", required=True, metavar="SUITE",
        help="suite name (see `flowzoo list`) or YAML path: its seed_sets and its claims: key")
    add("--out", default=None, metavar="DIR", help="output folder (default: reports/<suite name>)")
    claims = add("--claims", default=None, metavar="SET", help="claim set to judge: %(claim_sets)s, or none "
                 "(default: the suite's claims: key, else the set whose task the suite holds; `flowzoo list` "
                 "describes them)")
    claims.claim_sets = RegistryNames("flowzoo.benchmark.study.claims")  # read from the registry when --help is shown
    add("--vs", default=None, metavar="CELL,...", help="cells (algorithm or algorithm@variant) to pair the others "
        "with besides the baseline (the claim set's own, e.g. op_grpo, are added when they ran)")
    add("--baseline", default="flow_grpo", help="the cell every other is paired with; its gain sets the targets")
    add("--seed-sets", action="append", default=None, metavar="SPEC",
        help="the seed sets to judge instead of every one that ran: the suite's set names "
             "(exploration,replication) or a set of your own, NAME=SEEDS (unseen=300-309); repeatable")
    add("--replicate-on", default=None, metavar="SET", help="say 'replicated' when the held-out 'replication' set "
        "and this set agree (default: when exploration and replication agree)")
    add("--timing", default=None, metavar="CSV", help="per-step costs measured interleaved (flowzoo time-cells) for "
        "the wall-clock-to-target estimates; copied into DIR as timing.csv")
    add("--smooth", type=int, default=3, help="evaluations averaged into the final reward and the curves the costs "
        "are read on")
    add("--resamples", type=at_most(1_000_000), default=10_000, help="bootstrap resamples (>= 100)")
    add("--save-metrics", default=None, metavar="DIR", help="also copy every run's config.yaml and metrics.csv "
        "trimmed to the columns the study reads into DIR (a committable record)")


def run(args: argparse.Namespace) -> int:
    from flowzoo.benchmark.run.suite import load_suite
    from flowzoo.benchmark.study.verdicts import StudyRequest, write_study

    suite = load_suite(args.suite)  # a bad name fails here, in one line, before anything is read
    out = args.out or str(Path("reports") / suite.name)
    vs = tuple(c.strip() for c in (args.vs or "").split(",") if c.strip())
    request = StudyRequest(args.runs_dir, out, args.suite, args.baseline, vs, args.claims or "auto", args.timing,
                           args.seed_sets, args.replicate_on, args.smooth, args.resamples, args.save_metrics)
    print(f"study written to {write_study(request)}")
    return 0
