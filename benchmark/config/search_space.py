"""Search spaces: what ``flowzoo tune`` may change of an algorithm or a prompt sampler, declared once beside its recipe.

An algorithm's space is the ``search_space:`` section of its recipe file ``benchmark/recipes/<algorithm>.yaml``;
a prompt sampler's, the same section of ``benchmark/recipes/samplers/<sampler>.yaml``. Scopes work as in the
recipe (``default``, a model name, a task name; the most specific scope's knob wins), one knob per line with its
source or ``ours: why`` as a trailing comment::

    search_space:
      default:
        lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}  # ours: two decades around the released 3e-4
      tiny:
        t_off: {type: int, low: 1, high: 4}  # ours: T = 5 sampling steps on the tiny tier

Knob types: ``float`` and ``int`` (``low``, ``high``, optional ``log``) and ``categorical`` (``choices``). An
algorithm reads the spaces of the recipe files it reads (:func:`benchmark.config.recipe_files.read_algorithm_files`,
base first, a later file's knob over an earlier one's); when none of them declares a space (a new algorithm with no
file of its own), it reads the default space, ``benchmark/recipes/defaults/search_space.yaml`` (the learning
rate), so adding an algorithm is one file and ``flowzoo tune`` still gives it a budget; a preset (an ablation) inherits its parent's space less the keys
the preset fixes (``op_grpo_no_truncation`` never tunes ``t_off``: its ``t_off: null`` is what it ablates).

Reading the files (the section, each knob's source comment, the chain of files an algorithm reads, the merge of
scopes) is :mod:`benchmark.config.recipe_files`'s, shared with the recipes; this module makes knobs of what it
reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from flowzoo import algorithms
from flowzoo.algorithms import prompt_samplers
from flowzoo.benchmark.config import recipe_files
from flowzoo.benchmark.config.recipe_files import SEARCH_SPACE
from flowzoo.errors import ConfigError

TYPES = ("float", "int", "categorical")
#: keys a preset fixes: never tuned (named here for the tuned layer (experiments/tuned.py) and the tests)
_preset_keys = recipe_files.preset_keys


@dataclass(frozen=True)
class Knob:
    """One tunable value: its range and where the range comes from."""

    name: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple = ()
    source: str = ""

    def describe(self) -> str:
        if self.type == "categorical":
            return f"{self.name}: one of {list(self.choices)}"
        scale = ", log scale" if self.log else ""
        return f"{self.name}: {self.type} in [{self.low}, {self.high}]{scale}"

    def points(self) -> list[Any]:
        """Values that probe the range: both bounds and the (log-)midpoint, or every choice."""
        if self.type == "categorical":
            return list(self.choices)
        if self.log:
            middle = math.exp((math.log(self.low) + math.log(self.high)) / 2)
        else:
            middle = (self.low + self.high) / 2
        if self.type == "int":
            middle = int(round(middle))
        return list(dict.fromkeys([self.low, middle, self.high]))

    def suggest(self, trial, name: str | None = None) -> Any:
        """The value an Optuna trial draws for this knob (as its parameter ``name``, default the knob's)."""
        name = name or self.name
        if self.type == "categorical":
            return trial.suggest_categorical(name, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(name, self.low, self.high, log=self.log)
        return trial.suggest_float(name, self.low, self.high, log=self.log)


def _knob(name: str, spec: Any, where: str, source: str) -> Knob:
    if not isinstance(spec, dict) or spec.get("type") not in TYPES:
        raise ConfigError(f"{where}: knob {name!r} needs `type:` one of {', '.join(TYPES)}, got {spec!r}")
    kind = spec["type"]
    allowed = {"type", "choices"} if kind == "categorical" else {"type", "low", "high", "log"}
    unknown = set(spec) - allowed
    if unknown:
        raise ConfigError(f"{where}: knob {name!r} ({kind}) has unknown keys {sorted(unknown)}; valid: "
                          f"{', '.join(sorted(allowed))}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}: knob {name!r} needs a non-empty list `choices`, got {choices!r}")
        return Knob(name, kind, choices=tuple(choices), source=source)
    number = int if kind == "int" else (int, float)
    low, high, log = spec.get("low"), spec.get("high"), spec.get("log", False)
    if (not isinstance(low, number) or not isinstance(high, number) or isinstance(low, bool)
            or isinstance(high, bool) or not low < high):
        raise ConfigError(f"{where}: knob {name!r} needs {kind} bounds low < high, got low {low!r}, high {high!r}")
    if not isinstance(log, bool) or (log and low <= 0):
        raise ConfigError(f"{where}: knob {name!r}: `log` must be true or false, and a log range needs low > 0")
    return Knob(name, kind, low, high, log, source=source)


def _file_space(file: recipe_files.RecipeFile) -> dict[str, dict[str, Knob]]:
    """A read file's search space as {scope: {knob: Knob}}."""
    space: dict[str, dict[str, Knob]] = {}
    for value in recipe_files.space_values(file):
        where = f"{file.path.name}: {SEARCH_SPACE}.{value.scope}"
        space.setdefault(value.scope, {})[value.knob] = _knob(value.knob, value.value, where, value.source)
    return space


def read_space_file(path: Path) -> dict[str, dict[str, Knob]]:
    """The ``search_space`` section of ``path`` as {scope: {knob: Knob}}; every knob on one line with its source."""
    return _file_space(recipe_files.read_recipe_file(path)) if path.is_file() else {}


def _known(space: dict[str, Knob], config: type, owner: str) -> dict[str, Knob]:
    """``space``, refused when it names a knob that ``config`` (the owner's Config) lacks."""
    fields = set(config.__dataclass_fields__)
    unknown = sorted(set(space) - fields)
    if unknown:
        raise ConfigError(f"search space of {owner}: unknown knobs {unknown}; valid: {', '.join(sorted(fields))}")
    return space


def _space_files(algorithm: str) -> list[recipe_files.RecipeFile]:
    """The files the algorithm's space is read from: its recipe files when any declares a space, else the default."""
    files = recipe_files.read_algorithm_files(algorithm)
    if any(file.space for file in files):
        return files
    default = recipe_files.default_space_path()
    return [recipe_files.read_recipe_file(default)] if default.is_file() else []


def space_paths(algorithm: str) -> list[Path]:
    """The paths of the files the algorithm's search space is read from, base first (:func:`_space_files`)."""
    return [file.path for file in _space_files(algorithm)]


def algorithm_space(algorithm: str, model: str | None = None, task: str | None = None) -> dict[str, Knob]:
    """The algorithm's knobs for a task on a model (no model/task: the ``default`` scope only)."""
    fixed = recipe_files.preset_keys(algorithm)
    files = _space_files(algorithm)
    space = recipe_files.merge_scopes([_file_space(file) for file in files], model, task)
    known = _known(space, algorithms.get(algorithm).Config, algorithm)
    return {name: knob for name, knob in known.items() if name not in fixed}


def sampler_space(sampler: str, model: str | None = None, task: str | None = None) -> dict[str, Knob]:
    """The prompt sampler's knobs (its arguments) for a task on a model."""
    config = prompt_samplers.get(sampler).Config
    space = recipe_files.merge_scopes([read_space_file(recipe_files.sampler_path(sampler))], model, task)
    return _known(space, config, f"sampler {sampler}")


def describe(scopes: dict[str, dict[str, Knob]]) -> list[str]:
    """Lines for ``flowzoo list NAME``: each scope's knobs with their sources."""
    lines = []
    for scope, knobs in scopes.items():
        lines.append(f"  {scope}:")
        lines += [f"    {knob.describe()}  # {knob.source}" for knob in knobs.values()]
    return lines


def declared_scopes(files: list[Path], fixed: set[str] = frozenset()) -> dict[str, dict[str, Knob]]:
    """Every scope the files declare, merged base first, less the ``fixed`` keys (a preset's)."""
    merged: dict[str, dict[str, Knob]] = {}
    for path in files:
        for scope, knobs in read_space_file(path).items():
            merged.setdefault(scope, {}).update({k: v for k, v in knobs.items() if k not in fixed})
    return merged


def listing(name: str) -> list[str]:
    """The search-space lines of an algorithm or prompt sampler for ``flowzoo list NAME`` (none: one line saying so)."""
    default = ""
    if name in algorithms.names():
        paths = space_paths(name)
        scopes = declared_scopes(paths, recipe_files.preset_keys(name))
        where = f"benchmark/recipes/{name}.yaml"
        if paths == [recipe_files.default_space_path()]:
            default = f"; the default space: none declared, add a `{SEARCH_SPACE}:` section to {where} to tune more"
    else:
        scopes = declared_scopes([recipe_files.sampler_path(name)])
        where = f"benchmark/recipes/samplers/{name}.yaml"
    if not any(scopes.values()):
        return [f"search space (flowzoo tune): none declared; add a `{SEARCH_SPACE}:` section to {where}"]
    return [f"search space (flowzoo tune; scopes: default < model < task{default}):", *describe(scopes)]


def dump_value(value: Any) -> str:
    """A value as YAML text that reads back as the same value (a float keeps its dot: 1.0e-05, not 1e-05)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
