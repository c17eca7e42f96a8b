"""The pruners a tuning design may name (``tuning.pruner.name``), built for one Optuna study.

* ``median`` is Optuna's ``MedianPruner``: a trial stops when the **best** partial objective it reported so far is
  below the median of the finished trials' partial objectives at the same point. With the ``auc`` objective the
  partial objective is the running mean of the evaluations so far, and its first value is the step-0 evaluation of
  the base model, the same for every trial of a seed: a trial's best is never below it. So when the finished trials'
  running means sit below the base at the check (a cell whose runs first lose reward), no trial can be pruned.
  This is what happened to Flow-GRPO's cell of the tiny study's tuning (0 of 12 trials pruned;
  reports/example-tiny-rare-counting-study-tuning/HOW.md).
* ``median_latest`` (ours) compares the trial's **latest** partial objective with that median instead: the same rule
  with the floor removed. It is Optuna's rule wherever the partial objective only rises.
* ``none`` never prunes.
"""

from __future__ import annotations

import math
import statistics

from flowzoo.benchmark.config.tuning_design import PRUNERS  # the names a design may give; each is built here


def make_pruner(name: str, startup_trials: int, warmup_evaluations: int):
    """The Optuna pruner of a design: ``startup_trials`` finished trials before any pruning, and no check of a trial
    before it reported ``warmup_evaluations`` partial objectives (steps 0 .. warmup - 1)."""
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup_evaluations)
    if name == "median_latest":
        return _latest_median_pruner(startup_trials, warmup_evaluations)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise ValueError(f"pruner {name!r} is not one of {', '.join(PRUNERS)}")


def latest_below_median(latest: float, others: list[float]) -> bool:
    """The rule of ``median_latest``: prune when the latest partial objective is below the median of the finished
    trials' values at the same step (NaN counts as below; no finished value at that step: keep)."""
    others = [v for v in others if not math.isnan(v)]
    if not others:
        return False
    return math.isnan(latest) or latest < statistics.median(others)


def _latest_median_pruner(startup_trials: int, warmup_evaluations: int):
    import optuna
    from optuna.trial import TrialState

    class LatestMedianPruner(optuna.pruners.BasePruner):
        def prune(self, study, trial) -> bool:
            step = trial.last_step
            if step is None or step < warmup_evaluations:
                return False
            finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if len(finished) < max(startup_trials, 1):
                return False
            others = [t.intermediate_values[step] for t in finished if step in t.intermediate_values]
            return latest_below_median(trial.intermediate_values[step], others)

    return LatestMedianPruner()
