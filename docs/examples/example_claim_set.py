"""MixGRPO-Flash against Flow-GRPO on the quick suite's toy tasks: the example claim set of docs/adding-a-study.md.

Three claims in the form a paper states them, each with the rule that decides its verdict, fixed before any run:
MixGRPO-Flash (SDE steps in a sliding window, the steps after it compressed into a coarser DPM-Solver++ tail) reaches
80% of Flow-GRPO's gain in no more training steps, with fewer model evaluations, and loses no final reward. The
margins are this example's, not a paper's numbers. Save this file in ``benchmark/study/claim_sets/`` to add it to
the zoo; a suite then names it with ``claims: example-mix-grpo-flash``.
"""

from __future__ import annotations

import pandas as pd

from flowzoo.benchmark.study.claims import (
    INF,
    SAVING_ZONES,
    ClaimSet,
    ci_text,
    claim_row,
    estimate,
    find_effect,
    ratio_claim,
    register,
    saving_judge,
    task_tag,
)

ALGORITHM, BASELINE = "mix_grpo_flash", "flow_grpo"
#: the tasks the claims read, with their label in a claim's text (the first also matches a suite without `claims:`)
TASKS = (("toy2d_target", "sparse disc reward"), ("toy2d_mode", "dense mode reward"))
#: "no more steps" allows a steps ratio up to this (10% more)
STEPS_MARGIN = 1.10
#: "no reward lost" allows a final-reward difference down to minus this
REWARD_MARGIN = 0.05


def steps_claim(effects: pd.DataFrame, task: str, label: str) -> dict:
    """A ratio of restricted means with its CI, judged by our own rule (:func:`ratio_claim` finds the row)."""
    claim = f"MixGRPO-Flash reaches 80% of Flow-GRPO's gain in no more steps ({label})"
    rule = (f"steps to 80% of Flow-GRPO's gain, {ALGORITHM} / {BASELINE}: reproduced if the ratio's CI lies below "
            f"{STEPS_MARGIN:.2f}; contradicted if it lies above {STEPS_MARGIN:.2f}; else inconclusive")

    def judge(low: float, high: float) -> str:
        if high < STEPS_MARGIN:
            return "reproduced"
        return "contradicted (needs more steps)" if low > STEPS_MARGIN else "inconclusive"

    return ratio_claim(effects, task, ALGORITHM, claim, rule, judge, reference=BASELINE,
                       reproduced=(0, STEPS_MARGIN), contradicted=(STEPS_MARGIN, INF))


def nfe_claim(effects: pd.DataFrame, task: str, label: str) -> dict:
    """The same on another metric, judged by a shared rule (a ratio claimed below 1: :func:`saving_judge`)."""
    claim = f"MixGRPO-Flash needs fewer model evaluations (NFE) than Flow-GRPO to reach 80% of its gain ({label})"
    rule = (f"NFE to 80% of Flow-GRPO's gain, {ALGORITHM} / {BASELINE}: reproduced if the ratio's CI lies below 1; "
            "contradicted if at or above 1")
    return ratio_claim(effects, task, ALGORITHM, claim, rule, saving_judge, reference=BASELINE, metric="nfe_to_80",
                       **SAVING_ZONES)


def reward_claim(effects: pd.DataFrame, task: str, label: str) -> dict:
    """A paired difference read straight from the effects table, with its own measured text and figure."""
    claim = f"MixGRPO-Flash loses no final reward against Flow-GRPO ({label})"
    rule = (f"final reward, {ALGORITHM} - {BASELINE} over the seeds both ran: reproduced if the CI lies above "
            f"-{REWARD_MARGIN}; contradicted if it lies below -{REWARD_MARGIN}; else inconclusive")
    e = find_effect(effects, task, BASELINE, ALGORITHM, "final_reward")
    if e is None:
        return claim_row(claim, rule, "no runs", "not tested")
    low, high = float(e["ci_low"]), float(e["ci_high"])
    measured = f"difference {e['diff']:+.3f} {ci_text(low, high)} (MDE {e['mde']:.3f}, n {int(e['n'])})"
    figure = estimate(f"{ALGORITHM} - {BASELINE}: final reward ({task_tag(task)})", "difference", e["diff"], low, high,
                      "reward", reproduced=(-REWARD_MARGIN, INF), contradicted=(-INF, -REWARD_MARGIN))
    if low > -REWARD_MARGIN:
        return claim_row(claim, rule, measured, "reproduced", figure)
    if high < -REWARD_MARGIN:
        return claim_row(claim, rule, measured, "contradicted", figure)
    return claim_row(claim, rule, measured, f"inconclusive (CI width {high - low:.3f})", figure)


def claims(table: pd.DataFrame, effects: pd.DataFrame) -> list[dict]:
    """Every claim on every task, in a fixed order (the study lines the seed sets' rows up by position)."""
    return [row for task, label in TASKS
            for row in (steps_claim(effects, task, label), nfe_claim(effects, task, label),
                        reward_claim(effects, task, label))]


register(ClaimSet("example-mix-grpo-flash", claims, tasks=tuple(task for task, _ in TASKS),
                  description="docs/adding-a-study.md's example: MixGRPO-Flash vs Flow-GRPO on the quick suite's "
                              "toy tasks",
                  note="Each claim names its task."))
