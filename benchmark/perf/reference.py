"""The released Flow-GRPO / DanceGRPO training loss, transcribed by hand from the released code (not from ours), for
the SD3 adapter: what ``flowzoo perf``'s reference loop trains with and what the fidelity tests compare our update's
gradient against.

One batched transformer call on [uncond; cond] with the unconditional half detached (Flow-GRPO scripts/train_sd3.py:
180-195 at ac4c86e), the released kernels' log-densities (flow_grpo/diffusers_patch/sd3_sde_with_logprob.py:45-68;
DanceGRPO fastvideo/train_grpo_flux.py:141-167), the PPO ratio and clip, the KL on the means over the released
std_dev_t (train_sd3.py:880-897), and the accumulation: Flow-GRPO averages each timestep's loss over its micro-batch
and accumulates over the trained timesteps (train_sd3.py:360, 872-939); DanceGRPO / MixGRPO loop over single samples
and divide each (sample, timestep) loss by gradient_accumulation_steps * train_timesteps (DanceGRPO
train_grpo_flux.py:570-611, MixGRPO train_grpo_flux.py:540-608). The CFG scale is the trajectory's.
"""

from __future__ import annotations

import math

import torch


def released_velocity(model, x, sigma, cond, null, guidance, detach_uncond=True):
    """compute_log_prob's CFG: one transformer call on [uncond; cond], uncond detached, u + g (c - u)."""
    timestep = sigma * model.pipe.scheduler.config.num_train_timesteps
    out = model.transformer(
        hidden_states=torch.cat([x, x]),
        timestep=torch.cat([timestep, timestep]),
        encoder_hidden_states=torch.cat([null["prompt_embeds"], cond["prompt_embeds"]]),
        pooled_projections=torch.cat([null["pooled_prompt_embeds"], cond["pooled_prompt_embeds"]]),
        return_dict=False,
    )[0]
    uncond, text = out.chunk(2)
    if detach_uncond:
        uncond = uncond.detach()
    return uncond + guidance * (text - uncond)


def _gaussian_log_prob(prev, mean, std):
    lp = -((prev - mean) ** 2) / (2 * std**2) - torch.log(std) - math.log(math.sqrt(2 * math.pi))
    return lp.mean(dim=tuple(range(1, lp.dim())))


def released_flow_grpo_step(v, x, prev, sigma, sigma_next, sigma_max, a):
    """sd3_sde_with_logprob.py:45-68: returns (log_prob, mean, std_dev_t)."""
    dt = sigma_next - sigma
    std_t = torch.sqrt(sigma / (1 - (sigma_max if float(sigma) == 1 else sigma))) * a
    mean = x * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
    return _gaussian_log_prob(prev, mean, std_t * torch.sqrt(-dt)), mean, std_t


def released_dance_step(v, x, prev, sigma, sigma_next, eta):
    """DanceGRPO's flux_step with sde_solver (train_grpo_flux.py:141-167): returns (log_prob, mean, std)."""
    dsigma = sigma_next - sigma
    x0 = x - sigma * v
    std = eta * torch.sqrt(sigma - sigma_next)
    score = -(x - x0 * (1 - sigma)) / sigma**2
    mean = x + dsigma * v + (-0.5 * eta**2 * score) * dsigma
    return _gaussian_log_prob(prev, mean, std), mean, std


def released_cps_step(v, x, prev, sigma, sigma_next, a):
    """The ``cps`` branch of sd3_sde_with_logprob.py (at 54809b5): constants dropped from the log-density."""
    std = sigma_next * math.sin(a * math.pi / 2)
    mean = (x - sigma * v) * (1 - sigma_next) + (x + v * (1 - sigma)) * torch.sqrt(sigma_next**2 - std**2)
    return (-((prev - mean) ** 2)).mean(dim=tuple(range(1, x.dim()))), mean, std


def adapter_velocity(model, cfg_grad):
    """The transformer call of a released trainer that calls its pipeline's transformer the way our adapter does (FLUX:
    one call, the distilled guidance an input; Qwen-Image: one call on [cond; neg] with the norm rescale,
    Flow-GRPO scripts/train_qwenimage.py:217-230 at 27b6ef8): the adapter's own call, batched as released, so
    that what a reference transcribes is the loop around it (rows per call, losses, backward, optimizer steps)."""

    def velocity(traj, x, sigma_b, rows, detach_uncond=True):
        return model.velocity(x, sigma_b, traj.cond.index(rows), traj.guidance, cfg_grad=cfg_grad, cfg_batch="batched")

    return velocity


def _sd3_velocity(model):
    """The SD3 release's call (``released_velocity``) on a trajectory's rows."""

    def velocity(traj, x, sigma_b, rows, detach_uncond=True):
        cond = {k: v[rows] for k, v in traj.cond.tensors.items()}
        null = model.null_condition(len(rows)).tensors
        return released_velocity(model, x, sigma_b, cond, null, traj.guidance, detach_uncond)

    return velocity


def released_pair_loss(model, traj, adv, rows, t, cfg, detach_uncond=True, velocity=None):
    """The per-sample loss of transition t for ``rows`` (policy surrogate + beta KL) and its ratio. ``velocity``: the
    transformer call (default: the SD3 release's, ``released_velocity``; ``adapter_velocity`` for FLUX, Qwen-Image)."""
    x, prev = traj.latents[rows, t].float(), traj.latents[rows, t + 1].float()
    # the step plan lives on the host (docs/perf.md, "Device placement"): its sigmas join the latents' device here, as
    # the adapters' kernels move them, so the transformer's timestep is not a host tensor on a GPU run
    sigma, sigma_next = traj.sigmas[t].to(x.device), traj.sigmas[t + 1].to(x.device)
    sigma_b = sigma.expand(len(rows))
    velocity = velocity or _sd3_velocity(model)

    def kernel(v):
        if traj.kind == "flow_grpo":
            return released_flow_grpo_step(v, x, prev, sigma, sigma_next, traj.sigmas[1], traj.noise_level)
        if traj.kind == "cps":
            return released_cps_step(v, x, prev, sigma, sigma_next, traj.noise_level)
        assert traj.kind == "dance_grpo", traj.kind
        return released_dance_step(v, x, prev, sigma, sigma_next, traj.noise_level)

    log_prob, mean, std = kernel(velocity(traj, x, sigma_b, rows, detach_uncond))
    ratio = torch.exp(log_prob - traj.log_probs[rows, t])
    a = adv[rows]
    loss = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - cfg.clip_range, 1 + cfg.clip_range))
    if cfg.kl_beta > 0:  # train_sd3.py:880-897 (std: the kernel's released std_dev_t)
        with torch.no_grad(), model.reference():
            _, ref_mean, _ = kernel(velocity(traj, x, sigma_b, rows))
        loss = loss + cfg.kl_beta * ((mean - ref_mean) ** 2).mean(dim=tuple(range(1, mean.dim()))) / (2 * std**2)
    return loss, ratio


def released_gradient(model, traj, adv, cfg, style, detach_uncond=True):
    """The LoRA gradient of one optimizer step over the whole trajectory, accumulated as the released trainers do."""
    params = model.trainable_parameters()
    for p in params:
        p.grad = None
    n = len(traj)
    if style == "flow_grpo":
        steps = [t for t in range(traj.num_steps) if traj.train[:, t].any()]
        for t in steps:
            rows = torch.arange(n)
            assert bool(traj.train[:, t].all())  # Flow-GRPO trains the same timesteps for every sample
            loss, _ = released_pair_loss(model, traj, adv, rows, t, cfg, detach_uncond)
            (loss.mean() / len(steps)).backward()  # per-timestep batch mean; accumulation / num_train_timesteps
    else:
        for i in range(n):  # one sample per micro-batch, gradient_accumulation_steps = n (one optimizer step)
            steps = traj.train[i].nonzero().flatten().tolist()
            for t in steps:
                loss, _ = released_pair_loss(model, traj, adv, torch.tensor([i]), t, cfg, detach_uncond)
                (loss.mean() / (n * len(steps))).backward()
    grads = torch.cat([p.grad.flatten() for p in params])
    for p in params:
        p.grad = None
    return grads


#: the released step structure of each algorithm the GPU check times against ours (benchmark/perf/gpu_large.py):
#: ``per_timestep``: Flow-GRPO's, one call per (sample batch, trained timestep) on the batch's rows (x2 with CFG),
#: its loss averaged over the batch and divided by (batches per optimizer step x trained timesteps), backward per
#: call (train_sd3.py:872-939 at ac4c86e; the Qwen-Image trainer the same, scripts/train_qwenimage.py:837-940 at
#: 27b6ef8, gradient_accumulation_steps x num_train_timesteps calls per optimizer step); ``per_sample``: DanceGRPO's
#: and MixGRPO's, one call per (sample, trained timestep) on that one sample's row, its loss divided by (samples per
#: optimizer step x trained timesteps), backward per call (DanceGRPO fastvideo/train_grpo_flux.py:571-611 at
#: 15cc71d; MixGRPO fastvideo/train_grpo_flux.py:543-608 at e5cdd6a); an optimizer step after each minibatch.
RELEASED_STRUCTURE = {"flow_grpo": "per_timestep", "flow_grpo_fast": "per_timestep", "dance_grpo": "per_sample",
                      "mix_grpo": "per_sample"}


def released_update(alg, traj, adv, structure: str, rows_per_call: int | None = None, velocity=None,
                    detach_uncond: bool = True) -> int:
    """One released-style update of ``alg``'s model on a rollout: for each of ``minibatches`` parts of the batch (a
    permutation seeded by the iteration, as ``benchmark/perf/measure.py``'s SD3 loop), the loop ``structure`` names
    (``RELEASED_STRUCTURE``), then gradient clipping and one optimizer step with ``alg``'s optimizer.
    ``rows_per_call``: samples per call of ``per_timestep`` (the released ``train_batch_size``; None: the whole
    minibatch). Returns the number of transformer calls with gradient it made (the KL's reference calls not counted)."""
    model, cfg = alg.model, alg.config
    if structure not in ("per_timestep", "per_sample"):
        raise ValueError(f"released_update: structure {structure!r}; valid: per_timestep, per_sample")
    perm = torch.randperm(len(traj), generator=torch.Generator().manual_seed(alg.iteration))
    calls = 0
    for _ in range(cfg.inner_epochs):
        for minibatch in perm.chunk(cfg.minibatches):
            minibatch = minibatch.sort().values
            alg.optimizer.zero_grad(set_to_none=True)
            if structure == "per_timestep":
                batches = minibatch.split(rows_per_call or len(minibatch))
                for rows in batches:
                    steps = [t for t in range(traj.num_steps) if bool(traj.train[rows, t].any())]
                    for t in steps:
                        part = rows[traj.train[rows, t]]
                        loss, _ = released_pair_loss(model, traj, adv, part, t, cfg, detach_uncond, velocity)
                        (loss.mean() / (len(batches) * len(steps))).backward()
                        calls += 1
            else:
                for i in minibatch.tolist():
                    steps = traj.train[i].nonzero().flatten().tolist()
                    for t in steps:
                        loss, _ = released_pair_loss(model, traj, adv, torch.tensor([i]), t, cfg, detach_uncond,
                                                     velocity)
                        (loss.mean() / (len(minibatch) * len(steps))).backward()
                        calls += 1
            if cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), cfg.max_grad_norm)
            alg.optimizer.step()
    alg.optimizer.zero_grad(set_to_none=True)
    return calls
