"""The tuned layer of a run's keys (benchmark/config/resolve.py): a suite's ``tuned:`` directory of chosen
configurations ``DIR/<task>/<algorithm>.yaml`` (what ``flowzoo tune --out`` writes under ``tuned/``), or a tune trial's
values.

A cell without a file of its own takes its base task's (``task`` of ``task@variant``), then its method's (an ablation
takes the file of the method it ablates, less the keys its preset fixes). The tuned values sit above the suite's
shared per-algorithm block and below a cell's own ``tasks.<task>.per_algorithm`` keys (the keys that make a control
what it is are never replaced) and the command line. The tuning itself (design, trials, pruners, report) is
benchmark/tuning/.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowzoo import algorithms
from flowzoo.benchmark.config.schema import read_yaml
from flowzoo.cells import base_task
from flowzoo.errors import ConfigError


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
    from flowzoo.benchmark.config.search_space import _preset_keys

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
