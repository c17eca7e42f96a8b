"""Step-plan building blocks shared by the on-policy algorithms (pure functions of their arguments).

* :func:`window_plan`: SDE only inside a window of consecutive steps, ODE elsewhere, train the window
  (MixGRPO, MixGRPO-Flash, Flow-GRPO-Fast);
* :func:`random_steps_plan`: SDE at a few random steps, the same for every sample, and train them (Flow-DPPO);
* :func:`random_step_subsets`: each sample trains its own random subset of steps (DanceGRPO);
* :func:`compressed_tail_sigmas`: MixGRPO-Flash's coarser schedule after the window;
* :func:`iteration_generator`: a random stream that is a pure function of (seed, iteration, purpose), so a plan drawn
  at iteration k is the same after a resume.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from flowzoo.algorithms.engine.rollout import sample_generators
from flowzoo.algorithms.engine.sde import inverse_time_shift, time_shift
from flowzoo.algorithms.engine.trajectory import StepPlan


def iteration_generator(seed: int, iteration: int, purpose: int) -> torch.Generator:
    """A generator seeded by (seed, iteration, purpose) only; ``purpose`` is one of ``flowzoo.streams``' keys."""
    return sample_generators(seed, iteration, purpose, count=1)[0]


def window_mask(num_steps: int, start: int, size: int) -> torch.Tensor:
    """[T] bool, True on steps ``start .. start + size - 1`` (none when ``size`` is 0)."""
    if start < 0 or size < 0 or start + size > num_steps:
        raise ValueError(f"window [{start}, {start + size}) does not fit in {num_steps} steps")
    mask = torch.zeros(num_steps, dtype=torch.bool)
    mask[start : start + size] = True
    return mask


def window_plan(
    sigmas: torch.Tensor,
    start: int,
    size: int,
    batch: int,
    kind: str,
    noise_level: float,
    dpm_solver: torch.Tensor | None = None,
) -> StepPlan:
    """SDE on the window's steps, deterministic elsewhere; every sample trains exactly the window."""
    sde = window_mask(sigmas.shape[0] - 1, start, size)
    return StepPlan(sigmas, sde, sde.expand(batch, -1).clone(), kind, noise_level, dpm_solver)


def random_steps_plan(
    sigmas: torch.Tensor, candidates: int, count: int, batch: int, kind: str, noise_level: float,
    generator: torch.Generator,
) -> StepPlan:
    """SDE at ``count`` distinct steps drawn uniformly among the first ``candidates``, deterministic elsewhere; every
    sample trains exactly those steps (Flow-DPPO's sparse SDE steps, the release's ``AllSDEScheduler``)."""
    num_steps = sigmas.shape[0] - 1
    if not 1 <= count <= candidates <= num_steps:
        raise ValueError(f"cannot draw {count} of the first {candidates} of {num_steps} steps")
    sde = torch.zeros(num_steps, dtype=torch.bool)
    sde[torch.randperm(candidates, generator=generator)[:count]] = True
    return StepPlan(sigmas, sde, sde.expand(batch, -1).clone(), kind, noise_level)


def random_step_subsets(batch: int, num_steps: int, candidates: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """[B, T] bool: for each sample, ``count`` distinct steps drawn uniformly among the first ``candidates``."""
    if not 1 <= count <= candidates <= num_steps:
        raise ValueError(f"cannot draw {count} of the first {candidates} of {num_steps} steps")
    chosen = torch.stack([torch.randperm(candidates, generator=generator)[:count] for _ in range(batch)])
    train = torch.zeros(batch, num_steps, dtype=torch.bool)
    train.scatter_(1, chosen, True)
    return train


def compressed_tail_sigmas(
    sigmas: torch.Tensor, last: int, ratio: float, shift: float, counted: int | None = None
) -> torch.Tensor:
    """MixGRPO-Flash's schedule: ``sigmas[: last + 2]`` then a coarser tail down to 0.

    ``last`` is the window's last step, so the original schedule has ``n = T - 1 - last`` steps after it. The tail has
    ``P = max(int(counted * ratio), 2)`` points from ``sigmas[last + 1]`` to 0 inclusive (``P - 1`` steps), spaced
    evenly in the *unshifted* time and then shifted, as MixGRPO's reference builds it (``linspace(t_{last+1}, 0, P)``
    then ``sd3_time_shift``, fastvideo/utils/sampling_utils.py:47-49). ``counted`` is the step count the ratio
    multiplies: ``n`` by default; the reference uses ``T - last`` (:44). The result has ``last + P + 1`` sigmas, i.e.
    ``last + P`` steps.
    """
    num_steps = sigmas.shape[0] - 1
    remaining = num_steps - 1 - last
    if remaining < 1:
        raise ValueError(f"no step left after the window ending at step {last} of {num_steps}")
    points = max(int((remaining if counted is None else counted) * ratio), 2)
    start = inverse_time_shift(sigmas[last + 1].double(), shift)
    tail = time_shift(torch.linspace(float(start), 0.0, points, dtype=torch.float64), shift).to(sigmas.dtype)
    tail[0] = sigmas[last + 1]  # exact, so the window's steps see the original sigmas
    return torch.cat([sigmas[: last + 1], tail])


def forward_draws(generators: Sequence[torch.Generator], k: int, like: torch.Tensor,
                  draw: Callable[[torch.Generator], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoupled methods' forward-process draws: for each sample, from its own (host) generator, ``draw(gen)``
    (its K training steps or times) then its K noises; stacked [n, K] and [n, K, ...], the noise moved onto
    ``like``'s device and dtype (DiffusionNFT, AWM)."""
    picked, noise = [], []
    for gen in generators:
        picked.append(draw(gen))
        noise.append(torch.randn((k, *like.shape[1:]), generator=gen, dtype=torch.float32))
    return torch.stack(picked), torch.stack(noise).to(device=like.device, dtype=like.dtype)
