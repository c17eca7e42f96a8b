"""Search spaces: what ``flowzoo tune`` may change of an algorithm or a prompt sampler, declared once beside its recipe.

An algorithm's space is the ``search_space:`` section of its recipe file ``benchmark/hyperparams/<algorithm>.yaml``;
a prompt sampler's, the same section of ``benchmark/hyperparams/samplers/<sampler>.yaml``. Scopes work as in the
recipe (``default``, a model name, a task name; the most specific scope's knob wins), one knob per line with its
source or ``ours: why`` as a trailing comment::

    search_space:
      default:
        lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}  # ours: two decades around the released 3e-4
      tiny:
        t_off: {type: int, low: 1, high: 4}  # ours: T = 5 sampling steps on the tiny tier

Knob types: ``float`` and ``int`` (``low``, ``high``, optional ``log``) and ``categorical`` (``choices``). An
algorithm reads the spaces of the recipe files it reads (:func:`benchmark.experiments.recipes.recipe_files`, base
first, a later file's knob over an earlier one's); a preset (an ablation) inherits its parent's space less the keys
the preset fixes (``op_grpo_no_truncation`` never tunes ``t_off``: its ``t_off: null`` is what it ablates).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import algorithms
from algorithms import prompt_samplers
from benchmark.experiments.config import read_yaml
from flowzoo.errors import ConfigError

SECTION = "search_space"
SAMPLERS_DIR = Path(__file__).resolve().parents[1] / "hyperparams" / "samplers"
TYPES = ("float", "int", "categorical")

_KNOB_LINE = re.compile(r"^    ([A-Za-z0-9_]+):.*?#\s*(.+)$")
_SCOPE_LINE = re.compile(r"^  ([A-Za-z0-9_.@\-]+):\s*(#.*)?$")


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


def read_space_file(path: Path) -> dict[str, dict[str, Knob]]:
    """The ``search_space`` section of ``path`` as {scope: {knob: Knob}}; every knob on one line with its source."""
    if not path.is_file():
        return {}
    section = read_yaml(path).get(SECTION)
    if section is None:
        return {}
    if not isinstance(section, dict) or not all(isinstance(v, dict) for v in section.values()):
        raise ConfigError(f"{path.name}: {SECTION} must map scopes (default, a model, a task) to knobs")
    sources: dict[tuple[str, str], str] = {}
    inside, scope = False, None
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            inside = line.startswith(f"{SECTION}:")
            continue
        if not inside:
            continue
        if top := _SCOPE_LINE.match(line):
            scope = top.group(1)
        elif (knob := _KNOB_LINE.match(line)) and scope is not None:
            sources[(scope, knob.group(1))] = knob.group(2).strip()
    space: dict[str, dict[str, Knob]] = {}
    for scope, knobs in section.items():
        for name, spec in knobs.items():
            source = sources.get((scope, name))
            if not source:
                raise ConfigError(f"{path.name}: {SECTION}.{scope}.{name} has no source; write the knob on one line "
                                  f"ending in `# <released file:line>` or `# ours: <why>`")
            space.setdefault(scope, {})[name] = _knob(name, spec, f"{path.name}: {SECTION}.{scope}", source)
    return space


def _scoped(files: list[Path], model: str | None, task: str | None) -> dict[str, Knob]:
    merged: dict[str, Knob] = {}
    for path in files:
        scopes = read_space_file(path)
        for scope in ("default", model, task):
            merged.update(scopes.get(scope, {}) if scope else {})
    return merged


def _preset_keys(algorithm: str) -> set[str]:
    """Keys a preset fixes (relative to the class it is a preset of): its identity, never tuned."""
    from benchmark.experiments.recipes import algorithm_classes, own_preset

    return {key for cls in algorithm_classes(algorithm) for key in own_preset(cls)}


def algorithm_space(algorithm: str, model: str | None = None, task: str | None = None) -> dict[str, Knob]:
    """The algorithm's knobs for a task on a model (no model/task: the ``default`` scope only)."""
    from benchmark.experiments.recipes import recipe_files

    fixed = _preset_keys(algorithm)
    space = _scoped(recipe_files(algorithm), model, task)
    fields = set(algorithms.get(algorithm).Config.__dataclass_fields__)
    unknown = sorted(set(space) - fields)
    if unknown:
        raise ConfigError(f"search space of {algorithm}: unknown knobs {unknown}; valid: {', '.join(sorted(fields))}")
    return {name: knob for name, knob in space.items() if name not in fixed}


def sampler_space(sampler: str, model: str | None = None, task: str | None = None) -> dict[str, Knob]:
    """The prompt sampler's knobs (its arguments) for a task on a model."""
    cls = prompt_samplers.get(sampler)
    space = _scoped([SAMPLERS_DIR / f"{sampler}.yaml"], model, task)
    fields = set(cls.Config.__dataclass_fields__)
    unknown = sorted(set(space) - fields)
    if unknown:
        raise ConfigError(f"search space of sampler {sampler}: unknown knobs {unknown}; valid: "
                          f"{', '.join(sorted(fields))}")
    return space


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
    from benchmark.experiments.recipes import recipe_files

    if name in algorithms.names():
        scopes = declared_scopes(recipe_files(name), _preset_keys(name))
        where = "benchmark/hyperparams/<algorithm>.yaml"
    else:
        scopes = declared_scopes([SAMPLERS_DIR / f"{name}.yaml"])
        where = f"benchmark/hyperparams/samplers/{name}.yaml"
    if not any(scopes.values()):
        return [f"search space (flowzoo tune): none declared; add a `{SECTION}:` section to {where}"]
    return ["search space (flowzoo tune; scopes: default < model < task):", *describe(scopes)]


def dump_value(value: Any) -> str:
    """A value as YAML text that reads back as the same value (a float keeps its dot: 1.0e-05, not 1e-05)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
