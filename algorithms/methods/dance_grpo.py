"""DanceGRPO (Xue et al., "DanceGRPO: Unleashing GRPO on Visual Generation", arXiv 2505.07818).

What differs from Flow-GRPO (the base template):

* the ``dance_grpo`` kernel: Euler step plus the score term ``-0.5 eta^2 score dt``, std ``eta sqrt(-dt)``, with
  eta = 0.3 (the paper's FLUX / HunyuanVideo recipes);
* one shared initial noise per group (``init_same_noise``), so the G samples of a prompt differ only by the SDE noise;
* each sample trains its own random ``timestep_fraction`` = 60% of the steps: ``int((T - 1) * 0.6)`` steps drawn
  without replacement among the first T - 1 (the reference shuffles the T - 1 transitions left once the last one is
  dropped, ``samples["latents"][:, :-1]``, and trains ``int(len * timestep_fraction)`` of them), so the final
  transition is never trained;
* no KL term (``kl_beta`` 0);
* the reward scores the last step's data prediction ``x_{T-1} - sigma_{T-1} v(x_{T-1})``, not the final SDE sample
  (``rewarded: prediction``): the released trainers decode ``pred_original`` of the last step (XueZeyue/DanceGRPO
  fastvideo/train_grpo_flux_lora.py:192, train_grpo_flux.py:254, train_grpo_wan_2_1.py:219, ``latents =
  pred_original`` after the sampling loop); the final sample x_T would carry the last step's noise
  ``eta sqrt(sigma_{T-1})`` (0.15 at T = 10, shift 3, eta 0.3). ``rewarded: sample`` rewards x_T instead;
* the sigma grid ``shift(linspace(1, 0, T + 1))`` (``sigma_grid: linspace``; XueZeyue/DanceGRPO
  fastvideo/train_grpo_flux.py:311-313 with ``sd3_time_shift`` :127-128), not diffusers' SD3 grid, which ends at the
  shifted 1/1000 before 0 (``sigma_grid: diffusers``, the other algorithms' grid).

The subsets come from a generator seeded by (seed, iteration), so a resumed run draws the same ones.
NFE per iteration (B samples, CFG factor c, E inner epochs, k = 2 if kl_beta > 0 else 1):
sampling T * B * c; training E * k * c * B * int((T - 1) * timestep_fraction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from flowzoo.algorithms import register
from flowzoo.algorithms.engine.base import Algorithm, AlgorithmConfig
from flowzoo.algorithms.engine.plans import iteration_generator, random_step_subsets
from flowzoo.algorithms.engine.sde import Kernel, SigmaGrid
from flowzoo.algorithms.engine.trajectory import StepPlan
from flowzoo.errors import ConfigError
from flowzoo.streams import PURPOSE_TRAIN_SUBSETS


@dataclass
class DanceGRPOConfig(AlgorithmConfig):
    kernel: Kernel = "dance_grpo"
    noise_level: float = 0.3  # eta
    timestep_fraction: float = 0.6
    shared_noise: bool = True
    kl_beta: float = 0.0
    sigma_grid: SigmaGrid = "linspace"
    # the state the reward decodes: "prediction" x_{T-1} - sigma_{T-1} v (the released trainers' pred_original) or
    # "sample" x_T (the final SDE sample)
    rewarded: Literal["prediction", "sample"] = "prediction"

    def check_num_steps(self, num_steps: int) -> None:
        super().check_num_steps(num_steps)
        if num_steps < 2:
            raise ConfigError(
                f"dance_grpo needs num_steps >= 2 (the last transition is never trained), got {num_steps}"
            )


@register("dance_grpo")
class DanceGRPO(Algorithm):
    label, colormap = "DanceGRPO", "Greens"  # the report's name and colours of this family
    Config = DanceGRPOConfig
    # each sample trains its own random steps: the rollout's kept graphs would cover every sample at nearly every step,
    # a backward over more rows than the recomputed forward + backward of the trained ones saves
    rollout_graph_auto = False

    def sigma_grid(self) -> SigmaGrid:
        return self.config.sigma_grid

    def trained_steps_per_sample(self) -> int:
        """int((T - 1) * timestep_fraction), at least 1: the size of each sample's random subset."""
        return max(1, int((self.num_steps - 1) * self.config.timestep_fraction))

    def step_plan(self, batch: int) -> StepPlan:
        gen = iteration_generator(self.seed, self.iteration, PURPOSE_TRAIN_SUBSETS)
        train = random_step_subsets(batch, self.num_steps, self.num_steps - 1, self.trained_steps_per_sample(), gen)
        sde = torch.ones(self.num_steps, dtype=torch.bool)
        return StepPlan(self.sigmas, sde, train, self.config.kernel, self.config.noise_level,
                        decode=self.config.rewarded)
