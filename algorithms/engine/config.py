"""The hyper-parameters every GRPO-style algorithm shares (:class:`AlgorithmConfig`, checked on construction: one-line
ConfigErrors naming ``algorithm.<key>``) and the minibatch orders of an update (:func:`ordered_rows`). A method's
config subclasses it (``algorithms/methods/``); ``Algorithm.Config`` names the class."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from flowzoo.algorithms.engine.advantages import Aggregation, StdMode
from flowzoo.algorithms.engine.losses import KLVariance
from flowzoo.algorithms.engine.sde import MAX_SAMPLING_STEPS, Kernel
from flowzoo.errors import ConfigError


#: AlgorithmConfig.minibatch_order's values
MINIBATCH_ORDERS = ("shuffled", "grouped", "interleaved")


def ordered_rows(batch: int, group_size: int, order: str) -> torch.Tensor:
    """The rows of a group-major batch in ``order``: ``grouped``, as they are (whole groups in turn);
    ``interleaved``, by position in the group first (each group's first sample, then each group's second, ...), so
    that equal chunks take the same slice of every group."""
    rows = torch.arange(batch)
    if order == "grouped":
        return rows
    return rows[torch.argsort((rows % group_size) * batch + rows // group_size)]


@dataclass
class AlgorithmConfig:
    """Hyper-parameters shared by every GRPO-style algorithm (defaults: Flow-GRPO's SD3.5 recipe)."""

    group_size: int = 8  # G samples per prompt
    num_steps: int | None = None  # T sampling steps of a training rollout; None = the model's default
    shift: float | None = None  # sigma-schedule shift (SD3 uses 3.0); None = the model's default
    guidance: float | None = None  # CFG scale; None = the model's default
    kernel: Kernel = "flow_grpo"
    noise_level: float = 0.7  # a in Flow-GRPO's std_t = a sqrt(s/(1-s)); eta for dance_grpo
    timestep_fraction: float = 0.99  # fraction of the T steps trained (Flow-GRPO: int(10 * .99) = the first 9)
    shared_noise: bool = False  # one initial noise per group (DanceGRPO)
    clip_range: float = 1e-4  # PPO clip epsilon
    adv_clip: float = 5.0
    # A = (r - group mean) / (std + adv_eps), std over the group or (``batch``) the whole batch (Flow-GRPO's SD3
    # recipes: ``global_std``). Released forms: Flow-GRPO population std + 1e-4 (flow_grpo/stat_tracking.py:27-29);
    # DanceGRPO / MixGRPO group ``.std()`` (unbiased) + 1e-8 (DanceGRPO fastvideo/train_grpo_flux.py:542, MixGRPO
    # fastvideo/train_grpo_flux.py:448,475).
    adv_std: StdMode = "group"
    adv_std_unbiased: bool = False
    adv_eps: float = 1e-4
    # Leave samples whose advantage is exactly 0 out of the update (their loss, KL and the loss normaliser), as
    # Flow-GRPO's scripts/train_sd3.py:796-817 does (it then re-adds a few at random so that the count divides its
    # number of micro-batches; here minibatches may differ in size by one instead).
    drop_zero_advantage: bool = False
    reward_aggregation: Aggregation = "sum"
    kl_beta: float = 0.04
    # KL = ||mu - mu_ref||^2 / (2 s^2) with s the step's std (``step``) or, as the released Flow-GRPO code
    # (scripts/train_sd3.py:895, s = std_dev_t of sd3_sde_with_logprob.py:47, no sqrt(-dt)), ``release``: at the same
    # beta the ``release`` KL is (-dt) times the ``step`` KL, i.e. weaker.
    kl_variance: KLVariance = "step"
    # Which CFG branch carries the gradient in the update (models.base.FlowModel.velocity): ``cond`` detaches the
    # unconditional one (Flow-GRPO's compute_log_prob), ``both`` back-propagates through both.
    cfg_grad: Literal["cond", "both"] = "cond"
    # How ``cfg_grad: cond`` runs with autograd on (models.base.FlowModel.velocity): ``batched`` one call on
    # [cond; uncond] with the unconditional half detached after it (the released form), ``split`` the unconditional
    # half as its own no_grad call, ``auto`` the model's choice (on a GPU batched, as released; on the CPU split from
    # 1M transformer parameters: models.diffusers_common.cfg_split_pays). Same math.
    cfg_batch: Literal["auto", "batched", "split"] = "auto"
    lr: float = 3e-4
    weight_decay: float = 1e-4
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0  # 0 = no gradient clipping (the norm is still logged)
    inner_epochs: int = 1  # passes over each rollout batch
    minibatches: int = 1  # optimizer steps per pass
    # which rows each optimizer step takes: "shuffled", a fresh permutation of the batch every inner epoch (Flow-GRPO's
    # trainers); "grouped", the batch in order, so each step takes whole groups one after another (DanceGRPO's FLUX
    # and Qwen-Image trainers: 2 prompts per GPU, a step every 12 samples); "interleaved", each step the same slice
    # of every group (MixGRPO's FLUX trainer: 1 prompt per GPU, a step every 3 of its 12 samples). The released
    # trainers step every gradient_accumulation_steps samples of each GPU's in-order sample list
    minibatch_order: str = "shuffled"
    micro_batch: int | None = None  # samples per forward pass in the update (memory); None = all at once
    # samples per network call of the training rollout (the CFG pair makes 2x rows), per VAE decode call and per
    # reward call (memory: a GPU's whole share of the batch in one decode does not fit at the paper recipes); None =
    # the model's ``default_rollout_batch`` (the released trainer's sampling batch; toy2d and tiny: all at once).
    # The same samples and rewards to float rounding; not part of a run's identity
    rollout_batch: int | None = None
    # How a step's Gaussian log-density is reduced over latent dims: "mean" as the released Flow-GRPO/DanceGRPO
    # code (a per-dimension average), or "sum", the true joint density the OP-GRPO trajectory ratio is written
    # with. Applied alike to behaviour log-probs, the PPO ratio, the KL and the sequence weight.
    log_prob_reduction: Literal["mean", "sum"] = "mean"
    # Recompute-free first update (LeanGRPO, arXiv 2609.03528): the rollout evaluates the trained steps with
    # gradients and keeps their graphs, and the update back-propagates through them instead of recomputing the
    # policy forward. Same gradients; saves one forward per trained transition; holds the graphs in memory
    # until the update. Needs a single optimizer step per rollout (inner_epochs 1, minibatches 1). ``auto``: on where
    # that holds, ``micro_batch`` is unset (kept graphs are not micro-batched) and the algorithm's trajectories keep
    # their graphs and train every sample at the same steps (``Algorithm.rollout_graph_auto``).
    reuse_rollout_graph: bool | Literal["auto"] = "auto"
    # An exponential moving average of the trainable weights, with which the run evaluates and exports (training
    # rollouts sample the trained weights), as released Flow-GRPO (scripts/train_sd3.py:445 at ac4c86e): after
    # optimizer step s (from 1) it moves when (s + 1) % ema_every == 0, by 1 - min((1 + s) / (10 + s), ema_decay)
    # (algorithms/engine/ema.py). Off by default; part of a run's identity only when on.
    ema: bool = False
    ema_decay: float = 0.9
    ema_every: int = 8

    def __post_init__(self) -> None:
        positive = {"group_size": self.group_size, "inner_epochs": self.inner_epochs, "minibatches": self.minibatches}
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"algorithm.{name} must be a positive integer, got {value}")
        if self.group_size < 2:
            raise ConfigError(f"algorithm.group_size must be >= 2 for group-relative advantages, got {self.group_size}")
        if self.minibatch_order not in MINIBATCH_ORDERS:
            raise ConfigError(f"algorithm.minibatch_order must be one of {', '.join(MINIBATCH_ORDERS)}, got "
                              f"{self.minibatch_order!r}")
        if self.num_steps is not None and not 1 <= self.num_steps <= MAX_SAMPLING_STEPS:
            raise ConfigError(f"algorithm.num_steps must be in [1, {MAX_SAMPLING_STEPS}] or null (the model's default), "
                              f"got {self.num_steps}")
        if self.reuse_rollout_graph is True and (self.inner_epochs, self.minibatches) != (1, 1):
            raise ConfigError(
                "algorithm.reuse_rollout_graph needs inner_epochs 1 and minibatches 1 (one optimizer step per rollout); "
                f"got inner_epochs {self.inner_epochs}, minibatches {self.minibatches}"
            )
        if not (isinstance(self.ema_decay, (int, float)) and 0 <= self.ema_decay < 1):  # NaN fails the range
            raise ConfigError(f"algorithm.ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.ema_every < 1:
            raise ConfigError(f"algorithm.ema_every must be a positive integer, got {self.ema_every}")
        if self.micro_batch is not None and self.micro_batch < 1:
            raise ConfigError(f"algorithm.micro_batch must be >= 1, got {self.micro_batch}")
        if self.rollout_batch is not None and self.rollout_batch < 1:
            raise ConfigError(f"algorithm.rollout_batch must be >= 1 or null (the model's default), got "
                              f"{self.rollout_batch}")
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(f"algorithm.timestep_fraction must be in (0, 1], got {self.timestep_fraction}")
        if self.guidance is not None and not (math.isfinite(self.guidance) and self.guidance >= 0):  # NaN fails
            raise ConfigError(f"algorithm.guidance must be a finite number >= 0 (1 = no classifier-free guidance) or "
                              f"null (the model's default), got {self.guidance}")
        if self.shift is not None and not (math.isfinite(self.shift) and self.shift > 0):  # NaN fails `> 0`
            raise ConfigError(f"algorithm.shift must be a finite number > 0 (1 = no shift) or null (the model's "
                              f"default), got {self.shift}")
        nonnegative = ("noise_level", "clip_range", "adv_clip", "adv_eps", "kl_beta", "lr", "max_grad_norm",
                       "weight_decay", "adam_eps")
        for name in nonnegative:
            value = getattr(self, name)
            if not math.isfinite(value):  # NaN passes `value < 0`
                raise ConfigError(f"algorithm.{name} must be a finite number, got {value}")
            if value < 0:
                raise ConfigError(f"algorithm.{name} must be >= 0, got {value}")
        if self.noise_level < 1e-6:  # smaller levels underflow in float32 (step variance ~ noise_level^2 * dt)
            raise ConfigError(f"algorithm.noise_level must be >= 1e-6, got {self.noise_level}: below it the sampler is "
                              f"deterministic (in float32), so a trajectory has no log-probability to train")

    def check_num_steps(self, num_steps: int) -> None:
        """Checks of knobs bounded by T, the rollout's sampling steps (``num_steps``, else the model's default);
        ``benchmark.config.schema`` calls it at load time. Nothing here; subclasses add theirs (OP-GRPO's ``t_off``)."""

    def inert_keys(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Knobs whose value cannot change a run of this config: {knob: (why, the knobs that make it inert)}. ``flowzoo
        tune`` leaves such a knob out of a cell's space unless one of the knobs that make it inert is tuned too.
        Here: the weight average's knobs with ``ema`` off; subclasses add theirs (AWM's copy KL at ``kl_beta`` 0)."""
        inert: dict[str, tuple[str, tuple[str, ...]]] = {}
        if not self.ema:
            for name in ("ema_decay", "ema_every"):
                inert[name] = ("ema is off: no weight average is kept", ("ema",))
        return inert
