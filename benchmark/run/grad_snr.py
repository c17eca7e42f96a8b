"""Gradient signal-to-noise of one training step, measured at a run's starting weights.

    flowzoo grad-snr CONFIG [--batches K] [--fixed-prompts] [key=value ...]

K independent batches (the config's prompts per step x G, each with its own prompts and noise) each give the update's
gradient; the weights and the optimizer are restored after every batch, so all K gradients are taken at the same
point. Reported:

* ``cos_mean`` (with a leave-one-batch-out jackknife standard error): the mean cosine between two batches' gradients.
  For g_k = g + n_k with independent noise, E[cos] ~ |g|^2 / (|g|^2 + E|n|^2), the fraction of a step's squared
  length that is signal. A run of N steps accumulates signal ~ N cos against noise ~ sqrt(N); when N * cos is near
  or below 1, seeds of the same config can end anywhere between a gain and a loss.
* ``z_frac_3``: the fraction of gradient coordinates whose mean over the K batches lies more than 3 standard errors
  from 0 (about 1% from chance alone at K = 16: Student t with 15 degrees of freedom).
* ``reward_mean`` of the K batches and seconds per batch.

A batch whose gradient is exactly 0 (every group's rewards equal, so every advantage is 0) has no direction: it is
left out of the cosine and counted (``zero_batches``); when fewer than 2 batches have a gradient there is no cosine
and the line says so. The standard error needs 3 batches with a gradient (``--batches`` must be >= 3).

``--fixed-prompts`` uses the same prompts in every batch (only the noise changes): it separates the spread that comes
from the SDE noise from the spread that comes from which prompts a step draws.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import torch

from flowzoo.benchmark.run import experiment
from flowzoo.benchmark.config.schema import ExperimentConfig
from flowzoo.benchmark.run.experiment import Experiment
from flowzoo.errors import ConfigError
from flowzoo.streams import GRAD_SNR_STEP_OFFSET


def pairwise_cosines(gradients: torch.Tensor) -> torch.Tensor:
    """The K(K-1)/2 cosines between the rows of ``gradients`` [K, P] (K >= 2), pair (i, j) for i < j."""
    if gradients.dim() != 2 or gradients.shape[0] < 2:
        raise ValueError(f"need a [K >= 2, P] matrix of gradients, got shape {tuple(gradients.shape)}")
    unit = gradients / gradients.norm(dim=1, keepdim=True).clamp_min(1e-30)
    rows, cols = torch.triu_indices(len(unit), len(unit), offset=1)
    return (unit @ unit.T)[rows, cols]


def jackknife_se(gradients: torch.Tensor) -> float:
    """Leave-one-batch-out jackknife standard error of the mean pairwise cosine (the pairs share batches, so the
    plain standard error over pairs would understate it). Needs K >= 3."""
    k = gradients.shape[0]
    if k < 3:
        return float("nan")
    means = torch.stack([pairwise_cosines(torch.cat([gradients[:i], gradients[i + 1:]])).mean() for i in range(k)])
    return float(((k - 1) / k * ((means - means.mean()) ** 2).sum()).sqrt())


def significant_fraction(gradients: torch.Tensor, threshold: float = 3.0) -> float:
    """Fraction of coordinates whose mean over the K rows is more than ``threshold`` standard errors from 0."""
    k = gradients.shape[0]
    se = gradients.std(dim=0) / k**0.5
    z = gradients.mean(dim=0) / se.clamp_min(1e-30)
    return float(((z.abs() > threshold) & (se > 0)).float().mean())


MIN_BATCHES = 3  # the jackknife standard error leaves one batch out of at least 2


@dataclass
class SNRResult:
    batches: int
    samples_per_batch: int
    cos_mean: float  # NaN: fewer than 2 batches with a non-zero gradient
    cos_se: float  # NaN: fewer than 3 batches with a non-zero gradient
    z_frac_3: float
    reward_mean: float
    seconds_per_batch: float
    zero_batches: int = 0  # batches whose gradient is exactly 0, left out of the cosine

    def line(self) -> str:
        head = f"{self.batches} batches of {self.samples_per_batch} samples: "
        tail = f"reward {self.reward_mean:.3f}, {self.seconds_per_batch:.2f} s a batch"
        with_gradient = self.batches - self.zero_batches
        if with_gradient < 2:
            return (head + f"the gradient is exactly 0 in {self.zero_batches} of {self.batches} batches (every "
                    "advantage 0: equal rewards in every group, or a config that trains nothing), so there is no "
                    f"gradient cosine; {tail}")
        se = (f"se {self.cos_se:.4f}" if math.isfinite(self.cos_se)
              else f"no se: it needs {MIN_BATCHES} batches with a non-zero gradient")
        zero = (f"; {self.zero_batches} of {self.batches} batches had an exactly zero gradient (every advantage 0) "
                "and are left out") if self.zero_batches else ""
        return (head + f"gradient cosine {self.cos_mean:+.4f} ({se}){zero}, coordinates with |z| > 3: "
                f"{self.z_frac_3:.2%}, {tail}")


def batch_gradients(config: ExperimentConfig, batches: int, fixed_prompts: bool = False,
                    progress: bool = True) -> tuple[torch.Tensor, list[float], float]:
    """[K, P] gradients of K independent update steps at the config's starting weights, their batch rewards, and the
    seconds per batch. Uses the config's algorithm, model, reward and prompt stream; writes nothing."""
    return gradients_at(experiment.build(config), batches, fixed_prompts, progress)


def gradients_at(runner: Experiment, batches: int, fixed_prompts: bool = False,
                 progress: bool = True) -> tuple[torch.Tensor, list[float], float]:
    """``batch_gradients`` on a built experiment (or a built ``Runner``: anything with an ``algorithm`` given its
    training prompts), whose algorithm (weights, optimizer, iteration, sampler state) is left as it was."""
    from tqdm import tqdm

    if batches < 2:
        raise ConfigError(f"--batches must be >= 2 to compare gradients, got {batches}")
    algorithm = runner.algorithm
    start = copy.deepcopy(algorithm.state_dict())
    params = [p for group in algorithm.optimizer.param_groups for p in group["params"]]
    gradients, rewards = [], []
    t0 = time.perf_counter()
    for k in tqdm(range(batches), desc="gradient batches", disable=not progress):
        step = GRAD_SNR_STEP_OFFSET + (0 if fixed_prompts else k)
        algorithm.load_state_dict(copy.deepcopy(start))  # a copy: a model may load by reference
        algorithm.iteration = GRAD_SNR_STEP_OFFSET + k  # fresh noise for every batch
        stats = algorithm.train_step(step)  # the run's prompt sampler draws the batch
        gradients.append(torch.cat([p.grad.detach().flatten().clone() for p in params]))
        rewards.append(stats.reward_mean)
    algorithm.load_state_dict(start)
    algorithm.optimizer.zero_grad(set_to_none=True)
    return torch.stack(gradients), rewards, (time.perf_counter() - t0) / batches


def measure(config: ExperimentConfig, batches: int = 16, fixed_prompts: bool = False, progress: bool = True) -> SNRResult:
    if batches < MIN_BATCHES:  # before the model is built
        raise ConfigError(f"--batches must be >= {MIN_BATCHES}, got {batches}: the cosine's standard error is a "
                          f"leave-one-batch-out jackknife over pairs of batches")
    built = experiment.build(config)
    gradients, rewards, seconds = gradients_at(built, batches, fixed_prompts, progress)
    moving = gradients[gradients.norm(dim=1) > 0]  # an exactly zero gradient has no direction
    samples = config.train.prompts_per_step * built.algorithm_config.group_size
    return SNRResult(
        batches=batches,
        samples_per_batch=samples,
        cos_mean=float(pairwise_cosines(moving).mean()) if len(moving) >= 2 else math.nan,
        cos_se=jackknife_se(moving),
        zero_batches=batches - len(moving),
        z_frac_3=significant_fraction(gradients),
        reward_mean=sum(rewards) / len(rewards),
        seconds_per_batch=seconds,
    )
