"""Knob combinations that cannot train, or cannot change the evaluated model, refused with the reason by ``train``
(``Runner.run``) and ``bench`` (``run_suite``) before anything is written. Only where training starts: ``eval`` of
such a config (its untrained model at g = 0 is a fair question), ``export`` or ``eval`` of a run trained before this
check, and ``grad-snr`` (which then reports the zero gradient) are not refused.

* ``algorithm.guidance: 0`` with ``cfg_grad: cond`` (the default): every algorithm's loss goes through the guided
  velocity ``u + g (c - u)`` (``models.base.FlowModel.velocity``), whose unconditional branch ``u`` carries no
  gradient under ``cond``; at g = 0 the velocity is ``u`` alone, so every gradient is exactly 0 (PPO, KL, the
  DiffusionNFT and AWM losses alike). Not refused: ``cfg_grad: both`` at g = 0 (the gradient is ``d u``: it trains
  the unconditional branch, which a g = 0 evaluation samples), or any g != 0.
* ``algorithm.ema`` on with ``ema_every`` such that the average never moves: it first moves after optimizer step
  ``ema_every - 1`` (``algorithms/engine/ema.py``), and a run takes at most ``train.steps x inner_epochs x minibatches``
  optimizer steps; fewer, and every evaluation and the export are the base model.
* the ``difficulty`` prompt sampler with a ``success_threshold`` outside its reward's range (``rewards.bounds``): at
  or above the top every sample fails (pass rate 0), below the bottom every sample passes (pass rate 1); when the
  band ``[low, high]`` excludes that rate no group is ever kept, so every step pays ``max_rounds`` rollouts and
  trains on the fallback groups, uniform sampling at several times the cost. Rewards without declared bounds (CLIP
  family, JPEG, UnifiedReward) are not checked.
"""

from __future__ import annotations

from flowzoo import rewards
from flowzoo.algorithms import prompt_samplers
from flowzoo.algorithms.engine.base import AlgorithmConfig
from flowzoo.benchmark.config.schema import ExperimentConfig
from flowzoo.errors import ConfigError


def optimizer_steps(config: ExperimentConfig, algorithm_config: AlgorithmConfig) -> int:
    """The most optimizer steps the run takes: each training step updates ``inner_epochs x minibatches`` times
    (fewer when ``drop_zero_advantage`` leaves a minibatch empty)."""
    return config.train.steps * algorithm_config.inner_epochs * algorithm_config.minibatches


def check_trains_something(config: ExperimentConfig, algorithm_config: AlgorithmConfig) -> None:
    """``ConfigError`` naming the knobs and why when the run could not change the model it evaluates."""
    if algorithm_config.guidance is not None and float(algorithm_config.guidance) == 0 \
            and algorithm_config.cfg_grad == "cond":
        raise ConfigError(
            "algorithm.guidance 0 with cfg_grad cond trains nothing: the guided velocity u + 0 (c - u) is the "
            "unconditional branch u, which carries no gradient under cfg_grad cond, so every gradient is 0; give "
            "guidance 1 (no CFG) or another scale, or cfg_grad: both (trains the unconditional branch)")
    if algorithm_config.ema:
        total = optimizer_steps(config, algorithm_config)
        if total < algorithm_config.ema_every - 1:
            raise ConfigError(
                f"algorithm.ema_every {algorithm_config.ema_every} with ema on: the average first moves after "
                f"optimizer step {algorithm_config.ema_every - 1}, but the run takes at most {total} (train.steps "
                f"{config.train.steps} x inner_epochs {algorithm_config.inner_epochs} x minibatches "
                f"{algorithm_config.minibatches}), so every evaluation and the export would be the base model; give "
                f"ema_every <= {total + 1}, more steps, or ema: false")
    check_threshold_in_reward_range(config)


def check_threshold_in_reward_range(config: ExperimentConfig) -> None:
    """``ConfigError`` when the difficulty sampler's pass rate is constant and outside its band (module docstring)."""
    spec = prompt_samplers.spec_of(config.train.prompt_sampler)
    if spec is None or spec["name"] != "difficulty":
        return
    _, sampler = prompt_samplers.typed_config(spec)
    bounds = rewards.bounds(config.reward)
    if bounds is None:
        return
    low, high = bounds
    threshold = sampler.success_threshold
    if threshold >= high:
        rate, side = 0, f"at or above the reward's top {high:g}: no sample scores above it"
    elif threshold < low:
        rate, side = 1, f"below the reward's bottom {low:g}: every sample scores above it"
    else:
        return
    if sampler.low <= rate <= sampler.high:
        return
    raise ConfigError(
        f"train.prompt_sampler difficulty: success_threshold {threshold:g} is {side}, so every group's pass rate is "
        f"{rate}, outside the kept band [{sampler.low:g}, {sampler.high:g}]: no group is ever kept and every step "
        f"pays max_rounds {sampler.max_rounds} rollouts for uniform sampling; give a threshold in [{low:g}, {high:g}) "
        f"for reward {config.reward!r}")
