"""Claims judged by zones: a rule names the interval a claim's 95% CI must lie inside to be reproduced and the one
for contradicted; a CI in neither is inconclusive. The verdict (:func:`zone_verdict`), a judge for
:func:`benchmark.study.claims.ratio_claim` (:func:`zone_judge`), and two paired differences on one task: of the
study's effects table (:func:`effect_claim`) and of a run-table column over the seeds both cells ran
(:func:`paired_claim`). The claim sets of ``claim_sets/`` build their rules from these."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from flowzoo.benchmark.analysis.stats import bootstrap_ci
from flowzoo.benchmark.study.claims import cell_runs, ci_text, claim_row, estimate, find_effect, paired


def zone_verdict(low: float, high: float, reproduced: tuple[float, float], contradicted: tuple[float, float],
                 digits: int = 3) -> str:
    """'reproduced' if the CI [low, high] lies inside the open interval ``reproduced``, 'contradicted' if inside
    ``contradicted``, else 'inconclusive' with the CI's width."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "inconclusive (no CI)"
    if reproduced[0] < low and high < reproduced[1]:
        return "reproduced"
    if contradicted[0] < low and high < contradicted[1]:
        return "contradicted"
    return f"inconclusive (CI width {high - low:.{digits}g})"


def zone_judge(reproduced: tuple[float, float], contradicted: tuple[float, float]):
    """A ``judge(low, high)`` for :func:`ratio_claim` from the rule's zones."""
    return lambda low, high: zone_verdict(low, high, reproduced, contradicted)


def effect_claim(task: str, effects: pd.DataFrame, cell: str, reference: str, metric: str, claim: str, rule: str,
                 reproduced: tuple[float, float], contradicted: tuple[float, float]) -> dict:
    """A paired difference of the effects table (``cell - reference`` on ``metric``) judged by its zones."""
    e = find_effect(effects, task, reference, cell, metric)
    if e is None:
        return claim_row(claim, rule, "no runs", "not tested")
    low, high = float(e["ci_low"]), float(e["ci_high"])
    measured = (f"{cell} - {reference}: {e['diff']:+.3f} {ci_text(low, high)} (MDE {e['mde']:.3f}, n {int(e['n'])})")
    figure = estimate(f"{cell} - {reference}: {metric.replace('_', ' ')}", "difference", e["diff"], low, high,
                      "reward", reproduced=reproduced, contradicted=contradicted)
    return claim_row(claim, rule, measured, zone_verdict(low, high, reproduced, contradicted), figure)


def paired_claim(task: str, table: pd.DataFrame, cell: str, reference: str, column: str, claim: str, rule: str,
                 zones,
                 unit: str) -> dict:
    """A paired ``cell - reference`` difference of a run-table ``column`` over common seeds, its bootstrap CI judged
    by ``zones(reference mean) -> (reproduced, contradicted)``; 'not tested' without runs or the column."""
    if cell_runs(table, task, cell).empty or cell_runs(table, task, reference).empty:
        return claim_row(claim, rule, "no runs", "not tested")
    diff, reference_mean = paired(table, task, cell, reference, column)
    diff = diff[np.isfinite(diff)]
    if diff.size < 2:
        return claim_row(claim, rule, f"{column} not logged", "not tested")
    low, high = bootstrap_ci(diff)
    reproduced, contradicted = zones(reference_mean)
    measured = (f"{column}: {reference} {reference_mean:.4g}, {cell} {reference_mean + diff.mean():.4g}; difference "
                f"{diff.mean():+.4g} {ci_text(low, high)} (n {diff.size})")
    figure = estimate(f"{cell} - {reference}: {unit}", "difference", diff.mean(), low, high, unit,
                      reproduced=reproduced, contradicted=contradicted)
    return claim_row(claim, rule, measured, zone_verdict(low, high, reproduced, contradicted), figure)
