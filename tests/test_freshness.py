"""A committed report's fingerprint detects a changed recipe and changed numerics, and passes unchanged code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from flowzoo.benchmark.render import freshness
from flowzoo.benchmark.cli import main as flowzoo
from flowzoo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

SUITE = {
    "name": "fresh-mini",
    "seeds": [0, 1],
    "algorithms": ["flow_grpo"],
    "defaults": {
        "algorithm": {"group_size": 4, "lr": 1.0e-3},
        "train": {"steps": 5, "prompts_per_step": 2, "eval_every": 5, "eval_samples_per_prompt": 4,
                  "checkpoint_every": 5, "save_samples": False, "threads": 1},
        "model": {"name": "toy2d"}, "reward": "toy_mode",
    },
    "tasks": {"toy2d_mode": {}},
}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A 2-seed, 5-step toy grid and its fingerprint (`flowzoo report` writes it too: tests/test_report.py)."""
    tmp = tmp_path_factory.mktemp("fresh")
    suite = tmp / "fresh-mini.yaml"
    suite.write_text(yaml.safe_dump(SUITE))
    assert flowzoo(["bench", str(suite), "--runs", str(tmp / "runs")]) == 0
    freshness.write_fingerprint(tmp / "runs", tmp / "report")
    return suite, tmp / "report"


def test_the_report_carries_the_lowest_seeds_first_rows(made):
    _, report = made
    data = json.loads((report / freshness.FINGERPRINT_FILE).read_text())
    cell = data["cells"]["toy2d_mode/flow_grpo"]
    assert list(data["cells"]) == ["toy2d_mode/flow_grpo"] and cell["seed"] == 0
    assert [r["step"] for r in cell["rows"]] == [0, 1, 2, 3]
    assert set(cell["rows"][0]) == {"step", "eval_reward"} and "eval_reward" not in cell["rows"][3]
    assert {"reward_mean", "grad_norm"} <= set(cell["rows"][2]) and "run_dir" not in cell["config"]


def test_unchanged_code_is_fresh_and_changed_numbers_or_recipe_are_stale(made, tmp_path, capsys):
    suite, report = made
    assert freshness.main([str(report), "--suite", str(suite)]) == 0
    assert "1 of 1 cells fresh" in capsys.readouterr().out

    copy = tmp_path / "report"
    copy.mkdir()
    data = json.loads((report / freshness.FINGERPRINT_FILE).read_text())
    data["cells"]["toy2d_mode/flow_grpo"]["rows"][2]["reward_mean"] += 1e-3  # what a changed kernel would do
    (copy / freshness.FINGERPRINT_FILE).write_text(json.dumps(data))
    assert freshness.main([str(copy), "--suite", str(suite)]) == 1
    out = capsys.readouterr().out
    assert "STALE: step 2 reward_mean" in out and "stale: toy2d_mode/flow_grpo" in out

    changed = tmp_path / "changed.yaml"  # the suite's recipe moved after the report was made
    changed.write_text(yaml.safe_dump({**SUITE, "defaults": {**SUITE["defaults"],
                                                            "algorithm": {"group_size": 4, "lr": 2.0e-3}}}))
    verdicts = freshness.check_fresh(report, str(changed), progress=lambda line: None)
    assert verdicts["toy2d_mode/flow_grpo"][0] == "recipe: algorithm.lr"


def test_a_cancelling_loss_is_compared_at_the_scale_of_its_terms(made, tmp_path):
    """The loss of the machine that made a report, -0.0568984, rerun elsewhere as -0.0568909 (7.5e-6 apart, 1.3e-4
    relative: rounding of O(1) terms): fresh. A changed loss (1e-3) and a rerun at a learning rate 10% off are
    stale by their rows alone, the recipe check aside."""
    assert freshness.row_differences([{"step": 2, "loss": -0.0568984}], [{"step": 2, "loss": -0.0568909}]) == []
    assert freshness.row_differences([{"step": 2, "loss": -0.0568984}], [{"step": 2, "loss": -0.0558984}]) == [
        "step 2 loss -0.0568984 -> -0.0558984"]
    assert freshness.row_differences([{"step": 2, "reward_mean": 0.0568984}],
                                     [{"step": 2, "reward_mean": 0.0568909}]) != []  # no cancelling sum: relative
    _, report = made
    cell = json.loads((report / freshness.FINGERPRINT_FILE).read_text())["cells"]["toy2d_mode/flow_grpo"]
    moved = json.loads(json.dumps(cell))
    moved["config"]["algorithm"]["lr"] *= 1.1
    rows = freshness.rerun_rows(moved, freshness.STEPS, tmp_path / "rerun")
    assert any(line.startswith(("step 2", "step 3")) for line in freshness.row_differences(cell["rows"], rows))


def test_rounding_passes_and_a_missing_value_differs():
    stored = [{"step": 1, "reward_mean": 0.5, "loss": 1e-9}]
    assert freshness.row_differences(stored, [{"step": 1, "reward_mean": 0.5 + 1e-7, "loss": 3e-9}]) == []
    assert freshness.row_differences(stored, [{"step": 1, "loss": 1e-9}]) == ["step 1 reward_mean 0.5 -> missing"]


def test_bad_input_is_one_line(tmp_path, capsys, made):
    suite, report = made
    assert freshness.main([str(tmp_path), "--suite", str(suite)]) == 2
    assert "no fingerprint" in capsys.readouterr().err
    assert freshness.main([str(report), "--suite", str(suite), "--cells", "toy2d_mode/nope"]) == 2
    assert "--cells toy2d_mode/nope: not in" in capsys.readouterr().err
    (tmp_path / freshness.FINGERPRINT_FILE).write_text("{")
    with pytest.raises(ConfigError, match="not a readable fingerprint"):
        freshness.read_fingerprint(tmp_path)


def test_the_committed_quick_example_has_a_fingerprint_of_every_cell():
    """reports/example-quick can be checked: `make report-check` reruns its cells (not here: a few CPU-minutes)."""
    from flowzoo.benchmark.run.suite import load_suite

    data = freshness.read_fingerprint(ROOT / "reports" / "example-quick")
    suite = load_suite("quick")
    assert len(data["cells"]) == len(suite.algorithms) * len(suite.tasks) == 45
    assert all(cell["seed"] == 0 and len(cell["rows"]) == data["steps"] + 1 for cell in data["cells"].values())
