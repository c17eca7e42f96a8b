"""The update on a tiny random SD3 pipeline against the released training code, transcribed by hand in
``benchmark/perf/reference.py`` (shared with ``flowzoo perf``; the released files are cited there at each piece).

One update's LoRA gradient of every algorithm that trains with CFG is compared with the gradient of the released
per-timestep loss on the same trajectory and advantages.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from flowzoo import algorithms  # noqa: E402
import flowzoo.algorithms.engine.base  # noqa: E402
from flowzoo.models.sd3 import SD3Model  # noqa: E402
from flowzoo.benchmark.perf.reference import released_gradient, released_pair_loss  # noqa: E402,F401
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
    # the update below stands for a later optimizer step (the policy moved after the rollout): the rollout's graphs
    # cannot serve it, so the update recomputes
    config = {"group_size": 2, "num_steps": 6, "guidance": GUIDANCE, "max_grad_norm": 0.0, "lr": 1e-4,
              "reuse_rollout_graph": False, **extra}
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
    plain_loss = flowzoo.algorithms.engine.base.ppo_clip_loss

    def spy(log_prob, old, adv, clip_range):
        terms = plain_loss(log_prob, old, adv, clip_range)
        steps[-1].append((terms.clipped.detach(), (log_prob - old).detach()))
        return terms

    plain_step = alg.optimizer.step

    def step(*args, **kwargs):
        steps.append([])
        return plain_step(*args, **kwargs)

    monkeypatch.setattr(flowzoo.algorithms.engine.base, "ppo_clip_loss", spy)
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
