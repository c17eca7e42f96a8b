"""Claims about what a reward gain cost (:mod:`benchmark.analysis.costs`: spread kept, gold gain, unseen-prompt gain),
with the rules that decide them; the claim sets of the studies call them (``claim_sets/``), so each is judged on
every seed set and replicated like the step claims (:mod:`benchmark.study.claims`).

The margins are ours, fixed with the claims before any run that logs the columns was looked at (2026-12-03):

* ``SPREAD_MARGIN`` 0.05: a cell that keeps less than 5% of the base's per-prompt spread fewer than the baseline does
  narrows by no practical difference;
* ``GOLD`` judgments have no margin: the gold gain's CI above 0 (the judge agrees with the proxy) or below 0 (the
  proxy rose while the judge fell: reward hacking);
* ``UNSEEN_MARGIN`` 0.05 reward: an unseen-prompt gain within 0.05 of the baseline's generalises as it does.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from flowzoo.benchmark.analysis.stats import bootstrap_ci
from flowzoo.benchmark.study.claims import INF, cell_runs, ci_text, claim_row, estimate, paired, task_tag

SPREAD_MARGIN = 0.05
UNSEEN_MARGIN = 0.05


def _no_runs(table: pd.DataFrame, task: str, *cells: str) -> bool:
    """Whether a cell the claim reads ran no run of ``task`` (a study of other tasks, a cell not re-run): such a
    claim reads "no runs", as the step claims do, not that its runs lack a column."""
    return any(cell_runs(table, task, cell).empty for cell in cells)


def narrowing_claim(table: pd.DataFrame, task: str, cell: str, name: str, label: str,
                    reference: str = "flow_grpo") -> dict:
    """"``name``'s gain narrows each prompt's samples more than the reference's": paired (cell - reference) spread
    kept over seeds; reproduced if its CI lies below 0, contradicted if it lies above -SPREAD_MARGIN."""
    claim = f"{name}'s gain narrows each prompt's samples more than Flow-GRPO's ({label})"
    rule = (f"spread kept (final / base mean pairwise distance of a prompt's samples), paired {cell} - {reference}: "
            f"reproduced if its CI lies below 0; contradicted if it lies above -{SPREAD_MARGIN} (less than 5% of the "
            "base's spread: no practical difference); else inconclusive")
    if _no_runs(table, task, cell, reference):
        return claim_row(claim, rule, "no runs", "not tested")
    diff, reference_mean = paired(table, task, cell, reference, "spread_kept")
    diff = diff[np.isfinite(diff)]
    if diff.size < 2:
        return claim_row(claim, rule, "no spread logged (runs before eval_spread)", "not tested")
    low, high = bootstrap_ci(diff)
    measured = (f"spread kept: {reference} {reference_mean:.3f}, {cell} {reference_mean + diff.mean():.3f}; "
                f"difference {diff.mean():+.3f} {ci_text(low, high)} (n {diff.size})")
    figure = estimate(f"{cell} - {reference}: spread kept ({task_tag(task)})", "difference", diff.mean(), low, high,
                      "spread kept", reproduced=(-INF, 0), contradicted=(-SPREAD_MARGIN, INF))
    if high < 0:
        return claim_row(claim, rule, measured, "reproduced", figure)
    if low > -SPREAD_MARGIN:
        return claim_row(claim, rule, measured, "contradicted" + (" (it keeps more)" if low > 0 else ""), figure)
    return claim_row(claim, rule, measured, f"inconclusive (CI width {high - low:.3f})", figure)


def gold_changes(table: pd.DataFrame, task: str, cell: str) -> tuple[np.ndarray, np.ndarray] | str:
    """(gold gain, reward gain) over the cell's seeds on ``task``, or why there are none: "no runs", or no gold
    logged (fewer than 2 runs with one)."""
    runs = cell_runs(table, task, cell)
    if runs.empty:
        return "no runs"
    if "gold_gain" not in runs or runs["gold_gain"].notna().sum() < 2:
        return "no gold measure logged (runs before train.gold)"
    return (runs["gold_gain"].dropna().to_numpy(float),
            (runs["final_reward"] - runs["base"]).to_numpy(float))


def gold_claim(table: pd.DataFrame, task: str, cell: str, name: str, label: str, gold: str) -> dict:
    """"``name``'s reward gain is no reward hacking": the cell's gold gain over seeds; reproduced if its CI lies above
    0, contradicted if below 0 (the proxy rose, the judge fell)."""
    claim = f"{name}'s reward gain is confirmed by a judge it never trains on, {gold} (no reward hacking; {label})"
    rule = ("gold gain (final - base of the gold judge, signed so that positive is better by it) over seeds: "
            "reproduced if its CI lies above 0; contradicted if it lies below 0 (hacking); else inconclusive")
    changes = gold_changes(table, task, cell)
    if isinstance(changes, str):
        return claim_row(claim, rule, changes, "not tested")
    gain, proxy = changes
    low, high = bootstrap_ci(gain)
    measured = (f"gold gain {gain.mean():+.4f} {ci_text(low, high)} beside a reward gain {proxy.mean():+.3f} "
                f"(n {gain.size})")
    figure = estimate(f"{cell}: gold gain ({task_tag(task)})", "difference", gain.mean(), low, high, "gold gain",
                      reproduced=(0, INF), contradicted=(-INF, 0))
    if low > 0:
        return claim_row(claim, rule, measured, "reproduced", figure)
    if high < 0:
        return claim_row(claim, rule, measured, "contradicted (reward hacking)", figure)
    return claim_row(claim, rule, measured, f"inconclusive (CI width {high - low:.3g})", figure)


def unseen_claim(table: pd.DataFrame, task: str, cell: str, name: str, label: str,
                 reference: str = "flow_grpo") -> dict:
    """"``name`` generalises to prompts never trained on as the reference does": paired (cell - reference)
    unseen-prompt gain; reproduced if its CI lies above -UNSEEN_MARGIN, contradicted if below it."""
    claim = f"{name} generalises to prompts never trained on as Flow-GRPO does ({label})"
    rule = (f"unseen-prompt gain (final - base reward on prompts never trained on), paired {cell} - {reference}: "
            f"reproduced if its CI lies above -{UNSEEN_MARGIN}; contradicted if it lies below -{UNSEEN_MARGIN}; "
            "else inconclusive")
    if _no_runs(table, task, cell, reference):
        return claim_row(claim, rule, "no runs", "not tested")
    diff, reference_mean = paired(table, task, cell, reference, "unseen_gain")
    diff = diff[np.isfinite(diff)]
    if diff.size < 2:
        return claim_row(claim, rule, "no unseen prompts evaluated (prompts.unseen and unseen_every unset)",
                         "not tested")
    low, high = bootstrap_ci(diff)
    measured = (f"unseen-prompt gain: {reference} {reference_mean:+.3f}, {cell} {reference_mean + diff.mean():+.3f}; "
                f"difference {diff.mean():+.3f} {ci_text(low, high)} (n {diff.size})")
    figure = estimate(f"{cell} - {reference}: unseen-prompt gain ({task_tag(task)})", "difference", diff.mean(), low,
                      high, "reward", reproduced=(-UNSEEN_MARGIN, INF), contradicted=(-INF, -UNSEEN_MARGIN))
    if low > -UNSEEN_MARGIN:
        return claim_row(claim, rule, measured, "reproduced", figure)
    if high < -UNSEEN_MARGIN:
        return claim_row(claim, rule, measured, "contradicted", figure)
    return claim_row(claim, rule, measured, f"inconclusive (CI width {high - low:.3f})", figure)
