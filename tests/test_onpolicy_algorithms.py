"""DanceGRPO, MixGRPO, MixGRPO-Flash(*) and Flow-GRPO-Fast: plans, windows, NFE, DPM-Solver++ and learning."""

import math

import pytest
import torch

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms.engine.plans import compressed_tail_sigmas
from flowzoo.algorithms.engine.rollout import rollout
from flowzoo.algorithms.engine.sde import dpm_solver_pp_2m_step, sigma_schedule
from flowzoo.algorithms.engine.trajectory import StepPlan
from flowzoo.errors import ConfigError
from flowzoo.models.base import Condition, FlowModel

TOY = {"clip_range": 0.2, "lr": 1e-3, "kl_beta": 0.0}
MINE = ["dance_grpo", "mix_grpo", "mix_grpo_flash", "mix_grpo_flash_star", "flow_grpo_fast"]
WHOLE = {"window_bound": "whole"}  # MixGRPO's window kept whole up to step T - 2 (tests/test_sigma_grid.py: released)


def build(name, model, config=None, seed=0):
    return algorithms.get(name)(model, rewards.build("toy_mode"), {**TOY, **(config or {})}, seed=seed)


def window_of(plan):
    """(start, size) of a plan whose SDE steps are one contiguous window trained by every sample."""
    steps = plan.sde.nonzero().flatten().tolist()
    assert steps == list(range(steps[0], steps[0] + len(steps))), f"SDE steps {steps} are not contiguous"
    assert torch.equal(plan.train, plan.sde.expand_as(plan.train)), "every sample must train exactly the window"
    return steps[0], len(steps)


# ---- MixGRPO's sliding window ---------------------------------------------------------------------------------
def starts(alg, iterations):
    return [alg.sde_window_start(i) for i in iterations]


def test_progressive_window_slides_every_tau_and_rolls_back(toy_model):
    alg = build("mix_grpo", toy_model, WHOLE)  # T = 10, w = 4: starts 0 .. 5
    assert alg.last_window_start == 5
    assert starts(alg, [0, 24, 25, 49, 50, 124, 125, 149, 150, 175]) == [0, 0, 1, 1, 2, 4, 5, 5, 0, 1]
    for it in (0, 30, 140):
        alg.iteration = it
        assert window_of(alg.step_plan(16)) == (alg.sde_window_start(it), 4)


def test_progressive_without_rollback_stays_at_the_end(toy_model):
    alg = build("mix_grpo", toy_model, {"window_rollback": False, "window_tau": 3, **WHOLE})
    assert starts(alg, [0, 2, 3, 15, 17, 18, 300]) == [0, 0, 1, 5, 5, 5, 5]


def test_progressive_stride_and_start(toy_model):
    alg = build("mix_grpo", toy_model, {"window_stride": 2, "window_tau": 1, "window_start": 1, **WHOLE})
    assert starts(alg, range(8)) == [1, 3, 5, 1, 3, 5, 1, 3]
    alg = build("mix_grpo", toy_model, {"window_stride": 2, "window_tau": 2, **WHOLE})
    assert starts(alg, range(8)) == [0, 0, 2, 2, 4, 4, 0, 0]


def test_fixed_window_never_moves(toy_model):
    alg = build("mix_grpo", toy_model, {"window_strategy": "fixed", "window_start": 3, "window_tau": 1})
    assert set(starts(alg, range(200))) == {3}


def test_random_window_is_uniform_in_range_and_reproducible(toy_model):
    alg = build("mix_grpo", toy_model, {"window_strategy": "random", **WHOLE}, seed=1)
    again = build("mix_grpo", toy_model, {"window_strategy": "random", **WHOLE}, seed=1)
    other = build("mix_grpo", toy_model, {"window_strategy": "random", **WHOLE}, seed=2)
    got = starts(alg, range(200))
    assert got == starts(again, range(200))
    assert got != starts(other, range(200))
    assert set(got) == set(range(6))  # every valid start, never one past L


def test_window_position_survives_resume(toy_model, toy_prompts):
    from flowzoo import models

    prompts, meta = toy_prompts
    alg = build("mix_grpo", toy_model, {"window_tau": 2, "group_size": 2})
    for _ in range(3):
        alg.step(prompts, meta)
    resumed = build("mix_grpo", models.get("toy2d")(), {"window_tau": 2, "group_size": 2})
    resumed.load_state_dict(alg.state_dict())
    assert resumed.sde_window_start() == alg.sde_window_start() == 1
    a, b = alg.step(prompts, meta), resumed.step(prompts, meta)
    assert a.extra["window_start"] == b.extra["window_start"] == 1
    assert a.reward_mean == b.reward_mean


def test_window_must_fit_before_the_last_step(toy_model):
    with pytest.raises(ConfigError, match="window_size"):
        build("mix_grpo", toy_model, {"window_size": 10})
    with pytest.raises(ConfigError, match="window_start"):
        build("mix_grpo", toy_model, {"window_start": 6, **WHOLE})


# ---- Flow-GRPO-Fast -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [2, 3])
def test_fast_window_is_drawn_per_iteration_within_range(toy_model, size):
    alg = build("flow_grpo_fast", toy_model, {"sde_window_size": size}, seed=3)
    seen = set()
    for it in range(100):
        alg.iteration = it
        start, got_size = window_of(alg.step_plan(8))
        assert got_size == size and 0 <= start and start + size <= 5  # range None -> T // 2 = 5
        seen.add(start)
    assert seen == set(range(5 - size + 1))
    again = build("flow_grpo_fast", toy_model, {"sde_window_size": size}, seed=3)
    assert starts(again, range(100)) == starts(alg, range(100))


def test_fast_window_range_and_cps_kernel(toy_model, toy_prompts):
    alg = build("flow_grpo_fast", toy_model, {"sde_window_range": 3, "kernel": "cps", "group_size": 2})
    assert set(starts(alg, range(100))) == {0, 1}
    plan = alg.step_plan(4)
    assert plan.kind == "cps"
    stats = alg.step(*toy_prompts)
    assert math.isfinite(stats.loss)
    with pytest.raises(ConfigError, match="does not fit"):
        build("flow_grpo_fast", toy_model, {"sde_window_range": 1}).step_plan(4)


# ---- DanceGRPO ------------------------------------------------------------------------------------------------
def test_dance_grpo_trains_random_60_percent_never_the_last(toy_model):
    alg = build("dance_grpo", toy_model)
    assert alg.config.kernel == "dance_grpo" and alg.config.noise_level == 0.3 and alg.config.kl_beta == 0.0
    counts = torch.zeros(10)
    for it in range(20):
        alg.iteration = it
        plan = alg.step_plan(32)
        assert plan.sde.all()
        assert (plan.train.sum(1) == int(9 * 0.6)).all()
        assert not plan.train[:, -1].any()
        assert len({tuple(row.tolist()) for row in plan.train}) > 1  # each sample draws its own subset
        counts += plan.train.sum(0)
    assert (counts[:-1] > 0).all() and counts[-1] == 0
    alg.iteration = 7
    again = build("dance_grpo", toy_model)
    again.iteration = 7
    assert torch.equal(alg.step_plan(32).train, again.step_plan(32).train)


@pytest.mark.parametrize("name", ["dance_grpo", "mix_grpo", "mix_grpo_flash"])
def test_shared_noise_within_group_distinct_across_groups(toy_model, toy_prompts, name):
    alg = build(name, toy_model, {"group_size": 4})
    traj = alg.collect(*toy_prompts)
    x1 = traj.latents[:, 0].reshape(4, 4, -1)  # [prompt, sample, dim]
    assert (x1 == x1[:, :1]).all(), "samples of one group must share the initial noise"
    firsts = x1[:, 0]
    assert torch.cdist(firsts, firsts)[~torch.eye(4, dtype=torch.bool)].min() > 1e-3
    assert (traj.final.reshape(4, 4, -1).std(1) > 0).all(), "the SDE must still diversify each group"


def test_flow_grpo_fast_noise_is_not_shared(toy_model, toy_prompts):
    traj = build("flow_grpo_fast", toy_model, {"group_size": 4}).collect(*toy_prompts)
    x1 = traj.latents[:, 0].reshape(4, 4, -1)
    assert (x1[:, 1:] != x1[:, :1]).any(-1).all()


# ---- MixGRPO-Flash and DPM-Solver++ ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, start, steps",
    [("mix_grpo_flash", 0, 3 + 8), ("mix_grpo_flash", 7, 10 + 5), ("mix_grpo_flash", 10, 13 + 4), ("mix_grpo_flash", 20, 23 + 2), ("mix_grpo_flash_star", 0, 3 + 4)],
)
def test_flash_step_count_and_sigmas(toy_model, name, start, steps):
    # T = 25, w = 4, last = start + 3: steps = last + max(int((T - 1 - last) * r), 2) (tests/test_sigma_grid.py:
    # the released count T - last)
    alg = build(name, toy_model, {"num_steps": 25, "shift": 3.0, "window_strategy": "fixed", "window_start": start,
                                  "compress_count": "remaining", **WHOLE})
    plan = alg.step_plan(8)
    assert plan.num_steps == steps
    assert window_of(plan) == (start, 4)
    last = start + 3
    assert torch.equal(plan.sigmas[: last + 2], alg.sigmas[: last + 2])  # the window sees the original sigmas
    assert plan.sigmas[-1] == 0 and (plan.sigmas[1:] < plan.sigmas[:-1]).all()
    assert plan.dpm_solver.tolist() == [False] * (last + 1) + [True] * (steps - last - 1)
    # the tail is evenly spaced in unshifted time t = s / (3 - 2 s)
    t = plan.sigmas[last + 1 :].double() / (3 - 2 * plan.sigmas[last + 1 :].double())
    torch.testing.assert_close(t.diff(), t.diff()[:1].expand(len(t) - 1), atol=1e-6, rtol=0)


def test_flash_star_is_frozen_with_ratio_02(toy_model):
    alg = build("mix_grpo_flash_star", toy_model)
    assert alg.config.compress_ratio == 0.2 and alg.config.window_strategy == "fixed"
    assert set(starts(alg, range(0, 1000, 25))) == {0}


def analytic_velocity(x, sigma):
    """A smooth, non-linear velocity field of (x, sigma), sigma broadcast from [B]."""
    s = sigma.reshape(-1, *([1] * (x.dim() - 1)))
    return torch.sin(1.3 * x) * (1 + s) + 0.4 * x * s - 0.7


def diffusers_dpm(sigmas, x, num_steps, shift):
    from diffusers import DPMSolverMultistepScheduler

    sched = DPMSolverMultistepScheduler(
        algorithm_type="dpmsolver++", solver_order=2, solver_type="midpoint", use_flow_sigmas=True,
        flow_shift=shift, prediction_type="flow_prediction", final_sigmas_type="zero", lower_order_final=True,
    )
    sched.set_timesteps(num_steps)
    if sigmas is not None:
        sched.sigmas = sigmas.clone()
    out = [x]
    for i, t in enumerate(sched.timesteps):
        v = analytic_velocity(x, sched.sigmas[i].expand(x.shape[0]))
        x = sched.step(v, t, x).prev_sample
        out.append(x)
    return sched.sigmas, torch.stack(out, 1)


@pytest.mark.parametrize("num_steps, shift, ours", [(10, 1.0, False), (25, 3.0, False), (25, 3.0, True), (7, 3.0, True)])
def test_dpm_solver_pp_2m_matches_diffusers(num_steps, shift, ours):
    x = torch.randn(6, 3, 2, generator=torch.Generator().manual_seed(0))
    sigmas, expected = diffusers_dpm(sigma_schedule(num_steps, shift) if ours else None, x, num_steps, shift)
    got, prev_x0, prev_sigma = [x], None, None
    for i in range(num_steps):
        s, s_next = sigmas[i].expand(6), sigmas[i + 1].expand(6)
        v = analytic_velocity(got[-1], s)
        got.append(dpm_solver_pp_2m_step(got[-1], v, s, s_next, prev_x0, prev_sigma))
        prev_x0, prev_sigma = got[-2] - s.reshape(-1, 1, 1) * v, s
    torch.testing.assert_close(torch.stack(got, 1), expected, atol=1e-5, rtol=0)
    # and it is genuinely second order: Euler on the same schedule is far from it
    euler = x
    for i in range(num_steps):
        euler = euler + analytic_velocity(euler, sigmas[i].expand(6)) * (sigmas[i + 1] - sigmas[i])
    assert (euler - expected[:, -1]).abs().max() > 1e-3


class AnalyticFlow(FlowModel):
    """A FlowModel whose velocity is :func:`analytic_velocity` (no parameters)."""

    latent_shape = (3, 2)

    def predict(self, x, sigma, cond):
        return analytic_velocity(x, sigma)


def test_rollout_dpm_steps_match_diffusers_and_keep_the_history():
    """A plan with DPM-Solver++ on every step reproduces diffusers; after an Euler prefix the first DPM step is
    already second order (it uses the data prediction of the step before)."""
    model = AnalyticFlow()
    x = torch.randn(5, 3, 2, generator=torch.Generator().manual_seed(1))
    sigmas = sigma_schedule(12, 3.0)
    cond = Condition({"c": torch.zeros(5)})
    no = torch.zeros(12, dtype=torch.bool)
    plan = StepPlan(sigmas, no, no.expand(5, -1), dpm_solver=torch.ones(12, dtype=torch.bool))
    latents, log_probs = rollout(model, cond, plan, x, [], guidance=1.0)
    _, expected = diffusers_dpm(sigmas, x, 12, 3.0)
    torch.testing.assert_close(latents, expected, atol=1e-5, rtol=0)
    assert (log_probs == 0).all() and model.nfe == 12 * 5

    mixed = StepPlan(sigmas, no, no.expand(5, -1), dpm_solver=torch.arange(12) >= 4)
    latents, _ = rollout(model, cond, mixed, x, [], guidance=1.0)
    x4, s = latents[:, 4], sigmas[3:6]
    x0_prev = latents[:, 3] - s[0] * analytic_velocity(latents[:, 3], s[0].expand(5))
    second = dpm_solver_pp_2m_step(x4, analytic_velocity(x4, s[1].expand(5)), s[1], s[2], x0_prev, s[0])
    first = dpm_solver_pp_2m_step(x4, analytic_velocity(x4, s[1].expand(5)), s[1], s[2])
    torch.testing.assert_close(latents[:, 5], second, atol=1e-6, rtol=0)
    assert (latents[:, 5] - first).abs().max() > 1e-5


def test_step_plan_rejects_dpm_on_sde_steps():
    sde = torch.tensor([True, False])
    with pytest.raises(ValueError, match="ODE steps only"):
        StepPlan(torch.tensor([1.0, 0.5, 0.0]), sde, sde.expand(2, -1), dpm_solver=torch.tensor([True, True]))


def test_compressed_tail_needs_a_step_after_the_window():
    with pytest.raises(ValueError, match="no step left"):
        compressed_tail_sigmas(sigma_schedule(10), 9, 0.4, 1.0)


# ---- every registered algorithm -------------------------------------------------------------------------------
def batch_invariant(model):
    """Evaluate ``predict`` one sample at a time. CPU GEMMs round differently for different batch sizes (~5e-7 on
    the toy MLP's velocity); an update that evaluates a per-step subset of rows (DanceGRPO) sees that noise amplified
    by 1/std^2 of the step, ~1e-6 in the log-prob. One sample per call makes rollout and update bit-identical, so the
    test checks the algorithm's bookkeeping (latents, sigmas, kernel, plan) rather than float32 GEMM blocking."""
    predict = model.predict

    def per_row(x, sigma, cond):
        return torch.cat([predict(x[i : i + 1], sigma[i : i + 1], cond.index([i])) for i in range(x.shape[0])])

    model.predict = per_row
    return model


@pytest.mark.parametrize("exact", [True, False], ids=["per-row", "batched"])
@pytest.mark.parametrize("name", algorithms.names())
def test_on_policy_first_update_ratio_is_one_at_every_trained_step(toy_model, toy_prompts, name, exact):
    if algorithms.get(name).likelihood_free:
        pytest.skip(f"{name} trains on the forward process of its samples: no log-probs, no ratio")
    alg = build(name, batch_invariant(toy_model) if exact else toy_model, {"group_size": 4, "clip_range": 1e-4})
    tol = 1e-6 if exact else 1e-4
    recorded = {}
    original = alg._step_terms

    def spy(traj, rows, t, live=None):
        out, kl = original(traj, rows, t, live)
        ratio = torch.exp(out.log_prob.detach() - traj.log_probs[rows, t])
        steps = torch.as_tensor(t).expand(len(rows))  # a fused tier scores all trained steps at once
        for step in steps.unique().tolist():
            recorded.setdefault(step, []).append(ratio[steps == step])
        recorded.setdefault("train", traj.train)
        return out, kl

    alg._step_terms = spy
    stats = alg.step(*toy_prompts)
    train = recorded.pop("train")
    assert set(recorded) == set(train.any(0).nonzero().flatten().tolist()) and recorded
    for t, ratios in recorded.items():
        ratio = torch.cat(ratios)
        assert len(ratio) == int(train[:, t].sum())
        torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=tol, rtol=0)
    assert abs(stats.ratio_mean - 1) < tol
    if exact:
        assert stats.clip_frac == 0.0


def expected_nfe(alg, samples):
    """The documented per-iteration formulas (docs/algorithms.md), written independently of the plans."""
    cfg, T = alg.config, alg.num_steps
    c = alg.model.cfg_factor(cfg.guidance)
    k = 2 if cfg.kl_beta > 0 else 1
    if alg.name == "flow_grpo":
        steps, trained = T, max(1, int(T * cfg.timestep_fraction))
    elif alg.name == "dance_grpo":
        steps, trained = T, max(1, int((T - 1) * cfg.timestep_fraction))
    elif alg.name == "mix_grpo":
        steps, trained = T, alg.window_steps()
    elif alg.name in ("mix_grpo_flash", "mix_grpo_flash_star"):
        last = alg.sde_window_start() + alg.window_steps() - 1
        counted = T - last if cfg.compress_count == "released" else T - 1 - last
        steps, trained = last + max(int(counted * cfg.compress_ratio), 2), alg.window_steps()
    elif alg.name == "flow_grpo_fast":
        steps, trained = T, cfg.sde_window_size
    else:
        pytest.skip(f"no NFE formula for {alg.name} here")
    k -= alg.keeps_rollout_graph()  # the recompute-free update (one epoch) runs no policy forward of its own
    return steps * samples * c, cfg.inner_epochs * k * c * samples * trained


@pytest.mark.parametrize("variant", [{}, {"guidance": 2.5, "kl_beta": 0.04, "inner_epochs": 2}])
@pytest.mark.parametrize("name", ["flow_grpo", *MINE])
def test_measured_nfe_matches_the_documented_formula(toy_model, toy_prompts, name, variant):
    alg = build(name, toy_model, {"group_size": 3, **variant})
    for _ in range(2):
        expected = expected_nfe(alg, 4 * 3)
        stats = alg.step(*toy_prompts)
        assert (stats.nfe_sampling, stats.nfe_training) == expected
        assert stats.nfe == sum(expected)


def test_nfe_examples_from_the_docs(toy_model):
    """MixGRPO at T = 25, w = 4: 25 sampling + 4 trained passes per sample; Flash at its first window: 11 + 4."""
    recompute = {"reuse_rollout_graph": False}  # the docs' formula: the update recomputes the policy forward
    alg = build("mix_grpo", toy_model, {"num_steps": 25, "shift": 3.0, **recompute})
    assert expected_nfe(alg, 1) == (25, 4)
    assert alg.step_plan(1).num_steps == 25 and int(alg.step_plan(1).train.sum()) == 4
    flash = build("mix_grpo_flash", toy_model, {"num_steps": 25, "shift": 3.0, **recompute})
    assert expected_nfe(flash, 1) == (11, 4) and flash.step_plan(1).num_steps == 11


@pytest.mark.parametrize("name", MINE)
def test_raises_the_toy_reward(toy_model, toy_prompts, name):
    prompts, meta = toy_prompts
    alg = build(name, toy_model, seed=0)
    rewards_seen = [alg.step(prompts * 2, meta * 2).reward_mean for _ in range(20)]
    first, last = sum(rewards_seen[:3]) / 3, sum(rewards_seen[-3:]) / 3
    assert last > first + 0.15, f"{name}: batch reward {first:.3f} -> {last:.3f}"


def test_fast_window_start_fixed_as_the_qwen_image_release_runs_it(toy_model):
    """The Qwen-Image release's window always starts at step 3 (random.seed(0) before every randint(0, 3)): its
    recipe fixes sde_window_start 3; SD3's draws it; a start that puts the window outside the range is refused."""
    import random

    from flowzoo.benchmark.config.recipes import recipe

    random.seed(0)
    assert random.randint(0, 10 // 2 - 2) == 3  # what the release computes on every call
    assert recipe("flow_grpo_fast", "qwen_pickscore", "qwen_image")["sde_window_start"] == "seed_0"
    assert "sde_window_start" not in recipe("flow_grpo_fast", "sd3_pickscore", "sd3")
    released = build("flow_grpo_fast", toy_model, {"sde_window_size": 2, "sde_window_start": "seed_0"})
    assert {released.sde_window_start(i) for i in range(20)} == {3}  # T = 10 on the toy tier: range 5
    fixed = build("flow_grpo_fast", toy_model, {"sde_window_size": 2, "sde_window_start": 1})
    assert {fixed.sde_window_start(i) for i in range(20)} == {1}
    drawn = build("flow_grpo_fast", toy_model, {"sde_window_size": 2})
    assert len({drawn.sde_window_start(i) for i in range(20)}) > 1
    from flowzoo.algorithms.methods.flow_grpo_fast import FlowGRPOFastConfig

    with pytest.raises(ConfigError, match="sde_window_start 4 puts the window outside the first 5 of 10 steps"):
        FlowGRPOFastConfig(sde_window_size=2, sde_window_start=4).check_num_steps(10)
