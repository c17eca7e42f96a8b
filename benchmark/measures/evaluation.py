"""The evaluation protocol: which deterministic sampler scores a run (``train.eval_sampler``).

A suite's cells train with their algorithms' own samplers (DanceGRPO's FLUX recipe at shift 3 on a linear grid,
Flow-GRPO-Fast's Qwen-Image recipe at CFG 4, ...), but their evaluation rewards are compared with each other, so they
must come from one sampler. ``pipeline`` (the default) is each model's reference evaluation sampler, the model
adapter's declared defaults with their sources, not a diffusers pipeline's call defaults: its shift (for FLUX and
Qwen-Image the pipeline's resolution-dependent ``e^mu``), its CFG scale, its sigma grid and ``train.eval_num_steps``
steps (the model's ``default_eval_num_steps`` when unset). Per model: SD3.5 CFG 4.5, 40 steps, shift 3, SD3's Euler
grid: Flow-GRPO's evaluation settings (config/base.py:41,43 at ac4c86e), where StableDiffusion3Pipeline's defaults
are 7.0 and 28; Wan2.1 CFG 4.5, 50 steps, Wan2.1's UniPC flow sigmas at flow_shift 3 (Flow-GRPO's Wan evaluation,
models/wan.py); FLUX FluxPipeline's grid, e^mu and 28 steps, with the transformer's timesteps truncated where the
suite sets ``integer_timesteps`` (DanceGRPO's and MixGRPO's FLUX trainers, models/flux.py); Qwen-Image
QwenImagePipeline's grid with its terminal, true CFG 4, 50 steps (Flow-GRPO's Qwen-Image evaluation). Every step is
the probability-flow Euler step, whatever the pipeline's scheduler (Wan's UniPC multistep solver is not run).
``train.eval_shift`` and ``train.eval_guidance`` name another shift and CFG scale for every cell. ``algorithm`` evaluates each cell with its algorithm's training shift and guidance, the harness's only form
before 2026-12-03. ``train.eval_own: true`` adds the algorithm's own evaluation as an extra column,
``eval_own_reward``, where it differs from the protocol's.

The grid is always the model's (``default_sigma_grid``, ``shift_terminal``): an algorithm's training grid (e.g.
DanceGRPO's ``linspace``) is part of its training, not of how the model is scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flowzoo.algorithms.engine.sde import sigma_schedule
from flowzoo.models.base import FlowModel


@dataclass(frozen=True)
class EvalSampler:
    """One deterministic evaluation sampler: its sigma grid and CFG scale (None: the model's default)."""

    sigmas: torch.Tensor
    guidance: float | None
    shift: float
    label: str  # "pipeline" or "algorithm": what the metrics and the report call it

    @property
    def num_steps(self) -> int:
        return len(self.sigmas) - 1

    def effective_guidance(self, model: FlowModel) -> float:
        return float(model.default_guidance if self.guidance is None else self.guidance)


def _sampler(train, model: FlowModel, shift: float, guidance: float | None, label: str) -> EvalSampler:
    steps = train.eval_num_steps or model.default_eval_num_steps
    sigmas = sigma_schedule(steps, shift, grid=model.default_sigma_grid, terminal=model.shift_terminal)
    return EvalSampler(sigmas, guidance, float(shift), label)


def protocol_sampler(train, model: FlowModel, algorithm) -> EvalSampler:
    """The run's evaluation sampler under ``train.eval_sampler`` (module docstring)."""
    if train.eval_sampler == "algorithm":
        return own_sampler(train, model, algorithm)
    shift = model.default_shift if train.eval_shift is None else train.eval_shift
    return _sampler(train, model, shift, train.eval_guidance, "pipeline")


def own_sampler(train, model: FlowModel, algorithm) -> EvalSampler:
    """The algorithm's own evaluation: its training shift and guidance on the model's grid."""
    return _sampler(train, model, algorithm.shift, algorithm.config.guidance, "algorithm")


def same_sampler(a: EvalSampler, b: EvalSampler, model: FlowModel) -> bool:
    """Whether two samplers draw the same samples (equal grids and effective CFG scales)."""
    return a.effective_guidance(model) == b.effective_guidance(model) and torch.equal(a.sigmas, b.sigmas)


def extra_sampler(train, model: FlowModel, algorithm, protocol: EvalSampler) -> EvalSampler | None:
    """The algorithm's own sampler for ``eval_own_reward``, when asked for and different from the protocol's."""
    if not train.eval_own:
        return None
    own = own_sampler(train, model, algorithm)
    return None if same_sampler(own, protocol, model) else own
