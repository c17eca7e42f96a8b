"""The Trajectory batch: everything one rollout produced that the update (or a replay buffer) needs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import NamedTuple, Sequence

import torch

from flowzoo.algorithms.engine.sde import deterministic_steps
from flowzoo.models.base import Condition


#: which state of a trajectory the reward decodes (``StepPlan.decode``)
DECODED_STATES = ("sample", "prediction")


@dataclass
class StepPlan:
    """What a rollout does at each of its T steps.

    ``sigmas`` [T+1] (1 -> 0); ``sde`` [T] which steps are stochastic (the rest are deterministic ODE steps);
    ``train`` [B, T] which (sample, step) transitions the update trains on (only stochastic steps can be trained).
    ``dpm_solver`` [T] (optional) which deterministic steps use DPM-Solver++ 2M instead of the Euler step
    (MixGRPO-Flash's compressed tail); ``None`` means Euler on every ODE step.
    ``decode`` which state the reward decodes: ``sample``, the final latent x_T (Flow-GRPO, MixGRPO), or
    ``prediction``, the last step's data prediction x_{T-1} - sigma_{T-1} v(x_{T-1}) (DanceGRPO's released trainers:
    ``latents = pred_original`` after the sampling loop), which the rollout records (``rollout(prediction=...)``).

    A plan is host-side control data: its tensors stay on the CPU whatever the model's device, so reading a mask
    (``bool(plan.sde[t])``) never waits for an accelerator; the kernels (``algorithms.engine.sde``) move the sigmas they use
    onto the latents' device.
    """

    sigmas: torch.Tensor
    sde: torch.Tensor
    train: torch.Tensor
    kind: str = "flow_grpo"
    noise_level: float = 0.7
    dpm_solver: torch.Tensor | None = None
    reduction: str = "mean"  # log-density over latent dims: "mean" (reference codes) or "sum" (joint density)
    decode: str = "sample"  # the rewarded state: "sample" (x_T) or "prediction" (x_{T-1} - sigma_{T-1} v)
    # [T] the steps a recompute-free rollout evaluates with autograd (keeps graphs of): those any sample of the
    # *global* batch trains, so that every process keeps the same graphs whatever its rows (a sharded model's calls
    # are collectives, algorithms/engine/lockstep.py); None: the steps this plan's own rows train
    graph_steps: torch.Tensor | None = None

    def __post_init__(self) -> None:
        num_steps = self.sigmas.shape[0] - 1
        if self.decode not in DECODED_STATES:
            raise ValueError(f"decode must be one of {', '.join(DECODED_STATES)}, got {self.decode!r}")
        if self.sde.shape != (num_steps,):
            raise ValueError(f"sde mask has shape {tuple(self.sde.shape)}, expected ({num_steps},)")
        if self.train.dim() != 2 or self.train.shape[1] != num_steps:
            raise ValueError(f"train mask has shape {tuple(self.train.shape)}, expected (B, {num_steps})")
        if (self.train & ~self.sde).any():
            raise ValueError("the plan trains a deterministic (ODE) step; only SDE steps have a log-probability")
        if self.dpm_solver is not None:
            if self.dpm_solver.shape != (num_steps,):
                raise ValueError(f"dpm_solver mask has shape {tuple(self.dpm_solver.shape)}, expected ({num_steps},)")
            if (self.dpm_solver & self.sde).any():
                raise ValueError("the plan solves an SDE step with DPM-Solver++; the solver is for ODE steps only")

    @property
    def num_steps(self) -> int:
        return self.sde.shape[0]

    def same_grid(self, other: "StepPlan") -> bool:
        """Whether ``other`` samples on this plan's grid: the same sigmas and SDE steps (compared on the host), the
        same kernel and noise level (a stored trajectory can be replayed only on its own grid)."""
        return (self.kind == other.kind and self.noise_level == other.noise_level
                and torch.equal(self.sigmas.cpu(), other.sigmas.cpu()) and torch.equal(self.sde.cpu(), other.sde.cpu()))


class RolloutInputs(NamedTuple):
    """What a rollout of a batch starts from: its samples' prompts, metadata, condition, initial latents, noise
    generators, plan and group ids (``Algorithm.fresh_inputs``)."""

    prompts: list[str]
    metadata: list[dict]
    cond: Condition
    x: torch.Tensor
    generators: list[torch.Generator]
    plan: StepPlan
    group: torch.Tensor

    @staticmethod
    def cat(parts: Sequence["RolloutInputs"]) -> "RolloutInputs":
        """One batch of ``parts`` (in order) that share the first part's plan apart from its ``train`` rows."""
        first = parts[0]
        return RolloutInputs(
            prompts=[q for p in parts for q in p.prompts],
            metadata=[m for p in parts for m in p.metadata],
            cond=Condition.cat([p.cond for p in parts]),
            x=torch.cat([p.x for p in parts]),
            generators=[g for p in parts for g in p.generators],
            plan=dataclasses.replace(first.plan, train=torch.cat([p.plan.train for p in parts])),
            group=torch.cat([p.group for p in parts]),
        )


@dataclass
class Trajectory:
    """A batch of B denoising trajectories of T steps.

    ``latents[:, t]`` is the state at ``sigmas[t]``: index 0 is the initial noise, index T the final sample.
    ``log_probs[:, t]`` is the behaviour policy's log-density of the transition t -> t+1 (0 on ODE steps).
    ``group`` gives each sample's group id (samples of one prompt); advantages are relative within a group.
    ``plan`` is the plan it was sampled under, its ``train`` rows those of this batch's samples; ``sigmas``, ``sde``,
    ``train``, ``kind``, ``noise_level``, ``reduction`` and ``decode`` read it. ``decode`` says which state the reward
    decodes, :attr:`rewarded`: the final sample, or ``prediction`` [B, ...], the last step's data prediction
    x_{T-1} - sigma_{T-1} v recorded by the rollout.

    Placement: ``latents``, ``log_probs``, ``means``, ``cond``, ``prediction``, ``samples``, ``rewards``,
    ``reward_components`` and ``log_weight`` are on the model's device (the math); the plan, ``group`` and
    ``off_policy`` are host-side (CPU) bookkeeping, which index device tensors as they are.
    """

    prompts: list[str]
    metadata: list[dict]
    cond: Condition
    latents: torch.Tensor
    log_probs: torch.Tensor
    plan: StepPlan
    group: torch.Tensor
    guidance: float | None = None
    #: the last step's data prediction, recorded when ``decode`` is ``prediction``
    prediction: torch.Tensor | None = None
    #: filled after decoding and scoring
    samples: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    reward_components: dict[str, torch.Tensor] = field(default_factory=dict)
    #: OP-GRPO: which samples reuse stored (off-policy) steps, and the log of their sequence weight
    off_policy: torch.Tensor | None = None
    log_weight: torch.Tensor | None = None
    #: recompute-free schedule: per trained step t, the rollout's StepOutput with its autograd graph (see rollout)
    live: dict | None = None
    #: [B, T, ...] float32: the behaviour policy's Gaussian mean of each SDE transition (zeros elsewhere), recorded
    #: by the rollout for the algorithms whose loss anchors on it (``Algorithm.records_means``: Flow-DPPO, GRPO-Guard)
    means: torch.Tensor | None = None

    @classmethod
    def from_rollout(
        cls, plan: StepPlan, prompts: list[str], metadata: list[dict], cond: Condition, latents: torch.Tensor,
        log_probs: torch.Tensor, group: torch.Tensor, guidance: float | None, **fields,
    ) -> "Trajectory":
        """A batch recorded under ``plan`` (its sigmas, masks, kernel and reduction)."""
        return cls(prompts=prompts, metadata=metadata, cond=cond, latents=latents, log_probs=log_probs, plan=plan,
                   group=group, guidance=guidance, **fields)

    # ---- the plan's fields ----------------------------------------------------------------------------------------
    @property
    def sigmas(self) -> torch.Tensor:
        return self.plan.sigmas

    @property
    def sde(self) -> torch.Tensor:
        return self.plan.sde

    @property
    def train(self) -> torch.Tensor:
        return self.plan.train

    @property
    def kind(self) -> str:
        return self.plan.kind

    @property
    def noise_level(self) -> float:
        return self.plan.noise_level

    @property
    def reduction(self) -> str:
        return self.plan.reduction

    @property
    def decode(self) -> str:
        return self.plan.decode

    def device_sigmas(self) -> torch.Tensor:
        """The plan's sigmas on the latents' device in float32, copied there once per trajectory (the update reads
        them at every call; a host grid would be copied to the device at each of them)."""
        cached = self.__dict__.get("_device_sigmas")
        if cached is None or cached.device != self.latents.device:
            cached = self.plan.sigmas.to(device=self.latents.device, dtype=torch.float32)
            self.__dict__["_device_sigmas"] = cached
        return cached

    def quiet_steps(self) -> torch.Tensor:
        """[T] host bool: the grid's zero-noise transitions (``algorithms.engine.sde.deterministic_steps``), once."""
        cached = self.__dict__.get("_quiet_steps")
        if cached is None:
            cached = deterministic_steps(self.kind, self.sigmas, self.noise_level)
            self.__dict__["_quiet_steps"] = cached
        return cached

    def __post_init__(self) -> None:
        b = len(self.prompts)
        if self.off_policy is None:  # a host-side flag, like ``group`` (it selects rows; no math)
            self.off_policy = torch.zeros(b, dtype=torch.bool)
        if self.log_weight is None:  # it scales the loss: on the latents' device (float32, as the log-probs)
            self.log_weight = torch.zeros(b, dtype=torch.float32, device=self.latents.device)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def num_steps(self) -> int:
        return self.sigmas.shape[0] - 1

    @property
    def final(self) -> torch.Tensor:
        return self.latents[:, -1]

    @property
    def rewarded(self) -> torch.Tensor:
        """The latents the reward decodes: the final sample, or with ``decode: prediction`` the last step's data
        prediction (refused when the rollout did not record it, so a path that forgets it cannot reward x_T)."""
        if self.decode == "sample":
            return self.final
        if self.prediction is None:
            raise ValueError("the plan decodes the last step's data prediction, but the rollout did not record it")
        return self.prediction

    def select(self, idx: torch.Tensor | Sequence[int]) -> "Trajectory":
        """The sub-batch of the given sample indices (a host index: it selects the host-side fields too)."""
        idx = torch.as_tensor(idx, dtype=torch.long, device="cpu")
        items = idx.tolist()
        per_sample = {"latents", "log_probs", "group", "samples", "rewards", "off_policy", "log_weight", "prediction",
                      "means"}
        kwargs = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("prompts", "metadata"):
                value = [value[i] for i in items]
            elif f.name == "cond":
                value = value.index(idx)
            elif f.name == "plan":
                value = dataclasses.replace(value, train=value.train[idx])
            elif f.name == "reward_components":
                value = {k: v[idx] for k, v in value.items()}
            elif f.name in per_sample and value is not None:
                value = value[idx]
            elif f.name == "live":
                value = None  # a sub-batch recomputes its log-probs
            kwargs[f.name] = value
        return Trajectory(**kwargs)

    @staticmethod
    def cat(parts: Sequence["Trajectory"]) -> "Trajectory":
        """Concatenate batches that share sigmas, SDE mask and kernel (e.g. fresh and replayed samples)."""
        first = parts[0]
        for p in parts[1:]:
            if not first.plan.same_grid(p.plan) or (p.reduction, p.decode) != (first.reduction, first.decode):
                raise ValueError("cannot concatenate trajectories with different sigmas, SDE steps, kernels, noise "
                                 "levels, log-prob reductions or decoded states")

        def cat_opt(name: str):
            values = [getattr(p, name) for p in parts]
            return None if any(v is None for v in values) else torch.cat(values)

        keys = set.intersection(*[set(p.reward_components) for p in parts]) if parts else set()
        return Trajectory(
            prompts=[q for p in parts for q in p.prompts],
            metadata=[m for p in parts for m in p.metadata],
            cond=Condition.cat([p.cond for p in parts]),
            latents=torch.cat([p.latents for p in parts]),
            log_probs=torch.cat([p.log_probs for p in parts]),
            plan=dataclasses.replace(first.plan, train=torch.cat([p.train for p in parts])),
            group=torch.cat([p.group for p in parts]),
            guidance=first.guidance,
            prediction=cat_opt("prediction"),
            samples=cat_opt("samples"),
            rewards=cat_opt("rewards"),
            reward_components={k: torch.cat([p.reward_components[k] for p in parts]) for k in sorted(keys)},
            off_policy=cat_opt("off_policy"),
            log_weight=cat_opt("log_weight"),
            means=cat_opt("means"),
        )
