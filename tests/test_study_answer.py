"""A study page's answer (benchmark/study/answer.py): the table's cells from the claims' estimates, the
fallback to the claims table's words, the title, and the limits of a hand-written answer."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from flowzoo.benchmark.study import answer as study_answer
from flowzoo.errors import ConfigError

CLAIMS = pd.DataFrame([
    {"claim": "A needs 34.2% of B's steps", "measured exploration": "ratio 1.47", "verdict exploration": "contradicted",
     "measured replication": "ratio 1.16", "verdict replication": "contradicted", "measured all": "ratio 1.34",
     "verdict all": "contradicted", "replication": "replicated: contradicted"},
    {"claim": "no correction diverges", "measured exploration": "2/10 unstable", "verdict exploration": "reproduced",
     "measured replication": "0/10 unstable", "verdict replication": "contradicted", "measured all": "2/20",
     "verdict all": "inconclusive", "replication": "not replicated"},
])
ESTIMATES = pd.DataFrame([
    {"claim": "A needs 34.2% of B's steps", "seed_set": s, "kind": "ratio", "unit": "", "estimate": e, "ci_low": lo,
     "ci_high": hi, "paper": 0.342} for s, e, lo, hi in [("exploration", 1.4709, 1.1751, 1.8042),
                                                          ("replication", 1.16, 1.05, 1.47), ("all", 1.34, 1.18, 1.56)]
])


def test_the_table_has_one_row_per_claim_with_the_paper_ours_per_set_and_the_verdict():
    lines = study_answer.answer_table(CLAIMS, ESTIMATES)
    assert lines[0] == "| claim | paper | ours: exploration (95% CI) | ours: replication (95% CI) | verdict |"
    assert lines[2] == ("| A needs 34.2% of B's steps | 0.342x | 1.47x [1.18, 1.80] | 1.16x [1.05, 1.47] "
                        "| **replicated: contradicted** |")
    # a claim judged without an interval keeps the claims table's words; no paper value: "-"
    assert lines[3] == "| no correction diverges | - | 2/10 unstable | 0/10 unstable | **not replicated** |"
    assert "#the-papers-claims" in lines[-2]
    assert study_answer.answer_table(None, None) == [] and study_answer.answer_table(CLAIMS.iloc[:0], None) == []


def test_a_difference_carries_its_sign_and_unit():
    row = pd.Series({"kind": "difference", "unit": "steps", "estimate": 40.0, "ci_low": -3.0, "ci_high": 91.0,
                     "paper": math.nan})
    assert study_answer.estimate_text(row) == "+40 [-3, +91] steps"
    assert study_answer.paper_text(row) == "-"
    clip = pd.Series({"kind": "difference", "unit": "clip rate", "estimate": 0.0265, "ci_low": 0.0238,
                      "ci_high": 0.0297, "paper": 0.282})
    assert study_answer.estimate_text(clip) == "+0.0265 [+0.0238, +0.0297] clip rate"
    assert study_answer.paper_text(clip) == "+0.282 clip rate"
    assert study_answer.estimate_text(clip.copy().replace({0.0265: math.nan})) == "-"
    # a unit with pipes stays inside its cell
    ratio = pd.Series({"kind": "difference", "unit": "|log ratio|", "estimate": 0.12, "ci_low": 0.117,
                       "ci_high": 0.123, "paper": math.nan})
    claims = pd.DataFrame([{"claim": "late steps", "verdict exploration": "reproduced", "replication": "reproduced",
                            "verdict replication": "reproduced"}])
    estimates = pd.DataFrame([{**ratio, "claim": "late steps", "seed_set": s} for s in ("exploration", "replication")])
    row = study_answer.answer_table(claims, estimates)[2]
    assert row.count(" | ") == 4 and "+0.12 [+0.117, +0.123] \\|log ratio\\|" in row


def test_the_title_is_the_suites_name_and_question():
    assert study_answer.page_title("s", "does A beat B?", "out") == "s: does A beat B?"
    assert study_answer.page_title("s", "", "out") == "Study of s"
    assert study_answer.page_title(None, "", "out") == "Study of out"


def test_a_hand_written_answer_is_at_most_five_short_lines(tmp_path):
    assert study_answer.hand_written_answer(tmp_path) == []
    (tmp_path / "ANSWER.md").write_text("\n\n")
    assert study_answer.hand_written_answer(tmp_path) == []
    (tmp_path / "ANSWER.md").write_text("one\ntwo\nthree\nfour\nfive\n")
    assert study_answer.hand_written_answer(tmp_path) == ["one\ntwo\nthree\nfour\nfive", ""]
    (tmp_path / "ANSWER.md").write_text("one\ntwo\nthree\nfour\nfive\nsix\n")
    with pytest.raises(ConfigError, match="6 lines.*at most 5 lines"):
        study_answer.hand_written_answer(tmp_path)
    (tmp_path / "ANSWER.md").write_text("x" * (study_answer.MAX_ANSWER_LINE_CHARS + 1))
    with pytest.raises(ConfigError, match="HOW.md"):
        study_answer.hand_written_answer(tmp_path)


def test_the_committed_answers_fit_one_screen():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "reports"
    answers = sorted(root.glob("example-*/**/ANSWER.md"))
    assert answers, "the committed studies carry hand-written answers"
    for path in answers:
        study_answer.hand_written_answer(path.parent)  # raises for one over the limits
