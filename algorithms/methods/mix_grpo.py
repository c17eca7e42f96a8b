"""MixGRPO and MixGRPO-Flash (Li et al., "MixGRPO: Unlocking Flow-based GRPO Efficiency with Mixed ODE-SDE",
arXiv 2507.21802).

MixGRPO: the rollout is stochastic (``flow_grpo`` kernel, a = 0.7) only inside a sliding window of ``window_size``
(w = 4) consecutive steps and deterministic Euler elsewhere; only the window's steps are trained, so a sample costs
T forward passes to sample but only w to train. Defaults follow the paper and its released FLUX script
(Tencent-Hunyuan/MixGRPO ``scripts/finetune/finetune_flux_grpo_MixGRPO.sh``): w = 4, stride 1, tau = 25 iterations
per position, ``progressive`` strategy with roll-back, one shared initial noise per group (``--init_same_noise``),
no KL, clip 1e-4 (the base default), several rewards merged by advantage (``multi_reward_mix="advantage_aggr"``,
:62: each reward's group advantage, weighted, summed, and the sum clamped, see ``algorithms.engine.advantages``), and the
sigma grid ``shift(linspace(1, 0, T + 1))`` (``sigma_grid: linspace``, fastvideo/train_grpo_flux.py:187-189); the
paper samples T = 25 steps, here ``num_steps`` stays the model's default so that tiers compare at equal T.

Window position (``sde_window_start(iteration)``; a pure function of the iteration, which ``state_dict`` stores, so a
resumed run continues with the same windows). ``window_bound`` says where the window must end:

* ``released`` (default): its steps lie in ``0 .. T - 3``. The reference builds its window state with
  ``max_timesteps = T - 2`` (fastvideo/train_grpo_flux.py:919) and trains ``range(cur, min(cur + w, max_timesteps))``
  (fastvideo/utils/grpo_states.py:148), an exclusive bound, so step T - 2 is never trained. A progressive start
  runs up to T - 2 (it rolls back once past it, :95-97) and the window is cut at T - 3: it shrinks over the last
  w - 1 positions and is empty at start T - 2, where an iteration samples with the ODE only and makes no optimizer
  step (the reference gets there after tau (T - 2) iterations and would fail: train_grpo_flux.py:611-612 prints the
  ``ratio`` of a loop that did not run). A random start is drawn in ``0 .. T - 2 - w`` (:102).
* ``whole``: the window stays whole and may contain step T - 2; a start is at most ``L = T - 1 - w``.

Strategies (``L`` = the last start: T - 2 for a released progressive window, else the last whole-window start):

* ``progressive``: ``start = window_start + stride * (iteration // tau)``. Reaching past ``L``, MixGRPO's rule
  (``GRPOTrainingStates.update_iteration``, grpo_states.py:85-99) is: with roll-back, return to the initial start
  and slide again (so positions cycle with period ``(L - window_start) // stride + 1`` shifts); without, stay at
  ``L``.
* ``random``: a uniform start in ``0 .. L`` each iteration (the reference draws one per iteration), from a generator
  seeded by (seed, iteration).
* ``fixed``: always ``window_start`` (the reference's progressive with stride 0: Flash*'s frozen window).

MixGRPO-Flash: after the window, the remaining ``T - 1 - last`` steps (``last`` = the window's last step) are replaced
by a coarser schedule of ``P = max(int(n * r), 2)`` points from ``sigmas[last + 1]`` to 0 (``P - 1`` steps;
r = ``compress_ratio`` = 0.4, the released script's ``dpm_post_compress_ratio``), with ``n = T - last`` as the
reference counts (``compress_count: released``, fastvideo/utils/sampling_utils.py:44) or ``n = T - 1 - last``
(``remaining``). The floor of 2 points is ours: the reference's floor of 1 (reached at the last released window
positions) would end its schedule at ``sigmas[last + 1]`` instead of 0. Solved with DPM-Solver++ 2M
(``algorithms.engine.sde.dpm_solver_pp_2m_step``), see ``algorithms.engine.plans.compressed_tail_sigmas`` for the sigmas.
Steps before the window stay Euler. Flash's tau is 20 (both released Flash scripts). ``mix_grpo_flash_star`` is
Flash* (r = 0.2 and a frozen window at step 0). An empty window (released bound, start T - 2) has ``last = start - 1``
(the reference fails there: it finds no SDE step to compress after).

NFE per iteration (B samples, CFG factor c, E inner epochs, k = 2 if kl_beta > 0 else 1, w' = the window's steps
this iteration: w, or fewer where a released window is cut at T - 3):
MixGRPO sampling T * B * c, training E * k * c * B * w'; Flash sampling (last + P) * B * c, training the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from flowzoo.algorithms import register, register_preset
from flowzoo.algorithms.engine.base import Algorithm, AlgorithmConfig
from flowzoo.algorithms.engine.advantages import Aggregation
from flowzoo.algorithms.engine.distributed import GatheredBatch
from flowzoo.algorithms.engine.plans import (
    compressed_tail_sigmas, iteration_generator, window_plan,
)
from flowzoo.algorithms.engine.sde import SigmaGrid
from flowzoo.algorithms.engine.trajectory import StepPlan, Trajectory
from flowzoo.errors import ConfigError
from flowzoo.streams import PURPOSE_WINDOW


@dataclass
class MixGRPOConfig(AlgorithmConfig):
    shared_noise: bool = True
    kl_beta: float = 0.0
    window_size: int = 4
    window_stride: int = 1
    window_tau: int = 25  # iterations per window position
    window_strategy: Literal["progressive", "random", "fixed"] = "progressive"
    window_start: int = 0  # the first (progressive) or only (fixed) start
    window_rollback: bool = True
    window_bound: Literal["released", "whole"] = "released"  # where the window must end (see the module)
    sigma_grid: SigmaGrid = "linspace"
    reward_aggregation: Aggregation = "advantage"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window_size < 1 or self.window_tau < 1:
            raise ConfigError("algorithm.window_size and algorithm.window_tau must be >= 1")
        if self.window_stride < 0 or self.window_start < 0:
            raise ConfigError("algorithm.window_stride and algorithm.window_start must be >= 0")


@register("mix_grpo")
class MixGRPO(Algorithm):
    label, colormap = "MixGRPO", "Oranges"  # the report's name and colours of this family
    Config = MixGRPOConfig
    # the report groups a column's algorithms under one description: Fast draws the start, MixGRPO slides it
    diagnostics = {"window_start": "first denoising step of this iteration's SDE window"}

    def sigma_grid(self) -> SigmaGrid:
        return self.config.sigma_grid

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.config.window_start > self.last_window_start:
            raise ConfigError(
                f"algorithm.window_start {self.config.window_start} is past the last start {self.last_window_start} "
                f"(T = {self.num_steps}, window_size = {self.config.window_size}, "
                f"window_bound = {self.config.window_bound})"
            )

    @property
    def window_end(self) -> int:
        """One past the last step a window may hold: T - 2 (``released``) or T - 1 (``whole``; never the final
        transition)."""
        return self.num_steps - (2 if self.config.window_bound == "released" else 1)

    @property
    def last_window_start(self) -> int:
        """L: T - 2 for a released progressive window (which shrinks at the end), else the last whole-window start."""
        cfg = self.config
        last = self.window_end - cfg.window_size
        if last < 0:
            needed = cfg.window_size + self.num_steps - self.window_end
            raise ConfigError(
                f"algorithm.window_size {cfg.window_size} needs num_steps >= {needed} "
                f"(window_bound {cfg.window_bound}), got {self.num_steps}"
            )
        if cfg.window_bound == "released" and cfg.window_strategy == "progressive" and cfg.window_stride > 0:
            return self.window_end
        return last

    def sde_window_start(self, iteration: int | None = None) -> int:
        """The window's first step at ``iteration`` (default: the current one)."""
        cfg = self.config
        iteration = self.iteration if iteration is None else iteration
        last, first = self.last_window_start, cfg.window_start
        if cfg.window_strategy == "fixed" or cfg.window_stride == 0:
            return first
        if cfg.window_strategy == "random":
            gen = iteration_generator(self.seed, iteration, PURPOSE_WINDOW)
            return int(torch.randint(0, last + 1, (1,), generator=gen))
        shifts = iteration // cfg.window_tau
        if cfg.window_rollback:
            shifts %= (last - first) // cfg.window_stride + 1
        return min(first + cfg.window_stride * shifts, last)

    def window_steps(self, iteration: int | None = None) -> int:
        """The number of steps in the window at ``iteration``: w, less where it is cut at ``window_end``."""
        return max(0, min(self.config.window_size, self.window_end - self.sde_window_start(iteration)))

    def step_plan(self, batch: int) -> StepPlan:
        cfg = self.config
        return window_plan(self.sigmas, self.sde_window_start(), self.window_steps(), batch, cfg.kernel, cfg.noise_level)

    def after_update(self, traj: Trajectory, batch: GatheredBatch) -> None:
        self.log("window_start", self.sde_window_start())


@dataclass
class MixGRPOFlashConfig(MixGRPOConfig):
    compress_ratio: float = 0.4
    window_tau: int = 20  # iters_per_group=20 in both released Flash scripts (finetune_flux_grpo_MixGRPO_Flash*.sh:57)
    # the steps the compress ratio multiplies: "released" T - last (sampling_utils.py:44), "remaining" T - 1 - last
    compress_count: Literal["released", "remaining"] = "released"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.compress_ratio <= 1:
            raise ConfigError(f"algorithm.compress_ratio must be in (0, 1], got {self.compress_ratio}")


@register("mix_grpo_flash")
class MixGRPOFlash(MixGRPO):
    Config = MixGRPOFlashConfig
    diagnostics = {
        **MixGRPO.diagnostics,
        "tail_steps": "solver steps of the compressed ODE tail after the SDE window (released count int((T - last) r)); "
                      "at 1 the rewarded sample is the one-step prediction x - sigma v",
        "tail_sigma": "sigma at which the compressed tail starts",
    }

    def flash_sigmas(self) -> tuple[torch.Tensor, int]:
        """This iteration's sampling sigmas (the original grid up to the window's end, then the compressed tail) and
        ``last``, the window's last step (``start - 1`` for an empty window: the tail follows the ODE steps)."""
        cfg = self.config
        last = self.sde_window_start() + self.window_steps() - 1
        counted = self.num_steps - last if cfg.compress_count == "released" else None
        return compressed_tail_sigmas(self.sigmas, last, cfg.compress_ratio, self.shift, counted), last

    def step_plan(self, batch: int) -> StepPlan:
        cfg = self.config
        sigmas, last = self.flash_sigmas()
        dpm = torch.zeros(sigmas.shape[0] - 1, dtype=torch.bool)
        dpm[last + 1 :] = True
        return window_plan(sigmas, self.sde_window_start(), self.window_steps(), batch, cfg.kernel, cfg.noise_level, dpm)

    def after_update(self, traj: Trajectory, batch: GatheredBatch) -> None:
        super().after_update(traj, batch)
        # the tail's length and first sigma: with one tail step the rewarded sample is the one-step data prediction
        # x - sigma v at that sigma (docs/algorithms.md, "Flash on the toy tier")
        sigmas, last = self.flash_sigmas()
        self.log("tail_steps", sigmas.shape[0] - 2 - last)
        self.log("tail_sigma", float(sigmas[last + 1]))


register_preset(
    "mix_grpo_flash_star",
    MixGRPOFlash,
    {"compress_ratio": 0.2, "window_strategy": "fixed", "window_start": 0},
    "MixGRPO-Flash* (arXiv 2507.21802): compress ratio 0.2 and the window frozen at the first steps "
    "(the released Flash* script: dpm_post_compress_ratio 0.2, prog_overlap_step 0).",
    ablation_of=None,  # a published variant, not an ablation
)
