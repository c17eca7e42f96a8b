"""Flow-GRPO-Fast's shared ODE prefix: one prefix per group, the NFE of its formula, the same trajectories as the
unshared rollout, and the same numbers when a group is split over processes."""

import dataclasses

import pytest
import torch

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms.engine.distributed import SingleProcess
from flowzoo.algorithms.engine.rollout import branched_rollout

TOY = {"clip_range": 0.2, "lr": 1e-3, "kl_beta": 0.0}


def build(model, config=None, seed=0):
    return algorithms.get("flow_grpo_fast")(model, rewards.build("toy_mode"), {**TOY, **(config or {})}, seed=seed)


def expected_nfe(alg, prompts, prefixes=None):
    """docs/algorithms.md: sampling (s * P + (T - s) * B) * c, training E * k * c * B * w; ``prefixes`` is the
    number of prefixes run (P in one process)."""
    cfg, T, s = alg.config, alg.num_steps, alg.sde_window_start()
    c = alg.model.cfg_factor(cfg.guidance)
    k = 2 if cfg.kl_beta > 0 else 1
    samples = prompts * cfg.group_size
    prefixes = prompts if prefixes is None else prefixes
    k -= alg.keeps_rollout_graph()  # the recompute-free update (one epoch) runs no policy forward of its own
    return (s * prefixes + (T - s) * samples) * c, cfg.inner_epochs * k * c * samples * cfg.sde_window_size


@pytest.mark.parametrize("variant", [{}, {"guidance": 2.5, "kl_beta": 0.04, "inner_epochs": 2, "sde_window_size": 3}])
def test_measured_nfe_matches_the_formula(toy_model, toy_prompts, variant):
    alg = build(toy_model, {"group_size": 3, "shared_prefix": True, **variant}, seed=1)
    starts = set()
    for _ in range(6):
        expected = expected_nfe(alg, 4)
        starts.add(alg.sde_window_start())
        stats = alg.step(*toy_prompts)
        assert (stats.nfe_sampling, stats.nfe_training) == expected
    assert len(starts) > 1, "the formula must be checked at more than one window start"


def test_nfe_example_at_the_released_shape(toy_model):
    # SD3 fast_nocfg shape: T = 10, G = 24, window 3 at start 2, no CFG: 2 + 8 * 24 = 194 passes per prompt
    alg = build(toy_model, {"group_size": 24, "shared_prefix": True, "sde_window_size": 3, "guidance": 1.0,
                            "reuse_rollout_graph": False})  # the docs' formula: the update recomputes
    alg.iteration = next(i for i in range(100) if alg.sde_window_start(i) == 2)
    assert expected_nfe(alg, 1) == (194, 72)  # unshared: 10 * 24 = 240 sampling passes


def test_prefix_is_shared_and_matches_the_unshared_rollout(toy_model, toy_prompts):
    shared = build(toy_model, {"group_size": 4, "shared_prefix": True}, seed=2)
    assert shared.config.shared_noise  # the resolved config says the noise is shared
    plain = build(toy_model, {"group_size": 4, "shared_noise": True}, seed=2)
    for it in range(4):
        shared.iteration = plain.iteration = it
        s = shared.sde_window_start()
        a, b = shared.collect(*toy_prompts), plain.collect(*toy_prompts)
        torch.testing.assert_close(a.latents, b.latents, atol=1e-5, rtol=0)
        torch.testing.assert_close(a.log_probs, b.log_probs, atol=1e-4, rtol=0)
        assert torch.equal(a.train, b.train) and torch.equal(a.group, b.group)
        grouped = a.latents.reshape(4, 4, a.latents.shape[1], -1)  # [prompt, member, step, dim]
        assert (grouped[:, :, : s + 1] == grouped[:, :1, : s + 1]).all(), "members share the prefix exactly"
        assert (grouped[:, :, -1].std(1) > 0).all(), "the window still diversifies each group"


class Rank(SingleProcess):
    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size


def test_a_group_split_over_processes_gets_the_same_samples(toy_model, toy_prompts):
    prompts, meta = toy_prompts[0][:3], toy_prompts[1][:3]  # 3 prompts x G = 6: the middle group spans both ranks
    config = {"group_size": 6, "shared_prefix": True}
    whole = build(toy_model, config, seed=5)
    whole.iteration = next(i for i in range(100) if whole.sde_window_start(i) > 0)
    whole.model.nfe = 0
    single = whole.collect(prompts, meta)
    assert whole.model.nfe == expected_nfe(whole, 3)[0]
    parts, nfe = [], 0
    for rank in range(2):
        alg = build(toy_model, config, seed=5)
        alg.dist, alg.iteration = Rank(rank, 2), whole.iteration
        alg.model.nfe = 0
        parts.append(alg.collect(prompts, meta))
        nfe += alg.model.nfe
    torch.testing.assert_close(torch.cat([p.latents for p in parts]), single.latents, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat([p.log_probs for p in parts]), single.log_probs, atol=1e-4, rtol=0)
    assert torch.equal(torch.cat([p.group for p in parts]), single.group)
    assert nfe == expected_nfe(whole, 3, prefixes=4)[0]  # the split group runs its prefix on both ranks


def test_branched_rollout_refuses_what_it_cannot_share(toy_model, toy_prompts):
    alg = build(toy_model, {"group_size": 2})
    plan = alg.step_plan(8)
    start = int(plan.sde.nonzero()[0])
    cond = toy_model.encode(*toy_prompts).repeat_interleave(2)
    group = torch.arange(4).repeat_interleave(2)
    x = toy_model.initial_noise([torch.Generator().manual_seed(i) for i in range(8)])
    with pytest.raises(ValueError, match="do not share their initial latent"):
        branched_rollout(toy_model, cond, plan, x, [], group, start)
    x = x[::2].repeat_interleave(2, dim=0)
    every_step_sde = dataclasses.replace(plan, sde=torch.ones_like(plan.sde), train=torch.zeros_like(plan.train))
    with pytest.raises(ValueError, match="must be deterministic"):
        branched_rollout(toy_model, cond, every_step_sde, x, [], group, max(start, 1))


def test_shared_prefix_trains_and_resumes(toy_model, toy_prompts):
    from flowzoo import models

    alg = build(toy_model, {"group_size": 2, "shared_prefix": True})
    for _ in range(2):
        alg.step(*toy_prompts)
    resumed = build(models.get("toy2d")(), {"group_size": 2, "shared_prefix": True})
    resumed.load_state_dict(alg.state_dict())
    a, b = alg.step(*toy_prompts), resumed.step(*toy_prompts)
    assert a.extra["window_start"] == b.extra["window_start"]
    assert a.reward_mean == b.reward_mean and a.nfe == b.nfe
