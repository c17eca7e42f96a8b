"""Targets: the reward level a cost-to-target is measured at (:class:`Target`: ``gain``, ``relative`` or
``absolute``, parsed from the command line's ``--target``), and each task's target computed from the baseline's runs
(its base and final rewards). Definitions: :mod:`benchmark.analysis.stats`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from flowzoo.benchmark.analysis import effects
from flowzoo.errors import ConfigError



TARGET_KINDS = ("gain", "relative", "absolute")


DEFAULT_GAIN_FRACTION = 0.9


TARGET_SYNTAX = ("'0.9gain' or '90%gain' (that share of the baseline's gain over the base model), '0.9x' or '90%' "
                 "(that share of the baseline's final reward), or a reward value such as '0.8'")


@dataclass(frozen=True)
class Target:
    """How a task's target reward is set from the baseline's runs (``base`` = the baseline's step-0 eval reward, the
    base model; ``final`` = the baseline's final reward; both means over its seeds):

    * ``"gain"``: base + ``value`` x (final - base), i.e. ``value`` of the way from the base model to the baseline's
      final reward (the default, ``value`` 0.9). Undefined (NaN) where the baseline did not improve on the base.
    * ``"relative"``: ``value`` x final (assumes a positive reward where larger is better).
    * ``"absolute"``: ``value`` itself.
    """

    kind: str = "gain"
    value: float = DEFAULT_GAIN_FRACTION

    def __post_init__(self):
        if self.kind not in TARGET_KINDS:
            raise ConfigError(f"target kind {self.kind!r} is not one of {sorted(TARGET_KINDS)}")
        check_target_value(self.value, f"{self.kind} target")
        if self.kind != "absolute" and self.value <= 0:
            raise ConfigError(f"{self.kind} target fraction must be > 0, got {self.value!r}")

    def describe(self, baseline: str) -> str:
        if self.kind == "absolute":
            return f"eval reward >= {self.value:g} (absolute)"
        if self.kind == "gain":
            return (f"{100 * self.value:g}% of the way from the base model (`{baseline}`'s step-0 eval reward) to "
                    f"`{baseline}`'s final eval reward (smoothed; both means over its seeds)")
        share = "" if self.value == 1.0 else f"{100 * self.value:g}% of "
        return f"{share}`{baseline}`'s final eval reward (smoothed, mean over its seeds)"


def check_target_value(value, what: str = "target") -> float:
    """A finite number, else ``ConfigError`` naming the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} {value!r} is not a finite number; use {TARGET_SYNTAX}")
    return float(value)


def as_target(target: "Target | float | Mapping[str, float] | None") -> "Target | dict[str, float]":
    """Normalize a user target: None -> the default (90% of the baseline's gain); a number -> absolute; a mapping ->
    absolute per task."""
    if target is None:
        return Target()
    if isinstance(target, Target):
        return target
    if isinstance(target, Mapping):
        return {str(task): check_target_value(value, f"target of task {task!r}") for task, value in target.items()}
    if isinstance(target, (int, float)) and not isinstance(target, bool):
        return Target("absolute", float(target))
    raise ConfigError(f"target {target!r} is not None, a number, a {{task: value}} mapping or a Target")


def parse_target(text: str | None) -> "Target":
    """A command-line target: '' or None -> the default; '0.9gain' / '90%gain' -> that share of the baseline's gain;
    '0.9x' / '90%' -> that share of the baseline's final reward; a plain number such as '0.8' -> that eval reward.
    ``ConfigError`` (one line, naming the text and the valid forms) for anything else, NaN and infinities included."""
    if text is None or not str(text).strip():
        return Target()
    raw = str(text).strip()
    body, kind = raw.lower(), "absolute"
    for suffix, suffix_kind in (("gain", "gain"), ("x", "relative")):
        if body.endswith(suffix):
            body, kind = body[: -len(suffix)].strip(), suffix_kind
            break
    divisor = 1.0
    if body.endswith("%"):
        body, divisor = body[:-1].strip(), 100.0
        kind = "relative" if kind == "absolute" else kind
    try:
        value = float(body) / divisor
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (kind != "absolute" and value <= 0):
        raise ConfigError(f"target {raw!r} is not valid; use {TARGET_SYNTAX}")
    return Target(kind, value)


def check_baseline(runs: pd.DataFrame, baseline: str) -> None:
    algorithms = sorted(runs["algorithm"].unique())
    if baseline not in algorithms:
        raise ConfigError(f"baseline {baseline!r} has no runs; algorithms with runs: {algorithms}")


def base_rewards(curves: pd.DataFrame, baseline: str) -> dict[str, float]:
    """Per task: the baseline's step-0 eval reward (the base model before training), mean over its seeds; NaN where
    no baseline run evaluated at step 0."""
    start = curves[(curves["algorithm"] == baseline) & (curves["step"] == 0)]
    means = start.groupby("task")["eval_reward"].mean()
    return {task: float(means.get(task, math.nan)) for task in sorted(curves["task"].unique())}


def baseline_finals(finals: pd.DataFrame, baseline: str) -> dict[str, float]:
    """Per task: the baseline's final reward, mean over its seeds (NaN without baseline runs)."""
    means = finals[finals["algorithm"] == baseline].groupby("task")["final_reward"].mean()
    return {task: float(means.get(task, math.nan)) for task in sorted(finals["task"].unique())}


def task_targets(finals: pd.DataFrame, baseline: str, target=None, bases: Mapping[str, float] | None = None
                 ) -> dict[str, float]:
    """The target reward of every task (NaN where it cannot be defined: a task without baseline runs, or for a gain
    target one where the baseline's base reward is unknown or its final reward is not above it). ``bases``: the
    base reward per task (:func:`base_rewards`), needed by a gain target."""
    target = as_target(target)
    tasks = sorted(finals["task"].unique())
    if isinstance(target, dict):
        unknown = sorted(set(target) - set(tasks))
        if unknown:
            raise ConfigError(f"target names unknown tasks {unknown}; tasks: {tasks}")
        return {task: target.get(task, math.nan) for task in tasks}
    if target.kind == "absolute":
        return {task: target.value for task in tasks}
    final = baseline_finals(finals, baseline)
    if target.kind == "relative":
        return {task: target.value * final[task] for task in tasks}
    bases = bases or {}
    targets = {}
    for task in tasks:
        base = bases.get(task, math.nan)
        gain = final[task] - base
        targets[task] = base + target.value * gain if gain > 0 else math.nan
    return targets


def describe_target(baseline: str, target=None) -> str:
    target = as_target(target)
    if isinstance(target, dict):
        return "absolute per task: " + ", ".join(f"`{t}` >= {v:g}" for t, v in sorted(target.items()))
    return target.describe(baseline)


def target_function(target, task: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The task's target as a function of the baseline's mean base and mean final reward (vectorised), so that the
    effects' bootstraps re-estimate it in every resample; a constant for absolute targets."""
    target = as_target(target)
    if isinstance(target, dict):
        value = target.get(task, math.nan)
        return lambda base, final: np.full(np.shape(base), value, dtype=float)
    if target.kind == "absolute":
        return lambda base, final: np.full(np.shape(base), target.value, dtype=float)
    if target.kind == "relative":
        return lambda base, final: target.value * np.asarray(final, dtype=float)
    return effects.gain_target(target.value)
