"""The tuning pruners (benchmark/tuning/pruners.py): Optuna's median pruner compares a trial's best
partial objective, so with a running-mean objective the shared step-0 evaluation floors it; ``median_latest``
compares the latest value."""

import math

import optuna
import pytest

from flowzoo.benchmark.tuning.tune import objective_value
from flowzoo.benchmark.config.tuning_design import read_design
from flowzoo.benchmark.tuning.pruners import PRUNERS, latest_below_median, make_pruner
from flowzoo.errors import ConfigError

optuna.logging.set_verbosity(optuna.logging.WARNING)

BASE = 0.125  # every trial's step-0 evaluation: the base model on the seed's fixed evaluation noise


def finished_curve(drop: float) -> list[float]:
    """A finished run that first loses reward (base, then below it), as Flow-GRPO's tiny-study tuning runs did."""
    return [BASE] + [BASE - drop] * 12


def run_study(pruner_name: str, candidate: list[float], finished=(0.02, 0.03, 0.04, 0.05), curves=None):
    """Four finished trials (``curves``, else ``finished_curve`` of each drop in ``finished``), then a candidate
    reporting the running-mean ``auc`` of ``candidate``: the step at which it was pruned, or None."""
    study = optuna.create_study(direction="maximize", pruner=make_pruner(pruner_name, 4, 6))
    for curve in curves or [finished_curve(drop) for drop in finished]:
        trial = study.ask()
        for step in range(len(curve)):
            trial.report(objective_value([curve[: step + 1]], "auc"), step)
        study.tell(trial, objective_value([curve], "auc"))
    trial = study.ask()
    for step in range(len(candidate)):
        trial.report(objective_value([candidate[: step + 1]], "auc"), step)
        if trial.should_prune():
            return step
    return None


def test_median_cannot_prune_below_the_base_when_finished_trials_sit_below_it():
    collapsing = [BASE] + [0.0] * 12  # far worse than every finished trial at every step after 0
    assert run_study("median", collapsing) is None  # its best (the step-0 base) beats the median at every check
    assert run_study("median_latest", collapsing) == 6  # the first check after the warm-up


def test_median_latest_keeps_a_trial_at_or_above_the_median():
    good = [BASE] + [0.2] * 12
    assert run_study("median_latest", good) is None
    # exactly at the finished trials' median at every step: kept (the rule is strictly below)
    assert run_study("median_latest", finished_curve(0.03), finished=(0.02, 0.03, 0.03, 0.04)) is None
    assert run_study("median_latest", finished_curve(0.031), finished=(0.02, 0.03, 0.03, 0.04)) == 6


def test_both_prune_alike_when_the_partial_objective_only_rises():
    # finished trials rise above the base; the candidate rises more slowly: both rules stop it at the first check
    study_curves = [[BASE + 0.01 * k * r for k in range(13)] for r in (2, 3, 4, 5)]
    slow = [BASE + 0.005 * k for k in range(13)]
    for name in ("median", "median_latest"):
        assert run_study(name, slow, curves=study_curves) == 6, name


def test_median_latest_waits_for_startup_trials():
    study = optuna.create_study(direction="maximize", pruner=make_pruner("median_latest", 4, 0))
    for drop in (0.02, 0.03, 0.04):  # three finished, four needed
        trial = study.ask()
        trial.report(BASE - drop, 0)
        study.tell(trial, BASE - drop)
    trial = study.ask()
    trial.report(0.0, 0)
    assert not trial.should_prune()


def test_latest_below_median_rule():
    assert latest_below_median(0.1, [0.2, 0.3, 0.4])
    assert not latest_below_median(0.3, [0.2, 0.3, 0.4])
    assert latest_below_median(math.nan, [0.2])
    assert not latest_below_median(0.0, [])  # no finished trial reached this step
    assert not latest_below_median(0.0, [math.nan])


def test_design_accepts_every_pruner_and_names_them_on_a_bad_one():
    for name in PRUNERS:
        design = read_design("s", {"objective": "auc", "trials": 2, "seeds": [1000], "validation": {"eval_seed": 7}, "pruner": {"name": name}}, [0])
        assert design.pruner.name == name
        make_pruner(name, design.pruner.startup_trials, design.pruner.warmup_evaluations)
    with pytest.raises(ConfigError, match="'hyperband' is not one of median, median_latest, none"):
        read_design("s", {"objective": "auc", "trials": 2, "seeds": [1000], "validation": {"eval_seed": 7}, "pruner": {"name": "hyperband"}}, [0])
