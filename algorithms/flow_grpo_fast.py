"""Flow-GRPO-Fast (Liu et al., "Flow-GRPO: Training Flow Matching Models via Online RL", arXiv 2505.05470, and its
released ``train_sd3_fast`` recipe).

The rollout is deterministic (Euler ODE) everywhere except an SDE window of ``sde_window_size`` consecutive steps
(2; 3 in some recipes), and only the window is trained. The window's start is uniform in
``0 .. sde_window_range - sde_window_size`` so the whole window lies in the first ``sde_window_range`` steps, as the
reference pipeline draws it (``random.randint(range[0], range[1] - size)``); ``sde_window_range`` None means T // 2,
capped at T - 1 so the final transition is never in the window. It is drawn once per iteration (the same for every
sample of the batch) from a generator seeded by (seed, iteration), so a resumed run draws the same windows.
``kernel`` may be ``cps`` (Coefficients-Preserving Sampling, Flow-GRPO's ``sde_type="cps"``). Other defaults are
Flow-GRPO's (a = 0.7, KL beta 0.04).

NFE per iteration (B samples, CFG factor c, E inner epochs, k = 2 if kl_beta > 0 else 1):
sampling T * B * c; training E * k * c * B * sde_window_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import register
from algorithms.base import Algorithm, AlgorithmConfig, StepStats
from algorithms.plans import PURPOSE_WINDOW, iteration_generator, window_plan
from algorithms.trajectory import StepPlan, Trajectory
from flowzoo.errors import ConfigError


@dataclass
class FlowGRPOFastConfig(AlgorithmConfig):
    sde_window_size: int = 2
    sde_window_range: int | None = None  # the window lies in steps 0 .. range - 1; None = T // 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sde_window_size < 1:
            raise ConfigError(f"algorithm.sde_window_size must be >= 1, got {self.sde_window_size}")


@register("flow_grpo_fast")
class FlowGRPOFast(Algorithm):
    name = "flow_grpo_fast"
    Config = FlowGRPOFastConfig

    @property
    def window_range(self) -> int:
        cfg = self.config
        limit = min(cfg.sde_window_range or self.num_steps // 2, self.num_steps - 1)
        if limit < cfg.sde_window_size:
            raise ConfigError(
                f"algorithm.sde_window_size {cfg.sde_window_size} does not fit in the first {limit} of "
                f"{self.num_steps} steps (sde_window_range {cfg.sde_window_range})"
            )
        return limit

    def window_start(self, iteration: int | None = None) -> int:
        iteration = self.iteration if iteration is None else iteration
        gen = iteration_generator(self.seed, iteration, PURPOSE_WINDOW)
        return int(torch.randint(0, self.window_range - self.config.sde_window_size + 1, (1,), generator=gen))

    def step_plan(self, batch: int) -> StepPlan:
        cfg = self.config
        return window_plan(self.sigmas, self.window_start(), cfg.sde_window_size, batch, cfg.kernel, cfg.noise_level)

    def after_update(self, traj: Trajectory, stats: StepStats) -> None:
        stats.extra["window_start"] = float(self.window_start())
