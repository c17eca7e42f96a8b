"""A study's metrics, fixed before its runs are looked at (:data:`METRICS`, primary :data:`PRIMARY`), the training-log
columns its run table averages, and the words a row of effects or gains reads as (:func:`verdict`,
:func:`conditioning`). :mod:`benchmark.study.verdicts` computes them, :mod:`benchmark.study.tables` shows them."""

from __future__ import annotations

import math

import pandas as pd

from flowzoo.benchmark.analysis import effects

#: the study's metrics, in report order: (name, effects.Metric)
METRICS = (
    effects.cost_metric("steps_to_50", "step", effects.gain_target(0.5)),
    effects.cost_metric("steps_to_80", "step", effects.gain_target(0.8)),
    effects.cost_metric("nfe_to_50", "nfe", effects.gain_target(0.5)),
    effects.cost_metric("nfe_to_80", "nfe", effects.gain_target(0.8)),
    effects.value_metric("final_reward", "final"),
    effects.value_metric("auc", "auc"),
    effects.cost_metric("steps_to_final", "step", effects.gain_target(1.0)),
)
PRIMARY = "steps_to_80"
#: training-log columns averaged over a run's steps in the run table (absent ones are skipped)
DIAGNOSTICS = ("zero_std_frac", "off_policy_frac", "clip_frac", "clip_frac_on", "clip_frac_off", "weight_ess",
               "log_weight_std", "approx_kl", "clip_frac_pos_adv", "clip_frac_neg_adv", "dppo_masked_frac",
               "dppo_kl_score_mean")
#: per-timestep |log p_old - log p_off| of the reused transitions (OP-GRPO logs one column per reused step k)
STEP_LOG_RATIO_PREFIX = "abs_log_ratio_t"
EARLY_STEPS = 10  # zero_std_frac is also reported over the first this many steps


def verdict(row: pd.Series) -> str:
    metric = next((m for m in METRICS if m.name == row["metric"]), None)
    return effects.verdict(row, metric.higher_is_better if metric else False, bool(metric and metric.is_cost))


def conditioning(row: pd.Series) -> str:
    """Plain words for a baseline's gain row: whether the targets built on its gain are well-conditioned."""
    if not (math.isfinite(row["ci_low"]) and math.isfinite(row["ci_high"])):
        return "n<2"
    if row["ci_low"] > 0:
        return "learns: targets well-conditioned"
    if row["gain"] > 0:
        return "gain CI reaches 0: targets weak"
    return "no gain: no target"
