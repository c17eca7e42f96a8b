"""`flowzoo study`: verdicts on every seed set that ran (a user's own included), claim sets that travel with the suite
file, the page (its answer first: the suite's question, a kept hand-written answer, the answer table) and its one-line errors. One small synthetic runs directory
serves every test: flow_grpo and op_grpo on the toy study's sparse task, three seed sets."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from flowzoo.benchmark.render.report_check import check
from flowzoo.benchmark.study.seed_sets import parse_seed_sets, seed_sets_of
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.suite import SUITES_DIR, load_suite
from flowzoo.errors import ConfigError
from tests.synthetic_runs import write_run

TASK = "toy2d_sep64_sparse"
STEPS = [0, 10, 20, 30, 40, 50]
EXPLORATION, REPLICATION, UNSEEN = range(4), range(100, 104), range(300, 304)
FAST = ["--smooth", "1", "--resamples", "300"]


def _write(root, algorithm, seed, rewards):
    write_run(root, TASK, algorithm, seed, STEPS, rewards)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Flow-GRPO reaches 80% of its gain at step 40 everywhere. OP-GRPO: the same curve on the exploration seeds
    (ratio 1: the 34.2% claim contradicted); at step 10 or 20 on the replication seeds and on a user's own seeds
    300-303 (ratio 15/40, CI around 0.342: reproduced). A renamed copy of the op-grpo-study suite file."""
    root = tmp_path_factory.mktemp("study")
    runs = root / "runs"
    for seed in [*EXPLORATION, *REPLICATION, *UNSEEN]:
        _write(runs, "flow_grpo", seed, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
        if seed in EXPLORATION:
            op = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
        else:
            hit = 1 if seed % 2 else 2
            op = [0.0] + [0.6 if i >= hit else 0.1 for i in range(1, 6)]
        _write(runs, "op_grpo", seed, op)
    copy = yaml.safe_load((SUITES_DIR / "op-grpo-study.yaml").read_text())
    copy["name"] = "my-renamed-study"
    (root / "mine.yaml").write_text(yaml.safe_dump(copy))
    return root


def _steps_claim(out):
    claims = pd.read_csv(out / "claims.csv")
    return claims[claims["claim"].str.contains("34.2%.*sparse", regex=True)].iloc[0]


def test_a_renamed_suite_copy_judges_every_seed_set_that_ran_on_a_page_that_leads_with_its_answer(study):
    out = study / "page"
    out.mkdir()
    answer = "**By hand:** the answer in one sentence.\n"
    (out / "ANSWER.md").write_text(answer)
    assert main(["study", str(study / "runs"), "--suite", str(study / "mine.yaml"), "--out", str(out), *FAST]) == 0
    row = _steps_claim(out)
    assert row["verdict exploration"].startswith("contradicted (no saving)")
    assert row["verdict replication"] == "reproduced"
    assert row["verdict other"] == "reproduced"  # the seeds run outside the suite's sets: judged, not "not tested"
    assert row["replication"] == "not replicated"  # exploration and replication disagree
    figures = pd.read_csv(out / "claim_estimates.csv")
    mine = figures[(figures["seed_set"] == "other") & (figures["label"].str.startswith("op_grpo / flow_grpo"))].iloc[0]
    assert mine["estimate"] == pytest.approx(15 / 40) and mine["ci_low"] <= 0.342 <= mine["ci_high"]
    assert mine["paper"] == pytest.approx(0.342)
    # the page: the suite's name and question, the kept hand-written answer, the answer table, the claims' figure
    text = (out / "README.md").read_text()
    question = load_suite("op-grpo-study").question
    assert question and text.startswith(f"# my-renamed-study: {question}\n\n**By hand:** the answer in one "
                                        "sentence.\n\n| claim | paper | ours: exploration (95% CI) | ours: "
                                        "replication (95% CI) | ours: other (95% CI) | verdict |\n")
    assert (out / "ANSWER.md").read_text() == answer
    claims = pd.read_csv(out / "claims.csv")
    table = text[:text.index("\n\n", text.index("| claim | paper"))].split("\n")[-len(claims):]
    assert [line.split(" | ")[0].lstrip("| ") for line in table] == list(claims["claim"])  # one row per claim
    steps_row = next(line for line in table if line.startswith(f"| {row['claim']} |"))
    explored = figures[(figures["seed_set"] == "exploration") & (figures["claim"] == row["claim"])].iloc[0]
    assert (f"| 0.342x | {explored['estimate']:.2f}x [{explored['ci_low']:.2f}, {explored['ci_high']:.2f}] |"
            in steps_row) and steps_row.endswith("| **not replicated** |")
    assert text.index("| claim | paper") < text.index("](figures/claims_ratios.png)") < text.index("\n## ")
    for name in ("claims_ratios.png", f"{TASK}_reward_vs_step.png", f"{TASK}_reward_vs_nfe.png"):
        assert (out / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (out / "index.html").read_text()
    assert '<img src="figures/claims_ratios.png"' in html and "By hand:" in html
    assert check(out, None, None, need_figure=True) == []  # images, links, the answer before the first section


def test_an_answer_over_five_lines_is_refused_before_anything_is_written(study):
    out = study / "long"
    out.mkdir()
    (out / "ANSWER.md").write_text("\n".join(f"line {i}" for i in range(6)) + "\n")
    assert main(["study", str(study / "runs"), "--suite", str(study / "mine.yaml"), "--out", str(out), *FAST]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["ANSWER.md"]
    (out / "ANSWER.md").write_text("one line of " + "x" * 300 + "\n")
    assert main(["study", str(study / "runs"), "--suite", str(study / "mine.yaml"), "--out", str(out), *FAST]) == 2


def test_seed_sets_named_by_the_user_and_replication_on_them(study):
    out = study / "named"
    assert main(["study", str(study / "runs"), "--suite", str(study / "mine.yaml"), "--out", str(out), *FAST,
                 "--seed-sets", "replication", "--seed-sets", "unseen=300-303", "--replicate-on", "unseen"]) == 0
    row = _steps_claim(out)
    assert "verdict exploration" not in row and row["verdict unseen"] == "reproduced"
    assert row["replication"] == "replicated: reproduced"  # the held-out set and the user's agree
    text = (out / "README.md").read_text()
    assert "**replicated** only when the seed sets `replication` and `unseen` agree" in text
    assert "`unseen` (seeds 300-303)" in text


@pytest.mark.parametrize("extra, message", [
    (["--claims", "op-grpo-nope"], "--claims 'op-grpo-nope': no such claim set; claim sets: edit-replay, op-grpo-tiny-counting, "),
    (["--seed-sets", "mine=9-3"], "--seed-sets 'mine=9-3': range '9-3' runs backwards"),
    (["--seed-sets", "unknown"], "--seed-sets unknown: no such seed set in the suite; its sets: exploration, "
                                 "replication"),
    (["--replicate-on", "nope"], "--replicate-on 'nope': give a seed set other than 'replication' that ran; sets: "
                                 "exploration, replication, other"),
])
def test_bad_options_are_one_line_errors_and_write_nothing(study, capsys, extra, message):
    out = study / "bad"
    assert main(["study", str(study / "runs"), "--suite", str(study / "mine.yaml"), "--out", str(out), *FAST,
                 *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("flowzoo: error: ") and message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_seed_set_specs_parse_and_must_be_disjoint():
    assert parse_seed_sets(["a=1-3,7", "exploration,replication"]) == {"a": [1, 2, 3, 7], "exploration": None,
                                                                       "replication": None}
    with pytest.raises(ConfigError, match="'all' is not a seed-set name|not a seed-set name"):
        parse_seed_sets(["all=1-2"])
    with pytest.raises(ConfigError, match="--seed-sets b shares seeds 2-3 with a; seed sets are disjoint"):
        seed_sets_of(None, range(10), {"a": [1, 2, 3], "b": [2, 3, 4]})
    assert seed_sets_of(None, [1, 2, 5], {"a": [1, 2, 3]}) == {"a": [1, 2], "all": [1, 2, 5]}
