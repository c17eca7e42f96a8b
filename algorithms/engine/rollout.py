"""Sampling trajectories from a FlowModel under a StepPlan, and deterministic ODE sampling for evaluation."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import numpy as np
import torch

from flowzoo.algorithms.engine.sde import (NoiseStreams, StepOutput, deterministic_steps, dpm_solver_pp_2m_step, euler_step,
                                   sde_step)
from flowzoo.algorithms.engine.trajectory import StepPlan
from flowzoo.models.base import Condition, FlowModel


def sample_generators(seed: int, *keys: int, count: int) -> list[torch.Generator]:
    """``count`` independent generators, a pure function of ``(seed, *keys, index)``.

    Used so that sample i of iteration k always sees the same noise for a given run seed, whatever the batch
    layout, and different samples never share a stream.
    """
    states = np.random.SeedSequence([seed, *keys]).spawn(count)
    return [torch.Generator().manual_seed(int(s.generate_state(1, dtype=np.uint64)[0] >> 1)) for s in states]


@torch.no_grad()
def initial_noise(
    model: FlowModel, generators: Sequence[torch.Generator], group_size: int = 1, shared: bool = False
) -> torch.Tensor:
    """Initial latents; with ``shared`` every group of ``group_size`` consecutive samples gets the noise of the
    group's first generator (DanceGRPO's one-noise-per-prompt)."""
    if not shared:
        return model.initial_noise(generators)
    if len(generators) % group_size:
        raise ValueError(f"{len(generators)} samples do not split into groups of {group_size}")
    return model.initial_noise(list(generators)[::group_size]).repeat_interleave(group_size, dim=0)


def rollout(
    model: FlowModel,
    cond: Condition,
    plan: StepPlan,
    x: torch.Tensor,
    generators: Sequence[torch.Generator],
    guidance: float | None = None,
    start_step: int = 0,
    live: dict[int, StepOutput] | None = None,
    cfg_grad: str = "cond",
    cfg_batch: str = "auto",
    stop_step: int | None = None,
    prediction: dict[str, torch.Tensor] | None = None,
    chunk: int | None = None,
    means: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the plan's steps ``start_step .. stop_step - 1`` (default: to the last, T - 1) from state ``x`` (the
    latent at ``plan.sigmas[start_step]``).

    Returns ``latents`` [B, T+1, ...] (entries before ``start_step`` and after ``stop_step`` are zeros: the caller
    owns them) and behaviour ``log_probs`` [B, T] (0 on ODE steps and outside the run). No gradients are kept, unless
    ``live`` is a dict: then the steps the plan trains are evaluated with gradients and their StepOutputs (with the
    autograd graph) are stored in ``live[t]``, so the first update can back-propagate without recomputing them
    (the recompute-free schedule of LeanGRPO, arXiv 2609.03528); ``cfg_grad`` is then the CFG gradient form of those
    graphs and ``cfg_batch`` how they run (see ``FlowModel.velocity``).
    ODE steps marked in ``plan.dpm_solver`` use DPM-Solver++ 2M, whose history is the data prediction
    ``x - sigma v`` of the previous step whatever its kind (as MixGRPO-Flash's reference feeds its solver state during
    the SDE window); the first step after ``start_step`` has no history.
    With ``prediction`` a dict and a plan that decodes the prediction (``plan.decode == "prediction"``), the last
    step's data prediction ``x_{T-1} - sigma_{T-1} v`` (float32, as DanceGRPO's ``pred_original``) is stored in
    ``prediction["x0"]`` when the run reaches that step: the state the reward decodes (``Trajectory.rewarded``).
    ``chunk`` (None: all rows at once) bounds the samples per network call (``AlgorithmConfig.rollout_batch``): the
    step loop runs on each consecutive chunk of rows in turn. Each sample draws from its own generator, so the
    samples are those of one call (to the float rounding of a smaller batch); the chunks' kept graphs (``live``) and
    data predictions are concatenated, so autograd reaches every chunk's graph.
    ``means`` (a float32 tensor [B, T, ...] the caller allocated, or None): the Gaussian mean of every SDE transition
    the run samples is written into ``means[:, t]`` (detached), the old policy's anchor of the trust-region losses
    (Flow-DPPO, GRPO-Guard: ``Algorithm.records_means``); other entries are left as they are.
    """
    batch = x.shape[0]
    num_steps = plan.num_steps
    stop = num_steps if stop_step is None else stop_step
    latents = torch.zeros((batch, num_steps + 1, *x.shape[1:]), dtype=x.dtype, device=x.device)
    log_probs = torch.zeros((batch, num_steps), dtype=torch.float32, device=x.device)
    latents[:, start_step] = x
    grid = StepGrid.of(plan, x.device)  # once per rollout, whatever its chunks
    spans = chunk_spans(batch, chunk)
    if len(spans) == 1:  # one call per step on every row, as before chunking existed
        _noisy_steps(model, cond, plan, x, generators, latents, log_probs, guidance, start_step, live, cfg_grad,
                     cfg_batch, stop, prediction, grid, means)
        return latents, log_probs
    # every chunk keeps graphs at the steps the whole batch trains, so that the chunks' graphs line up
    chunk_plan = plan if plan.graph_steps is not None else dataclasses.replace(plan, graph_steps=plan.train.any(0))
    lives: list[dict[int, StepOutput]] = []
    predictions: list[dict[str, torch.Tensor]] = []
    for span in spans:
        part_live = None if live is None else {}
        part_prediction = None if prediction is None else {}
        # basic slices: views, which the step loop fills in place
        gens = generators[span] if len(generators) == batch else generators
        _noisy_steps(model, cond.index(span), chunk_plan, x[span], gens, latents[span], log_probs[span], guidance,
                     start_step, part_live, cfg_grad, cfg_batch, stop, part_prediction, grid,
                     None if means is None else means[span])
        if part_live is not None:
            lives.append(part_live)
        if part_prediction is not None:
            predictions.append(part_prediction)
    if live is not None:
        for t in lives[0]:
            live[t] = StepOutput(*(torch.cat(fields) for fields in zip(*(part[t] for part in lives))))
    if prediction is not None and "x0" in predictions[0]:
        prediction["x0"] = torch.cat([part["x0"] for part in predictions])
    return latents, log_probs


def chunk_spans(batch: int, chunk: int | None) -> list[slice]:
    """The consecutive row slices of a batch of ``batch`` rows cut into chunks of at most ``chunk`` (None: one
    slice of all of them; an empty batch is one empty slice, so that callers still run their loop once)."""
    if chunk is not None and chunk < 1:
        raise ValueError(f"a chunk holds at least one row, got {chunk}")
    if batch == 0:
        return [slice(0, 0)]
    size = batch if chunk is None else chunk
    return [slice(lo, min(lo + size, batch)) for lo in range(0, batch, size)]


class StepGrid(NamedTuple):
    """What the step loop reads of a plan's grid, made once per rollout: the sigmas on the latents' device (a host
    grid would be copied there at every call) and the host mask of the zero-noise steps (``deterministic_steps``:
    known without reading the device)."""

    sigmas: torch.Tensor
    quiet: torch.Tensor

    @classmethod
    def of(cls, plan: StepPlan, device: torch.device) -> "StepGrid":
        return cls(plan.sigmas.to(device=device, dtype=torch.float32),
                   deterministic_steps(plan.kind, plan.sigmas, plan.noise_level))


def _noisy_steps(model, cond, plan, x, generators, latents, log_probs, guidance, start_step, live, cfg_grad,
                 cfg_batch, stop_step, prediction, grid: StepGrid, means: torch.Tensor | None = None) -> None:
    """:func:`_run_steps` on rows ``x`` with their own noise streams (closed after, however the loop ends): each
    sample's noise for the run's noisy steps drawn at once where that gives the same values (``NoiseStreams``)."""
    noisy = int((plan.sde[start_step:stop_step] & ~grid.quiet[start_step:stop_step]).sum())
    noise = NoiseStreams(generators, x.shape[1:], steps=noisy)  # each sample's own generator, as drawn step by step
    try:
        _run_steps(model, cond, plan, x, noise, latents, log_probs, guidance, start_step, live, cfg_grad, cfg_batch,
                   stop_step, prediction, grid, means)
    finally:
        noise.close()


def _run_steps(model, cond, plan, x, noise, latents, log_probs, guidance, start_step, live, cfg_grad, cfg_batch,
               stop_step, prediction, grid: StepGrid, means: torch.Tensor | None = None) -> None:
    """The step loop of :func:`rollout` (its arguments; ``noise`` the samples' NoiseStreams, ``grid`` the rollout's
    :class:`StepGrid`), filling ``latents``, ``log_probs`` (and ``means``) in place. Nothing in it reads a device tensor on the
    host or copies one there: the grid is on the device already, the masks are the plan's host tensors."""
    batch, num_steps = x.shape[0], plan.num_steps
    sigmas, quiet = grid
    prev_x0 = prev_sigma = None
    for t in range(start_step, stop_step):
        sigma = sigmas[t].expand(batch)
        sigma_next = sigmas[t + 1].expand(batch)
        trained = plan.train[:, t].any() if getattr(plan, "graph_steps", None) is None else plan.graph_steps[t]
        keep_graph = live is not None and bool(plan.sde[t]) and bool(trained)
        with torch.set_grad_enabled(keep_graph):
            v = model.velocity(x, sigma, cond, guidance, cfg_grad=cfg_grad, cfg_batch=cfg_batch)
            if plan.sde[t]:
                out = sde_step(
                    x, v, sigma, sigma_next, kind=plan.kind, noise_level=plan.noise_level, generator=noise,
                    reduction=plan.reduction, deterministic=bool(quiet[t]),
                )
        v = v.detach()
        # the data prediction is the DPM-Solver++ history; plans without solver steps need not compute it
        x0 = None if plan.dpm_solver is None else _data_prediction(x, v, sigma)
        x_t = x
        if plan.sde[t]:
            if keep_graph:
                live[t] = out
            if means is not None:
                means[:, t] = out.mean.detach()
            x, log_probs[:, t] = out.prev_sample.detach(), out.log_prob.detach()
        elif plan.dpm_solver is not None and plan.dpm_solver[t]:
            x = dpm_solver_pp_2m_step(x, v, sigma, sigma_next, prev_x0, prev_sigma)
        else:
            x = euler_step(x, v, sigma, sigma_next)
        if prediction is not None and plan.decode == "prediction" and t == num_steps - 1:
            prediction["x0"] = _data_prediction(x_t, v, sigma)
        prev_x0, prev_sigma = x0, sigma
        latents[:, t + 1] = x


def _data_prediction(x: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """x0 = x - sigma v in float32 (``sigma``: [B])."""
    return x.float() - sigma.to(device=x.device, dtype=torch.float32).reshape(-1, *([1] * (x.dim() - 1))) * v.float()


def branched_rollout(
    model: FlowModel,
    cond: Condition,
    plan: StepPlan,
    x: torch.Tensor,
    generators: Sequence[torch.Generator],
    group: torch.Tensor,
    branch_step: int,
    guidance: float | None = None,
    live: dict[int, StepOutput] | None = None,
    cfg_grad: str = "cond",
    cfg_batch: str = "auto",
    prediction: dict[str, torch.Tensor] | None = None,
    chunk: int | None = None,
    prefix_padding: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rollout` for groups that share one deterministic prefix (Flow-GRPO-Fast's branching).

    The samples of a group (equal ``group`` ids) must share their initial latent ``x`` and their conditioning, and
    the plan's steps before ``branch_step`` must be deterministic: those steps are then the same for every member, so
    they run once per group, on the group's first member, and every member continues from the group's latent at
    ``branch_step``. Same results as :func:`rollout` on the whole batch (to the float rounding of a smaller batch),
    with ``branch_step`` forward passes per group instead of per sample. ``chunk``: :func:`rollout`'s, for the
    prefix (on the groups' first members) and the continuation alike. ``prefix_padding``: that many more prefix runs
    on one row, discarded and not counted in the NFE, right after the prefix (a sharded model's process with fewer
    prefix chunks than another makes them, so that every process makes the same calls in the same order:
    ``algorithms/engine/lockstep.py``).
    """
    if bool(plan.sde[:branch_step].any()):
        raise ValueError(f"a shared prefix must be deterministic, but the plan has SDE steps before {branch_step}")
    _, inverse = torch.unique(group, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), len(group), dtype=torch.long, device=group.device)
    members = torch.arange(len(group), device=group.device)
    first = first.scatter_reduce(0, inverse, members, reduce="amin")  # each group's first member
    if not torch.equal(x[first[inverse]], x):
        raise ValueError("the samples of a group do not share their initial latent; a shared prefix needs them to")
    heads = dataclasses.replace(plan, train=plan.train[first])
    prefix, _ = rollout(model, cond.index(first), heads, x[first], [], guidance, stop_step=branch_step, chunk=chunk)
    with model.uncounted():
        for _ in range(prefix_padding):
            one = first[:1]
            rollout(model, cond.index(one), dataclasses.replace(heads, train=heads.train[:1]), x[one], [], guidance,
                    stop_step=branch_step)
    prefix = prefix[inverse]
    latents, log_probs = rollout(
        model, cond, plan, prefix[:, branch_step], generators, guidance, start_step=branch_step, live=live,
        cfg_grad=cfg_grad, cfg_batch=cfg_batch, prediction=prediction, chunk=chunk,
    )
    latents[:, :branch_step] = prefix[:, :branch_step]
    return latents, log_probs


@torch.no_grad()
def sample_ode(
    model: FlowModel, cond: Condition, sigmas: torch.Tensor, x: torch.Tensor, guidance: float | None = None
) -> torch.Tensor:
    """Deterministic Euler sampling of the probability-flow ODE (used for evaluation)."""
    batch = x.shape[0]
    for t in range(sigmas.shape[0] - 1):
        v = model.velocity(x, sigmas[t].expand(batch), cond, guidance)
        x = euler_step(x, v, sigmas[t].expand(batch), sigmas[t + 1].expand(batch))
    return x
