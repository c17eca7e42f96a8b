"""One Optuna study per cell: opened bound to the design it was tuned under (refused under another), its TPE sampler
seeded by the trials drawn so far and the worker's index, and the progress line of a finished trial."""

from __future__ import annotations

import json
from typing import Any

from flowzoo.benchmark.run.suite import Suite
from flowzoo.benchmark.tuning.budget import counted
from flowzoo.benchmark.tuning.cells import Cell
from flowzoo.benchmark.config.tuning_design import TuningDesign
from flowzoo.benchmark.tuning.pruners import make_pruner
from flowzoo.errors import ConfigError


def design_record(design: TuningDesign, cell: Cell) -> str:
    """What a study is bound to: the objective, steps, seeds, sampler, pruner and the cell's space."""
    from dataclasses import asdict

    record = {k: v for k, v in asdict(design).items() if k not in ("trials", "cells")}
    record["space"] = {name: repr(knob) for name, knob in cell.all_knobs().items()}
    return json.dumps(record, sort_keys=True, default=str)


def open_study(storage, suite: Suite, design: TuningDesign, cell: Cell, trial_seed: int = 0):
    import optuna

    pruner = make_pruner(design.pruner.name, design.pruner.startup_trials, design.pruner.warmup_evaluations)
    study = optuna.create_study(storage=storage, study_name=f"{suite.name}/{cell.study_name}", direction="maximize",
                                pruner=pruner, sampler=make_sampler(design, trial_seed), load_if_exists=True)
    if check_design(study, design, cell) is None:
        study.set_user_attr("design", design_record(design, cell))
    return study


def check_design(study, design: TuningDesign, cell: Cell) -> str | None:
    """The design ``study`` was tuned under (None for a study no tune has bound yet); a one-line ConfigError when it
    is not ``design``'s for ``cell``: trials of other seeds, steps or space must neither resume nor report as this
    design's."""
    stored = study.user_attrs.get("design")
    if stored is not None and stored != design_record(design, cell):
        raise ConfigError(f"study {study.study_name} in the storage was tuned under another design (objective, steps, "
                          f"seeds, sampler, pruner or space changed); give another --storage or --runs")
    return stored


#: how far apart the sampler seeds of two workers start (more trials than this in one cell would be needed to collide)
WORKER_SEED_STRIDE = 7919


def drawn(study) -> int:
    """The trials that stand for a draw of the sampler: every trial but the failed ones (a trial stopped by Ctrl-C or a
    dead process is failed and re-run with its values, so its re-run stands for it). Seeding by this count makes an
    interrupted and resumed tune draw the values an uninterrupted one draws."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state.name != "FAIL")


def make_sampler(design: TuningDesign, trial_seed: int):
    """The design's TPE sampler, seeded for the next trial (seed + trials so far: a serial study is reproducible)."""
    import optuna

    return optuna.samplers.TPESampler(seed=design.sampler.seed + trial_seed, multivariate=design.sampler.multivariate,
                                      n_startup_trials=design.sampler.startup_trials, constant_liar=True)


def progress_line(suite: Suite, cell: Cell, study, trial, budget: int, seconds: float) -> str:
    from optuna.trial import TrialState

    params = " ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
    value = "-" if trial.value is None else f"{trial.value:.4f}"
    state = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned"}.get(trial.state, trial.state.name.lower())
    return (f"tune {suite.name} {cell.study_name} trial {trial.number} ({counted(study)}/{budget}): {params} "
            f"-> objective {value} {state} {seconds:.1f} s")


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
