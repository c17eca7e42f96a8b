"""Loading a config: the schema (``benchmark.config.schema``), then the dry run of every check
(``benchmark.run.experiment.check``). ``load_config`` returns a fully resolved, checked
:class:`ExperimentConfig`; every problem is a :class:`ConfigError` with a one-line message."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from flowzoo import models
from flowzoo import rewards
from flowzoo.benchmark.config.schema import (
    ExperimentConfig, declared_secrets, read_yaml, reward_names,
)
from flowzoo.benchmark.run import experiment, tracking
from flowzoo.benchmark.config.resolve import DEFAULT_ALGORITHM, Resolved, algorithm_refusal, resolve_config_mapping
from flowzoo.benchmark.prompts.sources import check_source
from flowzoo.errors import ConfigError
from flowzoo.labels import reject_nul
from flowzoo.named_spec import named_spec
from flowzoo.schema import from_mapping, to_mapping
from flowzoo.secrets import warn_literal_secrets
from flowzoo.models.shipped import refuse_shipped


def _check_reward_weights(weights: Mapping[str, Any]) -> None:
    """``reward: {name: weight}``: finite numbers, not all 0 (the reward would be a constant)."""
    if not weights:
        raise ConfigError("reward: give a reward name or a mapping {name: weight}")
    for name, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(f"reward: the weight of {name!r} must be a finite number, got {weight!r}")
    if not any(weights.values()):
        raise ConfigError(f"reward: every weight is 0 ({dict(weights)}), so the reward is a constant; give one a "
                          f"non-zero weight")


def build_config(data: Mapping[str, Any]) -> ExperimentConfig:
    """Validate a config mapping completely (names, arguments, values) without building anything heavy: the schema
    here, then the dry run of ``benchmark.run.experiment.check`` (constructor arguments, sample kinds, T-bounded knobs,
    the algorithm's own checks)."""
    reject_nul(data)  # before any value reaches the file system (a NUL there is a ValueError, not an OSError)
    data = dict(data)
    data["algorithm"] = named_spec(data.get("algorithm", {"name": DEFAULT_ALGORITHM}), algorithm_refusal(),
                                   optional=False, string_name=False)
    config = from_mapping(ExperimentConfig, data)
    config.resolve_algorithm()  # the name and every hyper-parameter, typed once
    refuse_shipped(config.resolved_run_dir(), "run_dir")  # also a bench grid whose --runs points there
    models.get(config.model.name)
    names = reward_names(config)
    for name in names:
        rewards.get(name)
    if isinstance(config.reward, Mapping):
        _check_reward_weights(config.reward)
    for name, kwargs in config.reward_args.items():
        if name not in names:
            raise ConfigError(f"reward_args: {name!r} is not a reward of this config; rewards: {', '.join(names)}")
    experiment.check(config)
    check_source(config.prompts)
    tracking.check_trackers(config.train.trackers)
    warn_literal_secrets(to_mapping(config), declared_secrets(config))
    config.__dict__[experiment.CHECKED] = experiment.fingerprint(config)  # build() skips a second dry run of an unchanged config
    return config


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """A config file (or none: every default) with ``key=value`` overrides, its algorithm keys resolved over the
    released recipe (:mod:`benchmark.config.resolve`), validated."""
    return load_resolved(path, overrides)[0]


def load_resolved(path: str | Path | None, overrides: Sequence[str] = ()) -> tuple[ExperimentConfig, Resolved]:
    """:func:`load_config` and where its algorithm keys came from (``Resolved.recipe_line`` for the command line)."""
    data = read_yaml(path) if path is not None else {}
    resolved = resolve_config_mapping(data, overrides)
    return build_config(resolved.data), resolved
