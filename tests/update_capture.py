"""Shared by the trust-region parity tests (tests/test_flow_dppo.py, tests/test_grpo_guard.py): one training step with
every optimizer step's weights and gradients recorded, and the released SDE step transcribed by hand, so that a test
can recompute each optimizer step's gradient from the released lines at the very weights the update saw."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class CapturedUpdate:
    traj: object  # the Trajectory the update trained on
    advantages: torch.Tensor
    before: list[torch.Tensor]  # the trainable weights before the update's first optimizer step
    steps: list[tuple[list[torch.Tensor], list[torch.Tensor]]]  # per optimizer step: (its weights, its gradients)
    stats: object  # the StepStats of the training step


def capture_update(alg, prompts, metadata) -> CapturedUpdate:
    """``alg.step(prompts, metadata)`` with the update's inputs, its starting weights and, at every optimizer step,
    the weights the gradient was taken at and the gradient (before clipping: run with ``max_grad_norm`` 0)."""
    params = alg.model.trainable_parameters()
    seen: dict = {"steps": []}
    step, update = alg.optimizer.step, alg.update

    def recording_step(*args, **kwargs):
        seen["steps"].append(([p.detach().clone() for p in params], [p.grad.detach().clone() for p in params]))
        return step(*args, **kwargs)

    def recording_update(traj, advantages):
        seen.update(traj=traj, advantages=advantages.detach().clone(), before=[p.detach().clone() for p in params])
        return update(traj, advantages)

    alg.optimizer.step, alg.update = recording_step, recording_update
    try:
        stats = alg.step(prompts, metadata)
    finally:
        alg.optimizer.step, alg.update = step, update
    return CapturedUpdate(seen["traj"], seen["advantages"], seen["before"], seen["steps"], stats)


def set_weights(params, values) -> None:
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)


def released_sde_step(model_output, sample, prev_sample, sigma, sigma_next, sigma_max, noise_level):
    """Flow-GRPO's ``sde`` step scoring a given ``prev_sample`` (yifan123/flow_grpo
    flow_grpo/diffusers_patch/sd3_sde_with_logprob.py:36-68,88-92 at 9745241; UniRL's FlowSDEStrategy, unirl/sde/
    kernels.py:193-236 and :176 at 1a7b501, is the same formula): (log_prob [B], prev_sample_mean, std_dev_t,
    sqrt(-dt)), ``sigma``/``sigma_next`` [B] and ``sigma_max`` the grid's sigmas[1]."""
    model_output, sample, prev_sample = model_output.float(), sample.float(), prev_sample.float()
    shape = (-1, *([1] * (sample.dim() - 1)))
    sigma, sigma_prev = sigma.view(shape), sigma_next.view(shape)
    dt = sigma_prev - sigma
    std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * noise_level
    prev_sample_mean = (sample * (1 + std_dev_t**2 / (2 * sigma) * dt)
                        + model_output * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt)
    log_prob = (
        -((prev_sample.detach() - prev_sample_mean) ** 2) / (2 * ((std_dev_t * torch.sqrt(-1 * dt)) ** 2))
        - torch.log(std_dev_t * torch.sqrt(-1 * dt))
        - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi)))
    )
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
    return log_prob, prev_sample_mean, std_dev_t, torch.sqrt(-1 * dt)
