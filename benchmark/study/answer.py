"""A study page's first screen: its title (the suite's name and question), the hand-written answer (``ANSWER.md``,
at most :data:`MAX_ANSWER_LINES` lines) and the answer table generated from the judged claims, one row per claim:
the paper's value, ours with its 95% CI on each seed set, and the verdict over the seed sets.

The long account (what changed, why) belongs to the page's HOW.md or its side-by-side pages; ANSWER.md is what a
reader takes away in one screen, and :func:`hand_written_answer` refuses a longer one, naming the file.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from flowzoo.benchmark.render.markdown_html import heading_id
from flowzoo.benchmark.render.tables import markdown_table
from flowzoo.benchmark.study.claims import CLAIMS_HEADING
from flowzoo.benchmark.study.seed_sets import ALL_SEEDS
from flowzoo.errors import ConfigError

ANSWER_FILE = "ANSWER.md"
MAX_ANSWER_LINES = 5
#: a line longer than this is a paragraph written as one line, which the line limit would not see
MAX_ANSWER_LINE_CHARS = 240


def page_title(suite_name: str | None, question: str, fallback: str) -> str:
    """``NAME: QUESTION``; the name alone (``Study of NAME``) when the suite states no question; ``fallback`` (the
    output folder's name) when the study read no suite."""
    if suite_name is None:
        return f"Study of {fallback}"
    return f"{suite_name}: {question}" if question else f"Study of {suite_name}"


def hand_written_answer(out: Path) -> list[str]:
    """The lines of ``out/ANSWER.md`` (with a blank line after), or none. ConfigError for a file over
    :data:`MAX_ANSWER_LINES` lines or with a line over :data:`MAX_ANSWER_LINE_CHARS` characters: the answer is read
    in one screen; the rest of the account goes to the page's HOW.md."""
    path = Path(out) / ANSWER_FILE
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8").replace("\r\n", "\n").strip("\n")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason}); a page's answer is a few "
                          "lines of Markdown") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read it ({error.strerror or error})") from None
    control = next((c for c in text if ord(c) < 32 and c not in "\t\n"), None)
    if control is not None:
        raise ConfigError(f"{path}: holds the control character {control!r} at character {text.index(control)}; a "
                          "page's answer is a few lines of Markdown text")
    if not text.strip():
        return []
    lines = text.split("\n")
    longest = max(len(line) for line in lines)
    if len(lines) > MAX_ANSWER_LINES or longest > MAX_ANSWER_LINE_CHARS:
        raise ConfigError(f"{path}: {len(lines)} lines, the longest {longest} characters; a page's answer is at most "
                          f"{MAX_ANSWER_LINES} lines of at most {MAX_ANSWER_LINE_CHARS} characters (what a reader "
                          "takes away in one screen): move the account to the folder's HOW.md")
    return [text, ""]


def _number(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _signed(value: float) -> str:
    return ("+" if value > 0 else "") + _number(value)


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def estimate_text(row: pd.Series) -> str:
    """One seed set's estimate of a claim: ``1.47x [1.18, 1.80]`` (ratio, two decimals) or ``+40 [-3, +91] steps``
    (difference, three significant digits)."""
    if not _finite(row["estimate"]):
        return "-"
    ci = (f" [{row['ci_low']:.2f}, {row['ci_high']:.2f}]" if row["kind"] == "ratio"
          else f" [{_signed(row['ci_low'])}, {_signed(row['ci_high'])}]") if _finite(row["ci_low"]) else ""
    if row["kind"] == "ratio":
        return f"{row['estimate']:.2f}x{ci}"
    unit = f" {row['unit']}" if isinstance(row.get("unit"), str) and row["unit"] else ""
    return f"{_signed(row['estimate'])}{ci}{unit}"


def paper_text(row: pd.Series) -> str:
    """The paper's own value of a claim, in the estimate's form; ``-`` for a claim stated without a number."""
    if not _finite(row.get("paper")):
        return "-"
    if row["kind"] == "ratio":
        return f"{_number(row['paper'])}x"
    unit = f" {row['unit']}" if isinstance(row.get("unit"), str) and row["unit"] else ""
    return f"{_signed(row['paper'])}{unit}"


def answer_sets(claims: pd.DataFrame) -> list[str]:
    """The seed sets the table shows: every judged set but ``all`` (``all`` alone when it is the only one)."""
    sets = [c[len("verdict "):] for c in claims.columns if c.startswith("verdict ")]
    return [s for s in sets if s != ALL_SEEDS] or sets


def answer_table(claims: pd.DataFrame | None, estimates: pd.DataFrame | None) -> list[str]:
    """The claims as the page's answer: one row per claim with the paper's value, ours per seed set (95% CI) and the
    verdict (the replication verdict where seed sets were paired, else the one set's). Empty without claims."""
    if claims is None or not len(claims):
        return []
    sets = answer_sets(claims)
    replicated = "replication" in claims
    by_claim = ({} if estimates is None or estimates.empty
                else {(r["claim"], r["seed_set"]): r for _, r in estimates.iterrows()})
    headers = ["claim", "paper"] + [f"ours: {s} (95% CI)" for s in sets] + ["verdict"]
    rows = []
    for _, claim in claims.iterrows():
        paper, ours = "-", []
        for s in sets:
            estimate = by_claim.get((claim["claim"], s))
            if estimate is None:  # judged without an interval (e.g. counts): the claims table's words
                ours.append(str(claim.get(f"measured {s}", "-")))
                continue
            paper = paper_text(estimate) if paper == "-" else paper
            ours.append(estimate_text(estimate))
        if not sets:  # a claims table of one unnamed set
            ours = [str(claim.get("measured", "-"))]
        verdict = claim["replication"] if replicated else claim.get(f"verdict {sets[0]}" if sets else "verdict", "-")
        rows.append([claim["claim"], paper, *ours, f"**{verdict}**"])
    # a | inside a cell (e.g. the unit |log ratio|) escaped, so it does not split the cell
    return markdown_table(headers, rows, pipe="\\|") + ["", "Rules, figures in words and each seed set's verdict: "
                    f"[{CLAIMS_HEADING.lower()}](#{heading_id(CLAIMS_HEADING)}) below.", ""]
