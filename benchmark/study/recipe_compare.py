"""A study's verdicts under two recipes side by side: the shared recipe (every algorithm at the baseline's) and each
algorithm's own tuned recipe (``flowzoo tune``, then ``flowzoo bench --tuned``), from the two studies' claims.csv.

``flowzoo compare-recipes SHARED_STUDY_DIR TUNED_STUDY_DIR --out FILE.md`` writes a markdown
page: the claims whose verdict changed first, then the rest; a claim the tuned runs could not judge (its cells not run
at tuned recipes) is listed as such, never as a change.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from flowzoo.benchmark.render.tables import markdown_table
from flowzoo.command_line import run_alias
from flowzoo.errors import ConfigError
from flowzoo.io import atomic_write_text, refuse_input_as_output

COLUMNS = ("claim", "verdict exploration", "verdict replication", "replication")
UNJUDGED = "not tested"


def read_claims(study_dir: str | Path) -> pd.DataFrame:
    path = Path(study_dir) / "claims.csv"
    try:
        text = path.read_bytes()
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as error:
        raise ConfigError(f"recipe_compare: cannot read {path}: {error}") from None
    if text and not text.endswith(b"\n"):  # a study writes whole lines: a cut verdict would read as another one
        raise ConfigError(f"recipe_compare: {path}: its last line is cut mid-row (no line end: an interrupted copy or "
                          f"write); regenerate it with flowzoo study")
    blanks = [c for c in COLUMNS if (frame[c] == "").any()] if all(c in frame for c in COLUMNS) else []
    if blanks:  # every claim has a verdict on every seed set (or "not tested"): a blank is a damaged row
        raise ConfigError(f"recipe_compare: {path}: a claim's {blanks[0]!r} is empty (a damaged or cut row); "
                          f"regenerate it with flowzoo study")
    missing = [c for c in COLUMNS if c not in frame]
    if missing:
        raise ConfigError(f"recipe_compare: {path} lacks the columns {missing}; is it a study's claims.csv?")
    if not len(frame):
        raise ConfigError(f"recipe_compare: {path} holds no claim (a study judged no claim: give the study of a "
                          "suite with a claim set)")
    twice = frame["claim"][frame["claim"].duplicated()]
    if len(twice):
        raise ConfigError(f"recipe_compare: {path} lists the claim {twice.iloc[0]!r} twice (a study writes each once; "
                          "an edited or concatenated file?)")
    return frame.set_index("claim")


def _status(row) -> str:
    return row["replication"]


def compare(shared: pd.DataFrame, tuned: pd.DataFrame) -> pd.DataFrame:
    """One row per claim of the shared study: both recipes' verdicts and whether the replicated verdict changed
    (``changed``), stayed (``same``) or could not be judged at tuned recipes (``not judged``)."""
    rows = []
    for claim, row in shared.iterrows():
        other = tuned.loc[claim] if claim in tuned.index else None
        tuned_status = _status(other) if other is not None else UNJUDGED
        if tuned_status.startswith(UNJUDGED) or other is None or (
                other["verdict exploration"] == UNJUDGED and other["verdict replication"] == UNJUDGED):
            change = "not judged"
        else:
            change = "same" if tuned_status == _status(row) else "changed"
        rows.append({"claim": claim, "shared": _status(row),
                     "shared exploration / replication": f"{row['verdict exploration']} / {row['verdict replication']}",
                     "tuned": tuned_status,
                     "tuned exploration / replication": "-" if other is None else
                     f"{other['verdict exploration']} / {other['verdict replication']}",
                     "change": change})
    order = {"changed": 0, "same": 1, "not judged": 2}
    frame = pd.DataFrame(rows)
    return frame.sort_values("change", key=lambda c: c.map(order), kind="stable").reset_index(drop=True)


def to_markdown(table: pd.DataFrame, shared_label: str, tuned_label: str) -> str:
    counts = table["change"].value_counts()
    lines = ["# Verdicts under the shared recipe and under each algorithm's tuned recipe", "",
             f"Shared: `{shared_label}`. Tuned: `{tuned_label}`. Replicated verdicts compared: "
             f"{counts.get('changed', 0)} changed, {counts.get('same', 0)} the same, "
             f"{counts.get('not judged', 0)} not judged at tuned recipes (their cells were not run tuned).", ""]
    rows = [[r["change"], r["claim"], r["shared"], r["tuned"], r["shared exploration / replication"],
             r["tuned exploration / replication"]] for _, r in table.iterrows()]
    lines += markdown_table(["change", "claim", "shared", "tuned", "shared: exploration / replication",
                             "tuned: exploration / replication"], rows, pipe="/")
    return "\n".join(lines) + "\n"


DESCRIPTION = ("Writes a markdown page: the claims whose verdict changed first, then the rest; a claim the tuned "
               "runs could\nnot judge (its cells not run at tuned recipes) is listed as such, never as a change.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``flowzoo compare-recipes``'s arguments."""
    parser.add_argument("shared", help="the study report made from the shared-recipe runs (holds claims.csv)")
    parser.add_argument("tuned", help="the study report made from the tuned-recipe runs (holds claims.csv)")
    parser.add_argument("--out", required=True, help="the markdown file to write")


def run(args: argparse.Namespace) -> int:
    """``flowzoo compare-recipes``: the page, and how many claims changed."""
    from flowzoo.models.shipped import refuse_shipped

    refuse_shipped(args.out, "--out")
    refuse_input_as_output(args.out, [Path(args.shared) / "claims.csv", Path(args.tuned) / "claims.csv"])
    table = compare(read_claims(args.shared), read_claims(args.tuned))
    atomic_write_text(args.out, to_markdown(table, args.shared, args.tuned))  # a full disk: one line naming it
    print(f"{args.out}: {dict(table['change'].value_counts())}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m flowzoo.benchmark.study.recipe_compare``: the older spelling of ``flowzoo compare-recipes``."""
    return run_alias("flowzoo.benchmark.study.recipe_compare", DESCRIPTION, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
