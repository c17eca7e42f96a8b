"""Flow-GRPO-Fast (Liu et al., "Flow-GRPO: Training Flow Matching Models via Online RL", arXiv 2505.05470, and its
released ``train_sd3_fast`` script; sources below are yifan123/flow_grpo at commit 9745241, 2025-11-04).

The rollout is deterministic (Euler ODE) everywhere except an SDE window of ``sde_window_size`` consecutive steps,
and only the window is trained. The window's start is uniform in ``0 .. sde_window_range - sde_window_size`` so the
whole window lies in the first ``sde_window_range`` steps, as the released pipeline draws it
(``random.randint(range[0], range[1] - size)``, flow_grpo/diffusers_patch/sd3_pipeline_with_logprob_fast.py:136-139);
``sde_window_range`` None means T // 2 (the released ``(0, num_steps // 2)``, config/grpo.py:190), capped at T - 1 so
the final transition is never in the window. It is drawn once per iteration (the same for every sample of the batch)
from a generator seeded by (seed, iteration), so a resumed run draws the same windows; ``sde_window_start`` fixes
it instead (an int), or draws it as the Qwen-Image release does (``seed_0``: its pipeline seeds Python's ``random``
with the process index, never passed, before every draw, so the start is always the seed-0 draw: steps 3-4 at T = 10,
qwenimage_pipeline_with_logprob.py:138-143 and train_qwenimage.py:657-670 at 27b6ef8). The released script draws one
window per sampling call (``train_batch_size`` samples on one process) from Python's ``random``, so its samples of
one prompt may sit in different windows.

The released Fast recipes (config/grpo.py ``geneval_sd3_fast_nocfg`` :163-203, ``pickscore_sd3_fast_nocfg``
:323-363) are: ``kernel: cps`` (``sde_type="cps"``), ``noise_level`` 0.8, window 3 in the first T // 2 = 5 of 10
steps, ``clip_range`` 1e-5, ``kl_beta`` 0, batch std (``global_std``), and no CFG in sampling or training
(``guidance_scale = 1``, ``train.cfg = False``). They live in ``benchmark/recipes/flow_grpo_fast.yaml``; the class
keeps the base defaults.

``shared_prefix`` (off by default, as in the released script since its 2025-10-14 refactor, where every sample has
its own initial noise: ``same_latent`` False, config/base.py:63): the G samples of a group start from one initial
noise and share the deterministic steps before the window, which run once per group instead of G times, and then
branch into G SDE continuations. This is Flow-GRPO-Fast as first released (2025-07-31 .. 10-14: the pipeline ran the
prompt alone up to the branch step and repeated its latent ``mini_num_image_per_prompt`` times there,
sd3_pipeline_with_logprob_fast.py:148-157 at commit 6cc454f; its README's Flow-GRPO-Fast section says the same:
the steps before branching run on the prompt alone, without the group).

NFE per iteration (P prompts, G samples each, B = P G, window start s and size w, CFG factor c, E inner epochs,
k = 2 if kl_beta > 0 else 1):
sampling T * B * c, or with ``shared_prefix`` (s * P + (T - s) * B) * c; training E * k * c * B * w.
Under several processes a group split between two processes runs its prefix on both, so the prefix term counts
the (process, group) pairs instead of P (P when the prompts per step divide by the number of processes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import random
from typing import Literal

import torch

from flowzoo.algorithms import register
from flowzoo.algorithms.engine.base import Algorithm, AlgorithmConfig
from flowzoo.algorithms.engine.distributed import GatheredBatch
from flowzoo.algorithms.engine.plans import iteration_generator, window_plan
from flowzoo.algorithms.engine.rollout import branched_rollout, chunk_spans
from flowzoo.algorithms.engine.trajectory import StepPlan, Trajectory
from flowzoo.errors import ConfigError
from flowzoo.streams import PURPOSE_WINDOW


SEED_0 = "seed_0"  # sde_window_start as the Qwen-Image release draws it (see FlowGRPOFastConfig)


@dataclass
class FlowGRPOFastConfig(AlgorithmConfig):
    sde_window_size: int = 2
    sde_window_range: int | None = None  # the window lies in steps 0 .. range - 1; None = T // 2
    # the window's first step: None draws it uniformly per iteration (the SD3 release); an int fixes it; "seed_0" is
    # the Qwen-Image release's: Python's random seeded with 0 (its unpassed process_index) before every draw, so the
    # start is always randint(0, range - size) of that seed, 3 at T = 10
    sde_window_start: int | Literal["seed_0"] | None = None
    # one initial noise per group and the deterministic steps before the window run once per group (see the module)
    shared_prefix: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sde_window_size < 1:
            raise ConfigError(f"algorithm.sde_window_size must be >= 1, got {self.sde_window_size}")
        if self.shared_prefix and not self.shared_noise:
            # a shared prefix starts from the group's one noise; say so in the resolved config
            self.shared_noise = True

    def window_range(self, num_steps: int) -> int:
        """The steps the window may lie in for T = ``num_steps``: min(sde_window_range or T // 2, T - 1)."""
        limit = min(self.sde_window_range or num_steps // 2, num_steps - 1)
        if limit < self.sde_window_size:
            raise ConfigError(
                f"algorithm.sde_window_size {self.sde_window_size} does not fit in the first {limit} of "
                f"{num_steps} steps (sde_window_range {self.sde_window_range})"
            )
        return limit

    def check_num_steps(self, num_steps: int) -> None:
        super().check_num_steps(num_steps)
        limit = self.window_range(num_steps)  # at config load, before anything is written
        last = limit - self.sde_window_size
        if isinstance(self.sde_window_start, int) and not 0 <= self.sde_window_start <= last:
            raise ConfigError(f"algorithm.sde_window_start {self.sde_window_start} puts the window outside the first "
                              f"{limit} of {num_steps} steps; give 0 .. {last} or null (a random start)")


@register("flow_grpo_fast")
class FlowGRPOFast(Algorithm):
    Config = FlowGRPOFastConfig
    family = "flow_grpo"
    # the report groups a column's algorithms under one description: Fast draws the start, MixGRPO slides it
    diagnostics = {"window_start": "first denoising step of this iteration's SDE window"}

    @property
    def window_range(self) -> int:
        return self.config.window_range(self.num_steps)

    def sde_window_start(self, iteration: int | None = None) -> int:
        if self.config.sde_window_start == SEED_0:  # the Qwen-Image release's draw, the same every call
            return random.Random(0).randint(0, self.window_range - self.config.sde_window_size)
        if self.config.sde_window_start is not None:
            return self.config.sde_window_start
        iteration = self.iteration if iteration is None else iteration
        gen = iteration_generator(self.seed, iteration, PURPOSE_WINDOW)
        return int(torch.randint(0, self.window_range - self.config.sde_window_size + 1, (1,), generator=gen))

    def step_plan(self, batch: int) -> StepPlan:
        cfg = self.config
        return window_plan(self.sigmas, self.sde_window_start(), cfg.sde_window_size, batch, cfg.kernel, cfg.noise_level)

    def collect(self, prompts: Sequence[str], metadata: Sequence[dict]) -> Trajectory:
        if not self.config.shared_prefix:
            return self.fresh_rollout(prompts, metadata)
        return self.branched_rollout(prompts, metadata)

    def branched_rollout(self, prompts: Sequence[str], metadata: Sequence[dict]) -> Trajectory:
        """G samples per prompt that branch from their group's one ODE prefix at the window's start.

        The layout, seeds and sharding are :meth:`Algorithm.fresh_rollout`'s (sample j of prompt i seeded by
        (seed, iteration, i, j), this process's contiguous slice of the global batch); a group whose members sit on
        two processes computes its prefix on each, from the same noise."""
        inputs = self.fresh_inputs(prompts, metadata, shared_noise=True)  # one noise per group: one prefix
        live = {} if self.keeps_rollout_graph() else None
        chunk = self.rollout_chunk()
        # a process's prefix runs on its groups' first members, whose count may differ between processes: under a
        # sharded model the one with fewer prefix chunks pads (algorithms/engine/lockstep.py)
        padding = self.lockstep_padding(len(chunk_spans(len(inputs.group.unique()), chunk))) if chunk else 0
        latents, log_probs = branched_rollout(
            self.model, inputs.cond, inputs.plan, inputs.x, inputs.generators, inputs.group, self.sde_window_start(),
            self.config.guidance, live, cfg_grad=self.config.cfg_grad, cfg_batch=self.config.cfg_batch, chunk=chunk,
            prefix_padding=padding,
        )
        return Trajectory.from_rollout(inputs.plan, inputs.prompts, inputs.metadata, inputs.cond, latents, log_probs,
                                       inputs.group, self.config.guidance, live=live)

    def after_update(self, traj: Trajectory, batch: GatheredBatch) -> None:
        self.log("window_start", self.sde_window_start())
