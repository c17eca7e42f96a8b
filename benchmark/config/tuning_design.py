"""A suite's tuning design (its ``tuning:`` section); its tuned recipes (its ``tuned:`` directory) are read
by :mod:`benchmark.config.tuned`.

The design is fixed in the suite file before any trial runs (docs/tuning.md)::

    tuning:
      objective: auc          # auc: mean eval reward over the run's evaluations; final: mean of the last 3
      trials: 24              # complete + pruned trials per (task, algorithm): the same for every cell
      steps: 400              # training steps of a trial's runs (default: the suite's train.steps)
      seeds: [1000, 1001]     # tuning seeds, disjoint from the suite's seeds and seed sets
      sampler: {name: tpe, seed: 0, startup_trials: 8}
      pruner: {name: median, startup_trials: 5, warmup_evaluations: 10}
      cells: {toy2d_sep64_sparse: [flow_grpo, op_grpo]}   # default: every cell of the suite
      knobs: [lr]             # only these knobs of each cell's space (default: all)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowzoo.errors import ConfigError
from flowzoo.schema import from_mapping

#: the pruners a design may name (benchmark/tuning/pruners.py builds each for one Optuna study)
PRUNERS = ("median", "median_latest", "none")

OBJECTIVES = ("auc", "final")
SAMPLERS = ("tpe",)


@dataclass
class SamplerSpec:
    name: str = "tpe"
    seed: int = 0  # the TPE sampler's seed (trial k draws with seed + k, so a serial study is reproducible)
    startup_trials: int = 8  # random trials before TPE models the results
    multivariate: bool = True  # TPE over the knobs jointly (they interact: lr and clip range)


@dataclass
class PrunerSpec:
    name: str = "median"  # median, median_latest or none (benchmark/tuning/pruners.py)
    startup_trials: int = 5  # no pruning before this many trials finished
    warmup_evaluations: int = 10  # no pruning of a trial before this many of its evaluations


#: where a trial's evaluations take their prompts: prompts held out from the reported evaluation set (the tiny
#: sources draw them, the files source reads prompts.validation), or the reported prompts (a task with too few
#: prompts to hold any out, e.g. toy2d's classes); either way with the design's own evaluation noise
VALIDATION_PROMPTS = ("held_out", "reported")


@dataclass
class ValidationSpec:
    eval_seed: int  # the trials' evaluation noise: never a reported run's train.eval_seed
    prompts: str = "held_out"


@dataclass
class ConfirmationSpec:
    seeds: list[int]  # confirmation seeds: disjoint from the tuning seeds and every seed the suite evaluates on
    top_k: int = 3  # the best complete trials re-run beside the shared (untuned) recipe


@dataclass
class TuningDesign:
    objective: str
    trials: int
    seeds: list[int]
    validation: ValidationSpec
    #: re-run the top trials and the shared recipe on fresh seeds and pick the best there (benchmark/tuning/confirm.py);
    #: None: the best trial on the tuning seeds is the pick (the page says it is unconfirmed)
    confirmation: ConfirmationSpec | None = None
    steps: int | None = None
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    pruner: PrunerSpec = field(default_factory=PrunerSpec)
    cells: dict = field(default_factory=dict)  # {task: [algorithm, ...]}; empty: every cell of the suite
    knobs: list = field(default_factory=list)  # tune only these knobs of every cell's space; empty: all of them


def read_design(suite_name: str, section: Any, evaluation_seeds: list[int]) -> TuningDesign:
    """The suite's ``tuning:`` section, checked: known objective, pruner and sampler, positive counts, tuning seeds
    disjoint from ``evaluation_seeds`` (every seed the suite's runs use)."""
    where = f"suite {suite_name}: tuning"
    if not isinstance(section, dict):
        raise ConfigError(f"{where} must be a mapping (objective, trials, seeds, ...), got {section!r}")
    for required in ("objective", "trials", "seeds"):
        if required not in section:
            raise ConfigError(f"{where} needs `{required}`: a tuning design is fixed in the suite before any trial")
    if "validation" not in section:
        raise ConfigError(f"{where} needs `validation: {{eval_seed: N, prompts: held_out|reported}}`: trials score "
                          f"with evaluation noise (and, where the task has enough prompts, prompts) of their own, "
                          f"never on the reported evaluation set")
    design = from_mapping(TuningDesign, section, where=where)
    design.validation = from_mapping(ValidationSpec, design.validation, where=f"{where}.validation")
    if design.confirmation is not None:
        design.confirmation = from_mapping(ConfirmationSpec, design.confirmation, where=f"{where}.confirmation")
        seeds = design.confirmation.seeds
        if not seeds or len(set(seeds)) != len(seeds) or not all(isinstance(x, int) for x in seeds):
            raise ConfigError(f"{where}.confirmation.seeds must be a non-empty list of distinct integers, got {seeds}")
        if design.confirmation.top_k < 1:
            raise ConfigError(f"{where}.confirmation.top_k must be a positive integer, got {design.confirmation.top_k}")
        if len(seeds) < 2:
            raise ConfigError(f"{where}.confirmation.seeds: give at least 2 (an interval over one seed has no width)")
        check_disjoint(seeds, [*evaluation_seeds, *design.seeds], f"{where}.confirmation",
                       "are also evaluation or tuning seeds; confirmation seeds are fresh: disjoint from the suite's "
                       "seeds, seed sets and tuning seeds (e.g. 2000, 2001, ...)")
    if design.validation.prompts not in VALIDATION_PROMPTS:
        raise ConfigError(f"{where}.validation.prompts {design.validation.prompts!r} is not one of "
                          f"{', '.join(VALIDATION_PROMPTS)}")
    design.sampler = from_mapping(SamplerSpec, design.sampler, where=f"{where}.sampler")
    design.pruner = from_mapping(PrunerSpec, design.pruner, where=f"{where}.pruner")
    if design.objective not in OBJECTIVES:
        raise ConfigError(f"{where}.objective {design.objective!r} is not one of {', '.join(OBJECTIVES)}")
    if design.pruner.name not in PRUNERS:
        raise ConfigError(f"{where}.pruner.name {design.pruner.name!r} is not one of {', '.join(PRUNERS)}")
    if design.sampler.name not in SAMPLERS:
        raise ConfigError(f"{where}.sampler.name {design.sampler.name!r} is not one of {', '.join(SAMPLERS)}")
    for name, value in (("trials", design.trials), ("steps", 1 if design.steps is None else design.steps)):
        if value < 1:  # steps 0 is no "the suite's steps": that is null
            raise ConfigError(f"{where}.{name} must be a positive integer, got {value}")
    if design.sampler.seed < 0:
        raise ConfigError(f"{where}.sampler.seed must be >= 0, got {design.sampler.seed}")
    for name, value in (("sampler.startup_trials", design.sampler.startup_trials),
                        ("pruner.startup_trials", design.pruner.startup_trials),
                        ("pruner.warmup_evaluations", design.pruner.warmup_evaluations)):
        if value < 0:
            raise ConfigError(f"{where}.{name} must be >= 0, got {value}")
    if not design.seeds or len(set(design.seeds)) != len(design.seeds):
        raise ConfigError(f"{where}.seeds must be a non-empty list of distinct integers, got {design.seeds}")
    for name, seeds in (("seeds", design.seeds), ("confirmation.seeds", (design.confirmation or ConfirmationSpec([])).seeds)):
        bad = [x for x in seeds if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2 ** 63]
        if bad:  # a run's seed is in [0, 2**63): said here, not later as a run's error blamed on a knob
            raise ConfigError(f"{where}.{name}: {bad[0]!r} is no seed; seeds are integers in [0, 2**63)")
    check_disjoint(design.seeds, evaluation_seeds, where)
    return design


def check_disjoint(tuning_seeds: list[int], evaluation_seeds: list[int], where: str,
                   why: str = "are also evaluation seeds of the suite; tuning seeds must be disjoint from its seeds "
                              "and seed sets (e.g. 1000, 1001, ...)") -> None:
    """Tuning seeds never evaluate: an overlap is refused in one line naming the shared seeds."""
    shared = sorted(set(tuning_seeds) & set(evaluation_seeds))
    if shared:
        raise ConfigError(f"{where}.seeds {shared} {why}")
