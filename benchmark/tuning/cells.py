"""The cells ``flowzoo tune`` tunes: each (task, algorithm) of a suite's tuning design with its search space (less the
keys the cell pins and the knobs inert in it), checked before any trial, and a trial's runs of a cell (the suite's
config with the trial's values in the tuned layer, scored on the design's validation evaluations)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from flowzoo.benchmark.config.schema import ExperimentConfig
from flowzoo.benchmark.config.search_space import Knob, algorithm_space, sampler_space
from flowzoo.benchmark.run.suite import Suite, cell_keys, expand, load_suite, select
from flowzoo.benchmark.run.suite import cells as suite_cells_of
from flowzoo.benchmark.config.tuned import TunedValues, sampler_name
from flowzoo.benchmark.config.tuning_design import TuningDesign, read_design
from flowzoo.cells import base_task
from flowzoo.errors import ConfigError


@dataclass(frozen=True)
class Cell:
    """A (task, algorithm) of the suite with what its trials may change."""

    task: str
    algorithm: str
    knobs: dict  # algorithm key -> Knob
    sampler: str | None
    sampler_knobs: dict  # sampler argument -> Knob
    inert: dict = field(default_factory=dict)  # knob -> why it was left out: its value cannot change the cell's runs

    @property
    def study_name(self) -> str:
        return f"{self.task}/{self.algorithm}"

    def all_knobs(self) -> dict[str, Knob]:
        """Every knob under the name its parameter has in the study (sampler arguments prefixed ``sampler.``)."""
        return {**self.knobs, **{f"sampler.{k}": v for k, v in self.sampler_knobs.items()}}


def tuning_cells(suite: Suite, design: TuningDesign, tasks_csv: str | None = None,
                 algorithms_csv: str | None = None) -> list[Cell]:
    """The design's cells (default: every cell of the suite), cut by ``--tasks``/``--algorithms``; a cell's space
    is its algorithm's and its prompt sampler's, less the keys the cell pins (its own ``per_algorithm`` block and the
    sampler arguments it names): those make a control what it is."""
    suite_cells = suite_cells_of(suite)
    wanted = [(t, a) for t, algs in design.cells.items() for a in algs] if design.cells else suite_cells
    unknown = [f"{t}/{a}" for t, a in wanted if (t, a) not in suite_cells]
    if unknown:
        raise ConfigError(f"suite {suite.name}: tuning.cells names {', '.join(unknown)}, not cells of the suite; "
                          f"cells: {', '.join(f'{t}/{a}' for t, a in suite_cells)}")
    chosen = select(suite, algorithms_csv, None, tasks_csv)  # validates the names
    wanted = [(t, a) for t, a in wanted if (t, a) in suite_cells_of(chosen)]
    if not wanted:
        raise ConfigError(f"--tasks/--algorithms leave no cell of suite {suite.name}'s tuning design to tune")
    cells = []
    for task, alg in wanted:
        keys = cell_keys(suite, task, alg)
        check_validation(suite, design, task, keys)
        model, base = keys.model, base_task(task)
        knobs = {k: v for k, v in algorithm_space(alg, model, base).items() if k not in keys.pinned}
        spec = keys.data["train"].get("prompt_sampler")
        sampler = sampler_name(spec)
        named = set(spec) - {"name"} if isinstance(spec, dict) else set()
        sampler_knobs = ({k: v for k, v in sampler_space(sampler, model, base).items() if k not in named}
                         if sampler else {})
        inert = inert_knobs(keys, task, alg, knobs)
        named_inert = [k for k in design.knobs if k in inert]
        if named_inert:
            raise ConfigError(f"suite {suite.name}: tuning.knobs names {named_inert[0]!r}, inert in {task}/{alg} "
                              f"({inert[named_inert[0]]}): tuning it would spend trials on a value that changes nothing")
        knobs = {k: v for k, v in knobs.items() if k not in inert}
        if design.knobs:
            missing = [k for k in design.knobs if k not in knobs and k not in sampler_knobs]
            if missing:
                raise ConfigError(f"suite {suite.name}: tuning.knobs {missing} are not in the space of {task}/{alg}; "
                                  f"its knobs: {', '.join([*knobs, *sampler_knobs]) or 'none'}")
            knobs = {k: v for k, v in knobs.items() if k in design.knobs}
            sampler_knobs = {k: v for k, v in sampler_knobs.items() if k in design.knobs}
        if not knobs and not sampler_knobs:
            raise ConfigError(f"{alg} declares no search space; add a `search_space:` section to "
                              f"benchmark/recipes/{alg}.yaml (docs/tuning.md)")
        cells.append(Cell(task, alg, knobs, sampler, sampler_knobs, inert))
    return cells


#: what an evaluation measures beside ``eval_reward`` that no objective reads (what a gain cost: the gold judge, the
#: prompts never trained on, the image-feature spread; the algorithm sampler's extra column): a trial leaves them out.
#: They read the evaluation's samples and draw no training randomness, so a trial trains as the reported run would
#: (tests/test_tuning.py); on the tiny rare-counting task they were 2/3 of the evaluations' samples. Held-out
#: *training* conditions (``prompts.unseen_every``) change what trains and are kept
UNREAD_BY_OBJECTIVES = ("train.gold=null", "prompts.unseen=null", "train.spread_features=null", "train.eval_own=false")


def validation_overrides(design: TuningDesign) -> list[str]:
    """What makes a trial's evaluations validation ones: the design's evaluation noise, its held-out prompts, and
    nothing measured that the objective does not read (:data:`UNREAD_BY_OBJECTIVES`)."""
    overrides = [f"train.eval_seed={design.validation.eval_seed}", *UNREAD_BY_OBJECTIVES]
    if design.validation.prompts == "held_out":
        overrides.append("prompts.eval_split=validation")
    return overrides


def check_validation(suite: Suite, design: TuningDesign, task: str, keys) -> None:
    """A one-line ConfigError when a cell's trials would score on its reported evaluation set: the design's
    evaluation noise is the cell's own, or its held-out prompts do not exist for the cell's prompt source."""
    from flowzoo.benchmark.config.schema import TrainSection
    from flowzoo.benchmark.prompts.sources import PromptSection, load_prompts
    from flowzoo.schema import from_mapping

    where = f"suite {suite.name}: tuning.validation"
    reported = keys.data["train"].get("eval_seed", TrainSection.eval_seed)
    if design.validation.eval_seed == reported:
        raise ConfigError(f"{where}.eval_seed {reported} is the evaluation noise of the reported runs of {task}: "
                          f"trials would score on the reported evaluation set; give another eval_seed")
    if design.validation.prompts == "held_out":
        section = from_mapping(PromptSection, {**(keys.data.get("prompts") or {}), "eval_split": "validation"},
                               where="prompts")
        try:
            load_prompts(section)
        except ConfigError as error:
            raise ConfigError(f"{where}.prompts held_out, task {task}: {error}") from None


def inert_knobs(keys, task: str, alg: str, knobs: dict) -> dict[str, str]:
    """The knobs of a cell's space whose value cannot change its runs at the cell's own keys (the algorithm config's
    ``inert_keys``: e.g. AWM's ``ema_kl_beta`` at ``kl_beta`` 0), unless a knob that makes them inert is tuned too:
    {knob: why}."""
    from flowzoo import algorithms
    from flowzoo.benchmark.config.resolve import Layers, resolve

    data = {**keys.data, "task": task}
    resolved = resolve(data, alg, Layers(keys.shared, keys.own, keys.pinned)).data["algorithm"]
    config = algorithms.get(alg).typed_config({k: v for k, v in resolved.items() if k != "name"})
    return {knob: why for knob, (why, switches) in config.inert_keys().items()
            if knob in knobs and not any(switch in knobs for switch in switches)}


def trial_configs(suite: Suite, design: TuningDesign, cell: Cell, values: dict, trial_dir: Path,
                  seeds: list[int] | None = None) -> list[ExperimentConfig]:
    """The trial's runs, one per tuning seed (or per one of ``seeds``: the confirmation's): the suite's cell config
    (as bench builds it) with ``values`` in the tuned layer, the design's steps and validation split, in
    ``trial_dir/s<seed>``."""
    algorithm_values = {k: v for k, v in values.items() if not k.startswith("sampler.")}
    sampler_values = {k.removeprefix("sampler."): v for k, v in values.items() if k.startswith("sampler.")}
    layer = TunedValues(algorithm_values, sampler_values, f"trial {trial_dir.name}")
    seeds = ",".join(str(s) for s in (design.seeds if seeds is None else seeds))
    one_cell = select(suite, cell.algorithm, seeds, cell.task)
    overrides = [f"train.steps={design.steps}"] if design.steps else []
    overrides += validation_overrides(design)
    configs = expand(one_cell, trial_dir, overrides, tuned=lambda task, alg: layer)
    for config in configs:
        config.run_dir = str(trial_dir / f"s{config.seed}")
    return configs


def check_space(suite: Suite, design: TuningDesign, cell: Cell, trials_dir: Path) -> int:
    """Every probe point of every knob of the cell (bounds, (log-)midpoint, each choice; the other knobs unset)
    passes the config loader, before any trial: a range that does not fit the cell fails in one line. Returns the
    number of points checked."""
    checked = 0
    for name, knob in cell.all_knobs().items():
        for value in knob.points():
            try:
                trial_configs(suite, design, cell, {name: value}, trials_dir / "check")
            except ConfigError as error:
                raise ConfigError(f"search space of {cell.study_name}: {name}={value!r} does not fit the cell "
                                  f"({error}); narrow the knob's range for this model or task") from None
            checked += 1
    return checked


def load_tuning(suite_ref: str) -> tuple[Suite, TuningDesign]:
    from flowzoo.benchmark.run.suite import evaluation_seeds

    suite = load_suite(suite_ref)
    if suite.tuning is None:
        raise ConfigError(f"suite {suite.name} has no `tuning:` section; fix its tuning design there before tuning "
                          f"(docs/tuning.md)")
    return suite, read_design(suite.name, suite.tuning, evaluation_seeds(suite))
