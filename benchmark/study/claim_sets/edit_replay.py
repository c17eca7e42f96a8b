"""Does off-policy replay help instruction editing as it does (or does not) text-to-image? The edit tier's claims
(suite ``edit-replay-study``), each with the rule that decides its verdict, fixed and committed with the suite before
any of its runs.

The claims carry OP-GRPO's (arXiv 2604.04142: replaying stored high-reward trajectories with a sequence-level
importance correction saves steps over Flow-GRPO) to edits, where a sample is judged against its source image: the
edit reward ``shapes_edit`` is the mean of an ``edit`` term (the asked change is made) and a ``preserve`` term
(nothing else changed; rewards/shapes_edit.py). Edit RL's own failure is a gain in the edit term paid for in the
preserve term, so the study's gold measure is the preserve term alone (``train.gold: {name: shapes_edit,
edit_weight: 0, preserve_weight: 1}``; ``gold_gain`` = its final - base change).

Input: the study's run table and paired effects on ``tiny_edit_rare`` (the 4 rare edits;
:func:`benchmark.study.verdicts.analyze_study`), cells ``flow_grpo`` and ``op_grpo``. Margins (ours, fixed with the
rules): :data:`REWARD_MARGIN` 0.05 reward (the reuse study's), :data:`PRESERVE_MARGIN` 0.05 of the preserve term (a twentieth of its [0, 1] range). Verdicts from
where the 95% CI lies against each rule's zones (:mod:`benchmark.study.zone_claims`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from flowzoo.benchmark.analysis.stats import bootstrap_ci
from flowzoo.benchmark.study.claims import (
    INF,
    SAVING_ZONES,
    ClaimSet,
    ci_text,
    claim_row,
    estimate,
    ratio_claim,
    register,
    saving_judge,
)
from flowzoo.benchmark.study.cost_claims import gold_changes
from flowzoo.benchmark.study.zone_claims import effect_claim, paired_claim, zone_verdict

TASK = "tiny_edit_rare"
LABEL = "rare edits, tiny edit tier"
REWARD_MARGIN = 0.05
PRESERVE_MARGIN = 0.05
CELLS = {"flow_grpo": "Flow-GRPO", "op_grpo": "OP-GRPO"}
KEEPS = ((-PRESERVE_MARGIN, INF), (-INF, -PRESERVE_MARGIN))  # (reproduced, contradicted) of "does not fall"


def _saving(effects: pd.DataFrame, metric: str) -> dict:
    unit = "NFE" if metric.startswith("nfe") else "steps"
    claim = f"off-policy replay (OP-GRPO) reaches 80% of Flow-GRPO's edit-reward gain in fewer {unit} ({LABEL})"
    rule = (f"{unit} to 80% of Flow-GRPO's gain, op_grpo / flow_grpo: reproduced if the ratio's CI lies below 1; "
            "contradicted if at or above 1")
    also = "nfe_to_80" if unit == "steps" else "steps_to_80"
    return ratio_claim(effects, TASK, "op_grpo", claim, rule, saving_judge, metric=metric, also=also, **SAVING_ZONES)


def _final_reward(effects: pd.DataFrame) -> dict:
    claim = f"OP-GRPO loses no final edit reward against Flow-GRPO ({LABEL})"
    rule = (f"final reward, op_grpo - flow_grpo over the seeds both ran: reproduced if its CI lies above "
            f"-{REWARD_MARGIN}; contradicted if it lies below -{REWARD_MARGIN}; else inconclusive")
    return effect_claim(TASK, effects, "op_grpo", "flow_grpo", "final_reward", claim, rule,
                        (-REWARD_MARGIN, INF), (-INF, -REWARD_MARGIN))


def _keeps_source(table: pd.DataFrame, cell: str) -> dict:
    claim = (f"{CELLS[cell]}'s edit-reward gain is not paid for by changing what the instruction did not ask for: "
             f"the preserve term does not fall ({LABEL})")
    rule = (f"preserve-term change (final - base, gold_gain) of {cell} over seeds: reproduced if its CI lies above "
            f"-{PRESERVE_MARGIN}; contradicted if it lies below -{PRESERVE_MARGIN}; else inconclusive")
    changes = gold_changes(table, TASK, cell)
    if isinstance(changes, str):
        return claim_row(claim, rule, changes.replace("gold measure", "preserve term"), "not tested")
    change, reward = changes
    low, high = bootstrap_ci(change)
    measured = (f"preserve change {change.mean():+.3f} {ci_text(low, high)} beside an edit-reward gain "
                f"{np.nanmean(reward):+.3f} (n {change.size})")
    figure = estimate(f"{cell}: preserve change (edit)", "difference", change.mean(), low, high, "preserve",
                      reproduced=KEEPS[0], contradicted=KEEPS[1])
    return claim_row(claim, rule, measured, zone_verdict(low, high, *KEEPS), figure)


def _keeps_as_flow_grpo(table: pd.DataFrame) -> dict:
    claim = f"replayed samples keep the source as well as Flow-GRPO's fresh ones: no larger preserve loss ({LABEL})"
    rule = (f"preserve-term change, paired op_grpo - flow_grpo: reproduced if its CI lies above -{PRESERVE_MARGIN}; "
            f"contradicted if it lies below -{PRESERVE_MARGIN}; else inconclusive")
    return paired_claim(TASK, table, "op_grpo", "flow_grpo", "gold_gain", claim, rule, lambda _mean: KEEPS,
                        "preserve change")


def edit_claims(table: pd.DataFrame, effects: pd.DataFrame) -> list[dict]:
    """The edit-replay study's claims (module docstring), in a fixed order."""
    return [_saving(effects, "steps_to_80"), _saving(effects, "nfe_to_80"), _final_reward(effects),
            *(_keeps_source(table, cell) for cell in CELLS), _keeps_as_flow_grpo(table)]


register(ClaimSet("edit-replay", edit_claims, (TASK,),
                  note="Gold measure: the preserve term of the edit reward alone (what an edit must not change).",
                  description="off-policy replay on the tiny edit tier: OP-GRPO against Flow-GRPO, steps and what "
                              "the gain costs the source (suite edit-replay-study)"))
