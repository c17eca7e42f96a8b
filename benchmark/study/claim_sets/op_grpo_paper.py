"""The OP-GRPO paper's claims, each with the rule that decides its verdict, and its claim set on the toy tier.

Claims are quoted from the OP-GRPO paper ("OP-GRPO: Efficient Off-Policy GRPO for Flow-Matching Models"; its
"Training Efficiency", "Sequence-Level Importance Correction", "Trajectory Truncation" and ablation paragraphs), with
the decoupled methods' and the prompt curricula's claims the study tests beside them. The rules were fixed before the
runs of the separable-task study were looked at; the machinery that judges them on every seed set is
:mod:`benchmark.study.claims`.

Input: the study's run table and paired effects (:func:`benchmark.study.verdicts.analyze_study`, with ``op_grpo`` and
``flow_grpo@buffer_prompts`` among the references) on the sparse task ``toy2d_sep64_sparse`` and the dense task
``toy2d_sep64_dense`` (claim set ``op-grpo-toy``, suite ``op-grpo-study``). :func:`tiny_claims` gives a subset of the
same rules on one task of the image tier (claim sets ``op-grpo-tiny-counting`` and ``op-grpo-tiny-rare-counting``,
each its own file beside this one).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.stats import fisher_exact

from flowzoo.benchmark.study.cost_claims import gold_claim, narrowing_claim, unseen_claim
from flowzoo.benchmark.analysis.stats import bootstrap_ci
from flowzoo.benchmark.study.claims import (
    INF,
    SAVING_ZONES,
    STEPS_METRIC,
    ClaimSet,
    cell_runs,
    ci_text,
    claim_row,
    estimate,
    find_effect,
    paired,
    ratio_claim,
    register,
    saving_judge,
    saving_side,
    task_tag,
)

SPARSE, DENSE = "toy2d_sep64_sparse", "toy2d_sep64_dense"
PAPER_STEPS_RATIO = 0.342
#: clip rates that differ by less than this are "no practical difference" (claim: 11.8% vs > 40%)
CLIP_MARGIN = 0.02
#: the paper's gap between the two clip rates: > 40% naive - 11.8% with the correction
PAPER_CLIP_GAP = 0.40 - 0.118
PROPORTION_CELLS = {"op_grpo@p12.5": "12.5%", "op_grpo": "25%", "op_grpo@p37.5": "37.5%", "op_grpo@p50": "50%"}


def _steps_claim(effects: pd.DataFrame, task: str, label: str) -> dict:
    claim = f"OP-GRPO needs 34.2% of Flow-GRPO's steps to reach its final performance ({label})"
    rule = ("judged on the steps to 80% of Flow-GRPO's gain (restricted means): reproduced if 0.342 lies in the CI of "
            "the OP-GRPO / Flow-GRPO ratio; contradicted if the CI excludes it")

    def judge(low: float, high: float) -> str:
        if low <= PAPER_STEPS_RATIO <= high:
            return "reproduced"
        return f"contradicted ({saving_side(low, high, 'saves steps, fewer than claimed')})"
    return ratio_claim(effects, task, "op_grpo", claim, rule, judge, paper=PAPER_STEPS_RATIO)


def _reuse_claim(table: pd.DataFrame, effects: pd.DataFrame) -> dict:
    claim = ("the saving comes from reusing stored high-reward trajectories (off-policy transitions), on sparse "
             "rewards where most groups are all-zero")
    rule = ("control op_grpo@no_reuse: same buffer prompts and stored initial noise, every transition regenerated "
            "(t_off 0, log w = 0). S = Flow-GRPO - OP-GRPO steps to 80% of the gain. Reproduced if the CI of "
            "(no_reuse - OP-GRPO) lies above S/2 (reuse explains most of the saving), contradicted if it lies below "
            "S/2")
    total = find_effect(effects, SPARSE, "flow_grpo", "op_grpo", STEPS_METRIC)
    reuse = find_effect(effects, SPARSE, "op_grpo", "op_grpo@no_reuse", STEPS_METRIC)
    if total is None or reuse is None:
        return claim_row(claim, rule, "no runs", "not tested")
    saving = -float(total["diff"])
    measured = (f"S = {saving:.1f} steps; no_reuse - OP-GRPO = {reuse['diff']:+.1f} "
                f"{ci_text(reuse['ci_low'], reuse['ci_high'])} steps (MDE {reuse['mde']:.1f}, n {int(reuse['n'])})")
    zones = (((saving / 2, INF), (-INF, saving / 2)) if saving > 0 else ((math.nan, math.nan), (-INF, INF)))
    figure = estimate(f"op_grpo@no_reuse - op_grpo: steps ({task_tag(SPARSE)})", "difference", reuse["diff"],
                      reuse["ci_low"], reuse["ci_high"], "steps", reproduced=zones[0], contradicted=zones[1])
    if saving <= 0:
        return claim_row(claim, rule, measured, "contradicted (OP-GRPO saves no steps here)", figure)
    if reuse["ci_low"] > saving / 2:
        return claim_row(claim, rule, measured, "reproduced", figure)
    if reuse["ci_high"] < saving / 2:
        return claim_row(claim, rule, measured,
                         "contradicted (the buffer's prompt choice, not reuse, saves the steps)", figure)
    return claim_row(claim, rule, measured,
                     f"inconclusive (CI width {reuse['ci_high'] - reuse['ci_low']:.1f} steps)", figure)


def _clip_claim(table: pd.DataFrame) -> dict:
    claim = "sequence-level correction keeps the off-policy clip rate near 11.8%, vs > 40% with naive per-step IS"
    rule = (f"paired (naive - sequence) clip rate of off-policy samples: reproduced if its CI lies above "
            f"{CLIP_MARGIN}; contradicted if it lies below {CLIP_MARGIN} (no practical difference, or the other way)")
    diff, sequence = paired(table, SPARSE, "op_grpo_naive_is", "op_grpo", "clip_frac_off")
    if diff.size < 2:
        return claim_row(claim, rule, "no runs", "not tested")
    low, high = bootstrap_ci(diff)
    naive = sequence + diff.mean()
    measured = (f"off-policy clip rate: sequence {sequence:.3f}, naive {naive:.3f}; difference {diff.mean():+.3f} "
                f"{ci_text(low, high)} (n {diff.size}; clip range 0.05, 4 minibatches)")
    figure = estimate(f"op_grpo_naive_is - op_grpo: off-policy clip ({task_tag(SPARSE)})", "difference", diff.mean(),
                      low, high, "clip rate", paper=PAPER_CLIP_GAP, reproduced=(CLIP_MARGIN, INF),
                      contradicted=(-INF, CLIP_MARGIN))
    if low > CLIP_MARGIN:
        return claim_row(claim, rule, measured, "reproduced (direction; levels differ from the paper's)", figure)
    if high < CLIP_MARGIN:
        return claim_row(claim, rule, measured, "contradicted", figure)
    return claim_row(claim, rule, measured, f"inconclusive (CI width {high - low:.3f})", figure)


def _late_steps_claim(table: pd.DataFrame) -> dict:
    claim = "late (low-noise) denoising steps make the importance weights ill-conditioned"
    rule = ("op_grpo_no_truncation reuses all T = 10 transitions and logs |log p_old - log p_off| per step: reproduced "
            "if the paired (late: steps 8-9) - (early: steps 0-1) mean over runs has a CI above 0; contradicted if below")
    cell = cell_runs(table, SPARSE, "op_grpo_no_truncation")
    early, late = ["abs_log_ratio_t0", "abs_log_ratio_t1"], ["abs_log_ratio_t8", "abs_log_ratio_t9"]
    if cell.empty or not set(early + late) <= set(cell.columns):
        return claim_row(claim, rule, "no per-step log-ratio columns", "not tested")
    e, l = cell[early].mean(axis=1).to_numpy(float), cell[late].mean(axis=1).to_numpy(float)
    low, high = bootstrap_ci(l - e)
    steps = [c for c in cell.columns if c.startswith("abs_log_ratio_t")]
    profile = ", ".join(f"{cell[c].mean():.3g}" for c in sorted(steps, key=lambda c: int(c.rsplit("t", 1)[1])))
    measured = (f"mean |log ratio| by step 0..9: {profile}; late - early {np.mean(l - e):+.3g} {ci_text(low, high)} "
                f"(n {len(cell)})")
    figure = estimate(f"no_truncation |log ratio|: steps 8-9 - 0-1 ({task_tag(SPARSE)})", "difference",
                      np.mean(l - e), low, high, "|log ratio|", reproduced=(0, INF), contradicted=(-INF, 0))
    if low > 0:
        return claim_row(claim, rule, measured, "reproduced", figure)
    if high < 0:
        return claim_row(claim, rule, measured, "contradicted", figure)
    return claim_row(claim, rule, measured, f"inconclusive (CI width {high - low:.3g})", figure)


#: the decoupled methods' papers: DiffusionNFT "3-25x more efficient than FlowGRPO" (Zheng et al., arXiv 2509.16117:
#: GenEval 0.24 -> 0.98 in ~1k steps vs Flow-GRPO's 0.95 in > 5k), AWM "up to 24x speedup over Flow-GRPO" (Xue et al.,
#: arXiv 2509.25050); judged at the low end of "several-fold": 3x, i.e. a steps ratio of 1/3
DECOUPLED_CLAIMS = {"diffusion_nft": "DiffusionNFT (paper: 3-25x more efficient than FlowGRPO)",
                    "awm": "AWM (paper: up to 24x speedup over Flow-GRPO)"}
SEVERAL_FOLD = 1 / 3


def _decoupled_claim(effects: pd.DataFrame, algorithm: str, task: str, label: str) -> dict:
    claim = f"{DECOUPLED_CLAIMS[algorithm]} reaches Flow-GRPO's level in several-fold fewer steps ({label})"
    rule = (f"steps to 80% of Flow-GRPO's gain, {algorithm} / Flow-GRPO: reproduced if the ratio's CI lies below 1/3 "
            "(at least 3x fewer steps); contradicted if it lies above 1/3; else inconclusive")

    def judge(low: float, high: float) -> str:
        if high < SEVERAL_FOLD:
            return "reproduced"
        if low > SEVERAL_FOLD:
            return f"contradicted ({saving_side(low, high, 'fewer steps, not several-fold')})"
        return "inconclusive"
    return ratio_claim(effects, task, algorithm, claim, rule, judge, reproduced=(0, SEVERAL_FOLD),
                              contradicted=(SEVERAL_FOLD, INF))


#: the prompt-curriculum controls (flow_grpo with a prompt sampler: algorithms/prompt_samplers), fixed with their rows
#: before their runs: cell -> label
CURRICULUM_CELLS = {"flow_grpo@buffer_prompts": "OP-GRPO's buffer prompts (no off-policy sample)",
                    "flow_grpo@variance": "CGPO's variance-prioritised prompts",
                    "flow_grpo@dynamic": "DAPO's dynamic sampling",
                    "flow_grpo@difficulty": "balanced difficulty filtering"}
FILTERING_CELLS = ("flow_grpo@dynamic", "flow_grpo@difficulty")
#: "no more steps than OP-GRPO" allows this relative margin (ours, fixed before the runs)
MATCH_MARGIN = 1.10
TASK_LABELS = ((SPARSE, "sparse"), (DENSE, "dense"))


def _curriculum_claim(effects: pd.DataFrame, cell: str, task: str, label: str) -> dict:
    claim = (f"a prompt curriculum alone, Flow-GRPO with {CURRICULUM_CELLS[cell]}, needs no more steps than OP-GRPO "
             f"({label})")
    rule = (f"steps to 80% of Flow-GRPO's gain, {cell} / op_grpo: reproduced if the ratio's CI lies below "
            f"{MATCH_MARGIN:.2f} (at most 10% more steps); contradicted if it lies above {MATCH_MARGIN:.2f}; else "
            "inconclusive. NFE ratio shown beside (the filtering samplers' extra rollouts)")

    def judge(low: float, high: float) -> str:
        if high < MATCH_MARGIN:
            return "reproduced" + (" (fewer steps than OP-GRPO)" if high < 1 else "")
        return "contradicted (needs more steps than OP-GRPO)" if low > MATCH_MARGIN else "inconclusive"
    return ratio_claim(effects, task, cell, claim, rule, judge, reference="op_grpo", also="nfe_to_80",
                              reproduced=(0, MATCH_MARGIN), contradicted=(MATCH_MARGIN, INF))



def _filter_cost_claim(effects: pd.DataFrame, cell: str, task: str, label: str) -> dict:
    claim = (f"{CURRICULUM_CELLS[cell]} saves samples, not only steps: fewer NFE to 80% of the gain than Flow-GRPO's "
             f"uniform prompts, its extra rollouts counted ({label})")
    rule = (f"NFE to 80% of the gain, {cell} / flow_grpo: reproduced if the CI lies below 1; contradicted if at or "
            "above 1")
    return ratio_claim(effects, task, cell, claim, rule, saving_judge, metric="nfe_to_80",
                              also=STEPS_METRIC, **SAVING_ZONES)


def _reuse_on_top_claim(effects: pd.DataFrame, task: str, label: str) -> dict:
    claim = f"OP-GRPO's off-policy reuse saves steps on top of its choice of prompts ({label})"
    rule = ("steps to 80% of the gain, op_grpo / flow_grpo@buffer_prompts (the same buffer-prompt share, no "
            "off-policy sample): reproduced if the CI lies below 1; contradicted if at or above 1")
    return ratio_claim(effects, task, "op_grpo", claim, rule, saving_judge,
                              reference="flow_grpo@buffer_prompts", **SAVING_ZONES)


def _reuse_alone_claim(effects: pd.DataFrame, task: str, label: str) -> dict:
    claim = f"OP-GRPO's off-policy reuse alone, with uniformly drawn prompts, saves steps over Flow-GRPO ({label})"
    rule = ("steps to 80% of the gain, op_grpo@uniform_prompts (replay_prompts: batch) / flow_grpo: reproduced if "
            "the CI lies below 1; contradicted if at or above 1")
    return ratio_claim(effects, task, "op_grpo@uniform_prompts", claim, rule, saving_judge, **SAVING_ZONES)


def _instability(table: pd.DataFrame, algorithm: str) -> tuple[int, int]:
    cell = cell_runs(table, SPARSE, algorithm)
    unstable = (~cell["finished"].astype(bool)) | cell["collapsed"].astype(bool)
    return int(unstable.sum()), len(cell)


def _ablation_claim(table: pd.DataFrame, effects: pd.DataFrame, algorithm: str, claim: str) -> dict:
    rule = ("unstable run = stopped by the non-finite guard or ending below its step-0 reward. Reproduced if more "
            "runs are unstable than OP-GRPO's (Fisher exact p < 0.05) or the final reward is below OP-GRPO's (CI < 0); "
            "contradicted if no run is unstable and the final-reward CI lies above -MDE; else inconclusive")
    if cell_runs(table, SPARSE, algorithm).empty:
        return claim_row(claim, rule, "no runs", "not tested")
    bad, n = _instability(table, algorithm)
    ref_bad, ref_n = _instability(table, "op_grpo")
    p = float(fisher_exact([[bad, n - bad], [ref_bad, ref_n - ref_bad]], alternative="greater")[1])
    final = find_effect(effects, SPARSE, "op_grpo", algorithm, "final_reward")
    bound = 1 - 0.05 ** (1 / n)  # one-sided 95% upper bound of the instability rate when 0 of n are unstable
    off = cell_runs(table, SPARSE, algorithm).get("off_policy_frac")
    ref_off = cell_runs(table, SPARSE, "op_grpo").get("off_policy_frac")
    share = (f"; realised off-policy share {off.mean():.3f} vs OP-GRPO's {ref_off.mean():.3f}"
             if off is not None and ref_off is not None else "")
    measured = (f"unstable {bad}/{n} (OP-GRPO {ref_bad}/{ref_n}, p {p:.2g}); final reward vs OP-GRPO "
                f"{final['diff']:+.3f} {ci_text(final['ci_low'], final['ci_high'])} (MDE {final['mde']:.3f}){share}")
    # drawn: the final-reward half of the rule (the instability counts' Fisher test is in the table)
    figure = estimate(f"{algorithm} - op_grpo: final reward ({task_tag(SPARSE)})", "difference", final["diff"],
                      final["ci_low"], final["ci_high"], "reward", reproduced=(-INF, 0),
                      contradicted=(-final["mde"], INF) if bad == 0 else (math.nan, math.nan))
    if p < 0.05 or final["ci_high"] < 0:
        return claim_row(claim, rule, measured, "reproduced", figure)
    if bad == 0 and final["ci_low"] > -final["mde"]:
        return claim_row(claim, rule, measured,
                         f"contradicted on this task (instability rate < {bound:.0%} at 95%)", figure)
    return claim_row(claim, rule, measured,
                     f"inconclusive (final-reward CI width {final['ci_high'] - final['ci_low']:.3f})", figure)


def _proportion_claim(effects: pd.DataFrame) -> dict:
    claim = "an off-policy proportion of ~25% is the best balance of speed and stability"
    rule = ("paired vs 25% (op_grpo) on steps to 80% of the gain and final reward: contradicted if another proportion is "
            "better on either with CI excluding 0; reproduced if none is better and at least one is worse; else "
            "inconclusive")
    parts, better, worse = [], [], []
    for cell, label in PROPORTION_CELLS.items():
        if cell == "op_grpo":
            continue
        steps = find_effect(effects, SPARSE, "op_grpo", cell, STEPS_METRIC)
        final = find_effect(effects, SPARSE, "op_grpo", cell, "final_reward")
        if steps is None or final is None:
            continue
        parts.append(f"{label}: steps {steps['diff']:+.1f} {ci_text(steps['ci_low'], steps['ci_high'])}, final "
                     f"{final['diff']:+.3f} {ci_text(final['ci_low'], final['ci_high'])}")
        if steps["ci_high"] < 0 or final["ci_low"] > 0:
            better.append(label)
        if steps["ci_low"] > 0 or final["ci_high"] < 0:
            worse.append(label)
    if not parts:
        return claim_row(claim, rule, "no runs (no proportion cells in this design)", "not tested")
    measured = "vs 25%: " + "; ".join(parts)
    if better:
        return claim_row(claim, rule, measured, f"contradicted ({', '.join(better)} better)")
    if worse:
        return claim_row(claim, rule, measured, "reproduced")
    return claim_row(claim, rule, measured, "inconclusive (no proportion differs)")


#: what a gain costs (benchmark/study/cost_claims.py), fixed before any run that logs spread or gold was looked at
#: (2026-12-03): cell -> its name in a claim
COST_CELLS = {"flow_grpo": "Flow-GRPO", "op_grpo": "OP-GRPO", "diffusion_nft": "DiffusionNFT", "awm": "AWM"}
TOY_GOLD = "the 2-Wasserstein distance to the target's ideal density (train.gold toy_w2)"
TINY_GOLD = "GenEval's partial credit beside the strict score"
UNSEEN_CELLS = {"op_grpo": "OP-GRPO", "flow_grpo@dynamic": "Flow-GRPO with DAPO's dynamic sampling",
                "diffusion_nft": "DiffusionNFT"}


def cost_claims(table: pd.DataFrame, tasks, cells, gold: str, unseen: bool = False) -> list[dict]:
    """The costs of the gain on ``tasks`` ((task, label) pairs): every cell of ``cells`` but Flow-GRPO against its
    spread kept, every cell's gold gain, and with ``unseen`` the unseen-prompt gain of :data:`UNSEEN_CELLS`."""
    rows = [narrowing_claim(table, task, cell, COST_CELLS[cell], label)
            for task, label in tasks for cell in cells if cell != "flow_grpo"]
    rows += [gold_claim(table, task, cell, COST_CELLS[cell], label, gold) for task, label in tasks for cell in cells]
    if unseen:
        rows += [unseen_claim(table, task, cell, name, label) for task, label in tasks
                 for cell, name in UNSEEN_CELLS.items()]
    return rows


#: the sparse task with every 8th condition never trained on (suite op-grpo-study; fixed 2026-12-04 before its runs)
UNSEEN_TASK = "toy2d_sep64_sparse_unseen"
UNSEEN_LABEL = "sparse, 8 of the 64 conditions never trained on"


def toy_claims(table: pd.DataFrame, effects: pd.DataFrame) -> list[dict]:
    """The toy study's claims (suite ``op-grpo-study``)."""
    return [
        _steps_claim(effects, SPARSE, "sparse binary reward, 64 conditions"),
        _steps_claim(effects, DENSE, "dense reward, same 64 conditions"),
        _reuse_claim(table, effects),
        _clip_claim(table),
        _late_steps_claim(table),
        _ablation_claim(table, effects, "op_grpo_no_truncation", "removing trajectory truncation causes instability"),
        _ablation_claim(table, effects, "op_grpo_no_correction", "removing the sequence correction leads to divergence"),
        _proportion_claim(effects),
        claim_row("in video generation the gap widens to 30.1% of the training time", "needs the Wan tier on a GPU",
                  "not run (CPU only)", "not tested"),
        *(_decoupled_claim(effects, algorithm, task, label) for algorithm in DECOUPLED_CLAIMS
          for task, label in TASK_LABELS),
        *(_curriculum_claim(effects, cell, task, label) for cell in CURRICULUM_CELLS for task, label in TASK_LABELS),
        *(_filter_cost_claim(effects, cell, task, label) for cell in FILTERING_CELLS for task, label in TASK_LABELS),
        *(_reuse_on_top_claim(effects, task, label) for task, label in TASK_LABELS),
        *(_reuse_alone_claim(effects, task, label) for task, label in TASK_LABELS),
        *cost_claims(table, TASK_LABELS, tuple(COST_CELLS), TOY_GOLD),
        *cost_claims(table, ((UNSEEN_TASK, UNSEEN_LABEL),), ("flow_grpo", "op_grpo", "diffusion_nft"), TOY_GOLD,
                     unseen=True),
    ]


def tiny_claims(task: str, label: str):
    """The claims of an image-tier study on ``task``: the toy rules, on that task; fixed with its suite before any of
    its runs."""

    def claims(table: pd.DataFrame, effects: pd.DataFrame) -> list[dict]:
        return [
            _steps_claim(effects, task, label),
            _reuse_on_top_claim(effects, task, label),
            *(_curriculum_claim(effects, cell, task, label)
              for cell in ("flow_grpo@buffer_prompts", "flow_grpo@dynamic")),
            _filter_cost_claim(effects, "flow_grpo@dynamic", task, label),
            _decoupled_claim(effects, "diffusion_nft", task, label),
            *cost_claims(table, ((task, label),), ("flow_grpo", "op_grpo", "diffusion_nft"), TINY_GOLD, unseen=True),
        ]

    return claims


#: the cells the paper's claims pair others with besides the baseline (added to the study's references when they ran)
REFERENCES = ("op_grpo", "flow_grpo@buffer_prompts")
#: the report's note under the claims' heading
NOTE = "Sparse task unless the claim says otherwise."

register(ClaimSet("op-grpo-toy", toy_claims, (SPARSE, DENSE), REFERENCES, note=NOTE,
                  description="the OP-GRPO paper's claims on the toy tier's sparse and dense tasks (suite "
                              "op-grpo-study)"))
