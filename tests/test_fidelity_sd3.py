"""The update on a tiny random SD3 pipeline against the released training code, transcribed here by hand.

One update's LoRA gradient of every algorithm that trains with CFG is compared with the gradient of the released
per-timestep loss on the same trajectory and advantages. The transcription (the released files are cited at each
piece) is written from the released code, not from ours: one batched transformer call on [uncond; cond] with the
unconditional half detached (Flow-GRPO scripts/train_sd3.py:180-195 at ac4c86e), the released kernels'
log-densities (flow_grpo/diffusers_patch/sd3_sde_with_logprob.py:45-68; DanceGRPO fastvideo/train_grpo_flux.py:141-167),
the PPO ratio and clip, the KL on the means over the released std_dev_t (train_sd3.py:880-897), and the accumulation:
Flow-GRPO averages each timestep's loss over its micro-batch and accumulates over the trained timesteps
(train_sd3.py:360, 872-939); DanceGRPO / MixGRPO loop over single samples and divide each (sample, timestep)
loss by gradient_accumulation_steps * train_timesteps (DanceGRPO train_grpo_flux.py:570-611, MixGRPO
train_grpo_flux.py:540-608).
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import algorithms  # noqa: E402
import algorithms.base  # noqa: E402
from models.sd3 import SD3Model  # noqa: E402
from tests.adapter_training import MeanBrightness  # noqa: E402
from tests.test_models_sd3 import MAX_SEQ, RESOLUTION, sd3_dir  # noqa: E402,F401  (sd3_dir: the fixture)

PROMPTS = ["a photo of a cat", "two red dogs"]
GUIDANCE = 4.5
#: (algorithm, the released code whose loss it reproduces, extra config)
CASES = [
    ("flow_grpo", "flow_grpo", {"kl_beta": 0.04, "kl_variance": "release"}),
    ("flow_grpo_fast", "flow_grpo", {"kl_beta": 0.04, "kl_variance": "release"}),
    ("flow_grpo_fast", "flow_grpo", {"kl_beta": 0.04, "kl_variance": "release", "kernel": "cps", "noise_level": 0.8}),
    ("op_grpo", "flow_grpo", {"kl_beta": 0.04, "kl_variance": "release", "t_off": 3}),
    ("dance_grpo", "dance_grpo", {}),
    ("mix_grpo", "dance_grpo", {}),
    ("mix_grpo_flash", "dance_grpo", {}),
]


@pytest.fixture(scope="module")
def model(sd3_dir):  # noqa: F811
    return SD3Model(path=sd3_dir, resolution=RESOLUTION, max_sequence_length=MAX_SEQ, lora_rank=4, lora_alpha=8,
                    device="cpu")


@pytest.fixture
def lora(model):
    """Random LoRA weights (A and B non-zero, so the policy differs from the reference); restored afterwards."""
    state = model.trainable_state_dict()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    yield
    model.load_trainable_state_dict(state)


# ---- the released code, transcribed ---------------------------------------------------------------------------
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
    sigma, sigma_next = traj.sigmas[t], traj.sigmas[t + 1]
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

    log_prob, mean, std = kernel(released_velocity(model, x, sigma_b, cond, null, GUIDANCE, detach_uncond))
    ratio = torch.exp(log_prob - traj.log_probs[rows, t])
    a = adv[rows]
    loss = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - cfg.clip_range, 1 + cfg.clip_range))
    if cfg.kl_beta > 0:  # train_sd3.py:880-897 (std: the kernel's released std_dev_t)
        with torch.no_grad(), model.reference():
            _, ref_mean, _ = kernel(released_velocity(model, x, sigma_b, cond, null, GUIDANCE))
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


def separating_clip_range(model, traj, adv, cfg):
    """A clip range that clips about half of the trained pairs, in the widest gap of |ratio - 1| near the middle
    (so rounding cannot move a pair across the boundary)."""
    dev = []
    with torch.no_grad():
        for t in range(traj.num_steps):
            rows = traj.train[:, t].nonzero().flatten()
            if len(rows):
                dev.append((released_pair_loss(model, traj, adv, rows, t, cfg)[1] - 1).abs())
    dev = torch.cat(dev).sort().values
    lo, hi = len(dev) // 4, max(3 * len(dev) // 4, len(dev) // 4 + 1)
    gaps = dev[lo + 1: hi + 1] - dev[lo:hi]
    k = lo + int(gaps.argmax())
    assert float(dev[k + 1] - dev[k]) > 1e-3 * float(dev[k + 1])
    return float(dev[k] + dev[k + 1]) / 2


# ---- the tests ------------------------------------------------------------------------------------------------
def _ours_and_released(model, name, style, extra, detach_uncond=True):
    config = {"group_size": 2, "num_steps": 6, "guidance": GUIDANCE, "max_grad_norm": 0.0, "lr": 1e-4, **extra}
    alg = algorithms.get(name)(model, MeanBrightness(), config, seed=0)
    params = alg.model.trainable_parameters()
    seen = {}
    plain_update = alg.update

    def update(traj, advantages):
        # a later optimizer step: the policy has moved since the rollout, so ratios differ from 1 and some clip
        gen = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        alg.config.clip_range = separating_clip_range(model, traj, advantages, alg.config)
        seen["released"] = released_gradient(model, traj, advantages, alg.config, style, detach_uncond)
        alg.optimizer.step = lambda: seen.setdefault("ours", torch.cat([p.grad.flatten() for p in params]))
        return plain_update(traj, advantages)

    alg.update = update
    stats = alg.step(PROMPTS)
    return seen["ours"], seen["released"], stats


@pytest.mark.parametrize("name,style,extra", CASES, ids=[c[0] + ("_cps" if "kernel" in c[2] else "") for c in CASES])
def test_update_gradient_is_the_released_losss_gradient(model, lora, name, style, extra):
    ours, released, stats = _ours_and_released(model, name, style, extra)
    assert 0.2 < stats.clip_frac < 0.8  # both branches of the clipped surrogate are exercised
    assert float(released.norm()) > 0
    assert float((ours - released).norm() / released.norm()) < 1e-5


def test_cfg_grad_both_is_the_undetached_loss(model, lora):
    """``cfg_grad: both`` is the same loss with the unconditional branch carrying gradient (DanceGRPO's
    train_grpo_sd.py / train_grpo_wan_2_1.py form); it is a different gradient from the released Flow-GRPO one."""
    extra = {"kl_beta": 0.04, "kl_variance": "release", "cfg_grad": "both"}
    ours, undetached, _ = _ours_and_released(model, "flow_grpo", "flow_grpo", extra, detach_uncond=False)
    assert float((ours - undetached).norm() / undetached.norm()) < 1e-5
    detached, _, _ = _ours_and_released(model, "flow_grpo", "flow_grpo", {**extra, "cfg_grad": "cond"})
    assert float((detached - undetached).norm() / undetached.norm()) > 1e-2


def test_flow_grpo_recipe_second_optimizer_step_clips(model, monkeypatch):
    """Flow-GRPO's SD3 recipe steps the optimizer twice per rollout (config/grpo.py:48, gradient_accumulation_steps =
    num_batches_per_epoch / 2): the first step is on-policy (ratio 1), the second sees the moved policy and clips.

    Recipe values (config/grpo.py general_ocr_sd3: clip 1e-4, beta 0.04 with the released KL, global std, T = 10,
    timestep_fraction 0.99, CFG 4.5) except lr 1e-3 instead of 3e-4: on this 2-layer 16x16-latent pipeline one
    3e-4 step moves the per-dimension mean log-probabilities by at most 5e-5 (measured), inside the clip range."""
    state = model.trainable_state_dict()
    config = {"group_size": 4, "num_steps": 10, "guidance": GUIDANCE, "minibatches": 2, "clip_range": 1e-4,
              "kl_beta": 0.04, "kl_variance": "release", "adv_std": "batch", "lr": 1e-3, "timestep_fraction": 0.99}
    alg = algorithms.get("flow_grpo")(model, MeanBrightness(), config, seed=0)
    steps = [[]]  # per optimizer step: (clipped flags, log-prob differences) of every scored pair
    plain_loss = algorithms.base.ppo_clip_loss

    def spy(log_prob, old, adv, clip_range):
        terms = plain_loss(log_prob, old, adv, clip_range)
        steps[-1].append((terms.clipped.detach(), (log_prob - old).detach()))
        return terms

    plain_step = alg.optimizer.step

    def step(*args, **kwargs):
        steps.append([])
        return plain_step(*args, **kwargs)

    monkeypatch.setattr(algorithms.base, "ppo_clip_loss", spy)
    alg.optimizer.step = step
    try:
        stats = alg.step(PROMPTS)
    finally:
        model.load_trainable_state_dict(state)
    per_step = [(torch.cat([c for c, _ in s]).float().mean(), 0.5 * torch.cat([d for _, d in s]).square().mean())
                for s in steps[:-1]]
    assert len(per_step) == 2
    (clip1, kl1), (clip2, kl2) = per_step
    assert clip1 == 0 and kl1 < 1e-12  # on-policy
    assert clip2 > 0 and kl2 > 0
    assert stats.clip_frac == pytest.approx(float(clip2) / 2, abs=1e-6)  # equal halves: the mean of the two steps
