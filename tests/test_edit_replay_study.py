"""The edit-replay study (suite edit-replay-study, claim set edit-replay): the suite expands to its two cells on the
edit tier with the preserve term as its gold measure, its held-out seeds are used by no other suite, and the claim
set judges synthetic runs built to give known verdicts (and flips them when the runs say otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowzoo.benchmark.study.claims import claim_set, judge, names
from flowzoo.benchmark.study.verdicts import analyze_study
from tests.synthetic_runs import write_run

SUITES = Path(__file__).resolve().parents[1] / "benchmark" / "suites"
STEPS = [0, 10, 20, 30, 40]
TASK = "tiny_edit_rare"


def test_the_suite_expands_to_its_cells_on_the_edit_tier(tmp_path):
    from flowzoo.benchmark.run.suite import expand, load_suite, select

    suite = load_suite("edit-replay-study")
    assert suite.claims == "edit-replay"
    configs = expand(select(suite, seed_set="exploration"), tmp_path)
    assert len(configs) == 10 and {c.seed for c in configs} == {0, 1, 2, 3, 4}
    cells = {c.algorithm_name: c for c in configs if c.seed == 0}
    assert set(cells) == {"flow_grpo", "op_grpo"}
    for config in cells.values():
        assert config.model.name == "tiny_edit" and config.prompts.source == "files"
        assert config.prompts.train == config.prompts.test == "benchmark/prompts/tiny_edit_rare.jsonl"
        assert config.train.gold == {"name": "shapes_edit", "edit_weight": 0.0, "preserve_weight": 1.0}
    op = cells["op_grpo"].algorithm
    assert op["off_policy_groups"] * op["replay_k"] / op["group_size"] == pytest.approx(0.25)
    shared = ("lr", "clip_range", "num_steps", "timestep_fraction", "group_size")
    # the recipe is the rare edit task's config (benchmark/configs/tiny_edit_rare_flow_grpo.yaml), stated before any run
    import yaml

    recipe = yaml.safe_load((SUITES.parent / "configs" / "tiny_edit_rare_flow_grpo.yaml").read_text())
    assert {k: cells["flow_grpo"].algorithm[k] for k in shared} == {k: recipe["algorithm"][k] for k in shared}
    assert cells["flow_grpo"].train.steps == recipe["train"]["steps"]
    assert {k: cells["flow_grpo"].algorithm[k] for k in shared} == {k: op[k] for k in shared}


def test_the_replication_seeds_are_held_out_from_every_other_suite():
    from flowzoo.benchmark.run.suite import load_suite

    held_out = set(load_suite("edit-replay-study").seed_sets["replication"])
    for path in SUITES.glob("*.yaml"):
        if path.stem != "edit-replay-study":
            assert not held_out & set(load_suite(path.stem).seeds), path.stem


def _write(root: Path, op_rewards, op_preserve) -> None:
    """4 seeds of both cells; Flow-GRPO gains 0.4 while its preserve term rises 0.1."""
    cells = {"flow_grpo": ([0.4, 0.5, 0.6, 0.7, 0.8], [0.5, 0.55, 0.6, 0.6, 0.6]),
             "op_grpo": (op_rewards, op_preserve)}
    for algorithm, (rewards, preserve) in cells.items():
        for seed in range(4):
            jitter = 0.01 * seed
            write_run(root, TASK, algorithm, seed, STEPS, [r + (jitter if i == 4 else 0) for i, r in enumerate(rewards)],
                      {"eval_gold": [p - (jitter if i == 4 else 0) for i, p in enumerate(preserve)]})


def _verdicts(root: Path) -> list[str]:
    table, effects, _, _ = analyze_study(root, smooth=1, also_vs=claim_set("edit-replay").references, resamples=400)
    claims, _ = judge(table, effects, None, "edit-replay")
    return [verdict.split(" ")[0] for verdict in claims["verdict"]]


def test_the_claim_set_judges_synthetic_runs(tmp_path):
    """OP-GRPO at Flow-GRPO's 80% in half the steps, the same final reward, its preserve term up 0.08 (Flow-GRPO's
    0.1: within the margin)."""
    assert "edit-replay" in names()
    assert claim_set("edit-replay").source == "benchmark/study/claim_sets/edit_replay.py"
    _write(tmp_path, [0.4, 0.75, 0.8, 0.8, 0.8], [0.5, 0.55, 0.58, 0.58, 0.58])
    # steps, NFE, final reward, Flow-GRPO keeps the source, OP-GRPO keeps it, OP-GRPO as well as Flow-GRPO
    assert _verdicts(tmp_path) == ["reproduced"] * 6


def test_the_verdicts_follow_the_runs(tmp_path):
    """OP-GRPO slower, lower, and paying for its gain with the source: every claim about it contradicted."""
    _write(tmp_path, [0.4, 0.4, 0.45, 0.5, 0.6], [0.5, 0.45, 0.4, 0.35, 0.3])
    verdicts = _verdicts(tmp_path)
    assert verdicts[0] == verdicts[1] == "contradicted"
    assert verdicts[2] == "contradicted" and verdicts[3] == "reproduced"
    assert verdicts[4] == verdicts[5] == "contradicted"
