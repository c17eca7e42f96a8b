"""The experiment config: YAML + a typed schema + ``key=value`` overrides, validated before any work.

A config names a task (model + reward + prompts), an algorithm with its hyper-parameters, a seed and the training
budget. ``benchmark.run.loading.load_config`` returns a fully resolved, checked :class:`ExperimentConfig`;
``resolved_dict`` is what a run directory stores as ``config.yaml``. Every problem is a :class:`ConfigError` with a one-line message.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms.engine.base import AlgorithmConfig
from flowzoo.algorithms.engine.sde import MAX_SAMPLING_STEPS
from flowzoo.benchmark.prompts.sources import PromptSection
from flowzoo import strict_yaml
from flowzoo.errors import ConfigError
from flowzoo.labels import check_label, check_path_text
from flowzoo.schema import to_mapping
from flowzoo.secrets import places, redact


@dataclass
class ModelSection:
    name: str = "toy2d"
    args: dict = field(default_factory=dict)  # constructor kwargs of the model class


#: the evaluation protocols (TrainSection.eval_sampler)
EVAL_SAMPLERS = ("pipeline", "algorithm")


@dataclass
class TrainSection:
    steps: int = 30  # training iterations
    prompts_per_step: int = 8  # groups per iteration (each of algorithm.group_size samples)
    eval_every: int = 10  # evaluate every N iterations (and before the first); 0 = only before and at the end
    eval_prompts: int | None = None  # held-out prompts per evaluation; None = all of them
    eval_samples_per_prompt: int = 16
    eval_num_steps: int | None = None  # ODE steps at evaluation; None = the model's default
    eval_seed: int = 12345  # the evaluation noise is the same at every evaluation and for every run
    # the evaluation's sampler, one for every cell of a suite (benchmark/measures/evaluation.py): "pipeline", the
    # model's reference evaluation sampler (its declared shift, CFG scale, sigma grid, eval_num_steps steps) unless eval_shift / eval_guidance
    # name others; "algorithm", each algorithm's training shift and guidance (the harness's only form before
    # 2026-12-03), which makes cells of different recipes evaluate with different samplers
    eval_sampler: str = "pipeline"
    eval_guidance: float | None = None  # the protocol's CFG scale (1 = none); None = the model's default
    eval_shift: float | None = None  # the protocol's sigma-schedule shift; None = the model's (pipeline's) own
    # also evaluate with the algorithm's own shift and guidance where they differ from the protocol's, logged as
    # eval_own_reward beside eval_reward (an extra, labelled column: no verdict reads it)
    eval_own: bool = False
    # samples per evaluation chunk (memory; chunk k is scored while chunk k+1 is sampled); None = the model's
    # ``default_eval_batch`` (64; the toy tier all of an evaluation at once). Not part of a run's identity.
    eval_batch: int | None = None
    checkpoint_every: int = 10  # 0 = only at the end
    save_samples: bool = True  # write samples/step_N.png at evaluations
    # a judge the method never trains on, read at every evaluation on the same samples as eval_gold: a gold measure
    # (toy_w2) or a reward of the registry, as a name or {name: ..., <arguments>} (benchmark/measures/gold.py)
    gold: str | dict | None = None
    # the image tiers' spread on CLIP image embeddings as eval_spread_features (benchmark/measures/diversity.py):
    # a local CLIPModel directory, or "clip" for $FLOWZOO_CLIPSCORE_PATH; None: pixels only (eval_spread)
    spread_features: str | None = None
    threads: int | None = None  # torch intra-op threads; None = the model's preferred number (or torch's default)
    trackers: list[str] = field(default_factory=list)  # accelerate trackers besides metrics.csv, e.g. [tensorboard]
    # which prompts each step trains on: a sampler name or {name: ..., <arguments>} (algorithms/prompt_samplers);
    # None: the algorithm's default (uniform; OP-GRPO's replay_prompts: buffer draws with replay_buffer)
    prompt_sampler: str | dict | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "eval_samples_per_prompt"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("eval_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("eval_prompts", "eval_num_steps", "threads", "eval_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"train.{name} must be a positive integer or null, got {value}")
        if self.eval_num_steps is not None and self.eval_num_steps > MAX_SAMPLING_STEPS:
            raise ConfigError(f"train.eval_num_steps must be at most {MAX_SAMPLING_STEPS} or null (the model's default), "
                              f"got {self.eval_num_steps}")
        if self.eval_sampler not in EVAL_SAMPLERS:
            raise ConfigError(f"train.eval_sampler must be one of {', '.join(EVAL_SAMPLERS)}, got {self.eval_sampler!r}")
        if self.eval_guidance is not None and not (math.isfinite(self.eval_guidance) and self.eval_guidance >= 0):
            raise ConfigError(f"train.eval_guidance must be a finite number >= 0 (1 = no classifier-free guidance) or "
                              f"null (the model's default), got {self.eval_guidance}")
        if self.eval_shift is not None and not (math.isfinite(self.eval_shift) and self.eval_shift > 0):
            raise ConfigError(f"train.eval_shift must be a finite number > 0 or null (the model's own), got "
                              f"{self.eval_shift}")
        if self.eval_sampler == "algorithm" and (self.eval_guidance is not None or self.eval_shift is not None):
            raise ConfigError("train.eval_sampler: algorithm evaluates with each algorithm's shift and guidance; "
                              "train.eval_guidance and train.eval_shift belong to eval_sampler: pipeline")


@dataclass
class ExperimentConfig:
    task: str = "toy2d_mode"  # a label: runs of the same task are compared in reports
    seed: int = 0
    algorithm: dict = field(default_factory=lambda: {"name": "flow_grpo"})  # name + hyper-parameters
    model: ModelSection = field(default_factory=ModelSection)
    reward: str | dict = "toy_mode"  # a reward name, or {name: weight}
    reward_args: dict = field(default_factory=dict)  # {reward name: constructor kwargs}
    prompts: PromptSection = field(default_factory=PromptSection)
    train: TrainSection = field(default_factory=TrainSection)
    run_dir: str | None = None  # None = runs/<task>/<algorithm>/s<seed>
    # where the recipe's values came from, a note that is no part of the run's identity (checkpoints.run_identity):
    # a cell run at a tuned recipe records {tuned: DIR, file: DIR/<task>/<algorithm>.yaml, algorithm_keys: {...},
    # sampler_keys: {...}} (the values the tuned layer set); None (left out of config.yaml): the suite's own recipe
    recipe: dict | None = None
    # apply the algorithm's released recipe (benchmark/recipes/<algorithm>.yaml) under this config's algorithm
    # keys (benchmark/config/resolve.py); false: the class defaults under them. How the keys were resolved, not
    # what they are: no part of a run's identity, and config.yaml (which holds every key) leaves it out when true
    use_recipe: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**63:  # the seed goes into torch.manual_seed and numpy's SeedSequence
            raise ConfigError(f"seed must be an integer in [0, 2**63), got {self.seed}")
        check_label(self.task, "task")  # a directory name: runs/<task>/<algorithm>/s<seed>
        if self.run_dir is not None:
            check_path_text(self.run_dir, "run_dir")

    @property
    def algorithm_name(self) -> str:
        return self.algorithm["name"]

    def resolve_algorithm(self) -> None:
        """Type the ``algorithm`` section once (``Algorithm.typed_config``: the class's preset under its keys) and
        write every key back, as config.yaml holds it. ``load_config`` calls it; so does :meth:`algorithm_config`
        for a config built or changed without it."""
        typed = algorithms.get(self.algorithm_name).typed_config(
            {k: v for k, v in self.algorithm.items() if k != "name"})
        self.algorithm = {"name": self.algorithm_name, **to_mapping(typed)}
        self.__dict__["_typed_algorithm"] = (copy.deepcopy(self.algorithm), typed)

    def algorithm_config(self) -> AlgorithmConfig:
        """The typed algorithm config resolved at load: a copy each time, so that an algorithm may keep and change
        its own (resolved again only if ``algorithm`` was changed since)."""
        resolved = self.__dict__.get("_typed_algorithm")
        if resolved is None or resolved[0] != self.algorithm:
            self.resolve_algorithm()
            resolved = self.__dict__["_typed_algorithm"]
        return copy.deepcopy(resolved[1])

    def resolved_run_dir(self) -> Path:
        if self.run_dir:
            return Path(self.run_dir)
        return Path("runs") / self.task / self.algorithm_name / f"s{self.seed}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"bad override {text!r}; expected key=value, e.g. train.steps=10")
    try:
        value = strict_yaml.load(raw, f"override {key}") if raw else ""
    except strict_yaml.NotYAML:
        value = raw  # not YAML: the text as it is (a duplicate key or a 5000-level nesting is refused)
    path = key.split(".")
    if len(path) > strict_yaml.MAX_DEPTH:
        raise ConfigError(f"bad override {text[:60]!r}...: its key is nested deeper than {strict_yaml.MAX_DEPTH} "
                          f"levels")
    return path, value


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"bad override {text!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict:
    """A config (or suite, or recipe) file's top-level mapping; a missing, empty, ambiguous (a key given twice) or
    malformed file is one line naming it (``flowzoo/strict_yaml.py``)."""
    path = Path(path)
    data = _yaml_file(path)
    if data is None:
        raise ConfigError(f"{path}: the file is empty (no config keys); an empty config would train every default, "
                          f"so give at least the keys you mean (see benchmark/configs/)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config keys")
    return data


def _yaml_file(path: Path) -> Any:
    """The value of YAML file ``path``, read under the bounds of ``flowzoo/strict_yaml.py`` (its size checked before
    it is read); a missing, unreadable or malformed file is a one-line ConfigError naming it."""
    if "\x00" in str(path):
        raise ConfigError(f"config file {str(path)!r}: a path cannot hold a NUL byte")
    if path.is_dir():
        raise ConfigError(f"{path} is a directory; give a YAML config file")
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    if not path.is_file():
        raise ConfigError(f"{path} is not a regular file (a device, pipe or socket); give a YAML config file")
    if path.stat().st_size > strict_yaml.MAX_CHARS:  # before reading it: a config is a few kB
        raise ConfigError(f"{path}: {path.stat().st_size:,} bytes, more than {strict_yaml.MAX_CHARS:,}; a config is a "
                          f"few kB")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    return strict_yaml.load(text, str(path))


def read_stored_config(path: str | Path) -> dict:
    """A run's stored ``config.yaml`` as a mapping, for every reader of run directories (the analysis, the runner's
    checks of a run directory it is given): read under the same bounds as any config (size, aliases, depth: a damaged
    or hostile run directory is refused in one line, never minutes of alias expansion); a ConfigError naming the file
    when it is missing, unreadable, not YAML, empty or not a mapping."""
    path = Path(path)
    try:
        data = _yaml_file(path)
    except OSError as error:  # permissions, a file vanishing: the run is unreadable, as a damaged one
        raise ConfigError(f"{path}: unreadable ({error.strerror or type(error).__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a run's config (expected a mapping of config keys, got "
                          f"{'nothing' if data is None else type(data).__name__})")
    return data


def reward_names(config: ExperimentConfig) -> list[str]:
    """The names of a config's rewards: ``reward`` is one name or a mapping {name: weight}."""
    return [config.reward] if isinstance(config.reward, str) else list(config.reward)


def declared_secrets(config: ExperimentConfig) -> set[tuple]:
    """The places of the config's secret values: the arguments its model and reward classes declare credentials
    (``secret_args``), at ``model.args.<arg>`` and ``reward_args.<reward>.<arg>`` (flowzoo/secrets.py)."""
    names = reward_names(config)
    found = places(("model", "args"), getattr(models.get(config.model.name), "secret_args", ()))
    for name in names:
        found |= places(("reward_args", name), getattr(rewards.get(name), "secret_args", ()))
    return found


#: top-level keys config.yaml leaves out at these values (a run stores the config.yaml it stored before they existed)
OPTIONAL_STORED_KEYS = {"recipe": None, "use_recipe": True}


def resolved_dict(config: ExperimentConfig) -> dict:
    """The config as stored and shown (config.yaml, trackers): every secret value is ``***``; an unset ``recipe``
    note is left out (a run at the suite's own recipe stores the config.yaml it stored before notes existed)."""
    resolved = redact(to_mapping(config), declared_secrets(config))
    for key, default in OPTIONAL_STORED_KEYS.items():
        if resolved.get(key) == default:
            resolved.pop(key, None)
    return resolved
