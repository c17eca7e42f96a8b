"""The OP-GRPO paper's claims, each with the study's measured figure and a verdict decided by a fixed rule, on every
seed set of the study.

Claims are quoted from the OP-GRPO paper ("OP-GRPO: Efficient Off-Policy GRPO for Flow-Matching Models"; its
"Training Efficiency", "Sequence-Level Importance Correction", "Trajectory Truncation" and ablation paragraphs).
Verdicts: **reproduced**, **contradicted**, **inconclusive** (then the CI width says the smallest effect the study
could have seen), or **not tested**. Every rule is written next to its claim below and in the report, before the
figure, so the verdict is mechanical; all intervals are 95% bootstrap CIs over seeds that re-estimate the target in
every resample (:mod:`benchmark.analysis.effects`). The rules were fixed before the runs of the separable-task study were
looked at. Each claim is judged on every seed set of the study apart (the designers' ``exploration`` and held-out
``replication`` seeds, and any set a user names), each with its own target; the row says **replicated** only when the
two sets it compares give the same verdict (:func:`replication`: by default exploration and replication, or the
held-out set and a user's own).

Each judged claim also carries its figure as numbers (:func:`estimate`: the ratio or difference, its 95% CI, the
paper's value and the verdict zones its rule draws), which the study page plots (``claim_estimates.csv``).

Input: the study's run table and paired effects (:func:`benchmark.analysis.study.analyze_study`, with ``op_grpo`` among the
``also_vs`` references) on the sparse task ``toy2d_sep64_sparse`` and the dense task ``toy2d_sep64_dense`` (suite
``op-grpo-study``), or on the tiny tier's sparse counting task (suite ``tiny-counting-study``, a subset of the same
rules). A claim set belongs to the suite that designed it (its ``claims:`` key names one of :data:`CLAIM_SETS`), so a
renamed copy of the suite keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import fisher_exact

from benchmark.analysis.stats import bootstrap_ci
from benchmark.analysis.study_sets import REPLICATION_SETS
from flowzoo.errors import ConfigError

SPARSE, DENSE = "toy2d_sep64_sparse", "toy2d_sep64_dense"
#: the cost the steps claims are judged on: steps to 80% of Flow-GRPO's gain, a target its runs cross decisively (the
#: paper's "reach Flow-GRPO's final reward" puts the target on the baseline's noisy plateau; benchmark/analysis/study.py)
STEPS_METRIC = "steps_to_80"
PAPER_STEPS_RATIO = 0.342
#: clip rates that differ by less than this are "no practical difference" (claim: 11.8% vs > 40%)
CLIP_MARGIN = 0.02
#: the paper's gap between the two clip rates: > 40% naive - 11.8% with the correction
PAPER_CLIP_GAP = 0.40 - 0.118
PROPORTION_CELLS = {"op_grpo@p12.5": "12.5%", "op_grpo": "25%", "op_grpo@p37.5": "37.5%", "op_grpo@p50": "50%"}


def _ci(low: float, high: float, digits: int = 3) -> str:
    return f"[{low:.{digits}g}, {high:.{digits}g}]" if math.isfinite(low) and math.isfinite(high) else "[-]"


def _effect(effects: pd.DataFrame, task: str, reference: str, algorithm: str, metric: str) -> pd.Series | None:
    hit = effects[(effects["task"] == task) & (effects["reference"] == reference)
                  & (effects["algorithm"] == algorithm) & (effects["metric"] == metric)]
    return None if hit.empty or not hit.iloc[0]["n"] else hit.iloc[0]


def _cell(table: pd.DataFrame, task: str, algorithm: str) -> pd.DataFrame:
    return table[(table["task"] == task) & (table["algorithm"] == algorithm)].set_index("seed")


def _paired(table: pd.DataFrame, task: str, algorithm: str, reference: str, column: str) -> tuple[np.ndarray, float]:
    """(algorithm - reference differences of ``column`` over common seeds, mean of the reference)."""
    a, b = _cell(table, task, algorithm), _cell(table, task, reference)
    if column not in a or column not in b:
        return np.array([]), math.nan
    seeds = sorted(set(a.index) & set(b.index))
    return (a.loc[seeds, column] - b.loc[seeds, column]).to_numpy(float), float(b.loc[seeds, column].mean())


def _row(claim: str, rule: str, measured: str, verdict: str, figure: dict | None = None) -> dict:
    return {"claim": claim, "rule": rule, "measured": measured, "verdict": verdict, "figure": figure}


INF = math.inf


def estimate(label: str, kind: str, value: float, low: float, high: float, unit: str = "", paper: float = math.nan,
             reproduced: tuple[float, float] = (math.nan, math.nan),
             contradicted: tuple[float, float] = (math.nan, math.nan)) -> dict:
    """A claim's figure on one seed set as numbers: ``kind`` 'ratio' (drawn on a log axis) or 'difference' (in
    ``unit``), the estimate and its 95% CI, the paper's own value (NaN when the paper gives none) and the verdict
    zones of the rule: a CI inside ``reproduced`` reproduces the claim, one inside ``contradicted`` contradicts it
    (NaN bounds: no such zone; a claim judged by whether its CI covers ``paper`` has none)."""
    return {"label": label, "kind": kind, "unit": unit, "estimate": float(value), "ci_low": float(low),
            "ci_high": float(high), "paper": float(paper), "reproduced_low": float(reproduced[0]),
            "reproduced_high": float(reproduced[1]), "contradicted_low": float(contradicted[0]),
            "contradicted_high": float(contradicted[1])}


def _tag(task: str) -> str:
    """A task's short name in a figure: its last word (toy2d_sep64_sparse -> sparse)."""
    return task.rsplit("_", 1)[-1]


def _ratio_label(algorithm: str, reference: str, metric: str, task: str) -> str:
    unit = metric.partition("_to_")[0]
    return f"{algorithm} / {reference}: {unit.upper() if unit == 'nfe' else unit} ({_tag(task)})"


def _saving_side(low: float, high: float, saving: str) -> str:
    """Which way a steps-ratio CI that missed its claim points: ``saving`` (below 1), no saving, or more steps."""
    return saving if high < 1 else "no saving" if low <= 1 else "needs more steps"


def _steps_ratio_claim(effects: pd.DataFrame, task: str, algorithm: str, claim: str, rule: str, judge,
                       reference: str = "flow_grpo", metric: str = STEPS_METRIC, also: str | None = None,
                       paper: float = math.nan, reproduced=(math.nan, math.nan),
                       contradicted=(math.nan, math.nan)) -> dict:
    """A claim on ``algorithm`` / ``reference`` cost to 80% of the gain (steps, or ``metric``): ``judge(low, high)``
    of the ratio's CI gives the verdict; no runs or no CI are 'not tested' / 'inconclusive (no CI)'. ``also``: a
    second metric whose ratio the measured text shows beside it (e.g. NFE next to steps). ``paper``, ``reproduced``,
    ``contradicted``: the figure's marks (:func:`estimate`), which must say what ``judge`` decides."""
    e = _effect(effects, task, reference, algorithm, metric)
    if e is None:
        return _row(claim, rule, "no runs", "not tested")
    label = _ratio_label(algorithm, reference, metric, task)
    if not math.isfinite(float(e["target"])):  # every run censored at the budget: a ratio of 1 that compares nothing
        empty = estimate(label, "ratio", math.nan, math.nan, math.nan, paper=paper, reproduced=reproduced,
                         contradicted=contradicted)  # drawn as its zones and its verdict
        return _row(claim, rule, "no target: Flow-GRPO's mean final reward does not exceed the base model's in these "
                    "seeds", "not tested (no target)", empty)
    unit = metric.split("_")[0]
    measured = (f"ratio {e['ratio']:.2f} {_ci(e['ratio_low'], e['ratio_high'])} ({e['algorithm_mean']:.0f} vs "
                f"{e['reference_mean']:.0f} {unit}, reached {int(e['reached'])}/{int(e['n'])} vs "
                f"{int(e['reference_reached'])}/{int(e['n'])})")
    other = _effect(effects, task, reference, algorithm, also) if also else None
    if other is not None:
        measured += f"; {also.split('_')[0]} ratio {other['ratio']:.2f} {_ci(other['ratio_low'], other['ratio_high'])}"
    figure = estimate(label, "ratio", e["ratio"], e["ratio_low"],
                      e["ratio_high"], paper=paper, reproduced=reproduced, contradicted=contradicted)
    if not (math.isfinite(e["ratio_low"]) and math.isfinite(e["ratio_high"])):
        return _row(claim, rule, measured, "inconclusive (no CI)", figure)
    return _row(claim, rule, measured, judge(float(e["ratio_low"]), float(e["ratio_high"])), figure)


def _steps_claim(effects: pd.DataFrame, task: str, label: str) -> dict:
    claim = f"OP-GRPO needs 34.2% of Flow-GRPO's steps to reach its final performance ({label})"
    rule = ("judged on the steps to 80% of Flow-GRPO's gain (restricted means): reproduced if 0.342 lies in the CI of "
            "the OP-GRPO / Flow-GRPO ratio; contradicted if the CI excludes it")

    def judge(low: float, high: float) -> str:
        if low <= PAPER_STEPS_RATIO <= high:
            return "reproduced"
        return f"contradicted ({_saving_side(low, high, 'saves steps, fewer than claimed')})"
    return _steps_ratio_claim(effects, task, "op_grpo", claim, rule, judge, paper=PAPER_STEPS_RATIO)


def _reuse_claim(table: pd.DataFrame, effects: pd.DataFrame) -> dict:
    claim = ("the saving comes from reusing stored high-reward trajectories (off-policy transitions), on sparse "
             "rewards where most groups are all-zero")
    rule = ("control op_grpo@no_reuse: same buffer prompts and stored initial noise, every transition regenerated "
            "(t_off 0, log w = 0). S = Flow-GRPO - OP-GRPO steps to 80% of the gain. Reproduced if the CI of "
            "(no_reuse - OP-GRPO) lies above S/2 (reuse explains most of the saving), contradicted if it lies below "
            "S/2")
    total = _effect(effects, SPARSE, "flow_grpo", "op_grpo", STEPS_METRIC)
    reuse = _effect(effects, SPARSE, "op_grpo", "op_grpo@no_reuse", STEPS_METRIC)
    if total is None or reuse is None:
        return _row(claim, rule, "no runs", "not tested")
    saving = -float(total["diff"])
    measured = (f"S = {saving:.1f} steps; no_reuse - OP-GRPO = {reuse['diff']:+.1f} {_ci(reuse['ci_low'], reuse['ci_high'])}"
                f" steps (MDE {reuse['mde']:.1f}, n {int(reuse['n'])})")
    zones = (((saving / 2, INF), (-INF, saving / 2)) if saving > 0 else ((math.nan, math.nan), (-INF, INF)))
    figure = estimate(f"op_grpo@no_reuse - op_grpo: steps ({_tag(SPARSE)})", "difference", reuse["diff"],
                      reuse["ci_low"], reuse["ci_high"], "steps", reproduced=zones[0], contradicted=zones[1])
    if saving <= 0:
        return _row(claim, rule, measured, "contradicted (OP-GRPO saves no steps here)", figure)
    if reuse["ci_low"] > saving / 2:
        return _row(claim, rule, measured, "reproduced", figure)
    if reuse["ci_high"] < saving / 2:
        return _row(claim, rule, measured, "contradicted (the buffer's prompt choice, not reuse, saves the steps)",
                    figure)
    return _row(claim, rule, measured, f"inconclusive (CI width {reuse['ci_high'] - reuse['ci_low']:.1f} steps)",
                figure)


def _clip_claim(table: pd.DataFrame) -> dict:
    claim = "sequence-level correction keeps the off-policy clip rate near 11.8%, vs > 40% with naive per-step IS"
    rule = (f"paired (naive - sequence) clip rate of off-policy samples: reproduced if its CI lies above "
            f"{CLIP_MARGIN}; contradicted if it lies below {CLIP_MARGIN} (no practical difference, or the other way)")
    diff, sequence = _paired(table, SPARSE, "op_grpo_naive_is", "op_grpo", "clip_frac_off")
    if diff.size < 2:
        return _row(claim, rule, "no runs", "not tested")
    low, high = bootstrap_ci(diff)
    naive = sequence + diff.mean()
    measured = (f"off-policy clip rate: sequence {sequence:.3f}, naive {naive:.3f}; difference {diff.mean():+.3f} "
                f"{_ci(low, high)} (n {diff.size}; clip range 0.05, 4 minibatches)")
    figure = estimate(f"op_grpo_naive_is - op_grpo: off-policy clip ({_tag(SPARSE)})", "difference", diff.mean(), low,
                      high, "clip rate", paper=PAPER_CLIP_GAP, reproduced=(CLIP_MARGIN, INF),
                      contradicted=(-INF, CLIP_MARGIN))
    if low > CLIP_MARGIN:
        return _row(claim, rule, measured, "reproduced (direction; levels differ from the paper's)", figure)
    if high < CLIP_MARGIN:
        return _row(claim, rule, measured, "contradicted", figure)
    return _row(claim, rule, measured, f"inconclusive (CI width {high - low:.3f})", figure)


def _late_steps_claim(table: pd.DataFrame) -> dict:
    claim = "late (low-noise) denoising steps make the importance weights ill-conditioned"
    rule = ("op_grpo_no_truncation reuses all T = 10 transitions and logs |log p_old - log p_off| per step: reproduced "
            "if the paired (late: steps 8-9) - (early: steps 0-1) mean over runs has a CI above 0; contradicted if below")
    cell = _cell(table, SPARSE, "op_grpo_no_truncation")
    early, late = ["abs_log_ratio_t0", "abs_log_ratio_t1"], ["abs_log_ratio_t8", "abs_log_ratio_t9"]
    if cell.empty or not set(early + late) <= set(cell.columns):
        return _row(claim, rule, "no per-step log-ratio columns", "not tested")
    e, l = cell[early].mean(axis=1).to_numpy(float), cell[late].mean(axis=1).to_numpy(float)
    low, high = bootstrap_ci(l - e)
    steps = [c for c in cell.columns if c.startswith("abs_log_ratio_t")]
    profile = ", ".join(f"{cell[c].mean():.3g}" for c in sorted(steps, key=lambda c: int(c.rsplit("t", 1)[1])))
    measured = (f"mean |log ratio| by step 0..9: {profile}; late - early {np.mean(l - e):+.3g} {_ci(low, high)} "
                f"(n {len(cell)})")
    figure = estimate(f"no_truncation |log ratio|: steps 8-9 - 0-1 ({_tag(SPARSE)})", "difference",
                      np.mean(l - e), low, high, "|log ratio|", reproduced=(0, INF), contradicted=(-INF, 0))
    if low > 0:
        return _row(claim, rule, measured, "reproduced", figure)
    if high < 0:
        return _row(claim, rule, measured, "contradicted", figure)
    return _row(claim, rule, measured, f"inconclusive (CI width {high - low:.3g})", figure)


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
            return f"contradicted ({_saving_side(low, high, 'fewer steps, not several-fold')})"
        return "inconclusive"
    return _steps_ratio_claim(effects, task, algorithm, claim, rule, judge, reproduced=(0, SEVERAL_FOLD),
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
    return _steps_ratio_claim(effects, task, cell, claim, rule, judge, reference="op_grpo", also="nfe_to_80",
                              reproduced=(0, MATCH_MARGIN), contradicted=(MATCH_MARGIN, INF))


def _saving_judge(low: float, high: float) -> str:
    """A ratio claimed below 1: reproduced if its CI lies below 1, contradicted if it lies at or above 1."""
    if high < 1:
        return "reproduced"
    if low > 1:
        return "contradicted (costs more)"
    return "contradicted (no saving)" if low == 1 else "inconclusive"


#: the zones of :func:`_saving_judge` (a CI exactly at 1 from below is "no saving": contradicted)
SAVING_ZONES = {"reproduced": (0, 1), "contradicted": (1, INF)}


def _filter_cost_claim(effects: pd.DataFrame, cell: str, task: str, label: str) -> dict:
    claim = (f"{CURRICULUM_CELLS[cell]} saves samples, not only steps: fewer NFE to 80% of the gain than Flow-GRPO's "
             f"uniform prompts, its extra rollouts counted ({label})")
    rule = (f"NFE to 80% of the gain, {cell} / flow_grpo: reproduced if the CI lies below 1; contradicted if at or "
            "above 1")
    return _steps_ratio_claim(effects, task, cell, claim, rule, _saving_judge, metric="nfe_to_80",
                              also=STEPS_METRIC, **SAVING_ZONES)


def _reuse_on_top_claim(effects: pd.DataFrame, task: str, label: str) -> dict:
    claim = f"OP-GRPO's off-policy reuse saves steps on top of its choice of prompts ({label})"
    rule = ("steps to 80% of the gain, op_grpo / flow_grpo@buffer_prompts (the same buffer-prompt share, no "
            "off-policy sample): reproduced if the CI lies below 1; contradicted if at or above 1")
    return _steps_ratio_claim(effects, task, "op_grpo", claim, rule, _saving_judge,
                              reference="flow_grpo@buffer_prompts", **SAVING_ZONES)


def _reuse_alone_claim(effects: pd.DataFrame, task: str, label: str) -> dict:
    claim = f"OP-GRPO's off-policy reuse alone, with uniformly drawn prompts, saves steps over Flow-GRPO ({label})"
    rule = ("steps to 80% of the gain, op_grpo@uniform_prompts (replay_prompts: batch) / flow_grpo: reproduced if "
            "the CI lies below 1; contradicted if at or above 1")
    return _steps_ratio_claim(effects, task, "op_grpo@uniform_prompts", claim, rule, _saving_judge, **SAVING_ZONES)


def _instability(table: pd.DataFrame, algorithm: str) -> tuple[int, int]:
    cell = _cell(table, SPARSE, algorithm)
    unstable = (~cell["finished"].astype(bool)) | cell["collapsed"].astype(bool)
    return int(unstable.sum()), len(cell)


def _ablation_claim(table: pd.DataFrame, effects: pd.DataFrame, algorithm: str, claim: str) -> dict:
    rule = ("unstable run = stopped by the non-finite guard or ending below its step-0 reward. Reproduced if more "
            "runs are unstable than OP-GRPO's (Fisher exact p < 0.05) or the final reward is below OP-GRPO's (CI < 0); "
            "contradicted if no run is unstable and the final-reward CI lies above -MDE; else inconclusive")
    if _cell(table, SPARSE, algorithm).empty:
        return _row(claim, rule, "no runs", "not tested")
    bad, n = _instability(table, algorithm)
    ref_bad, ref_n = _instability(table, "op_grpo")
    p = float(fisher_exact([[bad, n - bad], [ref_bad, ref_n - ref_bad]], alternative="greater")[1])
    final = _effect(effects, SPARSE, "op_grpo", algorithm, "final_reward")
    bound = 1 - 0.05 ** (1 / n)  # one-sided 95% upper bound of the instability rate when 0 of n are unstable
    off = _cell(table, SPARSE, algorithm).get("off_policy_frac")
    ref_off = _cell(table, SPARSE, "op_grpo").get("off_policy_frac")
    share = (f"; realised off-policy share {off.mean():.3f} vs OP-GRPO's {ref_off.mean():.3f}"
             if off is not None and ref_off is not None else "")
    measured = (f"unstable {bad}/{n} (OP-GRPO {ref_bad}/{ref_n}, p {p:.2g}); final reward vs OP-GRPO "
                f"{final['diff']:+.3f} {_ci(final['ci_low'], final['ci_high'])} (MDE {final['mde']:.3f}){share}")
    # drawn: the final-reward half of the rule (the instability counts' Fisher test is in the table)
    figure = estimate(f"{algorithm} - op_grpo: final reward ({_tag(SPARSE)})", "difference", final["diff"],
                      final["ci_low"], final["ci_high"], "reward", reproduced=(-INF, 0),
                      contradicted=(-final["mde"], INF) if bad == 0 else (math.nan, math.nan))
    if p < 0.05 or final["ci_high"] < 0:
        return _row(claim, rule, measured, "reproduced", figure)
    if bad == 0 and final["ci_low"] > -final["mde"]:
        return _row(claim, rule, measured, f"contradicted on this task (instability rate < {bound:.0%} at 95%)",
                    figure)
    return _row(claim, rule, measured, f"inconclusive (final-reward CI width {final['ci_high'] - final['ci_low']:.3f})",
                figure)


def _proportion_claim(effects: pd.DataFrame) -> dict:
    claim = "an off-policy proportion of ~25% is the best balance of speed and stability"
    rule = ("paired vs 25% (op_grpo) on steps to 80% of the gain and final reward: contradicted if another proportion is "
            "better on either with CI excluding 0; reproduced if none is better and at least one is worse; else "
            "inconclusive")
    parts, better, worse = [], [], []
    for cell, label in PROPORTION_CELLS.items():
        if cell == "op_grpo":
            continue
        steps = _effect(effects, SPARSE, "op_grpo", cell, STEPS_METRIC)
        final = _effect(effects, SPARSE, "op_grpo", cell, "final_reward")
        if steps is None or final is None:
            continue
        parts.append(f"{label}: steps {steps['diff']:+.1f} {_ci(steps['ci_low'], steps['ci_high'])}, final "
                     f"{final['diff']:+.3f} {_ci(final['ci_low'], final['ci_high'])}")
        if steps["ci_high"] < 0 or final["ci_low"] > 0:
            better.append(label)
        if steps["ci_low"] > 0 or final["ci_high"] < 0:
            worse.append(label)
    if not parts:
        return _row(claim, rule, "no runs (no proportion cells in this design)", "not tested")
    measured = "vs 25%: " + "; ".join(parts)
    if better:
        return _row(claim, rule, measured, f"contradicted ({', '.join(better)} better)")
    if worse:
        return _row(claim, rule, measured, "reproduced")
    return _row(claim, rule, measured, "inconclusive (no proportion differs)")


def _toy_claims(table: pd.DataFrame, effects: pd.DataFrame) -> list[dict]:
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
        _row("in video generation the gap widens to 30.1% of the training time", "needs the Wan tier on a GPU",
             "not run (CPU only)", "not tested"),
        *(_decoupled_claim(effects, algorithm, task, label) for algorithm in DECOUPLED_CLAIMS
          for task, label in TASK_LABELS),
        *(_curriculum_claim(effects, cell, task, label) for cell in CURRICULUM_CELLS for task, label in TASK_LABELS),
        *(_filter_cost_claim(effects, cell, task, label) for cell in FILTERING_CELLS for task, label in TASK_LABELS),
        *(_reuse_on_top_claim(effects, task, label) for task, label in TASK_LABELS),
        *(_reuse_alone_claim(effects, task, label) for task, label in TASK_LABELS),
    ]


#: the image-tier studies' tasks (docs/tiny.md): the tiny tier's 12 counting prompts, strict GenEval reward, 5 sampling
#: steps (suite ``tiny-counting-study``); the 4 of them the base gets right least often, same reward and sampling
#: (suite ``tiny-rare-counting-study``)
TINY_SPARSE = "tiny_counting_sparse"
TINY_RARE = "tiny_counting_rare"


def _tiny_claims(task: str, label: str):
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
        ]

    return claims


@dataclass(frozen=True)
class ClaimSet:
    """A study's claims with what they read: ``tasks`` (the first is the one every claim set's steps claim reads:
    how runs without a named claim set are matched to one) and ``references``, the cells besides the baseline its
    claims pair others with (the study adds those that ran)."""

    name: str
    claims: Callable[[pd.DataFrame, pd.DataFrame], list[dict]]
    tasks: tuple[str, ...]
    references: tuple[str, ...] = ("op_grpo", "flow_grpo@buffer_prompts")
    description: str = ""


#: every claim set by name; a suite names its own with its ``claims:`` key (benchmark/suites/*.yaml)
CLAIM_SETS = {cs.name: cs for cs in (
    ClaimSet("op-grpo-toy", _toy_claims, (SPARSE, DENSE),
             description="the OP-GRPO paper's claims on the toy tier's sparse and dense tasks (suite op-grpo-study)"),
    ClaimSet("op-grpo-tiny-counting", _tiny_claims(TINY_SPARSE, "tiny text-to-image, strict counting"),
             (TINY_SPARSE,), description="the same rules on the tiny tier's counting task (tiny-counting-study)"),
    ClaimSet("op-grpo-tiny-rare-counting",
             _tiny_claims(TINY_RARE, "tiny text-to-image, strict counting, rare prompts"), (TINY_RARE,),
             description="the same rules on the tiny tier's rare counting prompts (tiny-rare-counting-study)"),
)}
NO_CLAIMS = "none"


def claim_set(name: str, option: str = "--claims") -> ClaimSet:
    """The claim set called ``name``; ConfigError naming the valid ones."""
    if name not in CLAIM_SETS:
        raise ConfigError(f"{option} {name!r}: no such claim set; claim sets: {', '.join(CLAIM_SETS)} (or "
                          f"{NO_CLAIMS})")
    return CLAIM_SETS[name]


def match_claim_set(tasks) -> ClaimSet | None:
    """The claim set whose first task ran (runs of a suite that names none); None when no claim set's does."""
    tasks = set(tasks)
    found = [cs for cs in CLAIM_SETS.values() if cs.tasks[0] in tasks]
    return found[0] if len(found) == 1 else None


def replication(verdicts: list[str]) -> str:
    """'replicated: V' when every seed set's verdict has the same first word V, else 'not replicated'."""
    heads = {v.split(" ")[0] for v in verdicts}
    if heads == {"not"}:
        return "not tested"
    return f"replicated: {heads.pop()}" if len(heads) == 1 else "not replicated"


def judge(table: pd.DataFrame, effects: pd.DataFrame, seed_sets: dict[str, list[int]] | None = None,
          claims=_toy_claims, pair: tuple[str, str] = REPLICATION_SETS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the claims table, the figures' table). Claims: one row per claim, with claim, rule, and per seed set
    ``measured <set>`` and ``verdict <set>``; when both sets of ``pair`` were judged, ``replication`` says whether
    their verdicts agree. Without seed sets (an effects table of one set) the columns are ``measured`` and
    ``verdict``. Figures: one row per (claim, seed set) with a figure (:func:`estimate`), its verdict beside it."""
    if "seed_set" not in effects or not seed_sets:
        per_set = {"all": claims(table, effects)}
        flat = pd.DataFrame([{k: v for k, v in row.items() if k != "figure"} for row in per_set["all"]])
        return flat, _figures(per_set)
    names = [name for name in seed_sets if name in set(effects["seed_set"])]
    per_set = {}
    for name in names:
        seeds = set(seed_sets[name])
        per_set[name] = claims(table[table["seed"].isin(seeds)], effects[effects["seed_set"] == name])
    rows = []
    for i, first in enumerate(per_set[names[0]]):
        row = {"claim": first["claim"], "rule": first["rule"]}
        for name in names:
            row[f"measured {name}"], row[f"verdict {name}"] = per_set[name][i]["measured"], per_set[name][i]["verdict"]
        if all(name in per_set for name in pair):
            row["replication"] = replication([per_set[name][i]["verdict"] for name in pair])
        rows.append(row)
    return pd.DataFrame(rows), _figures(per_set)


FIGURE_COLUMNS = ("claim", "seed_set", "verdict", "label", "kind", "unit", "estimate", "ci_low", "ci_high", "paper",
                  "reproduced_low", "reproduced_high", "contradicted_low", "contradicted_high")


def _figures(per_set: dict[str, list[dict]]) -> pd.DataFrame:
    rows = [{"claim": row["claim"], "seed_set": name, "verdict": row["verdict"], **row["figure"]}
            for name, claims in per_set.items() for row in claims if row.get("figure")]
    return pd.DataFrame(rows, columns=list(FIGURE_COLUMNS))


def claims_table(table: pd.DataFrame, effects: pd.DataFrame, seed_sets: dict[str, list[int]] | None = None,
                 claims=_toy_claims, pair: tuple[str, str] = REPLICATION_SETS) -> pd.DataFrame:
    """The claims table of :func:`judge`."""
    return judge(table, effects, seed_sets, claims, pair)[0]


def shown_sets(claims: pd.DataFrame) -> list[str]:
    """The seed sets a claims table shows: every judged set but ``all``, or ``all`` when it is the only one."""
    sets = [c[len("verdict "):] for c in claims.columns if c.startswith("verdict ")]
    return [s for s in sets if s != "all"] or sets


def render_claims(claims: pd.DataFrame, pair: tuple[str, str] = REPLICATION_SETS) -> list[str]:
    sets = [c[len("verdict "):] for c in claims.columns if c.startswith("verdict ")]
    agree = ("exploration and the held-out replication seeds agree" if tuple(pair) == REPLICATION_SETS
             else f"seed sets `{pair[0]}` and `{pair[1]}` agree")
    lines = ["## The paper's claims", "",
             "Each verdict follows the rule in its row, applied mechanically by `benchmark/analysis/study_claims.py` on each "
             "seed set apart (each with its own target from its own Flow-GRPO runs); **replicated** only when the "
             f"{agree}. Sparse task unless the claim says otherwise.", ""]
    if not sets:
        lines += ["| claim | rule | measured (95% CI) | verdict |", "|---|---|---|---|"]
        for _, row in claims.iterrows():
            lines.append(f"| {row['claim']} | {row['rule']} | {row['measured']} | **{row['verdict']}** |")
        return lines + [""]
    shown = shown_sets(claims)
    replicated = "replication" in claims
    lines += ["| claim | rule | " + " | ".join(f"{s}: measured (95% CI) | {s}: verdict" for s in shown)
              + (" | replication |" if replicated else " |"),
              "|---|---|" + "---|---|" * len(shown) + ("---|" if replicated else "")]
    for _, row in claims.iterrows():
        cells = " | ".join(f"{row[f'measured {s}']} | {row[f'verdict {s}']}" for s in shown)
        lines.append(f"| {row['claim']} | {row['rule']} | {cells} |"
                     + (f" **{row['replication']}** |" if replicated else ""))
    return lines + [""]
