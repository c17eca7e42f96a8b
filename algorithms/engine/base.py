"""The Algorithm base class: one GRPO training iteration as a template.

``step(prompts)`` = plan -> rollout (``collect``) -> decode + reward -> group-relative advantages -> PPO-clip update,
returning a :class:`StepStats`. Subclasses override only what differs:

* ``step_plan(batch)``: which steps are SDE / trained, the kernel and sigmas (MixGRPO's window, ...);
* ``collect(...)``: how the batch of trajectories is produced (OP-GRPO mixes in replayed trajectories);
* ``after_update(traj, batch)``: bookkeeping after the optimizer step (replay buffer insertion, window advance);
* ``extra_state()`` / ``load_extra_state()``: whatever else a bit-identical resume needs.

Which prompts an iteration trains on is the algorithm's prompt sampler's choice (``algorithms/prompt_samplers``):
``use_prompts(pool, groups, sampler)`` gives the algorithm its training pool, ``train_step(step)`` draws and trains;
``step(prompts)`` trains on prompts given directly (tests, tools). ``default_prompt_sampler`` says which sampler a
config without ``train.prompt_sampler`` gets.

Hooks report per-iteration diagnostics with ``self.log(key, value)`` (Stable-Baselines3's ``logger.record``): the
values land in ``StepStats.extra`` and the runner writes them as metrics.csv columns. A class declares what the report
needs to know about it: ``family`` (colours and panels), ``ablation_of`` (the ablation table) and ``diagnostics``
(the logged columns the report shows, each with a one-line description).

Under several processes (``dist``, set by the runner; see ``algorithms/engine/distributed.py``) each rank rolls out its slice
of the global batch, rewards are gathered before the advantages, and gradients and statistics are summed over ranks,
so a run gives the same numbers whatever the number of processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Iterator, Literal, Sequence

import torch

from flowzoo.algorithms import prompt_samplers
from flowzoo.algorithms.engine.advantages import Aggregation, StdMode, combined_advantages, zero_std_fraction
from flowzoo.algorithms.engine.distributed import SINGLE_PROCESS, GatheredBatch, SingleProcess
from flowzoo.algorithms.engine.ema import WeightEMA
from flowzoo.algorithms.engine.lockstep import CallLedger, LockstepPadding, requested as lockstep_requested
from flowzoo.algorithms.prompt_samplers import GroupOutcome, PromptDraw, PromptSampler
from flowzoo.algorithms.engine.losses import (KLVariance, PPOTerms, approx_kl, binding_clips, gaussian_mean_kl, kl_std,
                                              ppo_clip_loss)
from flowzoo.algorithms.engine.rollout import chunk_spans, initial_noise, rollout, sample_generators
from flowzoo.algorithms.engine.sde import MAX_SAMPLING_STEPS, Kernel, SigmaGrid, StepOutput, sde_step, sigma_schedule
from flowzoo.algorithms.engine.trajectory import RolloutInputs, StepPlan, Trajectory
from flowzoo.errors import ConfigError, FlowZooError
from flowzoo.schema import from_mapping
from flowzoo.streams import UPDATE_ORDER_OFFSET
from flowzoo.models.base import FlowModel
from flowzoo.models.sharding import full_tensor, gathered, is_sharded, like
from flowzoo.rewards.base import Reward
from flowzoo.rewards.errors import RewardError
from flowzoo.rewards.multi import MultiReward


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


#: the largest |log pi_theta - log pi_old| over the on-policy (sample, step) pairs of an update's first optimizer
#: step: 0 up to rounding when the update recomputes what the rollout sampled; precision (bf16/fp16 rollouts against
#: a float32 recompute) or a nondeterministic kernel makes it grow, and the first PPO ratio is then not 1
ONPOLICY_DRIFT = "onpolicy_max_abs_log_ratio"
#: a sharded run's update logs the network calls its processes made only to stay in lockstep (models/sharding.py)
FSDP_PADDING = "fsdp_padding_calls"
#: the PPO clip fractions of the on- and off-policy samples, which ``update`` logs when a batch holds off-policy ones
CLIP_FRAC_ON, CLIP_FRAC_OFF = "clip_frac_on", "clip_frac_off"
#: the fractions of positive- and negative-advantage pairs whose PPO clip binds (``losses.binding_clips``), which
#: ``update`` logs for a class with ``logs_clip_sides``
CLIP_FRAC_POS, CLIP_FRAC_NEG = "clip_frac_pos_adv", "clip_frac_neg_adv"


@dataclass
class StepStats:
    """What one training iteration reports; ``row()`` flattens it into a metrics.csv row. ``extra`` holds the
    iteration's values recorded with :meth:`Algorithm.log`."""

    reward_mean: float
    reward_std: float
    clip_frac: float
    approx_kl: float
    kl: float
    ratio_mean: float
    loss: float
    grad_norm: float
    nfe_sampling: int
    nfe_training: int
    t_sampling: float
    t_reward: float
    t_training: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def nfe(self) -> int:
        return self.nfe_sampling + self.nfe_training

    def row(self) -> dict[str, float]:
        values = asdict(self)
        extra = values.pop("extra")
        values["nfe_step"] = self.nfe
        values.update(extra)
        return values


#: metrics.csv columns the template writes; ``Algorithm.log`` refuses them (the contract's columns and StepStats')
RESERVED_COLUMNS = frozenset(f.name for f in dataclasses.fields(StepStats) if f.name != "extra") | {
    "nfe_step", "step", "nfe", "wall_s", "eval_reward", "t_eval"}


class UpdateTally:
    """The PPO update's bookkeeping: sums over the trained (sample, step) pairs, the clipped pairs of named subsets of
    the samples (``Algorithm.clip_subsets``), with ``clip_range`` the pairs whose clip binds by advantage sign
    (``losses.binding_clips``) and the gradient norms; ``finish`` sums them over processes.

    The sums accumulate on the device, in float64 (each chunk's float32 sums widened, as Python floats held them
    before), and reach the host once, in ``finish``: a chunk adds no host read (on a GPU each would wait for it)."""

    FIELDS = ("clipped", "approx_kl", "kl", "ratio", "loss")

    def __init__(self, subsets: dict[str, torch.Tensor], device: torch.device | str = "cpu",
                 clip_range: float | None = None):
        self.subsets = subsets
        #: the subsets' masks on the device, moved once (they index the device's rows)
        self._masks = {name: mask.to(device) for name, mask in subsets.items()}
        #: the clip range whose binding sides are counted (None: not counted)
        self.clip_range = clip_range
        sides = 0 if clip_range is None else 4
        #: [clipped, approx_kl x rows, kl, ratio, loss, then (clipped, total) per subset, then (bound, total) for
        #: positive and negative advantages when counted], float64 on the device
        self._acc = torch.zeros(len(self.FIELDS) + 2 * len(subsets) + sides, dtype=torch.float64, device=device)
        self.pairs = 0
        self.grad_norms: list[float] = []

    @torch.no_grad()
    def add(self, rows: torch.Tensor, terms, log_prob: torch.Tensor, old: torch.Tensor, kl: torch.Tensor,
            per_sample: torch.Tensor, advantages: torch.Tensor | None = None) -> None:
        wide = torch.float64
        values = [terms.clipped.sum().to(wide), approx_kl(log_prob, old).to(wide) * len(rows), kl.sum().to(wide),
                  terms.ratio.sum().to(wide), per_sample.sum().to(wide)]
        for mask in self._masks.values():
            member = mask[rows]
            values += [(terms.clipped & member).sum().to(wide), member.sum().to(wide)]
        if self.clip_range is not None:
            positive, negative = binding_clips(terms.ratio, advantages, self.clip_range)
            values += [positive.sum().to(wide), (advantages > 0).sum().to(wide), negative.sum().to(wide),
                       (advantages < 0).sum().to(wide)]
        self._acc += torch.stack(values)
        self.pairs += len(rows)

    def finish(self, dist: SingleProcess) -> tuple[dict[str, float], dict[str, float]]:
        """(the StepStats fields of the update, {subset column: its clip fraction}) over all processes; the subsets'
        fractions only when every subset holds trained pairs; with ``clip_range`` the binding fractions of the
        positive- and negative-advantage pairs, each when the update trained such pairs."""
        acc = self._acc.tolist()  # the update's one read of its sums
        local = dict(zip(self.FIELDS, acc[: len(self.FIELDS)]), pairs=self.pairs)
        sums = dist.sum(local)
        n = max(sums["pairs"], 1)
        result = {
            "clip_frac": sums["clipped"] / n,
            "approx_kl": sums["approx_kl"] / n,
            "kl": sums["kl"] / n,
            "ratio_mean": sums["ratio"] / n,
            "loss": sums["loss"] / n,
            "grad_norm": sum(self.grad_norms) / max(len(self.grad_norms), 1),
        }
        counts = acc[len(self.FIELDS):]
        pairs = {name: dist.sum(torch.tensor(counts[2 * i: 2 * i + 2], dtype=torch.float64))
                 for i, name in enumerate(self.subsets)}
        fractions = ({} if not pairs or any(c[1] == 0 for c in pairs.values())
                     else {name: float(c[0] / c[1]) for name, c in pairs.items()})
        if self.clip_range is not None:
            sides = dist.sum(torch.tensor(counts[2 * len(self.subsets):], dtype=torch.float64))
            for column, (bound, total) in ((CLIP_FRAC_POS, sides[:2]), (CLIP_FRAC_NEG, sides[2:])):
                if total > 0:
                    fractions[column] = float(bound / total)
        return result, fractions


def rows_on_device(chunks: list[tuple[torch.Tensor | None, Any]], device: torch.device
                   ) -> list[tuple[torch.Tensor | None, Any]]:
    """The update's chunks (host row indices, step) with their rows on ``device``: the rows of every chunk of a
    minibatch go there in one copy, not one per chunk (each would wait for the device: a pageable host-to-device
    copy synchronises)."""
    host = [rows for rows, _ in chunks if rows is not None]
    if not host:
        return chunks
    moved = iter(torch.cat(host).to(device).split([len(rows) for rows in host]))
    return [(rows if rows is None else next(moved), t) for rows, t in chunks]


class Algorithm(LockstepPadding):
    """A GRPO-style algorithm; see the module docstring for the template and the hooks."""

    name: ClassVar[str | None] = None  # set by @register (algorithms/__init__.py): the name is stated once
    Config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    #: the method family it belongs to (its colour map and panel in the report); @register defaults it to the nearest
    #: registered base class's family, or the algorithm's own name (a family's own method)
    family: ClassVar[str | None] = None
    #: a family's own method declares its display name and the matplotlib colour map of its family (the report's
    #: titles and colours; read from the class's own attributes only, so a subclass does not inherit them); a family
    #: without a colour map is drawn in greys
    label: ClassVar[str | None] = None
    colormap: ClassVar[str | None] = None
    #: the algorithm this one ablates (its row goes to that method's ablation table); register_preset sets the base's
    #: name unless told otherwise; None for methods and variants
    ablation_of: ClassVar[str | None] = None
    #: {metrics.csv column: one-line description} of what the report shows for this algorithm, logged with
    #: :meth:`log`; ``{k}`` in a column stands for a denoising-step index (``abs_log_ratio_t{k}``)
    diagnostics: ClassVar[dict[str, str]] = {}
    #: config overrides that define a named preset of a class (e.g. an ablation), applied under the user's config
    preset: ClassVar[dict[str, Any]] = {}
    #: whether ``reuse_rollout_graph: auto`` may turn the recompute-free update on for this algorithm
    rollout_graph_auto: ClassVar[bool] = True
    #: whether fresh rollouts record each SDE transition's Gaussian mean (``Trajectory.means``): the old policy's
    #: anchor of a loss that compares means (Flow-DPPO's KL mask, GRPO-Guard's ratio normalisation)
    records_means: ClassVar[bool] = False
    #: whether the algorithm trains without the sampler's log-probabilities, on the forward (noising) process of its
    #: clean samples (the decoupled methods, DiffusionNFT): its trajectories record no transitions to train, so the
    #: PPO ratio checks do not apply to it
    likelihood_free: ClassVar[bool] = False
    #: whether the update logs where its PPO clip binds by advantage sign (``clip_frac_pos_adv``,
    #: ``clip_frac_neg_adv``: ``losses.binding_clips``): Flow-GRPO and GRPO-Guard, whose ``clipped`` is PPO's clip
    logs_clip_sides: ClassVar[bool] = False
    #: the data-parallel context (the runner sets it under a launcher); the default is the single-process no-op
    dist: SingleProcess = SINGLE_PROCESS
    #: the prompt sampler of ``train_step`` (``use_prompts``); None until a training pool is given
    prompt_sampler: PromptSampler | None = None
    #: the draw the current iteration trains on (``train_step``), or None for prompts given to ``step`` directly
    current_draw: PromptDraw | None = None
    #: added to the group ids and noise keys of fresh rollouts: 0, or a filtering sampler's extra round's base
    group_base: int = 0

    def __init__(self, model: FlowModel, reward: Reward, config: AlgorithmConfig | dict | None = None, seed: int = 0,
                 dist: SingleProcess | None = None):
        if dist is not None:  # the runner's data-parallel context: known here, so __init__ may depend on it
            self.dist = dist
        self.config = config if isinstance(config, AlgorithmConfig) else self.typed_config(config)
        self.model = model
        self.reward = reward
        self.seed = seed
        self.iteration = 0
        self.optimizer = torch.optim.AdamW(
            model.trainable_parameters(),
            lr=self.config.lr,
            weight_decay=self.config.weight_decay,
            eps=self.config.adam_eps,
            # a fused tier's optimizer step is one kernel over all tensors (3.5x faster on the toy MLP, the same
            # update to float rounding); elsewhere torch's default
            fused=True if model.fused_update else None,
        )
        self.num_steps = self.config.num_steps or model.default_num_steps
        self.config.check_num_steps(self.num_steps)  # the knobs bounded by T, once T is known (the model's default)
        self.shift = model.default_shift if self.config.shift is None else self.config.shift  # sigma-schedule shift
        grid = self.sigma_grid()
        # the model's own scheduler stretches its grid to a terminal sigma (Qwen-Image); another grid is left alone
        terminal = model.shift_terminal if grid == model.default_sigma_grid else None
        self.sigmas = sigma_schedule(self.num_steps, self.shift, grid=grid, terminal=terminal)
        self.update_generator = torch.Generator().manual_seed(seed + UPDATE_ORDER_OFFSET)
        #: the moving average of the trainable weights the run evaluates with (``ema``), or None
        self.ema = (WeightEMA(model.trainable_parameters(), self.config.ema_decay, self.config.ema_every)
                    if self.config.ema else None)
        #: the transformer calls of each phase, compared over processes after every step (algorithms/engine/lockstep.py):
        #: a sharded model under FLOWZOO_CHECK_LOCKSTEP=1, else None
        self.lockstep = CallLedger.attach(model) if model.sharded and lockstep_requested() else None
        #: one row of this step's first rollout: the input of a padding call on a process left with no rows
        self._padding_source: Trajectory | None = None

    def evaluation_weights(self) -> contextlib.AbstractContextManager:
        """The weights evaluation samples with: within this context the trainable parameters hold the moving average
        when ``ema`` is on (restored after); otherwise the trained weights, unchanged."""
        return self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext()

    # ---- hooks ----------------------------------------------------------------------------------------------
    def sigma_grid(self) -> SigmaGrid:
        """The grid of the training sigmas (``algorithms.engine.sde.sigma_schedule``): the model's pipeline's
        (``default_sigma_grid``: SD3's scheduler for sd3 / tiny, Wan2.1's UniPC flow sigmas for wan, FluxPipeline's
        for flux and qwen_image);
        DanceGRPO and MixGRPO read theirs from their config."""
        return self.model.default_sigma_grid

    def step_plan(self, batch: int) -> StepPlan:
        """Flow-GRPO's plan: SDE at every step, train the first int(T * timestep_fraction) steps of every sample."""
        trained = max(1, int(self.num_steps * self.config.timestep_fraction))
        train = torch.zeros(batch, self.num_steps, dtype=torch.bool)
        train[:, :trained] = True
        return StepPlan(
            self.sigmas, torch.ones(self.num_steps, dtype=torch.bool), train, self.config.kernel, self.config.noise_level
        )

    def collect(self, prompts: Sequence[str], metadata: Sequence[dict]) -> Trajectory:
        """Roll out G fresh samples for each prompt."""
        return self.fresh_rollout(prompts, metadata)

    def after_update(self, traj: Trajectory, batch: GatheredBatch) -> None:
        """Called after the optimizer step of each iteration; ``batch``: the rewards, groups and off-policy flags of
        the global batch (``traj`` itself in one process)."""

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    @classmethod
    def typed_config(cls, params: dict[str, Any] | None = None) -> AlgorithmConfig:
        """The class's typed config: its preset under ``params`` (the one place a preset is applied; unknown keys and
        bad values are one-line ConfigErrors naming ``algorithm.<key>``)."""
        return from_mapping(cls.Config, {**cls.preset, **(params or {})}, where="algorithm")

    # ---- prompts --------------------------------------------------------------------------------------------
    @classmethod
    def default_prompt_sampler(cls, config: AlgorithmConfig) -> dict[str, Any]:
        """The sampler a config without ``train.prompt_sampler`` gets: uniform."""
        return {"name": "uniform"}

    @classmethod
    def check_prompt_sampler(cls, config: AlgorithmConfig, spec: dict[str, Any]) -> None:
        """Refuse (one-line ConfigError) a sampler this algorithm cannot train with; every sampler is fine here."""

    def replayable_prompts(self) -> list[tuple[str, dict]] | None:
        """The (prompt, metadata) pairs the algorithm's replay buffer can replay now, distinct, in buffer order; None
        for an algorithm without a replay buffer (the ``replay_buffer`` sampler then keeps its own)."""
        return None

    def use_prompts(self, pool: Sequence[tuple[str, dict]], groups: int,
                    sampler: str | dict[str, Any] | None = None) -> None:
        """Train on ``pool`` with ``groups`` prompts per iteration, drawn by ``sampler`` (a name or ``{name: ...,
        <arguments>}``; None: ``default_prompt_sampler``)."""
        spec = prompt_samplers.spec_of(sampler) or self.default_prompt_sampler(self.config)
        self.check_prompt_sampler(self.config, spec)
        self.prompt_sampler = prompt_samplers.build(spec, pool, groups, self.seed)

    def train_step(self, step: int) -> StepStats:
        """Training step ``step`` (from 1) on the prompts the sampler draws for it."""
        if self.prompt_sampler is None:
            raise RuntimeError("Algorithm.train_step needs a training pool: call use_prompts(pool, groups) first")
        draw = self.prompt_sampler.draw(step, self.iteration, self)
        return self.step(draw.prompts, draw.metadata, draw=draw, at_step=step)

    def _filled_batch(self, traj: Trajectory, batch: GatheredBatch, draw: PromptDraw, at_step: int,
                      outcomes: list[GroupOutcome]) -> tuple[Trajectory, GatheredBatch]:
        """A filtering sampler's batch: the first rollout's kept groups, then fresh rounds of prompts until
        ``len(draw)`` groups are kept or the sampler stops; completed with unkept groups in draw order when short.
        Round r's groups have ids (and noise keys) from ``r * G * B`` on, and sample no replayed trajectories."""
        sampler, groups = self.prompt_sampler, len(draw)
        parts, kept, unkept = [traj], [], []
        for outcome_gid, outcome in outcomes:
            (kept if sampler.keeps(outcome.rewards) else unkept).append(outcome_gid)
        rounds = 1
        while len(kept) < groups:
            more = sampler.refill(at_step, self.iteration, rounds)
            if more is None:
                break
            self.group_base = rounds * self.config.group_size * groups
            self.current_draw = more
            try:
                part = self.collect(more.prompts, more.metadata)
            finally:
                self.group_base, self.current_draw = 0, draw
            if part.rewards is None:
                self.score(part)
            part_batch = self.dist.gather_batch(part)
            for gid, outcome in self._outcomes(part_batch, more, rounds * self.config.group_size * groups):
                outcomes.append((gid, outcome))
                (kept if sampler.keeps(outcome.rewards) else unkept).append(gid)
            parts.append(part)
            rounds += 1
        chosen = (kept + unkept)[:groups]
        self.log("sampler_rounds", rounds)
        self.log("sampler_kept_frac", len(kept) / max(len(outcomes), 1))
        if rounds == 1 and not unkept:
            return traj, batch
        whole = Trajectory.cat(parts) if len(parts) > 1 else traj
        rows = torch.isin(whole.group, torch.tensor(chosen, device=whole.group.device)).nonzero().flatten()
        whole = whole.select(rows)
        return whole, self.dist.gather_batch(whole)

    @staticmethod
    def _outcomes(batch: GatheredBatch, draw: PromptDraw | None, base: int = 0) -> list[tuple[int, GroupOutcome]]:
        """(group id, outcome) of every group of the global ``batch`` whose id ``base + i`` is position i of
        ``draw`` (none for prompts given directly), in group order."""
        if draw is None:
            return []
        rewards, group = batch.rewards.detach().cpu(), batch.group.cpu()  # the sampler's bookkeeping: once, on the host
        found = []
        for gid in group.unique().tolist():
            i = gid - base
            if 0 <= i < len(draw):
                found.append((gid, GroupOutcome(draw.indices[i], draw.prompts[i], rewards[group == gid])))
        return found

    # ---- diagnostics ----------------------------------------------------------------------------------------
    def log(self, key: str, value: float) -> None:
        """Record a scalar of the current iteration (Stable-Baselines3's ``logger.record``): ``step`` returns it in
        ``StepStats.extra`` and the runner writes it as column ``key`` of metrics.csv. Logging a key again in the
        same iteration keeps the last value. Declare the columns the report should show in ``diagnostics``."""
        if not isinstance(key, str) or not key or key in RESERVED_COLUMNS:
            raise ValueError(f"Algorithm.log: key {key!r} must be a non-empty string other than the columns the "
                             f"template writes ({', '.join(sorted(RESERVED_COLUMNS))})")
        self.logged[key] = float(value)

    @property
    def logged(self) -> dict[str, float]:
        """The values recorded with :meth:`log` since the current iteration began."""
        return self.__dict__.setdefault("_logged", {})

    # ---- the template ---------------------------------------------------------------------------------------
    def step(self, prompts: Sequence[str], metadata: Sequence[dict] | None = None, *, draw: PromptDraw | None = None,
             at_step: int | None = None) -> StepStats:
        """One training iteration on ``prompts`` (one group of G samples per prompt). ``draw``/``at_step``: the
        sampler's draw these prompts are and the training step it was drawn for (``train_step``); the sampler then
        sees every group's outcome, and a filtering sampler may roll out more prompts."""
        metadata = list(metadata) if metadata is not None else [{} for _ in prompts]
        self._logged: dict[str, float] = {}
        self.current_draw = draw
        self.model.nfe = 0
        t0 = time.perf_counter()
        with self.lockstep_phase("rollout"):
            traj = self.collect(list(prompts), metadata)
        if self.model.sharded and len(traj):
            self._padding_source = traj.select([0])
        t1 = time.perf_counter()
        if traj.rewards is None:
            self.score(traj)
        batch = self.dist.gather_batch(traj)  # the global batch's rewards and groups (traj itself in one process)
        outcomes = self._outcomes(batch, draw)
        if draw is not None and self.prompt_sampler is not None and self.prompt_sampler.filters:
            t_fill = time.perf_counter()
            with self.lockstep_phase("rollout"):
                traj, batch = self._filled_batch(traj, batch, draw, at_step if at_step is not None else 0, outcomes)
            t1 += time.perf_counter() - t_fill  # the extra rounds are sampling time (their scoring included)
        nfe_sampling = self.model.nfe
        advantages = self.advantages(batch)[batch.local]
        t2 = time.perf_counter()
        self.model.nfe = 0
        with self.lockstep_phase("update"):
            update = self.update(traj, advantages)
        t3 = time.perf_counter()
        stats = StepStats(
            reward_mean=float(batch.rewards.mean()),
            reward_std=float(batch.rewards.std(unbiased=False)),
            nfe_sampling=self.dist.sum(nfe_sampling),
            nfe_training=self.dist.sum(self.model.nfe),
            t_sampling=t1 - t0,
            t_reward=t2 - t1,
            t_training=t3 - t2,
            **update,
        )
        self.log("zero_std_frac", zero_std_fraction(batch.rewards, batch.group))
        for name, values in batch.reward_components.items():
            self.log(f"reward/{name}", float(values.mean()))
        self.after_update(traj, batch)
        if draw is not None and self.prompt_sampler is not None:
            self.prompt_sampler.observe([outcome for _, outcome in outcomes])
        self.current_draw = None
        stats.extra = self.logged
        self.iteration += 1
        self.check_lockstep(f"training step {at_step if at_step is not None else self.iteration}")
        return stats

    def fresh_rollout(
        self, prompts: Sequence[str], metadata: Sequence[dict], group_offset: int = 0, group_size: int | None = None,
        rows: range | None = None,
    ) -> Trajectory:
        """G on-policy samples for each prompt, sample j of prompt i seeded by (seed, iteration, i, j).

        ``group_size`` overrides G (OP-GRPO rolls out G - k fresh samples for groups that get k replayed ones).
        ``rows`` restricts the rollout to these indices of the ``len(prompts) * G`` samples (default: this process's
        shard, i.e. all of them in a single process); their noise, plan and groups are those of the full batch."""
        inputs = self.fresh_inputs(prompts, metadata, group_offset, group_size, rows)
        live = {} if self.keeps_rollout_graph() else None
        prediction: dict[str, torch.Tensor] = {}  # the last step's data prediction, where the plan decodes it
        means = None
        if self.records_means:
            x = inputs.x
            means = torch.zeros((x.shape[0], inputs.plan.num_steps, *x.shape[1:]), dtype=torch.float32, device=x.device)
        latents, log_probs = rollout(self.model, inputs.cond, inputs.plan, inputs.x, inputs.generators,
                                     self.config.guidance, live=live, cfg_grad=self.config.cfg_grad,
                                     cfg_batch=self.config.cfg_batch, prediction=prediction,
                                     chunk=self.rollout_chunk(), means=means)
        return Trajectory.from_rollout(inputs.plan, inputs.prompts, inputs.metadata, inputs.cond, latents, log_probs,
                                       inputs.group, self.config.guidance, live=live,
                                       prediction=prediction.get("x0"), means=means)

    def fresh_inputs(
        self, prompts: Sequence[str], metadata: Sequence[dict], group_offset: int = 0, group_size: int | None = None,
        rows: range | None = None, shared_noise: bool | None = None,
    ) -> RolloutInputs:
        """What :meth:`fresh_rollout` (same arguments) samples from: its rows' condition, initial noise, generators,
        plan and groups (OP-GRPO rolls several such parts out as one batch; Flow-GRPO-Fast branches them from one
        prefix per group). ``shared_noise``: one initial noise per group (default: the config's ``shared_noise``)."""
        g = self.config.group_size if group_size is None else group_size
        batch = len(prompts) * g
        rows = self.dist.shard(batch) if rows is None else rows
        first, last = rows.start // g, (rows.stop - 1) // g + 1  # the prompts these rows belong to
        local = slice(rows.start - first * g, rows.stop - first * g)
        cond = self.model.encode(list(prompts[first:last]), list(metadata[first:last]))
        cond = cond.repeat_interleave(g).index(local)
        group_offset += self.group_base
        gens = sample_generators(self.seed, self.iteration, group_offset, count=batch)
        shared = self.config.shared_noise if shared_noise is None else shared_noise
        x1 = initial_noise(self.model, gens[first * g: last * g], g, shared)[local]
        plan = self.make_plan(batch)
        return RolloutInputs(
            prompts=[prompts[i // g] for i in rows],
            metadata=[metadata[i // g] for i in rows],
            cond=cond,
            x=x1,
            generators=gens[rows.start: rows.stop],
            plan=dataclasses.replace(plan, train=plan.train[rows.start: rows.stop], graph_steps=plan.train.any(0)),
            group=torch.arange(group_offset, group_offset + len(prompts)).repeat_interleave(g)[rows.start: rows.stop],
        )

    def rollout_chunk(self) -> int | None:
        """Samples per network call of a training rollout and per decode and reward call (``rollout_batch``, else
        the model's ``default_rollout_batch``); None: all of a process's samples at once."""
        chunk = self.config.rollout_batch
        return self.model.default_rollout_batch if chunk is None else chunk

    def keeps_rollout_graph(self) -> bool:
        """``reuse_rollout_graph`` resolved (``auto``: see ``AlgorithmConfig``)."""
        cfg = self.config
        if cfg.reuse_rollout_graph != "auto":
            return bool(cfg.reuse_rollout_graph)
        return self.rollout_graph_auto and (cfg.inner_epochs, cfg.minibatches) == (1, 1) and cfg.micro_batch is None

    def make_plan(self, batch: int) -> StepPlan:
        """The algorithm's ``step_plan`` with the settings every algorithm shares (the log-prob reduction)."""
        return dataclasses.replace(self.step_plan(batch), reduction=self.config.log_prob_reduction)

    @torch.no_grad()
    def score(self, traj: Trajectory) -> None:
        """Decode the rewarded latents (``traj.rewarded``: the final sample, or the last step's data prediction where
        the plan says so) and score them; fills ``samples``, ``rewards`` and ``reward_components``. Decoded and
        scored in chunks of :meth:`rollout_chunk` samples (one decode call and one reward call each)."""
        rewarded = traj.rewarded
        samples, scores, components = [], [], []
        for span in chunk_spans(len(rewarded), self.rollout_chunk()):
            samples.append(self.model.decode(rewarded[span]))
            try:
                out = self.reward(samples[-1], traj.prompts[span], traj.metadata[span])
            except FlowZooError:  # already one line (a RewardError, non-finite samples, a bad prompt, ...)
                raise
            except Exception as error:  # as the evaluation's reward pool says it: one line naming the reward
                name = self.reward.name
                raise RewardError(f"reward {name!r} failed in training: {type(error).__name__}: {error}") from error
            scores.append(out.score)
            components.append(dict(out.components))
        if len(samples) == 1:  # the one call's tensors as they are
            traj.samples, traj.rewards, traj.reward_components = samples[0], scores[0], components[0]
            return
        traj.samples = torch.cat(samples)
        traj.rewards = torch.cat(scores)
        traj.reward_components = {name: torch.cat([part[name] for part in components]) for name in components[0]}

    def advantages(self, traj: Trajectory) -> torch.Tensor:
        weights = self.reward.weights if isinstance(self.reward, MultiReward) else None
        return combined_advantages(
            traj.rewards,
            traj.reward_components,
            weights,
            traj.group,
            aggregation=self.config.reward_aggregation,
            std_mode=self.config.adv_std,
            clip=self.config.adv_clip,
            eps=self.config.adv_eps,
            unbiased=self.config.adv_std_unbiased,
        )

    def score_transition(self, traj: Trajectory, rows: torch.Tensor, t: int | torch.Tensor) -> StepOutput:
        """The recorded transition t -> t+1 of samples ``rows`` scored under the model's current policy (gradients
        flow unless the caller disables them). ``t``: one step for every row, or a tensor of one step per row."""
        x = traj.latents[rows, t]
        sigma, sigma_next = self._step_sigmas(traj, t, len(rows))
        quiet = traj.quiet_steps()[t]  # host-side: whether the step has zero noise, without reading the device
        v = self.model.velocity(x, sigma, traj.cond.index(rows), traj.guidance, cfg_grad=self.config.cfg_grad,
                                cfg_batch=self.config.cfg_batch)
        return sde_step(x, v, sigma, sigma_next, kind=traj.kind, noise_level=traj.noise_level,
                        prev_sample=traj.latents[rows, t + 1], reduction=traj.reduction,
                        deterministic=bool(quiet.all()))

    @staticmethod
    def _step_sigmas(traj: Trajectory, t: int | torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(sigma, sigma_next) [n] of transition ``t`` (one step, or a host tensor of one step per row) from the
        trajectory's grid on its device: a view for one step, no host-to-device copy per call."""
        sigmas = traj.device_sigmas()
        if isinstance(t, torch.Tensor):  # the fused update's per-row steps (a host tensor)
            t = t.to(sigmas.device)
        return sigmas[t].expand(n), sigmas[t + 1].expand(n)

    def _step_terms(
        self, traj: Trajectory, rows: torch.Tensor, t: int, live: dict | None = None
    ) -> tuple[StepOutput, torch.Tensor]:
        """The current log-prob of transition t for samples ``rows`` (with grad) and the KL to the reference policy;
        from the rollout's kept graph (``live[t]``) when there is one, else recomputed."""
        if live and isinstance(t, int) and t in live:
            out = StepOutput(*(field[rows] for field in live[t]))
        else:
            out = self.score_transition(traj, rows, t)
        kl = out.log_prob.new_zeros(len(rows))  # the log-prob's device and dtype (float32: algorithms/engine/sde.py)
        if self.config.kl_beta > 0:
            with torch.no_grad(), self.model.reference():
                ref = self.score_transition(traj, rows, t)
            sigma, sigma_next = self._step_sigmas(traj, t, len(rows))
            std = kl_std(out.std, sigma, sigma_next, self.config.kl_variance, traj.kind)
            kl = gaussian_mean_kl(out.mean, ref.mean, std, traj.reduction)
        return out, kl

    def policy_terms(self, traj: Trajectory, rows: torch.Tensor, t: int | torch.Tensor, out: StepOutput,
                     old: torch.Tensor, advantages: torch.Tensor) -> PPOTerms:
        """The policy loss of one chunk of trained transitions (``rows`` at step ``t``; ``out`` their current
        StepOutput, ``old`` the behaviour log-probs, ``advantages`` the rows'): Flow-GRPO's PPO-clip surrogate. Its
        ``clipped`` mask is what the update counts as ``clip_frac``. Flow-DPPO and GRPO-Guard override it."""
        return ppo_clip_loss(out.log_prob, old, advantages, self.config.clip_range)

    def minibatch_rows(self, batch: int, kept: torch.Tensor | None, offset: int, local: int) -> Iterator[torch.Tensor]:
        """This rank's rows of each minibatch of an update, epoch after epoch: every inner epoch draws a fresh
        permutation of the global batch (or of the ``kept`` rows) from the update generator (``minibatch_order``
        grouped or interleaved: takes them in that fixed order, :func:`ordered_rows`) and splits it into
        ``minibatches`` parts; each part is sorted and cut to the rows ``[offset, offset + local)`` this rank holds,
        returned as local indices (possibly none: the caller skips a minibatch that is empty on every rank)."""
        for _ in range(self.config.inner_epochs):
            if self.config.minibatch_order != "shuffled":  # in order (rows are group-major), or slice by slice
                perm = ordered_rows(batch, self.config.group_size, self.config.minibatch_order)
                perm = perm if kept is None else perm[torch.isin(perm, kept)]
            elif kept is None:
                perm = torch.randperm(batch, generator=self.update_generator)
            else:
                perm = kept[torch.randperm(len(kept), generator=self.update_generator)]
            for minibatch in perm.chunk(self.config.minibatches):
                minibatch = minibatch.sort().values
                yield minibatch[(minibatch >= offset) & (minibatch < offset + local)] - offset

    def optimizer_step(self) -> float:
        """One optimizer step on the accumulated gradients: summed over ranks, clipped to ``max_grad_norm`` (0: no
        clipping), applied, then the weight EMA updated; returns the gradient norm before clipping."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        # a sharded parameter's gradient was already summed over ranks by FSDP's reduce-scatter (models/sharding.py)
        self.dist.all_reduce_gradients([p for p in params if not is_sharded(p)])
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm or math.inf)
        grad_norm = float(full_tensor(grad_norm))  # over every shard: a DTensor when the parameters are sharded
        self.optimizer.step()
        if self.ema is not None:
            self.ema.update()
        return grad_norm

    def clip_subsets(self, traj: Trajectory) -> dict[str, torch.Tensor]:
        """{metrics.csv column: bool mask over ``traj``'s samples}: subsets whose PPO clip fraction the update logs
        apart (all of them, when each holds trained pairs over all processes). None here; OP-GRPO splits its
        on- and off-policy samples."""
        return {}

    def trained_rows(self, advantages: torch.Tensor) -> torch.Tensor | None:
        """Global indices of the samples the update trains (None: all): with ``drop_zero_advantage``, those whose
        advantage is not exactly 0 (over all processes)."""
        if not self.config.drop_zero_advantage:
            return None
        kept = torch.nonzero(self.dist.cat(advantages) != 0).squeeze(1).cpu()  # host indices, as the permutation
        self.log("zero_adv_dropped_frac", 1.0 - len(kept) / max(self.dist.local_span(len(advantages))[1], 1))
        return kept

    def transition_chunks(
        self, traj: Trajectory, minibatch: torch.Tensor
    ) -> Iterator[tuple[torch.Tensor, int | torch.Tensor]]:
        """(rows, t): the minibatch's trained transitions, step by step, in chunks of ``micro_batch`` samples (a kept
        rollout graph is back-propagated whole: its forward already ran on the batch).

        Where the model's tier fuses its update (``FlowModel.fused_update``) and no rollout graph is kept, the
        transitions of every trained step come as one chunk (of at most ``micro_batch`` pairs) with ``t`` a tensor of
        one step per row, in the same step-major order."""
        if self.model.fused_update and not traj.live:
            steps, local = torch.nonzero(traj.train[minibatch].T, as_tuple=True)  # step-major, as below
            rows = minibatch[local]
            for part in torch.arange(len(rows), device=rows.device).split(max(self.config.micro_batch or len(rows), 1)):
                if len(part):
                    yield rows[part], steps[part]
            return
        for t in range(traj.num_steps):
            rows_t = minibatch[traj.train[minibatch, t]]
            chunk = len(rows_t) if traj.live and t in traj.live else self.config.micro_batch or len(rows_t)
            for rows in rows_t.split(max(chunk, 1)):
                if len(rows):
                    yield rows, t

    def update(self, traj: Trajectory, advantages: torch.Tensor) -> dict[str, Any]:
        """PPO-clip epochs over the rollout batch (Flow-GRPO's loss): per trained transition, the clipped surrogate of
        the ratio pi_theta / pi_old plus beta x KL to the reference, each sample scaled by exp(traj.log_weight),
        summed and normalised by the minibatch's number of trained (sample, step) pairs over all processes."""
        cfg = self.config
        offset, batch = self.dist.local_span(len(traj))  # minibatches are drawn over the global batch
        device = traj.log_probs.device
        weight = torch.exp(traj.log_weight).float()
        tally = UpdateTally(self.clip_subsets(traj), device, cfg.clip_range if self.logs_clip_sides else None)
        on_policy = ~traj.off_policy.to(device)  # once: the drift check reads it at every chunk
        first_drift = None  # max |log pi_theta - log pi_old| of the first optimizer step's on-policy pairs
        padded = 0  # network calls this process made only to keep a sharded model's processes in lockstep
        for minibatch in self.minibatch_rows(batch, self.trained_rows(advantages), offset, len(traj)):
            pairs = self.dist.sum(int(traj.train[minibatch].sum()))
            if pairs == 0:
                continue
            drift = [] if first_drift is None else None
            self.optimizer.zero_grad(set_to_none=True)
            fused = []  # a fused update's chunk losses, back-propagated once (a kept graph's steps included)
            for rows, t in rows_on_device(self.padded_chunks(traj, minibatch), device):
                if rows is None:
                    self._padding_call(traj, fused, t)
                    padded += 1
                    continue
                out, kl = self._step_terms(traj, rows, t, traj.live)
                old = traj.log_probs[rows, t.to(device) if isinstance(t, torch.Tensor) else t]
                terms = self.policy_terms(traj, rows, t, out, old, advantages[rows])
                per_sample = (terms.loss + cfg.kl_beta * kl) * weight[rows]
                loss = per_sample.sum() / pairs
                if self.model.fused_update:
                    fused.append(loss)
                else:
                    loss.backward()
                tally.add(rows, terms, out.log_prob, old, kl, per_sample, advantages[rows])
                if drift is not None:  # before any optimizer step: 0 unless sampling and training disagree
                    gap = (out.log_prob.detach() - old).abs()
                    drift.append(torch.where(on_policy[rows], gap, torch.zeros_like(gap)).amax().reshape(1))
            if fused:
                torch.stack(fused).sum().backward()
            if drift is not None:  # every process sets it at the same minibatch (this rank may hold none of it)
                first_drift = float(torch.cat(drift).max()) if drift else 0.0
            tally.grad_norms.append(self.optimizer_step())
        traj.live = None  # graphs are spent (and a second epoch would need fresh ones)
        if self.model.sharded:  # the calls made only to keep the processes in lockstep, summed over processes
            self.log(FSDP_PADDING, self.dist.sum(padded))
        result, subsets = tally.finish(self.dist)
        for column, value in subsets.items():
            self.log(column, value)
        if first_drift is not None:  # the largest over processes
            self.log(ONPOLICY_DRIFT, max(self.dist.all_gather_object(first_drift)))
        return result

    # ---- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {
            "iteration": self.iteration,
            "model": self.model.trainable_state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "update_generator": self.update_generator.get_state(),
            "extra": self.extra_state(),
        }
        sampler_state = self.prompt_sampler.state_dict() if self.prompt_sampler is not None else {}
        if sampler_state:  # only then: a run with a stateless sampler keeps the checkpoint it always had
            state["prompt_sampler"] = sampler_state
        if self.ema is not None:  # only then: a checkpoint without EMA is the one it always was
            state["ema"] = self.ema.state_dict()
        # a sharded model's weights, moments and copies gathered whole (a collective: every process calls
        # state_dict), so the checkpoint is the one a single process writes and resumes on any number of processes
        return gathered(state) if self.model.sharded else state

    def _optimizer_state_for_shards(self, saved: dict[str, Any]) -> dict[str, Any]:
        """A full optimizer state dict with each tensor of a sharded parameter's state cut to this process's shard
        (the checkpoint holds full tensors, ``state_dict``)."""
        if not self.model.sharded:
            return saved
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        state = {index: {k: like(v, params[index]) if isinstance(v, torch.Tensor) and v.dim() > 0 else v
                         for k, v in per_param.items()} if 0 <= index < len(params) else per_param
                 for index, per_param in saved.get("state", {}).items()}
        return {**saved, "state": state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iteration = state["iteration"]
        self.model.load_trainable_state_dict(state["model"])
        self.optimizer.load_state_dict(self._optimizer_state_for_shards(state["optimizer"]))
        self.update_generator.set_state(state["update_generator"])
        self.load_extra_state(state["extra"])
        if self.prompt_sampler is not None and "prompt_sampler" in state:
            self.prompt_sampler.load_state_dict(state["prompt_sampler"])
        if self.ema is not None:
            if "ema" not in state:
                raise FlowZooError("the checkpoint holds no EMA weights, but algorithm.ema is on")
            self.ema.load_state_dict(state["ema"])

