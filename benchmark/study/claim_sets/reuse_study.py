"""The reuse study's claims: is a sample better reused by more epochs under a trust region (Flow-DPPO's KL mask), or by
replaying it later with an importance correction (OP-GRPO)? Each claim with the rule that decides its verdict, fixed
and committed with the suite ``reuse-study`` before any of its runs.

Sources of the claims: Flow-DPPO (arXiv 2606.11025: ratio clipping degrades over several epochs on one batch, the
KL mask keeps multi-epoch training stable), GRPO-Guard (arXiv 2510.22319: Flow-GRPO's ratio drifts below 1, so its
clip binds on negative advantages and fails to bound over-confident positive updates; its normalised ratio fixes the
balance and the over-optimisation) and OP-GRPO (arXiv 2604.04142: "an off-policy sample proportion of ~25% was found
to offer the best balance between convergence speed and stability"). The reuse-by-epochs-or-by-replay question is the
zoo's own (issue 71).

Input: the study's run table and paired effects on ``toy2d_sep64_sparse`` with ``flow_dppo`` and ``op_grpo`` among
the references (:func:`benchmark.study.verdicts.analyze_study`). Cells: ``flow_grpo``, ``flow_dppo`` (1 epoch) and
their ``@e2`` / ``@e4`` variants (2, 4 epochs), ``grpo_guard``, ``op_grpo`` (25% off-policy) and its ``@p0``,
``@p12.5``, ``@p43.75`` variants. Margins (ours, fixed with the rules): :data:`REWARD_MARGIN` 0.05 reward,
``cost_claims.SPREAD_MARGIN`` 0.05 spread kept, :data:`GOLD_SHARE` 10% of the reference cell's mean gold gain,
:data:`MATCH_MARGIN` 1.10 on a steps ratio. A verdict is read from where the 95% CI lies against the rule's zones
(:func:`zone_verdict`): inside the reproduced zone, inside the contradicted zone, or neither (inconclusive).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

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
    ratio_claim,
    register,
    saving_judge,
)
from flowzoo.benchmark.study.cost_claims import SPREAD_MARGIN
from flowzoo.benchmark.study.zone_claims import effect_claim, paired_claim, zone_judge, zone_verdict

#: a final-reward difference within this is no practical difference
REWARD_MARGIN = 0.05
#: a gold-gain difference within this share of the reference cell's mean gold gain is no practical difference
GOLD_SHARE = 0.10
#: a steps ratio within [1 / MATCH_MARGIN, MATCH_MARGIN] is no practical difference
MATCH_MARGIN = 1.10
#: a count with more epochs is picked only if its mean steps to 80% of the gain are at least this share lower
BEST_MARGIN = 0.05


@dataclass(frozen=True)
class ReuseDesign:
    """What one run of the reuse study's rules reads: its task, its cells and how claims name them. The rules are the
    same for every design (fixed with the first suite, ``reuse-study``); a design only says where they read."""

    task: str
    #: the epoch counts of each method's cells: method -> {epochs: cell}
    epoch_cells: dict = field(default_factory=dict)
    #: OP-GRPO's off-policy proportion cells: cell -> label (empty: no proportion cells in the design)
    proportion_cells: dict = field(default_factory=dict)
    #: the proportion cells' reference (the ~25% cell)
    proportion_reference: str = "op_grpo"
    #: why the design has no proportion cells (the claims' 'measured' text when there are none)
    no_proportions: str = ""
    #: reuse by replay: its cell and how claims name it
    replay_cell: str = "op_grpo"
    replay_name: str = "OP-GRPO at 25%"
    replay_long: str = "reuse by replay (OP-GRPO, 25% off-policy)"
    #: Flow-DPPO's best epoch count fixed on the exploration seeds (None: the rule picks it on the set it judges)
    dppo_best_epochs: int | None = None
    #: the gold judge's gain in the rules' words: long (cost rows) and short (GRPO-Guard's row)
    gold_long: str = "gold gain (toy_w2: the 2-Wasserstein distance to each condition's ideal density, base - final)"
    gold_short: str = "gold gain (toy_w2, base - final)"

    def best_rule(self) -> str:
        counts = [str(c) for c in sorted(self.epoch_cells["flow_dppo"])]
        listed = f"{', '.join(counts[:-1])} and {counts[-1]}"
        return (f"Flow-DPPO's best epoch count: of {listed}, the one with the fewest mean steps to 80% of "
                "Flow-GRPO's gain (restricted means, vs flow_grpo) on the exploration seeds, a count with more epochs "
                f"chosen only if at least {BEST_MARGIN:.0%} lower than every count with fewer; fixed from the "
                "exploration seeds for the replication seeds")

    @property
    def references(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(("flow_dppo", self.replay_cell, *((self.proportion_reference,)
                                                                     if self.proportion_cells else ()))))


TOY_EPOCH_CELLS = {"flow_grpo": {1: "flow_grpo", 2: "flow_grpo@e2", 4: "flow_grpo@e4"},
                   "flow_dppo": {1: "flow_dppo", 2: "flow_dppo@e2", 4: "flow_dppo@e4"}}
#: the shared-recipe toy design (suite ``reuse-study``). Flow-DPPO's best epoch count picked 2026-12-05 on
#: exploration seeds 0-9, before any replication run finished: 349 steps to 80% of the gain at 1 epoch; at 2 and 4
#: epochs no run reached it in 400 steps
TOY = ReuseDesign("toy2d_sep64_sparse", TOY_EPOCH_CELLS,
                  {"op_grpo@p0": "0%", "op_grpo@p12.5": "12.5%", "op_grpo": "25%", "op_grpo@p43.75": "43.75%"},
                  dppo_best_epochs=1)


def gold_zones(mean: float, worse: bool) -> tuple[tuple[float, float], tuple[float, float]]:
    """The zones of a gold-gain difference with margin :data:`GOLD_SHARE` x |the reference's mean gold gain|:
    ``worse`` claims a loss (reproduced below minus the margin), else claims no loss (reproduced above it)."""
    margin = GOLD_SHARE * abs(mean) if math.isfinite(mean) else 0.0
    below, above = (-INF, -margin), (-margin, INF)
    return (below, above) if worse else (above, below)


def _reward_rule(cell: str, reference: str, worse: bool) -> tuple[str, tuple, tuple]:
    zones = ((-INF, -REWARD_MARGIN), (-REWARD_MARGIN, INF))
    if worse:
        return (f"final reward, {cell} - {reference} over the seeds both ran: reproduced if its CI lies below "
                f"-{REWARD_MARGIN}; contradicted if it lies above -{REWARD_MARGIN}; else inconclusive", *zones)
    return (f"final reward, {cell} - {reference} over the seeds both ran: reproduced if its CI lies above "
            f"-{REWARD_MARGIN}; contradicted if it lies below -{REWARD_MARGIN}; else inconclusive", *zones[::-1])


def _spread_zones(worse: bool):
    below, above = (-INF, -SPREAD_MARGIN), (-SPREAD_MARGIN, INF)
    return lambda _mean: (below, above) if worse else (above, below)


def _cost_claims(d: ReuseDesign, table: pd.DataFrame, effects: pd.DataFrame, cell: str, reference: str, name: str,
                 worse: bool) -> list[dict]:
    """What the reuse cost, three rows: final reward, spread kept (diversity), gold gain; ``worse`` claims a
    loss (the claim "X degrades"), else no loss ("X does not degrade")."""
    verb = "loses" if worse else "loses no"
    rule, reproduced, contradicted = _reward_rule(cell, reference, worse)
    side = "below" if worse else "above"
    other = "above" if worse else "below"
    spread_rule = (f"spread kept (final / base mean pairwise distance of a condition's samples), paired {cell} - "
                   f"{reference}: reproduced if its CI lies {side} -{SPREAD_MARGIN}; contradicted if it lies {other} "
                   f"-{SPREAD_MARGIN}; else inconclusive")
    gold_rule = (f"{d.gold_long}, "
                 f"paired {cell} - {reference}: reproduced if its CI lies {side} -{GOLD_SHARE:.0%} of {reference}'s "
                 f"mean gold gain; contradicted if it lies {other} it; else inconclusive")
    return [effect_claim(d.task, effects, cell, reference, "final_reward", f"{name} {verb} final reward", rule,
                         reproduced, contradicted),
            paired_claim(d.task, table, cell, reference, "spread_kept", f"{name} {verb} diversity (spread kept)",
                         spread_rule, _spread_zones(worse), "spread kept"),
            paired_claim(d.task, table, cell, reference, "gold_gain", f"{name} {verb} gold-judge gain", gold_rule,
                         lambda mean: gold_zones(mean, worse), "gold gain")]


def _saving_claim(d: ReuseDesign, effects: pd.DataFrame, cell: str, reference: str, claim: str,
                  metric: str = STEPS_METRIC,
                  also: str | None = "nfe_to_80") -> dict:
    unit = metric.split("_")[0].upper() if metric.startswith("nfe") else "steps"
    rule = (f"{unit} to 80% of Flow-GRPO's gain, {cell} / {reference}: reproduced if the ratio's CI lies below 1; "
            "contradicted if at or above 1")
    return ratio_claim(effects, d.task, cell, claim, rule, saving_judge, reference=reference, metric=metric,
                       also=also, **SAVING_ZONES)


def degrade_claims(d: ReuseDesign, table: pd.DataFrame, effects: pd.DataFrame) -> list[dict]:
    """(a) Flow-GRPO at 4 epochs against 1 degrades; what its 4 epochs save."""
    cell, ref = d.epoch_cells["flow_grpo"][4], d.epoch_cells["flow_grpo"][1]
    return [*_cost_claims(d, table, effects, cell, ref, "(a) Flow-GRPO at 4 epochs per batch, against 1,", worse=True),
            _saving_claim(d, effects, cell, ref, "(a) Flow-GRPO at 4 epochs reaches 80% of its 1-epoch gain in fewer "
                                              "steps")]


def _did_claim(d: ReuseDesign, table: pd.DataFrame) -> dict:
    """Paired by seed: (Flow-DPPO 4 - 1 epochs) - (Flow-GRPO 4 - 1 epochs) final reward."""
    claim = "(b) the KL mask keeps 4-epoch reuse from losing the final reward that ratio clipping loses"
    rule = ("final reward, paired by seed: (flow_dppo@e4 - flow_dppo) - (flow_grpo@e4 - flow_grpo): reproduced if its "
            "CI lies above 0; contradicted if it lies below 0; else inconclusive")
    d1, d4, g1, g4 = (cell_runs(table, d.task, d.epoch_cells[method][epochs])
                      for method in ("flow_dppo", "flow_grpo") for epochs in (1, 4))
    seeds = sorted(set(d1.index) & set(d4.index) & set(g1.index) & set(g4.index))
    if len(seeds) < 2:
        return claim_row(claim, rule, "no runs", "not tested")
    col = "final_reward"
    did = ((d4.loc[seeds, col] - d1.loc[seeds, col]) - (g4.loc[seeds, col] - g1.loc[seeds, col])).to_numpy(float)
    low, high = bootstrap_ci(did)
    measured = (f"Flow-DPPO 4 - 1: {(d4.loc[seeds, col] - d1.loc[seeds, col]).mean():+.3f}; Flow-GRPO 4 - 1: "
                f"{(g4.loc[seeds, col] - g1.loc[seeds, col]).mean():+.3f}; difference {did.mean():+.3f} "
                f"{ci_text(low, high)} (n {len(seeds)})")
    zones = ((0, INF), (-INF, 0))
    figure = estimate("(dppo e4 - e1) - (grpo e4 - e1): final reward", "difference", did.mean(), low, high, "reward",
                      reproduced=zones[0], contradicted=zones[1])
    return claim_row(claim, rule, measured, zone_verdict(low, high, *zones), figure)


def trust_region_claims(d: ReuseDesign, table: pd.DataFrame, effects: pd.DataFrame) -> list[dict]:
    """(b) Flow-DPPO at 4 epochs against its 1 epoch does not degrade, where clipping does; what its epochs save."""
    cell, ref = d.epoch_cells["flow_dppo"][4], d.epoch_cells["flow_dppo"][1]
    return [*_cost_claims(d, table, effects, cell, ref, "(b) Flow-DPPO at 4 epochs per batch, against 1,", worse=False),
            _did_claim(d, table),
            _saving_claim(d, effects, cell, ref, "(b) Flow-DPPO at 4 epochs reaches 80% of Flow-GRPO's gain in fewer "
                                              "steps than at 1")]


def best_epochs(d: ReuseDesign, effects: pd.DataFrame) -> int | None:
    """:meth:`ReuseDesign.best_rule` on ``effects`` (the seed set it judges): None when no Flow-DPPO cell ran or gave
    a mean."""
    means = {}
    for epochs, cell in d.epoch_cells["flow_dppo"].items():
        e = find_effect(effects, d.task, "flow_grpo", cell, STEPS_METRIC)
        if e is not None and math.isfinite(float(e["algorithm_mean"])):
            means[epochs] = float(e["algorithm_mean"])
    best = None
    for epochs in sorted(means):  # fewer epochs first: more must beat every fewer count by BEST_MARGIN
        fewer = [means[e] for e in means if e < epochs]
        if not fewer or means[epochs] <= (1 - BEST_MARGIN) * min(fewer):
            best = epochs
    return best


def reuse_claims(d: ReuseDesign, table: pd.DataFrame, effects: pd.DataFrame) -> list[dict]:
    """(c) reuse by epochs (Flow-DPPO at its best epoch count) against reuse by replay (OP-GRPO at 25%)."""
    epochs = d.dppo_best_epochs if d.dppo_best_epochs is not None else best_epochs(d, effects)
    fixed = "fixed on the exploration seeds" if d.dppo_best_epochs is not None else "picked on this seed set"
    cell = d.epoch_cells["flow_dppo"].get(epochs or 1)
    name = f"(c) reuse by epochs (Flow-DPPO at {epochs or '?'} epochs, {fixed})"
    replay = d.replay_cell
    rows = [_saving_claim(d, effects, cell, replay, f"{name} reaches 80% of Flow-GRPO's gain with fewer NFE than "
                                                    f"{d.replay_long}", "nfe_to_80", STEPS_METRIC),
            _saving_claim(d, effects, cell, replay, f"{name} reaches 80% of Flow-GRPO's gain in fewer steps than "
                                                    f"{d.replay_name}", STEPS_METRIC, None),
            *_cost_claims(d, table, effects, cell, replay, f"{name}, against {d.replay_name},", worse=False)]
    for row in rows:
        row["rule"] = f"{d.best_rule()}. {row['rule']}"
    return rows


def _mean(runs: pd.DataFrame, column: str) -> float:
    return float(runs[column].mean()) if column in runs else math.nan


def _balance(runs: pd.DataFrame) -> pd.Series:
    return runs["clip_frac_neg_adv"] - runs["clip_frac_pos_adv"]


def guard_claims(d: ReuseDesign, table: pd.DataFrame, effects: pd.DataFrame) -> list[dict]:
    """(d) GRPO-Guard against Flow-GRPO: where the clip binds by advantage sign, the gold judge, the reward."""
    grpo, guard = cell_runs(table, d.task, "flow_grpo"), cell_runs(table, d.task, "grpo_guard")
    sides = {"clip_frac_pos_adv", "clip_frac_neg_adv"}
    rows = []
    claim = "(d) Flow-GRPO's clip binds on negative advantages more often than on positive ones (GRPO-Guard's premise)"
    rule = ("per run, the fraction of negative-advantage trained pairs whose clip binds (ratio < 1 - clip_range) minus "
            "that of positive ones (ratio > 1 + clip_range), mean over steps: reproduced if its CI over seeds lies "
            "above 0; contradicted if below 0; else inconclusive")
    if grpo.empty or not sides <= set(grpo.columns):
        rows.append(claim_row(claim, rule, "no runs logging the clip sides", "not tested"))
    else:
        balance = _balance(grpo).dropna().to_numpy(float)
        low, high = bootstrap_ci(balance)
        measured = (f"flow_grpo: negative {grpo['clip_frac_neg_adv'].mean():.4f}, positive "
                    f"{grpo['clip_frac_pos_adv'].mean():.4f}; difference {balance.mean():+.4f} {ci_text(low, high)} "
                    f"(n {balance.size})")
        figure = estimate("flow_grpo: clip binds, negative - positive", "difference", balance.mean(), low, high,
                          "clip rate", reproduced=(0, INF), contradicted=(-INF, 0))
        rows.append(claim_row(claim, rule, measured, zone_verdict(low, high, (0, INF), (-INF, 0), 3), figure))
    claim = "(d) GRPO-Guard's normalised ratio balances where the clip binds: a smaller |negative - positive| gap"
    rule = ("paired by seed, |negative - positive| binding fraction of grpo_guard minus flow_grpo's: reproduced if its "
            "CI lies below 0; contradicted if above 0; else inconclusive (the clip ranges differ: 1e-3 on GRPO-Guard's "
            "normalised ratio, 0.05 on Flow-GRPO's)")
    if grpo.empty or guard.empty or not (sides <= set(grpo.columns) and sides <= set(guard.columns)):
        rows.append(claim_row(claim, rule, "no runs logging the clip sides", "not tested"))
    else:
        seeds = sorted(set(grpo.index) & set(guard.index))
        diff = (_balance(guard.loc[seeds]).abs() - _balance(grpo.loc[seeds]).abs()).dropna().to_numpy(float)
        low, high = bootstrap_ci(diff)
        measured = (f"|gap|: flow_grpo {_balance(grpo.loc[seeds]).abs().mean():.4f}, grpo_guard "
                    f"{_balance(guard.loc[seeds]).abs().mean():.4f} (clip fraction {_mean(guard, 'clip_frac'):.3f} vs "
                    f"{_mean(grpo, 'clip_frac'):.3f}); difference {diff.mean():+.4f} {ci_text(low, high)} "
                    f"(n {diff.size})")
        figure = estimate("grpo_guard - flow_grpo: |clip gap|", "difference", diff.mean(), low, high, "clip rate",
                          reproduced=(-INF, 0), contradicted=(0, INF))
        rows.append(claim_row(claim, rule, measured, zone_verdict(low, high, (-INF, 0), (0, INF), 3), figure))
    gold_rule = (f"{d.gold_short}, paired grpo_guard - flow_grpo: reproduced if its CI lies above 0; "
                 "contradicted if below 0; else inconclusive")
    rows.append(paired_claim(d.task, table, "grpo_guard", "flow_grpo", "gold_gain",
                             "(d) GRPO-Guard's gain is better by the gold judge than Flow-GRPO's "
                             "(less over-optimisation)",
                             gold_rule, lambda _mean: ((0, INF), (-INF, 0)), "gold gain"))
    rule, reproduced, contradicted = _reward_rule("grpo_guard", "flow_grpo", worse=False)
    rows.append(effect_claim(d.task, effects, "grpo_guard", "flow_grpo", "final_reward",
                             "(d) GRPO-Guard loses no final reward against Flow-GRPO", rule, reproduced, contradicted))
    return rows


def _sweet_spot_claim(d: ReuseDesign, effects: pd.DataFrame) -> dict:
    claim = ("(e) an off-policy proportion of ~25% offers the best balance between convergence speed and stability "
             "(OP-GRPO paper)")
    rule = (f"against 12.5% and 43.75%, each paired with 25% ({d.proportion_reference}): speed, steps to 80% of the "
            "gain, neighbour / "
            f"25%: 25% no slower if the CI lies above 1/{MATCH_MARGIN:.2f}, the neighbour faster if it lies below "
            f"1/{MATCH_MARGIN:.2f}; stability, final reward, neighbour - 25%: 25% no worse if the CI lies below "
            f"+{REWARD_MARGIN}, the neighbour better if above +{REWARD_MARGIN}. Reproduced if 25% is no slower and no "
            "worse than both; contradicted if either neighbour is faster or better; else inconclusive")
    parts, ok, beaten = [], [], []
    for cell in ("op_grpo@p12.5", "op_grpo@p43.75"):
        steps = find_effect(effects, d.task, d.proportion_reference, cell, STEPS_METRIC)
        final = find_effect(effects, d.task, d.proportion_reference, cell, "final_reward")
        if steps is None or final is None:
            return claim_row(claim, rule, "no runs", "not tested")
        s_low, s_high = float(steps["ratio_low"]), float(steps["ratio_high"])
        f_low, f_high = float(final["ci_low"]), float(final["ci_high"])
        parts.append(f"{d.proportion_cells[cell]}: steps ratio {steps['ratio']:.2f} {ci_text(s_low, s_high)}, final "
                     f"{final['diff']:+.3f} {ci_text(f_low, f_high)}")
        ok += [s_low > 1 / MATCH_MARGIN, f_high < REWARD_MARGIN]
        beaten += [s_high < 1 / MATCH_MARGIN, f_low > REWARD_MARGIN]
    measured = "vs 25%: " + "; ".join(parts)
    verdict = "contradicted" if any(beaten) else "reproduced" if all(ok) else "inconclusive"
    return claim_row(claim, rule, measured, verdict)


def proportion_claims(d: ReuseDesign, table: pd.DataFrame, effects: pd.DataFrame) -> list[dict]:
    """(e) OP-GRPO's off-policy proportion: the paper's ~25%, its saving over 0%, and the 0% control."""
    inverse = ((1, INF), (-INF, 1))
    rule = (f"steps to 80% of Flow-GRPO's gain, op_grpo@p0 / {d.proportion_reference} (0% over 25%): reproduced if "
            "the ratio's CI lies "
            "above 1; contradicted if below 1; else inconclusive")
    saving = ratio_claim(effects, d.task, "op_grpo@p0", "(e) replaying 25% off-policy saves steps over the same code "
                         "path at 0%", rule, zone_judge(*inverse), reference=d.proportion_reference,
                         reproduced=inverse[0],
                         contradicted=inverse[1])
    equal = ((1 / MATCH_MARGIN, MATCH_MARGIN), (MATCH_MARGIN, INF))
    rule = (f"steps to 80% of the gain, op_grpo@p0 / flow_grpo: reproduced if the ratio's CI lies within "
            f"[1/{MATCH_MARGIN:.2f}, {MATCH_MARGIN:.2f}]; contradicted if it lies above {MATCH_MARGIN:.2f} or below "
            f"1/{MATCH_MARGIN:.2f}; else inconclusive")

    def control_judge(low: float, high: float) -> str:
        if high < 1 / MATCH_MARGIN:
            return "contradicted (faster)"
        return zone_verdict(low, high, *equal)
    control = ratio_claim(effects, d.task, "op_grpo@p0", "(e) control: OP-GRPO at 0% off-policy trains as Flow-GRPO",
                          rule, control_judge, reproduced=equal[0], contradicted=equal[1])
    rows = [_sweet_spot_claim(d, effects), saving, control]
    if not d.proportion_cells:  # the same rows, each saying why nothing was measured
        rows = [claim_row(row["claim"], row["rule"], d.no_proportions, "not tested") for row in rows]
    return rows


def design_claims(d: ReuseDesign):
    """The rules read on design ``d``: a ``claims(table, effects)`` giving every claim in a fixed order (the study
    lines the seed sets' rows up by position)."""
    def claims(table: pd.DataFrame, effects: pd.DataFrame) -> list[dict]:
        return [*degrade_claims(d, table, effects), *trust_region_claims(d, table, effects),
                *reuse_claims(d, table, effects), *guard_claims(d, table, effects),
                *proportion_claims(d, table, effects)]
    return claims


claims = design_claims(TOY)


#: the first is a cell of the study's own (a task@variant of its suite), so runs of another suite on the same task
#: (op-grpo-study's) still match their own claim set; the reuse-study suite names this set with its `claims:` key
register(ClaimSet("reuse-toy", claims, tasks=("toy2d_sep64_sparse@e4", TOY.task), references=TOY.references,
                  description="reuse by epochs (Flow-GRPO, Flow-DPPO at 1, 2, 4 epochs; GRPO-Guard) or by replay "
                              "(OP-GRPO at 0-43.75% off-policy) on the toy tier's sparse task (suite reuse-study)",
                  note="Each claim names its letter in the study's design (docs/algorithms.md, \"The reuse study\"); "
                       "all on the sparse task toy2d_sep64_sparse."))

#: the tuned toy design (suite ``reuse-study-tuned``): the same task at each method's tuned recipe; reuse by replay is
#: OP-GRPO at its tuned pick (its own proportion), the ~25% reference of the proportion claims its @p25 cell (replay_k
#: 4 pinned). Flow-DPPO's best epoch count picked 2026-12-05 20:58 UTC by the rule on exploration seeds 0-9 (their
#: 120 runs alone, copied apart), as the replication runs started: mean 205 steps to 80% of the gain at 1 epoch; at 2
#: and 4 epochs no run reached it in 400 steps
TOY_TUNED = ReuseDesign("toy2d_sep64_sparse", TOY_EPOCH_CELLS,
                        {"op_grpo@p0": "0%", "op_grpo@p12.5": "12.5%", "op_grpo@p25": "25%",
                         "op_grpo@p43.75": "43.75%"},
                        proportion_reference="op_grpo@p25", replay_name="OP-GRPO at its tuned recipe",
                        dppo_best_epochs=1,
                        replay_long="reuse by replay (OP-GRPO at its tuned recipe and off-policy proportion)")
register(ClaimSet("reuse-toy-tuned", design_claims(TOY_TUNED), tasks=("toy2d_sep64_sparse@p25", TOY_TUNED.task),
                  references=TOY_TUNED.references,
                  description="the reuse study's rules at each method's tuned recipe on the toy tier's sparse task "
                              "(suite reuse-study-tuned)",
                  note="Each claim names its letter in the study's design (docs/algorithms.md, \"The reuse study\"); "
                       "all on the sparse task toy2d_sep64_sparse, each method at its tuned recipe."))

#: the tiny design (suite ``reuse-tiny-study``): 1 and 4 epochs, OP-GRPO at 25%, no proportion cells; the gold judge
#: is GenEval's partial credit (a score: its gain is final - base). Flow-DPPO's best epoch count picked 2026-12-05
#: 23:38 UTC by the rule on exploration seeds 0-4 (their 30 runs alone, copied apart): mean 104 steps to 80% of the
#: gain at 1 epoch, 98 at 4 (5.8% fewer: past the 5% margin). The replication runs ran beside the exploration ones
#: (24 of 30 finished before the pick); none was read before it
TINY = ReuseDesign("tiny_counting_rare",
                   {"flow_grpo": {1: "flow_grpo", 4: "flow_grpo@e4"}, "flow_dppo": {1: "flow_dppo", 4: "flow_dppo@e4"}},
                   no_proportions="no proportion cells in this design (the tiny tier's CPU budget: suite "
                                  "reuse-tiny-study)",
                   gold_long="gold gain (shapes_geneval's partial credit, final - base)",
                   gold_short="gold gain (shapes_geneval partial credit, final - base)", dppo_best_epochs=4)
register(ClaimSet("reuse-tiny", design_claims(TINY), tasks=("tiny_counting_rare@e4", TINY.task),
                  references=TINY.references,
                  description="the reuse study's rules on the tiny tier's rare counting prompts: Flow-GRPO and "
                              "Flow-DPPO at 1 and 4 epochs, GRPO-Guard, OP-GRPO at 25% (suite reuse-tiny-study)",
                  note="Each claim names its letter in the study's design (docs/algorithms.md, \"The reuse study\"); "
                       "all on the tiny tier's rare counting prompts tiny_counting_rare, at the shared recipe."))
