"""DiffusionNFT: online diffusion RL on the forward process (Zheng et al., "DiffusionNFT: Online Diffusion
Reinforcement with Forward Process", arXiv 2509.16117). Sources: NVlabs/DiffusionNFT at 24af555,
``scripts/train_nft_sd3.py`` (the trainer) and ``config/nft.py`` (the recipes); the values are in
``benchmark/recipes/diffusion_nft.yaml``.

A decoupled off-policy method: it never needs the sampler's log-probabilities, so its samples can come from any
solver. One iteration:

1. **collect**: G samples per prompt with a deterministic solver (DPM-Solver++ 2M, the release's ``dpm2``, or Euler)
   under the *old* policy (train_nft_sd3.py:640-659 samples with the "old" adapter); only the clean samples and
   their rewards are kept.
2. **rewards and advantages**: the template's (group-relative; the released recipe normalises by the std of the
   whole batch, ``adv_std: batch``), clipped to +-``adv_clip`` (the release's ``adv_clip_max``, :910-914).
3. **update**: for each sample, ``int(T timestep_fraction)`` of the T sampling sigmas, a random subset drawn per
   sample and per epoch (:810-816, :569), each with fresh Gaussian noise: ``x_t = (1 - s) x0 + s eps`` (:868-870).
   The current velocity v, the old policy's v_old and (with ``kl_beta`` > 0) the reference's v_ref at x_t give
   :func:`algorithms.engine.losses.nft_loss` (:927-970): positive ``beta v + (1 - beta) v_old``, negative
   ``(1 + beta) v_old - beta v``, adaptively weighted x0-space losses mixed by
   ``r = clamp(A / adv_clip / 2 + 1/2, 0, 1)``, times ``adv_clip``, plus ``kl_beta`` mean (v - v_ref)^2. The loss of
   an optimizer step is the mean over its samples and their timesteps (:983, the release's gradient accumulation
   over micro-batches and timesteps).
4. **old policy**: after the iteration's optimizer steps, ``old <- decay old + (1 - decay) theta`` with
   ``decay = return_decay(optimizer steps so far, decay_type)`` (:169-189, :1034-1039); at the start old = theta
   (:576-579).

The old weights are a copy of the trainable parameters that is swapped in for the rollout and for v_old (the
release keeps them as a second LoRA adapter), so every model tier works unchanged; they are part of the checkpoint.

NFE per iteration (B = P G samples, T sampling steps, K = max(1, int(T timestep_fraction)) trained timesteps, CFG
factor c, E inner epochs, k = 3 if kl_beta > 0 else 2 forwards per trained pair: current, old and reference):
sampling T * B * c; training E * k * c * B * K.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Sequence

import torch

from flowzoo.algorithms import register
from flowzoo.algorithms.engine.base import Algorithm, AlgorithmConfig
from flowzoo.algorithms.engine.advantages import StdMode
from flowzoo.algorithms.engine.distributed import GatheredBatch
from flowzoo.algorithms.engine.losses import nft_loss
from flowzoo.algorithms.engine.plans import forward_draws
from flowzoo.algorithms.engine.rollout import sample_generators
from flowzoo.algorithms.engine.trajectory import StepPlan, Trajectory
from flowzoo.errors import ConfigError, FlowZooError
from flowzoo.streams import DIFFUSION_NFT_FORWARD
from flowzoo.models.base import at_least_float32
from flowzoo.models.sharding import full_tensor, like

#: (flat, uprate, uphold) of the released decay schedules ``return_decay`` (train_nft_sd3.py:169-189)
DECAY_SCHEDULES = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}


def old_policy_decay(step: int, decay_type: int) -> float:
    """The weight the old policy keeps of itself after ``step`` optimizer steps: 0 before ``flat`` steps, then
    ``min((step - flat) uprate, uphold)`` (type 0: always 0, the old policy is the current one; type 1: rises by
    0.001 per step to 0.5; type 2: 0 for 75 steps, then rises by 0.0075 per step to 0.999)."""
    if decay_type not in DECAY_SCHEDULES:
        raise ValueError(f"unknown decay_type {decay_type!r}; known: {', '.join(map(str, DECAY_SCHEDULES))}")
    flat, uprate, uphold = DECAY_SCHEDULES[decay_type]
    if step < flat:
        return 0.0
    return min((step - flat) * uprate, uphold)


class OldPolicy:
    """The slowly updated copy of the trainable parameters (DiffusionNFT's "old" adapter)."""

    def __init__(self, parameters: Sequence[torch.nn.Parameter]):
        self.parameters = list(parameters)
        self.weights = [p.detach().clone() for p in self.parameters]

    @torch.no_grad()
    def blend(self, decay: float) -> None:
        """old <- old decay + theta (1 - decay), the release's expression (train_nft_sd3.py:1039)."""
        for old, parameter in zip(self.weights, self.parameters, strict=True):
            old.copy_(old.detach() * decay + parameter.detach().clone().to(old.dtype) * (1.0 - decay))

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Within this context the parameters hold the old weights; the trained values are restored after (exactly:
        both are copies)."""
        trained = [p.detach().clone() for p in self.parameters]
        try:
            with torch.no_grad():
                for parameter, old in zip(self.parameters, self.weights, strict=True):
                    parameter.copy_(old)
            yield
        finally:
            with torch.no_grad():
                for parameter, value in zip(self.parameters, trained, strict=True):
                    parameter.copy_(value)

    def state_dict(self) -> list[torch.Tensor]:
        # whole tensors (gathered from every process when the model is sharded: a collective)
        return [full_tensor(w.detach()).cpu().clone() for w in self.weights]

    def load_state_dict(self, weights: list[torch.Tensor]) -> None:
        if len(weights) != len(self.weights) or any(a.shape != b.shape for a, b in zip(weights, self.weights)):
            raise FlowZooError("the checkpoint's DiffusionNFT old-policy weights do not match the model's trainable "
                               "parameters")
        self.weights = [like(w, p).clone() for w, p in zip(weights, self.weights)]  # this process's shard if sharded


@dataclass
class DiffusionNFTConfig(AlgorithmConfig):
    # the guidance strength of the implicit policies, the release's ``config.beta`` (nft.py:61; 0.1 for OCR, :77)
    nft_beta: float = 1.0
    # the old policy's decay schedule, ``config.decay_type`` (nft.py:60; 2 for OCR, :78): see ``old_policy_decay``
    decay_type: Literal[0, 1, 2] = 1
    # the deterministic sampler of the rollout: DPM-Solver++ 2M (``sample.solver = "dpm2"``, nft.py:66) or Euler
    solver: Literal["dpm2", "euler"] = "dpm2"
    # the KL-to-reference coefficient on the velocity, the release's ``train.beta`` (nft.py:24)
    kl_beta: float = 1e-4
    # advantages normalised by the std of the whole batch (``sample.global_std``, base.py:57 of the release)
    adv_std: StdMode = "batch"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.nft_beta, (int, float)) and 0 < self.nft_beta <= 1):  # NaN fails the range
            raise ConfigError(f"algorithm.nft_beta must be in (0, 1], got {self.nft_beta}")
        if self.decay_type not in DECAY_SCHEDULES or isinstance(self.decay_type, bool):
            raise ConfigError(f"algorithm.decay_type must be one of {', '.join(map(str, DECAY_SCHEDULES))} (the "
                              f"released schedules), got {self.decay_type!r}")
        if self.adv_clip <= 0:
            raise ConfigError(f"algorithm.adv_clip must be > 0 for diffusion_nft (r divides the advantage by it, the "
                              f"release's adv_clip_max), got {self.adv_clip}")
        if self.reuse_rollout_graph is True:
            raise ConfigError("algorithm.reuse_rollout_graph cannot be true for diffusion_nft: its rollout is a "
                              "deterministic solver with no graph to reuse (use auto or false)")


@register("diffusion_nft")
class DiffusionNFT(Algorithm):
    """DiffusionNFT: implicit positive/negative policies trained on the forward process of ODE samples."""

    label, colormap = "DiffusionNFT", "Reds"  # the report's name and colours of this family
    Config = DiffusionNFTConfig
    likelihood_free = True
    rollout_graph_auto = False
    diagnostics = {
        "old_decay": "the decay of the old policy's update after this iteration (return_decay)",
        "old_deviation": "mean (v_theta - v_old)^2 over the trained pairs (the release's old_deviate)",
        "nft_r_mean": "mean optimality weight r = clamp(A / adv_clip / 2 + 1/2, 0, 1) of the trained samples",
    }

    def __init__(self, model, reward, config=None, seed: int = 0, dist=None):
        super().__init__(model, reward, config, seed, dist=dist)
        self.old_policy = OldPolicy(model.trainable_parameters())
        self.optimizer_steps = 0  # the release's global_step: the old policy's decay is a function of it

    @property
    def trained_timesteps(self) -> int:
        """K = int(T timestep_fraction) (train_nft_sd3.py:569), at least 1."""
        return max(1, int(self.num_steps * self.config.timestep_fraction))

    # ---- sampling ------------------------------------------------------------------------------------------------
    def step_plan(self, batch: int) -> StepPlan:
        """Deterministic at every step (DPM-Solver++ 2M or Euler), nothing recorded for training."""
        steps = self.num_steps
        ode = torch.zeros(steps, dtype=torch.bool)
        dpm = torch.ones(steps, dtype=torch.bool) if self.config.solver == "dpm2" else None
        return StepPlan(self.sigmas, ode, torch.zeros(batch, steps, dtype=torch.bool), self.config.kernel,
                        self.config.noise_level, dpm_solver=dpm)

    def collect(self, prompts: Sequence[str], metadata: Sequence[dict]) -> Trajectory:
        """G samples per prompt from the old policy (train_nft_sd3.py:640-659)."""
        with self.old_policy.swapped_in():
            return self.fresh_rollout(prompts, metadata)

    # ---- the loss --------------------------------------------------------------------------------------------------
    def _velocity(self, x: torch.Tensor, sigma: torch.Tensor, traj: Trajectory, rows: torch.Tensor) -> torch.Tensor:
        return self.model.velocity(x, sigma, traj.cond.index(rows), traj.guidance, cfg_grad=self.config.cfg_grad,
                                   cfg_batch=self.config.cfg_batch)

    def forward_draws(self, generators: list[torch.Generator], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sample's K trained step indices (a random subset of the T sampling steps) and their noise [n, K, ...],
        drawn from the sample's own generator (one draw per sample per epoch): on the host (the generators are CPU
        ones), the noise then moved onto ``like``'s device and dtype."""
        k = self.trained_timesteps
        return forward_draws(generators, k, like, lambda gen: torch.randperm(self.num_steps, generator=gen)[:k])

    def update(self, traj: Trajectory, advantages: torch.Tensor) -> dict[str, Any]:
        cfg = self.config
        offset, batch = self.dist.local_span(len(traj))
        kept = self.trained_rows(advantages)
        generators = sample_generators(self.seed, self.iteration, DIFFUSION_NFT_FORWARD, count=batch)
        k = self.trained_timesteps
        sums = {"loss": 0.0, "kl": 0.0, "old_deviation": 0.0, "r": 0.0, "pairs": 0}
        grad_norms = []
        for minibatch in self.minibatch_rows(batch, kept, offset, len(traj)):
            pairs = self.dist.sum(len(minibatch)) * k  # the global count normalises the loss
            if pairs == 0:
                continue
            parts = self.update_parts(traj, minibatch, cfg.micro_batch, self.forward_draws,
                                      [generators[offset + int(i)] for i in minibatch])
            self.optimizer.zero_grad(set_to_none=True)
            # the k timesteps one after another, or (a fused tier, FlowModel.fused_update) stacked as one batch,
            # timestep-major: the same loss terms, one forward and backward
            for js in ([list(range(k))] if self.model.fused_update else [[j] for j in range(k)]):
                for part in parts:
                    with part.counted(self.model):  # a padding part's calls train nothing: not counted
                        source, rows, (steps, noise) = part.source, part.rows.repeat(len(js)), part.draws
                        x0 = part.x0.repeat(len(js), *([1] * (part.x0.dim() - 1)))
                        sigma = traj.sigmas[steps[:, js].T.reshape(-1)].to(x0.device)
                        s = sigma.reshape(-1, *([1] * (x0.dim() - 1)))
                        x_t = (1 - s) * x0 + s * noise[:, js].transpose(0, 1).reshape(x0.shape)
                        # the old and reference forwards run before the trained one: swapping the old weights in
                        # writes the parameters in place, which must not happen under a live graph
                        with torch.no_grad():
                            with self.old_policy.swapped_in():
                                v_old = self._velocity(x_t, sigma, source, rows)
                            v_ref = None
                            if cfg.kl_beta > 0:
                                with self.model.reference():
                                    v_ref = self._velocity(x_t, sigma, source, rows)
                        v = self._velocity(x_t, sigma, source, rows)
                        v, v_old = at_least_float32(v), at_least_float32(v_old)
                        adv = part.take(advantages).repeat(len(js))  # a padding part: none
                        terms = nft_loss(v, v_old, None if v_ref is None else at_least_float32(v_ref), x_t,
                                         x0, sigma, adv.to(x0.device), cfg.nft_beta, cfg.adv_clip,
                                         cfg.kl_beta)
                        (terms.loss.sum() * part.scale / pairs).backward()
                        if part.padding:  # nothing to record
                            continue
                        with torch.no_grad():
                            sums["loss"] += float(terms.loss.sum())
                            sums["kl"] += float(terms.kl.sum())
                            dims = tuple(range(1, x0.dim()))
                            sums["old_deviation"] += float(((v - v_old) ** 2).mean(dim=dims).sum())
                            sums["r"] += float(terms.r.sum())
                            sums["pairs"] += len(rows)
            grad_norms.append(self.optimizer_step())
            self.optimizer_steps += 1
        sums = self.dist.sum(sums)
        n = max(sums["pairs"], 1)
        self.log("old_deviation", sums["old_deviation"] / n)
        self.log("nft_r_mean", sums["r"] / n)
        # no importance ratio and no clipping: the PPO columns hold their on-policy values
        return {"clip_frac": 0.0, "approx_kl": 0.0, "kl": sums["kl"] / n, "ratio_mean": 1.0,
                "loss": sums["loss"] / n, "grad_norm": sum(grad_norms) / max(len(grad_norms), 1)}

    def after_update(self, traj: Trajectory, batch: GatheredBatch) -> None:
        decay = old_policy_decay(self.optimizer_steps, self.config.decay_type)
        self.old_policy.blend(decay)
        self.log("old_decay", decay)

    # ---- state -----------------------------------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        return {"old_policy": self.old_policy.state_dict(), "optimizer_steps": self.optimizer_steps}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if "old_policy" not in state:
            raise FlowZooError("the checkpoint holds no DiffusionNFT old policy (was it written by another algorithm?)")
        self.old_policy.load_state_dict(state["old_policy"])
        self.optimizer_steps = int(state["optimizer_steps"])
