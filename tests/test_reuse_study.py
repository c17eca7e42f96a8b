"""The reuse study (suite reuse-study, claim set reuse-toy): the suite expands to the designed cells, its seed sets
are held out from every other suite, the claim set is registered and judges synthetic runs built to give known
verdicts (and flips them when the runs say otherwise), and Flow-GRPO's update logs where its clip binds by advantage
sign (the GRPO-Guard claim's measure)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flowzoo.algorithms.engine.stats import CLIP_FRAC_NEG, CLIP_FRAC_POS
from flowzoo.algorithms.engine.tally import UpdateTally
from flowzoo.algorithms.engine.distributed import SINGLE_PROCESS
from flowzoo.algorithms.engine.losses import PPOTerms, binding_clips
from flowzoo.benchmark.study.claims import claim_set, judge, names
from flowzoo.benchmark.study.verdicts import analyze_study
from tests.synthetic_runs import write_run

SUITES = Path(__file__).resolve().parents[1] / "benchmark" / "suites"


def test_the_suite_expands_to_the_designed_cells(tmp_path):
    from flowzoo.benchmark.run.suite import expand, load_suite, select

    suite = load_suite("reuse-study")
    assert suite.claims == "reuse-toy"
    configs = expand(select(suite, seed_set="exploration"), tmp_path)
    cells = {(c.task, c.algorithm_name): c.algorithm for c in configs if c.seed == 0}
    assert len(cells) == 11 and len(configs) == 110
    for method in ("flow_grpo", "flow_dppo"):  # epochs are the only difference within a method
        epochs = {task: cells[(task, method)]["inner_epochs"] for task, alg in cells if alg == method}
        assert epochs == {"toy2d_sep64_sparse": 1, "toy2d_sep64_sparse@e2": 2, "toy2d_sep64_sparse@e4": 4}
        assert {cells[(task, method)]["minibatches"] for task in epochs} == {4}
    share = {task: a["off_policy_groups"] * a["replay_k"] / a["group_size"]
             for (task, alg), a in cells.items() if alg == "op_grpo"}
    assert share == {"toy2d_sep64_sparse@p0": 0.0, "toy2d_sep64_sparse@p12.5": 0.125, "toy2d_sep64_sparse": 0.25,
                     "toy2d_sep64_sparse@p43.75": 0.4375}
    assert {a["replay_prompts"] for (_, alg), a in cells.items() if alg == "op_grpo"} == {"buffer"}
    assert cells[("toy2d_sep64_sparse", "grpo_guard")]["clip_range"] == pytest.approx(1e-3)
    assert all(a["lr"] == pytest.approx(1e-4) for a in cells.values())


#: a suite and the suites that may share its seeds: its own re-run at tuned recipes pairs with it seed by seed
TWINS = {"reuse-study": {"reuse-study", "reuse-study-tuned"}, "reuse-tiny-study": {"reuse-tiny-study"}}


@pytest.mark.parametrize("suite_name", sorted(TWINS))
def test_the_replication_seeds_are_held_out_from_every_other_suite(suite_name):
    from flowzoo.benchmark.run.suite import load_suite

    held_out = set(load_suite(suite_name).seed_sets["replication"])
    for path in SUITES.glob("*.yaml"):
        if path.stem not in TWINS[suite_name]:
            other = load_suite(path.stem)
            assert not held_out & set(other.seeds), path.stem


def _tuned_dir(root: Path) -> Path:
    """Tuned files of the four methods as ``flowzoo tune --out`` writes them (values chosen to be recognisable)."""
    import yaml

    keys = {"flow_grpo": {"lr": 1.25e-4, "clip_range": 0.03},
            "flow_dppo": {"lr": 2e-4, "kl_mask_threshold": 1e-4},
            "grpo_guard": {"lr": 3e-4, "clip_range": 2e-3},
            "op_grpo": {"lr": 1.07e-4, "off_policy_groups": 0.327, "replay_k": 2, "t_off": 1}}
    for algorithm, values in keys.items():
        path = root / "toy2d_sep64_sparse" / f"{algorithm}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"suite": "reuse-study-tuned", "task": "toy2d_sep64_sparse",
                                        "algorithm": algorithm, "algorithm_keys": values, "sampler_keys": {}}))
    return root


def test_the_tuned_suite_pins_what_makes_each_cell_and_tunes_the_rest(tmp_path):
    """Epoch counts and the proportion cells' off-policy share stay as designed under the tuned layer; every other
    key is the method's tuned value, and OP-GRPO's own cell keeps its tuned proportion."""
    from dataclasses import replace

    from flowzoo.benchmark.run.suite import expand, load_suite, select

    suite = load_suite("reuse-study-tuned")
    assert suite.claims == "reuse-toy-tuned" and suite.seed_sets == load_suite("reuse-study").seed_sets
    suite = replace(select(suite, seed_set="exploration"), tuned=str(_tuned_dir(tmp_path / "tuned")))
    configs = expand(suite, tmp_path / "runs")
    cells = {(c.task, c.algorithm_name): c.algorithm for c in configs if c.seed == 0}
    assert len(cells) == 12 and len(configs) == 120
    for method, lr in (("flow_grpo", 1.25e-4), ("flow_dppo", 2e-4)):
        epochs = {task: cells[(task, method)]["inner_epochs"] for task, alg in cells if alg == method}
        assert epochs == {"toy2d_sep64_sparse": 1, "toy2d_sep64_sparse@e2": 2, "toy2d_sep64_sparse@e4": 4}
        assert all(cells[(task, method)]["lr"] == pytest.approx(lr) for task in epochs)
    share = {task: a["off_policy_groups"] * a["replay_k"] / a["group_size"]
             for (task, alg), a in cells.items() if alg == "op_grpo"}
    assert share == {"toy2d_sep64_sparse@p0": 0.0, "toy2d_sep64_sparse@p12.5": 0.125,
                     "toy2d_sep64_sparse@p25": 0.25, "toy2d_sep64_sparse@p43.75": 0.4375,
                     "toy2d_sep64_sparse": pytest.approx(0.327 * 2 / 8)}
    assert all(a["lr"] == pytest.approx(1.07e-4) and a["t_off"] == 1 for (_, alg), a in cells.items() if alg == "op_grpo")
    assert cells[("toy2d_sep64_sparse", "grpo_guard")]["clip_range"] == pytest.approx(2e-3)


def test_the_tiny_suite_expands_to_its_cells(tmp_path):
    from flowzoo.benchmark.run.suite import expand, load_suite, select

    suite = load_suite("reuse-tiny-study")
    assert suite.claims == "reuse-tiny"
    configs = expand(select(suite, seed_set="replication"), tmp_path)
    cells = {(c.task, c.algorithm_name): c.algorithm for c in configs if c.seed == 310}
    assert len(cells) == 6 and len(configs) == 30
    assert {task: a["inner_epochs"] for (task, alg), a in cells.items() if alg == "flow_dppo"} == {
        "tiny_counting_rare": 1, "tiny_counting_rare@e4": 4}
    op = cells[("tiny_counting_rare", "op_grpo")]
    assert op["off_policy_groups"] * op["replay_k"] / op["group_size"] == 0.25
    assert all(a["lr"] == pytest.approx(1e-3) for a in cells.values())


STEPS = [0, 10, 20, 30, 40]
BASE = [0.0, 0.1, 0.2, 0.3, 0.4]
SPREAD = [1.0, 0.95, 0.9, 0.9, 0.9]
GOLD = [1.0, 0.9, 0.8, 0.7, 0.6]  # a distance: its gain is base - final, 0.4
#: cell -> (task, algorithm, eval curve, spread curve, gold-distance curve, NFE per step, extra columns)
CELLS = {
    "flow_grpo": ("toy2d_sep64_sparse", "flow_grpo", BASE, SPREAD, GOLD, 10,
                  {"clip_frac_neg_adv": 0.10, "clip_frac_pos_adv": 0.02, "clip_frac": 0.06}),
    "flow_grpo@e2": ("toy2d_sep64_sparse@e2", "flow_grpo", BASE, SPREAD, GOLD, 15, {}),
    # 4 epochs of clipping: lower final reward, narrower samples, a worse gold distance
    "flow_grpo@e4": ("toy2d_sep64_sparse@e4", "flow_grpo", [0.0, 0.2, 0.3, 0.25, 0.2], [1.0, 0.9, 0.8, 0.6, 0.5],
                     [1.0, 0.95, 0.95, 1.0, 1.1], 25, {}),
    "flow_dppo": ("toy2d_sep64_sparse", "flow_dppo", BASE, SPREAD, GOLD, 10, {}),
    # 2 and 4 epochs under the KL mask: at 80% of the gain in half the steps, nothing lost; 4 is no faster than 2
    "flow_dppo@e2": ("toy2d_sep64_sparse@e2", "flow_dppo", [0.0, 0.2, 0.35, 0.4, 0.45], SPREAD, GOLD, 20, {}),
    "flow_dppo@e4": ("toy2d_sep64_sparse@e4", "flow_dppo", [0.0, 0.2, 0.35, 0.4, 0.4], SPREAD, GOLD, 25, {}),
    "grpo_guard": ("toy2d_sep64_sparse", "grpo_guard", BASE, SPREAD, [1.0, 0.9, 0.8, 0.6, 0.5], 10,
                   {"clip_frac_neg_adv": 0.05, "clip_frac_pos_adv": 0.05, "clip_frac": 0.05}),
    "op_grpo": ("toy2d_sep64_sparse", "op_grpo", [0.0, 0.1, 0.25, 0.35, 0.4], SPREAD, GOLD, 10, {}),
    "op_grpo@p0": ("toy2d_sep64_sparse@p0", "op_grpo", BASE, SPREAD, GOLD, 10, {}),
    "op_grpo@p12.5": ("toy2d_sep64_sparse@p12.5", "op_grpo", BASE, SPREAD, GOLD, 10, {}),
    "op_grpo@p43.75": ("toy2d_sep64_sparse@p43.75", "op_grpo", [0.0, 0.1, 0.2, 0.3, 0.38], SPREAD, GOLD, 10, {}),
}


def _write(root: Path, cells: dict, seeds=range(4)) -> None:
    for task, algorithm, rewards, spread, gold, nfe, extra in cells.values():
        for seed in seeds:
            jitter = 0.01 * seed
            columns = {"nfe": [nfe * s for s in STEPS], "eval_spread": spread,
                       "eval_gold_distance": [g + (jitter if i else 0) for i, g in enumerate(gold)],
                       **{k: [float("nan")] + [v + jitter / 10] * 4 for k, v in extra.items()}}
            write_run(root, task, algorithm, seed, STEPS, [r + (jitter if i == 4 else 0) for i, r in enumerate(rewards)],
                      columns)


def _verdicts(root: Path, rules="reuse-toy", references=None) -> dict[str, str]:
    references = references or claim_set("reuse-toy").references
    table, effects, _, _ = analyze_study(root, smooth=1, also_vs=references, resamples=400)
    claims, _ = judge(table, effects, None, rules)
    return dict(zip(claims["claim"], claims["verdict"]))


def test_the_claim_set_is_registered_and_judges_synthetic_runs(tmp_path):
    from dataclasses import replace

    from flowzoo.benchmark.study.claim_sets.reuse_study import TOY, design_claims

    picking = design_claims(replace(TOY, dppo_best_epochs=None))  # the rule picks the count from the runs
    assert "reuse-toy" in names()
    assert claim_set("reuse-toy").source == "benchmark/study/claim_sets/reuse_study.py"
    _write(tmp_path, CELLS)
    verdicts = _verdicts(tmp_path, picking)
    heads = {claim: verdict.split(" ")[0] for claim, verdict in verdicts.items()}
    assert len(heads) == 21
    by_letter = lambda letter: [v for c, v in heads.items() if c.startswith(f"({letter})")]  # noqa: E731
    # (a) 4 clipped epochs lose reward, diversity and gold; their steps to the target are censored (no saving)
    assert by_letter("a")[:3] == ["reproduced"] * 3 and by_letter("a")[3] == "contradicted"
    # (b) the KL mask loses nothing at 4 epochs, keeps what clipping loses, and saves steps
    assert by_letter("b") == ["reproduced"] * 5
    # (c) the best epoch count is 2 (4 is not 5% faster): fewer steps than OP-GRPO but more NFE (20 a step vs 10)
    reuse = {c: v for c, v in verdicts.items() if c.startswith("(c)")}
    assert all("Flow-DPPO at 2 epochs, picked on this seed set" in c for c in reuse)
    assert [v.split(" ")[0] for v in reuse.values()] == ["contradicted", "reproduced", "reproduced", "reproduced",
                                                         "reproduced"]
    # the count fixed on the exploration seeds is the one judged
    fixed = [c for c in _verdicts(tmp_path, design_claims(replace(TOY, dppo_best_epochs=4))) if c.startswith("(c)")]
    assert all("Flow-DPPO at 4 epochs, fixed on the exploration seeds" in c for c in fixed)
    # (d) Flow-GRPO's clip binds on negatives more; GRPO-Guard balances it, gains more by the gold judge, loses no reward
    assert by_letter("d") == ["reproduced"] * 4
    # (e) 25% beats 12.5% and 43.75%, saves steps over 0%, and 0% trains as Flow-GRPO
    assert by_letter("e") == ["reproduced"] * 3


def test_the_verdicts_follow_the_runs(tmp_path):
    """The same rules on runs that say otherwise: clipping loses nothing at 4 epochs, 12.5% is faster than 25%."""
    cells = dict(CELLS)
    cells["flow_grpo@e4"] = ("toy2d_sep64_sparse@e4", "flow_grpo", BASE, SPREAD, GOLD, 25, {})
    cells["op_grpo@p12.5"] = ("toy2d_sep64_sparse@p12.5", "op_grpo", [0.0, 0.35, 0.4, 0.4, 0.4], SPREAD, GOLD, 10, {})
    _write(tmp_path, cells)
    verdicts = _verdicts(tmp_path)
    first = {c: v.split(" ")[0] for c, v in verdicts.items()}
    assert [v for c, v in first.items() if c.startswith("(a)")][:3] == ["contradicted"] * 3
    sweet = next(v for c, v in first.items() if "~25%" in c)
    assert sweet == "contradicted"


def test_binding_clips_count_the_clip_that_stops_the_gradient():
    ratio = torch.tensor([1.2, 1.2, 0.8, 0.8, 1.01, 0.99])
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    positive, negative = binding_clips(ratio, advantages, 0.05)
    assert positive.tolist() == [True, False, False, False, False, False]
    assert negative.tolist() == [False, False, False, True, False, False]
    # the update's tally: fractions of the positive and negative pairs, over every chunk
    tally = UpdateTally({}, "cpu", clip_range=0.05)
    terms = PPOTerms(torch.zeros(6), ratio, (ratio - 1).abs() > 0.05)
    zeros = torch.zeros(6)
    tally.add(torch.arange(6), terms, zeros, zeros, zeros, zeros, advantages)
    tally.add(torch.arange(2), PPOTerms(torch.zeros(2), ratio[:2], terms.clipped[:2]), zeros[:2], zeros[:2],
              zeros[:2], zeros[:2], torch.tensor([1.0, 0.0]))
    _, fractions = tally.finish(SINGLE_PROCESS)
    assert fractions == {CLIP_FRAC_POS: pytest.approx(2 / 4), CLIP_FRAC_NEG: pytest.approx(1 / 3)}
    assert UpdateTally({}, "cpu").finish(SINGLE_PROCESS)[1] == {}  # not counted unless asked


@pytest.mark.parametrize("name", ["flow_grpo", "grpo_guard"])
def test_flow_grpo_and_grpo_guard_log_where_their_clip_binds(toy_model, toy_prompts, name):
    from flowzoo import algorithms, rewards

    alg = algorithms.get(name)(toy_model, rewards.build("toy_mode"), {"group_size": 4, "lr": 3e-2, "kl_beta": 0.0,
                                                                        "minibatches": 2, "clip_range": 1e-3}, seed=0)
    rows = [alg.step(*toy_prompts).row() for _ in range(3)]
    logged = [r for r in rows if CLIP_FRAC_POS in r and CLIP_FRAC_NEG in r]
    assert logged and all(0 <= r[CLIP_FRAC_POS] <= 1 and 0 <= r[CLIP_FRAC_NEG] <= 1 for r in logged)
    assert any(r[CLIP_FRAC_POS] + r[CLIP_FRAC_NEG] > 0 for r in logged)


def test_the_tuned_rules_read_the_p25_cell_as_the_proportions_reference(tmp_path):
    """reuse-toy-tuned: the same rules, the ~25% reference its @p25 cell and reuse by replay OP-GRPO's own pick."""
    cells = dict(CELLS)
    cells["op_grpo@p25"] = ("toy2d_sep64_sparse@p25", "op_grpo", *CELLS["op_grpo"][2:])
    # OP-GRPO at its tuned pick: slower than the @p25 cell, so (e) must not read it
    cells["op_grpo"] = ("toy2d_sep64_sparse", "op_grpo", BASE, SPREAD, GOLD, 10, {})
    _write(tmp_path, cells)
    verdicts = _verdicts(tmp_path, "reuse-toy-tuned", claim_set("reuse-toy-tuned").references)
    first = {c: v.split(" ")[0] for c, v in verdicts.items()}
    assert len(first) == 21
    assert [v for c, v in first.items() if c.startswith("(e)")] == ["reproduced"] * 3
    assert all("OP-GRPO at its tuned recipe" in c for c in first if c.startswith("(c)") and "NFE" not in c)


def test_the_tiny_rules_leave_the_proportion_claims_untested_and_read_a_gold_score(tmp_path):
    """reuse-tiny: 1 and 4 epochs only, a gold judge whose gain is final - base, no proportion cells."""
    tiny = {}
    for cell, (task, algorithm, rewards, spread, gold, nfe, extra) in CELLS.items():
        if cell.endswith(("@e2",)) or "@p" in cell:
            continue
        tiny[cell] = (task.replace("toy2d_sep64_sparse", "tiny_counting_rare"), algorithm, rewards, spread,
                      [2 - g for g in gold], nfe, extra)  # a score: higher is better
    for task, algorithm, rewards, spread, gold, nfe, extra in tiny.values():
        for seed in range(4):
            jitter = 0.01 * seed
            columns = {"nfe": [nfe * s for s in STEPS], "eval_spread": spread,
                       "eval_gold": [g - (jitter if i else 0) for i, g in enumerate(gold)],
                       **{k: [float("nan")] + [v + jitter / 10] * 4 for k, v in extra.items()}}
            write_run(tmp_path, task, algorithm, seed, STEPS,
                      [r + (jitter if i == 4 else 0) for i, r in enumerate(rewards)], columns)
    verdicts = _verdicts(tmp_path, "reuse-tiny", claim_set("reuse-tiny").references)
    assert len(verdicts) == 21
    proportions = [v for c, v in verdicts.items() if c.startswith("(e)")]
    assert proportions == ["not tested"] * 3
    first = {c: v.split(" ")[0] for c, v in verdicts.items()}
    # the same verdicts as the toy design's on the same curves: 4 clipped epochs lose reward, diversity and gold
    assert [v for c, v in first.items() if c.startswith("(a)")][:3] == ["reproduced"] * 3
    assert [v for c, v in first.items() if c.startswith("(d)")] == ["reproduced"] * 4
    assert all("of 1 and 4" in rule for rule in _rules_of(tmp_path) if "best epoch count" in rule)


def _rules_of(root: Path) -> list[str]:
    table, effects, _, _ = analyze_study(root, smooth=1, also_vs=claim_set("reuse-tiny").references, resamples=100)
    claims, _ = judge(table, effects, None, "reuse-tiny")
    return list(claims["rule"])
