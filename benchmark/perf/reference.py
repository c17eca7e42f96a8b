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


def released_pair_loss(model, traj, adv, rows, t, cfg, detach_uncond=True):
    """The per-sample loss of transition t for ``rows`` (policy surrogate + beta KL) and its ratio."""
    x, prev = traj.latents[rows, t].float(), traj.latents[rows, t + 1].float()
    # the step plan lives on the host (docs/perf.md, "Device placement"): its sigmas join the latents' device here, as
    # the adapters' kernels move them, so the transformer's timestep is not a host tensor on a GPU run
    sigma, sigma_next = traj.sigmas[t].to(x.device), traj.sigmas[t + 1].to(x.device)
    cond = {k: v[rows] for k, v in traj.cond.tensors.items()}
    null = model.null_condition(len(rows)).tensors
    sigma_b = sigma.expand(len(rows))

    def kernel(v):
        if traj.kind == "flow_grpo":
            return released_flow_grpo_step(v, x, prev, sigma, sigma_next, traj.sigmas[1], traj.noise_level)
        if traj.kind == "cps":
            return released_cps_step(v, x, prev, sigma, sigma_next, traj.noise_level)
        assert traj.kind == "dance_grpo", traj.kind
        return released_dance_step(v, x, prev, sigma, sigma_next, traj.noise_level)

    log_prob, mean, std = kernel(released_velocity(model, x, sigma_b, cond, null, traj.guidance, detach_uncond))
    ratio = torch.exp(log_prob - traj.log_probs[rows, t])
    a = adv[rows]
    loss = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - cfg.clip_range, 1 + cfg.clip_range))
    if cfg.kl_beta > 0:  # train_sd3.py:880-897 (std: the kernel's released std_dev_t)
        with torch.no_grad(), model.reference():
            _, ref_mean, _ = kernel(released_velocity(model, x, sigma_b, cond, null, traj.guidance))
        loss = loss + cfg.kl_beta * ((mean - ref_mean) ** 2).mean(dim=(1, 2, 3)) / (2 * std**2)
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
