"""A suite's tuning design (its ``tuning:`` section) and its tuned recipes (its ``tuned:`` directory).

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

``tuned: DIR`` names the chosen configurations ``DIR/<task>/<algorithm>.yaml`` (what ``flowzoo tune --out`` writes
under ``tuned/``). A cell without a file of its own takes its base task's (``task`` of ``task@variant``), then its
method's (an ablation takes the file of the method it ablates, less the keys its preset fixes). The tuned values sit
above the suite's shared per-algorithm block and below a cell's own ``tasks.<task>.per_algorithm`` keys (the keys
that make a control what it is are never replaced) and the command line.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowzoo import algorithms
from flowzoo.benchmark.experiments.config import read_yaml
from flowzoo.benchmark.experiments.tuning_pruners import PRUNERS
from flowzoo.cells import base_task
from flowzoo.errors import ConfigError
from flowzoo.schema import from_mapping

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
    name: str = "median"  # median, median_latest or none (benchmark/experiments/tuning_pruners.py)
    startup_trials: int = 5  # no pruning before this many trials finished
    warmup_evaluations: int = 10  # no pruning of a trial before this many of its evaluations


@dataclass
class TuningDesign:
    objective: str
    trials: int
    seeds: list[int]
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
    design = from_mapping(TuningDesign, section, where=where)
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
    check_disjoint(design.seeds, evaluation_seeds, where)
    return design


def check_disjoint(tuning_seeds: list[int], evaluation_seeds: list[int], where: str) -> None:
    """Tuning seeds never evaluate: an overlap is refused in one line naming the shared seeds."""
    shared = sorted(set(tuning_seeds) & set(evaluation_seeds))
    if shared:
        raise ConfigError(f"{where}.seeds {shared} are also evaluation seeds of the suite; tuning seeds must be "
                          f"disjoint from its seeds and seed sets (e.g. 1000, 1001, ...)")


@dataclass(frozen=True)
class TunedValues:
    """A cell's tuned values: algorithm keys, prompt-sampler arguments, and where they come from."""

    algorithm: dict
    sampler: dict
    source: str
    seeds: tuple = ()  # the tuning seeds that chose them (a tuned file's ``seeds``)


def tuned_path(directory: str | Path, task: str, algorithm: str) -> Path:
    return Path(directory) / task / f"{algorithm}.yaml"


def find_tuned(directory: str | Path, task: str, algorithm: str, suite: str | None = None) -> TunedValues | None:
    """The cell's tuned values from ``directory``: its own file, else its base task's, else (for an ablation) its
    method's less the keys the ablation's preset fixes; None when there is none. A file that names another suite
    (``suite``, when given), task or algorithm than the place it was found at, or whose keys would change the
    algorithm (``name``), is a one-line ConfigError."""
    from flowzoo.benchmark.experiments.search_space import _preset_keys

    if not Path(directory).is_dir():
        raise ConfigError(f"tuned: {directory} is not a directory of tuned configurations (flowzoo tune --out DIR "
                          f"writes DIR/tuned)")
    method = algorithms.get(algorithm).ablation_of
    candidates = [(task, algorithm), (base_task(task), algorithm)]
    if method:
        candidates += [(task, method), (base_task(task), method)]
    for cell_task, cell_algorithm in dict.fromkeys(candidates):
        path = tuned_path(directory, cell_task, cell_algorithm)
        if path.is_file():
            data = read_yaml(path)
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: not a tuned configuration (a mapping written by flowzoo tune --out)")
            keys = data.get("algorithm_keys") or {}
            sampler = data.get("sampler_keys") or {}
            if not isinstance(keys, dict) or not isinstance(sampler, dict):
                raise ConfigError(f"{path}: algorithm_keys and sampler_keys must be mappings")
            check_tuned_file(path, data, {"suite": suite, "task": cell_task, "algorithm": cell_algorithm})
            fixed = _preset_keys(algorithm)
            seeds = data.get("seeds") or []
            if not isinstance(seeds, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds):
                raise ConfigError(f"{path}: seeds must be a list of integers (the tuning seeds), got {seeds!r}")
            return TunedValues({k: v for k, v in keys.items() if k not in fixed}, dict(sampler), str(path),
                               tuple(seeds))
    return None


def check_tuned_file(path: Path, data: dict, expected: dict[str, str | None]) -> None:
    """A one-line ConfigError when a tuned file was chosen for another suite, task or algorithm than the cell that
    found it (its own fields), or when its ``algorithm_keys`` name an algorithm (``name``: the cell would train
    another algorithm in its directory)."""
    if "name" in data.get("algorithm_keys", {}):
        raise ConfigError(f"{path}: algorithm_keys.name {data['algorithm_keys']['name']!r}: a tuned file holds "
                          f"the tuned knobs of the algorithm it was found for, never another algorithm")
    for key, want in expected.items():
        found = data.get(key)
        if want is not None and found is not None and found != want:
            raise ConfigError(f"{path}: chosen for {key} {found!r}, but found for {key} {want!r} (is --tuned "
                              f"the directory of another tuning?)")


def sampler_name(spec: Any) -> str | None:
    """The prompt sampler a ``train.prompt_sampler`` value names (None: the algorithm's default)."""
    return spec.get("name") if isinstance(spec, dict) else spec


def apply_tuned(data: dict, tuned: TunedValues, pinned: dict) -> tuple[dict, dict]:
    """Layer ``tuned`` into a run's merged config ``data`` (its ``algorithm`` and ``train`` already resolved), never
    over the cell's own ``pinned`` algorithm keys (``tasks.<task>.per_algorithm.<algorithm>``) or the sampler
    arguments the cell names. Returns the algorithm keys and sampler arguments it set."""
    applied = {k: copy.deepcopy(v) for k, v in tuned.algorithm.items() if k not in pinned}
    data["algorithm"].update(copy.deepcopy(applied))
    spec = (data.get("train") or {}).get("prompt_sampler")
    applied_sampler: dict = {}
    if tuned.sampler and sampler_name(spec):
        named = {k: v for k, v in spec.items() if k != "name"} if isinstance(spec, dict) else {}
        applied_sampler = {k: copy.deepcopy(v) for k, v in tuned.sampler.items() if k not in named}
        data["train"]["prompt_sampler"] = {"name": sampler_name(spec), **tuned.sampler, **named}
    return applied, applied_sampler


def recipe_note(directory: str | Path, tuned: TunedValues, applied: tuple[dict, dict], data: dict) -> dict | None:
    """A run's ``recipe`` note (config.yaml; no part of its identity): the ``tuned:`` directory, the file its values
    came from and the values of it the run holds (``data``: its config with the command line's overrides applied,
    which win over the tuned layer); None when none of them is left."""
    algorithm_keys = {k: v for k, v in applied[0].items() if (data.get("algorithm") or {}).get(k) == v}
    spec = (data.get("train") or {}).get("prompt_sampler")
    sampler_keys = {k: v for k, v in applied[1].items() if isinstance(spec, dict) and spec.get(k) == v}
    if not algorithm_keys and not sampler_keys:
        return None
    return {"tuned": str(directory), "file": tuned.source, "algorithm_keys": algorithm_keys,
            "sampler_keys": sampler_keys}
