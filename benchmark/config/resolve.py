"""One owner for a run's keys: every command (train, bench, tune, eval, grad-snr) resolves a run here.

A run's algorithm keys, lowest precedence first (docs/recipes.md):

1. the algorithm class's defaults, with its preset (applied when the config is typed:
   ``ExperimentConfig.resolve_algorithm``);
2. *shared* keys: a suite's ``algorithm:`` block (``defaults.algorithm``, then ``tasks.<task>.algorithm``), the
   sampling setup every algorithm of the suite starts from;
3. the algorithm's released recipe, ``benchmark/recipes/<algorithm>.yaml`` at the run's model and task
   (:func:`benchmark.config.recipes.recipe`; a ``task@variant`` takes the recipe of ``task``); left out when the
   config says ``use_recipe: false``;
4. *own* keys: a suite's ``per_algorithm.<algorithm>`` block, or a config file's ``algorithm:`` block (what a user
   writes for one algorithm wins over its release);
5. tuned values (a suite's ``tuned:`` directory, or a ``flowzoo tune`` trial), never over a suite cell's own
   ``tasks.<task>.per_algorithm.<algorithm>`` keys (those make a control what it is);
6. ``key=value`` overrides from the command line.

The same layering as rl-baselines3-zoo's ``ExperimentManager.read_hyperparameters`` (YAML, then the trial, then the
command line, one function for training and tuning alike). The recipe layer is picked by the run's *final*
algorithm, model and task, so ``algorithm.name=dance_grpo`` on the command line gets DanceGRPO's recipe.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

from flowzoo.benchmark.config.schema import ExperimentConfig, ModelSection, apply_overrides
from flowzoo.benchmark.config.recipes import recipe, recipe_paths
from flowzoo.benchmark.config.tuned import TunedValues, apply_tuned
from flowzoo.cells import base_task
from flowzoo.errors import ConfigError
from flowzoo.named_spec import named_spec, split_spec

DEFAULT_ALGORITHM = "flow_grpo"


@dataclass(frozen=True)
class Layers:
    """What a run's keys are made of besides its config mapping (see the module docstring)."""

    shared: dict = field(default_factory=dict)  # algorithm keys under the recipe
    own: dict = field(default_factory=dict)  # algorithm keys over the recipe
    pinned: dict = field(default_factory=dict)  # own keys the tuned layer never replaces
    tuned: TunedValues | None = None
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resolved:
    """A run's resolved config mapping and where its algorithm keys came from."""

    data: dict
    algorithm: str
    model: str
    task: str
    recipe_files: tuple[str, ...]  # the recipe files read (names), empty with use_recipe: false
    recipe_keys: dict  # the recipe's keys the run holds (not replaced by a later layer)
    recipe_offered: dict  # every key the recipe gives this algorithm, model and task
    tuned_applied: tuple[dict, dict] | None  # the tuned layer's algorithm keys and sampler arguments it set
    use_recipe: bool = True

    def recipe_line(self) -> str:
        """One line saying which recipe the run took, e.g. for ``flowzoo train``."""
        where = f"{self.algorithm} on {self.model}, task {self.task}"
        if not self.use_recipe:
            return f"recipe: off for {where} (use_recipe: false): class defaults under the config's keys"
        if not self.recipe_offered:
            return (f"recipe: none for {where} (benchmark/recipes holds no value for it): class defaults under "
                    f"the config's keys")
        files = " < ".join(self.recipe_files)
        if not self.recipe_keys:
            return (f"recipe: {files} for {where}: all {len(self.recipe_offered)} of its values replaced by the "
                    f"config's own keys")
        held = ", ".join(f"{k}={_short(v)}" for k, v in self.recipe_keys.items())
        return (f"recipe: {files} for {where}: {held} (under the config's own keys; use_recipe=false opts out; "
                f"docs/recipes.md)")


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def algorithm_refusal(where: str = "algorithm") -> str:
    """The one line refusing an ``algorithm:`` value that is neither a name nor a mapping with ``name``."""
    return f"{where}: give a name, e.g. `algorithm: flow_grpo` or `algorithm: {{name: flow_grpo, ...}}`"


def split_algorithm_block(block: Any, where: str = "algorithm") -> tuple[str, dict]:
    """A config's ``algorithm:`` value (a name, or a mapping with ``name``) as (name, its other keys)."""
    if block is None:
        return DEFAULT_ALGORITHM, {}
    return split_spec(named_spec(block, algorithm_refusal(where), string_name=False))


def _final(data: dict, name: str, overrides: Sequence[str]) -> tuple[str, str, str, bool]:
    """The run's algorithm, model, task and use_recipe after the command line's overrides."""
    peek = apply_overrides({"algorithm": {"name": name}, "task": data.get("task", ExperimentConfig.task),
                            "model": copy.deepcopy(data.get("model") or {}),
                            "use_recipe": data.get("use_recipe", True)}, list(overrides))
    algorithm, model = peek["algorithm"], peek["model"]  # an override may replace a section by a plain value
    if not isinstance(algorithm, str):
        algorithm = algorithm.get("name", name) if isinstance(algorithm, dict) else name
    model = model.get("name", ModelSection.name) if isinstance(model, dict) else ModelSection.name
    use = peek["use_recipe"]
    if not isinstance(use, bool):
        raise ConfigError(f"use_recipe must be true or false, got {use!r}")
    return str(algorithm), str(model), str(peek.get("task")), use


def resolve(data: dict, name: str, layers: Layers = Layers()) -> Resolved:
    """A run's config mapping with its algorithm keys layered: ``data`` holds the run's other sections (task, model,
    reward, prompts, train, seed, run_dir; its ``algorithm`` is replaced), ``name`` the algorithm before overrides."""
    data = copy.deepcopy(data)
    algorithm, model, task, use_recipe = _final(data, name, layers.overrides)
    from_recipe = recipe(algorithm, base_task(task), model) if use_recipe else {}
    data["algorithm"] = {**copy.deepcopy(layers.shared), **copy.deepcopy(from_recipe), **copy.deepcopy(layers.own),
                         "name": name}
    applied = apply_tuned(data, layers.tuned, layers.pinned) if layers.tuned is not None else None
    data = apply_overrides(data, list(layers.overrides))
    final = data.get("algorithm") if isinstance(data.get("algorithm"), dict) else {}
    held = {k: v for k, v in from_recipe.items() if k in final and final[k] == v and k not in layers.own
            and not (applied and k in applied[0])}
    files = tuple(p.name for p in recipe_paths(algorithm)) if use_recipe else ()
    return Resolved(data, algorithm, model, task, files, held, from_recipe, applied, use_recipe)


def resolve_config_mapping(data: dict, overrides: Sequence[str] = ()) -> Resolved:
    """A config file's mapping as a run (``flowzoo train``, ``eval``, ``grad-snr``): its ``algorithm:`` block is the
    run's own keys, over the released recipe of its algorithm, model and task."""
    data = dict(data)
    name, own = split_algorithm_block(data.get("algorithm"))
    return resolve(data, name, Layers(own=own, overrides=tuple(overrides)))
