"""Flow-GRPO with an annealed SDE noise level: the example of docs/adding-an-algorithm.md.

The noise level a of the rollout's SDE steps (Flow-GRPO's std_t = a sqrt(s / (1 - s))) starts at ``noise_level`` and
is multiplied by ``noise_decay`` every iteration, down to ``noise_floor``: more exploration early in training, samples
closer to the deterministic sampler later. Save this file as ``algorithms/methods/noise_decay_grpo.py`` to add it to the zoo.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from flowzoo.algorithms import register
from flowzoo.algorithms.engine.base import AlgorithmConfig
from flowzoo.algorithms.engine.distributed import GatheredBatch
from flowzoo.algorithms.methods.flow_grpo import FlowGRPO
from flowzoo.algorithms.engine.trajectory import StepPlan, Trajectory
from flowzoo.errors import ConfigError


@dataclass
class NoiseDecayConfig(AlgorithmConfig):
    noise_decay: float = 0.98  # the noise level is multiplied by this every iteration
    noise_floor: float = 0.2  # and never goes below this

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.noise_decay <= 1:
            raise ConfigError(f"algorithm.noise_decay must be in (0, 1], got {self.noise_decay}")
        if not 1e-6 <= self.noise_floor <= self.noise_level:
            raise ConfigError(f"algorithm.noise_floor must be in [1e-6, noise_level] = [1e-6, {self.noise_level}], "
                              f"got {self.noise_floor}")


@register("noise_decay_grpo")
class NoiseDecayGRPO(FlowGRPO):
    """Flow-GRPO whose SDE noise level decays geometrically over training."""

    Config = NoiseDecayConfig  # a subclass of FlowGRPO: its family (colours, "variants" panel) and its recipes
    diagnostics = {"sde_noise_level": "noise level a of this iteration's SDE steps"}

    def current_noise_level(self) -> float:
        """a at the current iteration; a function of the iteration alone, so a resumed run continues the schedule."""
        cfg = self.config
        return max(cfg.noise_floor, cfg.noise_level * cfg.noise_decay ** self.iteration)

    def step_plan(self, batch: int) -> StepPlan:
        return dataclasses.replace(super().step_plan(batch), noise_level=self.current_noise_level())

    def after_update(self, traj: Trajectory, batch: GatheredBatch) -> None:
        self.log("sde_noise_level", self.current_noise_level())
