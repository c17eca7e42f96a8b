"""Give the committed runs of this study the evaluation columns of what a gain costs (issue 57), from a re-run of
the same runs at a later commit that logs them: ``eval_gold`` (GenEval partial credit), ``eval_spread`` (the samples'
pixel spread) and ``eval_unseen_reward`` (the 8 counting prompts never trained on), with their components.

    python reports/example-tiny-rare-counting-study/add_cost_columns.py COMMITTED RERUN OUT

COMMITTED: the study's run-metrics tree (``run-metrics/tiny-rare-counting-study``); RERUN: the re-run's runs folder
(``<runs>/tiny-rare-counting-study``, e.g. the replication seeds of four cells); OUT: a new folder, the committed tree
with every re-run run's metrics.csv given the re-run's new columns. Its config.yaml stays the committed one: a study
pools only seeds of one config, and the seeds not re-run do not log these columns (the re-run's config adds
``train.gold`` and ``prompts.unseen``, which change what is evaluated, never what is trained). A re-run run must
reproduce its committed run: same steps, and every column both have, timings aside, equal bit for bit; otherwise
nothing is written and the script exits 1.
Timings (``wall_s``, ``t_*``) stay the committed run's: the re-run shared its cores with other work, and the page's
wall-clock estimates use timing.csv, not the runs' own times."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pandas as pd

TIMINGS = {"wall_s", "t_sampling", "t_reward", "t_training", "t_eval"}


def merged(committed: Path, rerun: Path) -> pd.DataFrame:
    """The committed run's metrics with the re-run's columns it lacks; ValueError when the re-run differs."""
    old, new = pd.read_csv(committed), pd.read_csv(rerun)
    if old["step"].tolist() != new["step"].tolist():
        raise ValueError(f"{rerun}: steps differ from {committed}")
    shared = [c for c in old.columns if c in new.columns and c not in TIMINGS]
    missing = [c for c in old.columns if c not in new.columns]
    if missing:
        raise ValueError(f"{rerun}: lacks the committed columns {missing}")
    differing = [c for c in shared if not old[c].equals(new[c])]
    if differing:
        raise ValueError(f"{rerun}: columns {differing} differ from {committed}")
    return pd.concat([old, new[[c for c in new.columns if c not in old.columns and c not in TIMINGS]]], axis=1)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    committed, rerun, out = map(Path, argv)
    if out.exists():
        print(f"{out} exists; give a new folder", file=sys.stderr)
        return 2
    runs = sorted(p.parent for p in rerun.glob("*/*/s*/done.json"))
    frames = {}
    try:
        for run in runs:
            relative = run.relative_to(rerun)
            if not (committed / relative / "metrics.csv").is_file():
                raise ValueError(f"{relative}: no committed run of that cell and seed")
            frames[relative] = merged(committed / relative / "metrics.csv", run / "metrics.csv")
    except ValueError as error:
        print(f"not reproduced: {error}", file=sys.stderr)
        return 1
    shutil.copytree(committed, out)
    for relative, frame in frames.items():
        frame.to_csv(out / relative / "metrics.csv", index=False)
    added = sorted({c for f in frames.values() for c in f.columns} - set(pd.read_csv(committed / next(iter(frames))
                                                                                    / "metrics.csv").columns))
    print(f"{len(frames)} re-run runs reproduce their committed runs; columns added: {', '.join(added)}; into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
