"""What a gain cost (benchmark/analysis/costs.py, cost_claims.py) on runs with a known answer: the per-run changes
read like the final reward, the Pareto front, the cost table's intervals, the claims' verdicts, and a study's page
and costs.csv end to end."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from flowzoo.benchmark.analysis import costs
from flowzoo.benchmark.render import gain_costs
from flowzoo.benchmark.study.cost_claims import gold_claim, narrowing_claim, unseen_claim
from tests.synthetic_runs import write_run

TASK = "toy2d_sep64_sparse"
STEPS = [0, 10, 20, 30, 40, 50]


def _frame(run: str, spread: list[float], distance: list[float], unseen: list[float] | None = None) -> pd.DataFrame:
    frame = pd.DataFrame({"run": run, "step": STEPS, "eval_reward": np.linspace(0, 0.5, len(STEPS)),
                          "eval_spread": spread, "eval_gold_distance": distance})
    if unseen is not None:
        frame["eval_unseen_reward"] = unseen
    return frame


def test_each_run_reads_its_last_evaluations_against_its_base():
    runs = pd.concat([
        _frame("a", [2.0, 2, 2, 1.0, 1.0, 1.0], [0.3, 0.3, 0.3, 0.1, 0.1, 0.1], [0.2, 0.2, 0.2, 0.5, 0.5, 0.5]),
        _frame("b", [2.0, 2, 2, 2, 2, 2], [0.3, 0.3, 0.3, 0.3, 0.4, 0.5]),
    ])
    per_run = costs.run_costs(runs, smooth=3)
    assert per_run.loc["a", "spread_kept"] == pytest.approx(0.5)
    assert per_run.loc["a", "gold_gain"] == pytest.approx(0.2)  # a distance: base - final
    assert per_run.loc["a", "unseen_gain"] == pytest.approx(0.3)
    assert per_run.loc["b", "spread_kept"] == pytest.approx(1.0)
    assert per_run.loc["b", "gold_gain"] == pytest.approx(0.3 - 0.4)  # last 3: 0.3, 0.4, 0.5
    assert math.isnan(per_run.loc["b", "unseen_gain"])
    judge = pd.DataFrame({"run": "c", "step": STEPS, "eval_reward": 0.0, "eval_gold": [0.1, 0, 0, 0.4, 0.4, 0.4]})
    assert costs.run_costs(judge, smooth=3).loc["c", "gold_gain"] == pytest.approx(0.3)  # a judge: final - base


def test_the_pareto_front_keeps_the_undominated_points():
    points = [(1.0, 0.2), (0.5, 0.6), (0.4, 0.5), (1.0, 0.1), (math.nan, 9.0)]
    assert costs.pareto(points) == [True, True, False, False, False]
    assert costs.pareto([(0.5, 0.5), (0.5, 0.5)]) == [True, True]  # ties dominate neither


def _table(spread_kept: dict[str, list[float]], gold_gain: dict[str, list[float]], unseen: dict | None = None):
    rows = []
    for cell, values in spread_kept.items():
        for seed, value in enumerate(values):
            rows.append({"task": TASK, "algorithm": cell, "seed": seed, "base": 0.0, "final_reward": 0.5,
                         "spread_kept": value, "gold_gain": gold_gain[cell][seed],
                         **({"unseen_gain": unseen[cell][seed]} if unseen else {})})
    return pd.DataFrame(rows)


def test_the_cost_table_has_intervals_over_seeds_and_marks_the_front():
    table = _table({"flow_grpo": [0.9, 0.92, 0.88, 0.9], "op_grpo": [0.5, 0.52, 0.48, 0.5]},
                   {"flow_grpo": [0.1, 0.12, 0.08, 0.1], "op_grpo": [0.1] * 4})
    table.loc[table["algorithm"] == "op_grpo", "final_reward"] = 0.7
    rows = costs.cost_table(table, {"all": None, "two": [0, 1]}).set_index(["seed_set", "algorithm"])
    flow, op = rows.loc[("all", "flow_grpo")], rows.loc[("all", "op_grpo")]
    assert flow["spread_kept"] == pytest.approx(0.9) and flow["spread_kept_low"] <= 0.9 <= flow["spread_kept_high"]
    assert op["reward_gain"] == pytest.approx(0.7) and flow["pareto"] and op["pareto"]  # each is best at one
    assert rows.loc[("two", "op_grpo"), "n"] == 2
    lines = gain_costs.cost_lines(costs.cost_table(table, {"all": None}), [], "all")
    assert any(line.startswith("| op_grpo | 4 | +0.700") for line in lines)
    assert "unseen-prompt gain" in lines[2] and "Not measured: CLIP spread kept, unseen-prompt gain." in lines[2]


def test_the_cost_claims_judge_narrowing_hacking_and_generalisation():
    table = _table({"flow_grpo": [0.9, 0.92, 0.88, 0.9, 0.91], "op_grpo": [0.5, 0.52, 0.48, 0.5, 0.49],
                    "awm": [0.9, 0.93, 0.89, 0.91, 0.9]},
                   {"flow_grpo": [0.1, 0.12, 0.08, 0.1, 0.11], "op_grpo": [-0.1, -0.12, -0.08, -0.1, -0.09],
                    "awm": [0.1, -0.1, 0.05, -0.05, 0.0]},
                   {"flow_grpo": [0.2] * 5, "op_grpo": [0.19, 0.2, 0.21, 0.2, 0.2], "awm": [-0.2, -0.21, -0.19, -0.2, -0.2]})
    assert narrowing_claim(table, TASK, "op_grpo", "OP-GRPO", "sparse")["verdict"] == "reproduced"
    assert narrowing_claim(table, TASK, "awm", "AWM", "sparse")["verdict"].startswith("contradicted")
    assert gold_claim(table, TASK, "flow_grpo", "Flow-GRPO", "sparse", "W2")["verdict"] == "reproduced"
    assert gold_claim(table, TASK, "op_grpo", "OP-GRPO", "sparse", "W2")["verdict"] == "contradicted (reward hacking)"
    assert gold_claim(table, TASK, "awm", "AWM", "sparse", "W2")["verdict"].startswith("inconclusive")
    assert unseen_claim(table, TASK, "op_grpo", "OP-GRPO", "sparse")["verdict"] == "reproduced"
    assert unseen_claim(table, TASK, "awm", "AWM", "sparse")["verdict"] == "contradicted"
    bare = table.drop(columns=["spread_kept", "gold_gain", "unseen_gain"])
    for row in (narrowing_claim(bare, TASK, "op_grpo", "OP-GRPO", "sparse"),
                gold_claim(bare, TASK, "op_grpo", "OP-GRPO", "sparse", "W2"),
                unseen_claim(bare, TASK, "op_grpo", "OP-GRPO", "sparse")):
        assert row["verdict"] == "not tested" and row["measured"] != "no runs"  # the runs lack the column
    for row in (narrowing_claim(table, "other_task", "op_grpo", "OP-GRPO", "sparse"),  # a task without runs
                gold_claim(table, TASK, "diffusion_nft", "DiffusionNFT", "sparse", "W2"),  # a cell without runs
                unseen_claim(table, TASK, "flow_grpo@dynamic", "dynamic sampling", "sparse")):
        assert (row["measured"], row["verdict"]) == ("no runs", "not tested")


def _write(root, algorithm, seed, spread_end: float, distance_end: float):
    noise = 0.01 * (seed % 3)
    write_run(root, TASK, algorithm, seed, STEPS, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5],
              {"eval_spread": [0.2] + [0.2 * spread_end + noise] * 5,
               "eval_gold_distance": [0.24] + [distance_end + noise] * 5})


def test_a_study_page_shows_the_cost_panel_table_and_judged_claims(tmp_path):
    from flowzoo.benchmark.cli import main

    runs = tmp_path / "runs"
    for seed in range(4):
        _write(runs, "flow_grpo", seed, 0.9, 0.1)
        _write(runs, "op_grpo", seed, 0.5, 0.3)  # narrower, and farther from the ideal density than its base
    out = tmp_path / "page"
    assert main(["study", str(runs), "--suite", "op-grpo-study", "--out", str(out), "--smooth", "1",
                 "--resamples", "300", "--seed-sets", "mine=0,1,2,3"]) == 0
    table = pd.read_csv(out / "costs.csv")
    table = table[table["seed_set"] == "mine"].set_index("algorithm")
    assert table.loc["op_grpo", "spread_kept"] == pytest.approx(0.5 + 0.05 * np.mean([0, 1, 2, 0]), abs=1e-9)
    assert table.loc["op_grpo", "gold_gain"] < 0 < table.loc["flow_grpo", "gold_gain"]
    page = (out / "README.md").read_text()
    assert "## What the gain cost" in page and (out / "figures" / f"{TASK}_costs.png").is_file()
    claims = pd.read_csv(out / "claims.csv")
    narrowing = claims[claims["claim"].str.startswith("OP-GRPO's gain narrows") & claims["claim"].str.contains("sparse")]
    assert narrowing.iloc[0]["verdict mine"].startswith("reproduced")
    hacking = claims[claims["claim"].str.startswith("OP-GRPO's reward gain is confirmed")
                     & claims["claim"].str.contains("sparse")]
    assert hacking.iloc[0]["verdict mine"].startswith("contradicted")


def test_a_claim_whose_measure_only_the_held_out_runs_logged_is_held_out_only():
    from flowzoo.benchmark.study.claims import replication

    pair = ["exploration", "replication"]
    assert replication(["not tested", "reproduced (x)"], pair) == "held-out only: reproduced"
    assert replication(["reproduced (x)", "not tested"], pair) == "not replicated"  # a designers' verdict alone
    assert replication(["not tested", "not tested"], pair) == "not tested"
    assert replication(["contradicted", "contradicted (y)"], pair) == "replicated: contradicted"
    assert replication(["reproduced", "inconclusive"], pair) == "not replicated"
    # --replicate-on unseen: the held-out set comes first, and only the other one was tested
    assert replication(["not tested", "inconclusive"], ["replication", "unseen"]) == "not replicated"


def test_cost_columns_on_the_held_out_seeds_only_give_held_out_only_verdicts(tmp_path):
    """The committed tiny study's case: its exploration runs predate the cost columns, its replication runs log them."""
    from flowzoo.benchmark.cli import main

    runs = tmp_path / "runs"
    for seed in range(4):
        write_run(runs, TASK, "flow_grpo", seed, STEPS, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
        write_run(runs, TASK, "op_grpo", seed, STEPS, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    for seed in range(100, 104):
        _write(runs, "flow_grpo", seed, 0.9, 0.1)
        _write(runs, "op_grpo", seed, 0.5, 0.3)
    out = tmp_path / "page"
    assert main(["study", str(runs), "--suite", "op-grpo-study", "--out", str(out), "--smooth", "1", "--resamples",
                 "300", "--seed-sets", "exploration=0-3", "--seed-sets", "replication=100-103"]) == 0
    claims = pd.read_csv(out / "claims.csv")
    narrowing = claims[claims["claim"].str.startswith("OP-GRPO's gain narrows") & claims["claim"].str.contains("sparse")]
    row = narrowing.iloc[0]
    assert row["verdict exploration"] == "not tested" and row["verdict replication"].startswith("reproduced")
    assert row["replication"] == "held-out only: reproduced"
    assert "**held-out only** when only the held-out seeds could be judged" in (out / "README.md").read_text()


def test_a_report_with_a_task_that_measures_no_cost_draws_the_others_panels(tmp_path):
    """The quick suite's shape: toy tasks log spread and gold, the edit run-through (one sample per prompt, no gold)
    logs none; the report draws a panel for the first only and lists both tasks in the table (it crashed on an
    empty panel before)."""
    from flowzoo.benchmark.cli import main

    runs = tmp_path / "runs"
    for seed in range(3):
        _write(runs, "flow_grpo", seed, 0.9, 0.1)
        write_run(runs, "tiny_edit", "flow_grpo", seed, STEPS, [0.7, 0.71, 0.72, 0.72, 0.73, 0.73])
    out = tmp_path / "report"
    assert main(["report", str(runs), "--out", str(out)]) == 0
    page = (out / "index.md").read_text()
    section = page[page.index("## What the gain cost"):]
    assert "### tiny_edit" in section and f"### {TASK}" in section
    assert (out / "figures" / f"{TASK}_costs.png").is_file()
    assert not list((out / "figures").glob("tiny_edit_costs*"))
