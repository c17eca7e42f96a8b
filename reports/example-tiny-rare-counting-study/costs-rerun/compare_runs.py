"""Does a re-run reproduce its committed run? For every run of RERUN (``task/algorithm/s<seed>``) with a run of the
same cell and seed under COMMITTED, the first step where a column both log (timings aside) differs, and both final
evaluations; a Markdown table on stdout.

    python reports/example-tiny-rare-counting-study/costs-rerun/compare_runs.py \\
        reports/example-tiny-rare-counting-study/run-metrics/tiny-rare-counting-study \\
        reports/example-tiny-rare-counting-study/costs-rerun/run-metrics/tiny-rare-counting-study
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

TIMINGS = {"wall_s", "t_sampling", "t_reward", "t_training", "t_eval"}


def compare(committed: Path, rerun: Path) -> dict:
    old, new = pd.read_csv(committed), pd.read_csv(rerun)
    shared = [c for c in old.columns if c in new.columns and c not in TIMINGS and c != "step"]
    both = old[["step", *shared]].merge(new[["step", *shared]], on="step", how="outer", suffixes=("", " re-run"))
    first = {}
    for column in shared:
        a, b = both[column].to_numpy(), both[f"{column} re-run"].to_numpy()
        differs = ~((a == b) | (pd.isna(a) & pd.isna(b)))
        if differs.any():
            first[column] = int(both["step"].iloc[differs.argmax()])
    training = [c for c in first if not c.startswith("eval")]
    return {"identical": not first,
            "training first differs at step": min((first[c] for c in training), default="-"),
            "eval first differs at step": first.get("eval_reward", "-"),
            "other columns differing": ", ".join(sorted(c for c in first if c not in ("eval_reward", "reward_mean",
                                                                                      "zero_std_frac"))) or "-",
            "final eval committed": old["eval_reward"].dropna().iloc[-1],
            "final eval re-run": new["eval_reward"].dropna().iloc[-1]}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    committed, rerun = map(Path, argv)
    rows = []
    for metrics in sorted(rerun.glob("*/*/s*/metrics.csv")):
        relative = metrics.relative_to(rerun)
        if (committed / relative).is_file():
            rows.append({"run": str(relative.parent), **compare(committed / relative, metrics)})
    table = pd.DataFrame(rows)
    print("| " + " | ".join(table.columns) + " |")
    print("|" + "---|" * len(table.columns))
    for row in table.itertuples(index=False):
        print("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |")
    print(f"\n{int(table['identical'].sum())} of {len(table)} re-runs identical to their committed runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
