"""One place builds an experiment (model, reward, algorithm, prompts) and checks it before anything is written.

* :func:`check` is the dry run every loaded config goes through (``benchmark.run.loading.build_config`` calls it, so
  ``flowzoo train``, ``bench`` (every run of a grid before the first starts), ``grad-snr`` and evaluation all do):
  model and reward arguments against their constructors' signatures and annotations, the reward's sample kinds
  against the model's, the checks of every knob bounded by T (``AlgorithmConfig.check_num_steps``), and the
  algorithm's own construction and step plan (MixGRPO's window bounds, ...) on a stand-in for the model that has
  its class's declared defaults (T, shift, guidance, sample kind) but no weights; and the prompt sampler against
  the algorithm and the training prompt pool. It loads no weights (only the prompt lists).
* :func:`build` constructs the real objects (the typed algorithm config resolved once, at config load; the
  data-parallel context handed to the algorithm's constructor), repeats the checks on them and makes the step plan
  of a full batch, all before the runner creates a run directory.
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms import prompt_samplers
from flowzoo.algorithms.engine.base import Algorithm, AlgorithmConfig
from flowzoo.algorithms.engine.distributed import SINGLE_PROCESS, SingleProcess
from flowzoo.benchmark.config.argument_ranges import check_ranges
from flowzoo.benchmark.config.schema import ExperimentConfig, reward_names
from flowzoo.benchmark.measures import gold
from flowzoo.benchmark.measures.evaluation import EvalSampler, extra_sampler, protocol_sampler
from flowzoo.benchmark.prompts.sources import Prompts, load_prompts, load_unseen
from flowzoo.errors import ConfigError
from flowzoo.schema import check_arguments, to_mapping
from flowzoo.streams import GROUP_OFFSET_LIMIT
from flowzoo.models.base import FlowModel
from flowzoo.models.sharding import SHARD_ARG, check_request, reshard_after_forward, shard_model, shard_request
from flowzoo.rewards.base import Reward


def check_constructor_arguments(kind: str, name: str, target: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Fail if ``kwargs`` are not parameters of ``target``'s constructor or their values do not fit its annotations
    (``kind``: "model" -> ``model.args``, "reward" -> ``reward_args.<name>``). Returns the numbers written as text
    (``check_arguments``): the caller sets them in the config, as the config's own fields are read."""
    where = {"model": "model.args", "gold": "train.gold"}.get(kind, f"reward_args.{name}")
    if not isinstance(kwargs, Mapping):
        raise ConfigError(f"{where}: expected a mapping of argument names to values, got {kwargs!r}")
    params = inspect.signature(target).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        valid = [p for p in params if p != "self"]
        for key in kwargs:
            if key not in valid:
                raise ConfigError(f"{kind} {name!r}: unknown argument {key!r}; valid: {', '.join(valid) or '(none)'}")
    read_as = check_arguments(where, target, kwargs)
    check_ranges("reward" if kind == "gold" else kind, name, target, {**kwargs, **read_as}, where)
    return read_as


def check_sample_kind(config: ExperimentConfig, accepts: Sequence[str], kind: str) -> None:
    """The reward scores the kind of samples the model makes."""
    if kind not in accepts:
        raise ConfigError(
            f"reward {config.reward!r} scores {', '.join(accepts) or 'no common'} samples but model "
            f"{config.model.name!r} makes {kind} samples"
        )


def check_world_size(config: ExperimentConfig, algorithm_config: AlgorithmConfig, world_size: int) -> None:
    """The global batch splits evenly over the processes."""
    prompts, g = config.train.prompts_per_step, algorithm_config.group_size
    if (prompts * g) % world_size:
        raise ConfigError(
            f"the global batch of train.prompts_per_step x algorithm.group_size = {prompts} x {g} = {prompts * g} "
            f"samples does not split evenly over {world_size} processes; make it a multiple of {world_size}"
        )


def chunk_count(samples: int, k: int) -> int:
    """How many minibatches ``torch.chunk`` makes of ``samples`` rows asked for ``k``: ceil(samples / k) rows a chunk,
    so ceil(samples / ceil(samples / k)) chunks, which can be fewer than k (32 rows in 12: 11 chunks of 3)."""
    return -(-samples // -(-samples // k))


def minibatch_counts(samples: int) -> list[int]:
    """The ``algorithm.minibatches`` values that split ``samples`` into exactly that many minibatches."""
    return [k for k in range(1, samples + 1) if chunk_count(samples, k) == k]


def _spans(values: list[int]) -> str:
    spans, start = [], values[0]
    for previous, value in zip(values, [*values[1:], None]):
        if value != previous + 1:
            spans.append(str(start) if start == previous else f"{start}..{previous}")
            start = value
    return ", ".join(spans)


def check_update(config: ExperimentConfig, algorithm_config: AlgorithmConfig) -> None:
    """Update knobs that would train nothing, or other than config.yaml records: clip values and the learning rate
    must be > 0 (``adv_clip: 0`` zeroes every advantage; the run "finished" with loss 0 at every step) and
    ``minibatches`` must split the batch into exactly that many."""
    zero = {"adv_clip": "every advantage would be 0 and nothing trains", "lr": "the policy would never change",
            "clip_range": "the PPO ratio would be clipped to exactly 1"}
    for name, what in zero.items():
        value = getattr(algorithm_config, name)
        if not value > 0:
            raise ConfigError(f"algorithm.{name} must be > 0, got {value} ({what})")
    samples = config.train.prompts_per_step * algorithm_config.group_size
    k = algorithm_config.minibatches
    if k <= samples and chunk_count(samples, k) == k:
        return
    product = f"train.prompts_per_step x algorithm.group_size = {config.train.prompts_per_step} x " \
              f"{algorithm_config.group_size}"
    if k > samples:
        problem = f"exceeds the {samples} samples of a training batch ({product})"
    else:
        problem = (f"would split the {samples} samples of a training batch ({product}) into "
                   f"{chunk_count(samples, k)} minibatches of up to {-(-samples // k)}")
    valid = _spans(minibatch_counts(samples)) if samples <= 4096 else \
        f"the k <= {samples} with ceil({samples} / ceil({samples} / k)) = k, e.g. any divisor of {samples}"
    raise ConfigError(f"algorithm.minibatches {k} {problem}; valid: {valid}")


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device`` (CUDA: the driver's free memory; CPU: Linux's MemAvailable), or
    None where it is not known."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                fields = dict(line.split(":", 1) for line in f)
            return int(fields["MemAvailable"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            return None
    return None


def check_rollout_memory(config: ExperimentConfig, algorithm: Algorithm, world_size: int) -> None:
    """Refuse a batch whose rollout latents alone (this process's samples x (T + 1) x the latent size, at 2 bytes a
    number: a lower bound) exceed the memory available now: it would fail at step 1 or be killed by the OS."""
    batch = -(-config.train.prompts_per_step * algorithm.config.group_size // world_size)
    numel = math.prod(algorithm.model.latent_shape)
    need = batch * (algorithm.num_steps + 1) * numel * 2
    available = available_memory(algorithm.model.device)
    if available is not None and need > available:
        raise ConfigError(
            f"a training batch of {batch} samples needs at least {need / 2**30:.1f} GiB for its rollout latents alone "
            f"({algorithm.num_steps + 1} x {numel} numbers each), more than the {available / 2**30:.1f} GiB available; "
            f"lower train.prompts_per_step or algorithm.group_size"
        )


class NotOnTheStandIn(NotImplementedError, AttributeError):
    """An algorithm's dry check read a part of the model the stand-in does not have (``hasattr`` sees it missing)."""


class DeclaredDefaults(FlowModel):
    """What an algorithm's constructor and step plan read of a model, without the model: its class's declared T,
    shift, guidance and sample kind, and one scalar parameter for the optimizer. Reading anything else raises
    :class:`NotOnTheStandIn` (the dry check then leaves the algorithm to :func:`build`, which repeats the checks on
    the real model); an AttributeError of the algorithm's own code is not that, and fails the check. The reward is
    None."""

    def __init__(self, model_cls: type[FlowModel]):
        super().__init__()
        self.name = model_cls.name
        self.sample_kind = model_cls.sample_kind
        for attr in ("default_guidance", "default_shift", "default_num_steps", "default_eval_num_steps",
                     "default_sigma_grid", "shift_terminal"):
            setattr(self, attr, getattr(model_cls, attr))
        self._parameter = torch.nn.Parameter(torch.zeros(1))

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [self._parameter]

    def __getattr__(self, name: str):  # only for attributes the stand-in was not given
        raise NotOnTheStandIn(f"the model stand-in has no {name!r}")


def prompt_sampler_spec(config: ExperimentConfig, algorithm_config: AlgorithmConfig) -> dict[str, Any]:
    """``train.prompt_sampler`` as ``{name: ..., <arguments>}``, or the algorithm's default."""
    spec = prompt_samplers.spec_of(config.train.prompt_sampler)
    return spec or algorithms.get(config.algorithm_name).default_prompt_sampler(algorithm_config)


def check_prompt_sampler(config: ExperimentConfig, algorithm_config: AlgorithmConfig) -> None:
    """The sampler's name and arguments, the algorithm's consent, and the training pool it must serve."""
    spec = prompt_sampler_spec(config, algorithm_config)
    algorithms.get(config.algorithm_name).check_prompt_sampler(algorithm_config, spec)
    cls, _ = prompt_samplers.typed_config(spec)
    groups = config.train.prompts_per_step
    if cls.filters:
        rounds = spec.get("max_rounds", cls.Config().max_rounds)
        if rounds * algorithm_config.group_size * groups >= GROUP_OFFSET_LIMIT:
            raise ConfigError(f"train.prompt_sampler {spec['name']!r}: max_rounds x group_size x prompts_per_step = "
                              f"{rounds * algorithm_config.group_size * groups} samples per step, above the "
                              f"{GROUP_OFFSET_LIMIT} the noise streams allow")
    prompt_samplers.check(spec, load_prompts(config.prompts)[0], groups)


#: where ``benchmark.run.loading.build_config`` records the fingerprint of the config its dry run passed
CHECKED = "_checked_fingerprint"


def fingerprint(config: ExperimentConfig) -> str:
    """The config's whole content as text: equal fingerprints, equal configs."""
    return json.dumps(to_mapping(config), sort_keys=True, default=str)


def constructor_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """``model.args`` without the ones the experiment, not the model's constructor, takes (``fsdp``)."""
    return {k: v for k, v in args.items() if k != SHARD_ARG}


def without_sharding(config: ExperimentConfig) -> ExperimentConfig:
    """``config`` without its FSDP request: how one process reads a run trained sharded (``flowzoo eval``,
    ``flowzoo export``), from its checkpoint's full weights. The same run (``fsdp`` is no part of its identity)."""
    import dataclasses

    if SHARD_ARG not in config.model.args:
        return config
    return dataclasses.replace(config, model=dataclasses.replace(config.model,
                                                                 args=constructor_args(config.model.args)))


def check(config: ExperimentConfig, world_size: int = 1) -> None:
    """The dry run (see the module docstring): every check that needs the model, reward and algorithm classes but
    not their weights. Raises a one-line :class:`ConfigError`; writes and loads nothing."""
    model_cls = models.get(config.model.name)
    check_request(model_cls, config.model.args)  # FSDP sharding: a model with transformer blocks, FSDP2
    # numbers written as text (``timeout: 1e9``: a string to YAML 1.1) become the numbers, as in the config's fields
    config.model.args.update(check_constructor_arguments("model", config.model.name, model_cls,
                                                         constructor_args(config.model.args)))
    reward_classes = {name: rewards.get(name) for name in reward_names(config)}
    for name, kwargs in config.reward_args.items():
        read_as = check_constructor_arguments("reward", name, reward_classes[name], kwargs or {})
        if read_as:
            kwargs.update(read_as)
    kinds = [set(cls.accepts) for cls in reward_classes.values()]
    check_sample_kind(config, sorted(set.intersection(*kinds)), model_cls.sample_kind)
    gold_spec = gold.check(config.train.gold, reward_names(config), config.train.eval_samples_per_prompt,
                           model_cls.sample_kind)
    check_spread_features(config, model_cls.sample_kind)
    if gold_spec is not None and gold_spec["name"] not in gold.TOY_MEASURES:
        gold_args = {k: v for k, v in gold_spec.items() if k != "name"}
        check_constructor_arguments("gold", gold_spec["name"], rewards.get(gold_spec["name"]), gold_args)
    alg_config = config.algorithm_config()
    check_world_size(config, alg_config, world_size)
    check_update(config, alg_config)
    check_prompt_sampler(config, alg_config)
    try:  # the algorithm's own checks (constructor, step plan) on a stand-in with the model's declared defaults
        stand_in = algorithms.get(config.algorithm_name)(DeclaredDefaults(model_cls), None, alg_config, seed=config.seed)
        stand_in.make_plan(1)
    except NotImplementedError:  # it reads more of the model than the stand-in has (NotOnTheStandIn, or a FlowModel
        pass  # method): build() runs the same checks on the real objects


def check_spread_features(config: ExperimentConfig, sample_kind: str) -> None:
    """``train.spread_features`` embeds images, 2 or more per prompt."""
    value = config.train.spread_features
    if value is None:
        return
    if not isinstance(value, str) or not value:
        raise ConfigError(f"train.spread_features: a local CLIPModel directory or 'clip' ($FLOWZOO_CLIPSCORE_PATH), "
                          f"got {value!r}")
    if sample_kind != "image":
        raise ConfigError(f"train.spread_features embeds images; model {config.model.name!r} makes {sample_kind} "
                          "samples (its spread on the samples themselves is eval_spread)")
    if config.train.eval_samples_per_prompt < 2:
        raise ConfigError(f"train.spread_features measures the spread of each prompt's samples: "
                          f"train.eval_samples_per_prompt must be >= 2, got {config.train.eval_samples_per_prompt}")


def spread_features(config: ExperimentConfig):
    """The feature extractor of ``train.spread_features`` (diversity.ClipFeatures), or None."""
    value = config.train.spread_features
    if value is None:
        return None
    from flowzoo.benchmark.measures.diversity import ClipFeatures

    return ClipFeatures(path=None if value == "clip" else value)


@dataclass
class Experiment:
    """A built experiment: what the runner trains and evaluates, grad-snr measures and evaluation scores."""

    config: ExperimentConfig
    algorithm_config: AlgorithmConfig
    model: FlowModel
    reward: Reward
    algorithm: Algorithm
    train_prompts: Prompts
    eval_prompts: Prompts
    eval_sampler: EvalSampler  # the evaluation protocol's deterministic ODE sampler (train.eval_sampler)
    dist: SingleProcess
    sharding: dict[str, Any] | None = None  # what FSDP sharded (models.sharding.shard_model), or None
    own_sampler: EvalSampler | None = None  # the algorithm's own evaluation beside it (train.eval_own), or None
    gold: Any = None  # the gold measure read at every evaluation (train.gold, benchmark/measures/gold.py), or None
    unseen_prompts: Prompts = field(default_factory=list)  # prompts never trained on (prompts.unseen), or []
    features: Any = None  # the spread's feature extractor (train.spread_features), or None


def build(config: ExperimentConfig, dist: SingleProcess | None = None) -> Experiment:
    """Construct the experiment of ``config`` for the data-parallel context ``dist`` (default: one process), with
    every check, before anything is written."""
    dist = SINGLE_PROCESS if dist is None else dist
    alg_config = config.algorithm_config()
    if config.__dict__.get(CHECKED) == fingerprint(config):  # checked at load and unchanged since
        check_world_size(config, alg_config, dist.world_size)
    else:  # built directly, or changed after loading: the dry run, before the model's weights load
        check(config, dist.world_size)
    model_cls = models.get(config.model.name)
    threads = config.train.threads or model_cls.preferred_threads
    if threads:
        torch.set_num_threads(threads)
    shard = shard_request(config.model.args)
    if shard and dist.world_size < 2:
        source = (f"model.args.{SHARD_ARG}: true" if config.model.args.get(SHARD_ARG)
                  else "the accelerate config's distributed_type: FSDP")
        raise ConfigError(f"{source} asks for FSDP sharding, which needs several processes (accelerate launch / "
                          f"torchrun with --num_processes >= 2); this run has {dist.world_size}")
    torch.manual_seed(config.seed)
    model = model_cls(**constructor_args(config.model.args))
    reward = rewards.build(config.reward, config.reward_args)
    check_sample_kind(config, reward.accepts, model.sample_kind)
    # every process starts from rank 0's weights; then (FSDP) each keeps its shard, before the optimizer is built on
    # the sharded parameters (its state is then sharded alike)
    dist.broadcast_parameters(model.trainable_parameters())
    sharding = shard_model(model, dist.world_size, reshard_after_forward()) if shard else None
    algorithm = algorithms.get(config.algorithm_name)(model, reward, alg_config, seed=config.seed, dist=dist)
    check_rollout_memory(config, algorithm, dist.world_size)
    # the checks that need the built model's T (windows, trained steps) on the plan of a full batch
    algorithm.make_plan(config.train.prompts_per_step * alg_config.group_size)
    train_prompts, eval_prompts = load_prompts(config.prompts)
    algorithm.use_prompts(train_prompts, config.train.prompts_per_step, prompt_sampler_spec(config, alg_config))
    if config.train.eval_prompts:
        eval_prompts = eval_prompts[: config.train.eval_prompts]
    protocol = protocol_sampler(config.train, model, algorithm)  # one sampler for every cell (evaluation.py)
    measure = gold.build(config.train.gold, reward_names(config), config.train.eval_samples_per_prompt,
                         model.sample_kind)
    return Experiment(config, alg_config, model, reward, algorithm, train_prompts, eval_prompts, protocol, dist,
                      sharding, extra_sampler(config.train, model, algorithm, protocol), measure,
                      load_unseen(config.prompts, train_prompts), spread_features(config))
