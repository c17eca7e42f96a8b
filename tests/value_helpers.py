"""Shared pieces of the value-level tests (tests/test_*_values.py, test_op_grpo_weights.py): a tiny untrained toy
model, a dense reward we control, and the current policy's log-probability of a recorded transition written from the
public kernel (``algorithms.engine.sde.sde_step``) and ``FlowModel.velocity`` alone, not through ``Algorithm`` code."""

from __future__ import annotations

from typing import Sequence

import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo.algorithms.engine.sde import sde_step
from flowzoo.models.toy2d import prompt_set
from flowzoo.rewards.base import Reward, RewardOutput

PROMPTS = [p for p, _ in prompt_set()]
META = [m for _, m in prompt_set()]
#: an untrained (random, seeded) toy MLP: no pretraining time, gradients of every parameter are non-trivial
TINY = dict(hidden=16, layers=1, pretrain_steps=0)


class FirstCoordinate(Reward):
    """Reward = the sample's first coordinate: dense, distinct per sample, no metadata needed."""

    name = "first_coordinate"
    accepts = ("points",)

    def score(self, samples, prompts, metadata) -> RewardOutput:
        return RewardOutput(samples[:, 0].float())


def build(name: str = "flow_grpo", seed: int = 0, **config) -> algorithms.Algorithm:
    """An algorithm on the tiny toy model. ``max_grad_norm 0`` (no clipping) leaves ``p.grad`` the raw gradient."""
    base = {"group_size": 4, "clip_range": 0.2, "lr": 1e-2, "kl_beta": 0.0, "max_grad_norm": 0.0,
            "weight_decay": 0.0}
    return algorithms.get(name)(models.get("toy2d")(**TINY), FirstCoordinate(), {**base, **config}, seed=seed)


def perturb(model, scale: float = 0.05, seed: int = 1) -> None:
    """Move the trained network away from the frozen reference (so the KL term is not 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def grads(alg) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in alg.model.trainable_parameters()]


def params(alg) -> list[torch.Tensor]:
    return [p.detach().clone() for p in alg.model.trainable_parameters()]


def transition_log_prob(model, traj, rows: Sequence[int] | torch.Tensor, t: int, reference: bool = False):
    """log pi(latents[:, t+1] | latents[:, t]) of the recorded transition t of ``rows`` under the model's current
    (or, with ``reference``, its frozen reference) parameters, with gradients when autograd is on."""
    rows = torch.as_tensor(rows, dtype=torch.long)
    x = traj.latents[rows, t]
    sigma, sigma_next = traj.sigmas[t].expand(len(rows)), traj.sigmas[t + 1].expand(len(rows))

    def log_prob():
        v = model.velocity(x, sigma, traj.cond.index(rows), traj.guidance)
        return sde_step(x, v, sigma, sigma_next, kind=traj.kind, noise_level=traj.noise_level,
                        prev_sample=traj.latents[rows, t + 1], reduction=traj.reduction).log_prob

    if reference:
        with model.reference():
            return log_prob()
    return log_prob()


class Keep:
    """Keeps every trajectory batch an algorithm's ``collect`` produced."""

    def __init__(self, alg):
        self.batches = []
        inner = alg.collect

        def collect(prompts, metadata):
            self.batches.append(inner(prompts, metadata))
            return self.batches[-1]

        alg.collect = collect
