"""DiffusionNFT against its release (NVlabs/DiffusionNFT at 24af555, scripts/train_nft_sd3.py): the loss on fixed
tensors and one update's gradient against a hand transcription of the released lines, the old policy's decay schedule,
r's clamp, sampling from the old policy, NFE, resume, learning on the toy tier and the sd3 gradient (training on the
sd3 / wan adapters: tests/test_models_sd3.py and test_models_wan.py, parametrized over algorithms)."""

from __future__ import annotations

import io
import math

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms.methods.diffusion_nft import old_policy_decay
from flowzoo.algorithms.engine.losses import nft_loss, nft_optimality
from flowzoo.algorithms.engine.rollout import sample_generators
from flowzoo.errors import ConfigError, FlowZooError
from flowzoo.streams import DIFFUSION_NFT_FORWARD
from tests.adapter_training import needs_diffusers, random_lora_sd3

TOY = {"group_size": 4, "lr": 1e-3, "kl_beta": 0.0}


def build(model, config=None, seed=0, reward="toy_mode"):
    return algorithms.get("diffusion_nft")(model, rewards.build(reward), {**TOY, **(config or {})}, seed=seed)


# ---- the released code, transcribed by hand ---------------------------------------------------------------------
def released_return_decay(step, decay_type):
    """train_nft_sd3.py:169-189."""
    if decay_type == 0:
        flat, uprate, uphold = 0, 0.0, 0.0
    elif decay_type == 1:
        flat, uprate, uphold = 0, 0.001, 0.5
    elif decay_type == 2:
        flat, uprate, uphold = 75, 0.0075, 0.999
    else:
        assert False
    if step < flat:
        return 0.0
    decay = (step - flat) * uprate
    return min(decay, uphold)


def released_loss(forward_prediction, old_prediction, ref_forward_prediction, xt, x0, t, advantages, beta,
                  adv_clip_max, train_beta):
    """train_nft_sd3.py:864-970 on one micro-batch at one timestep (adv_mode "all"): the scalar loss."""
    t_expanded = t.view(-1, *([1] * (len(x0.shape) - 1)))
    advantages_clip = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    normalized_advantages_clip = (advantages_clip / adv_clip_max) / 2.0 + 0.5
    r = torch.clamp(normalized_advantages_clip, 0, 1)
    positive_prediction = beta * forward_prediction + (1 - beta) * old_prediction.detach()
    implicit_negative_prediction = (1.0 + beta) * old_prediction.detach() - beta * forward_prediction
    x0_prediction = xt - t_expanded * positive_prediction
    with torch.no_grad():
        weight_factor = (torch.abs(x0_prediction.double() - x0.double())
                         .mean(dim=tuple(range(1, x0.ndim)), keepdim=True).clip(min=0.00001))
    positive_loss = ((x0_prediction - x0) ** 2 / weight_factor).mean(dim=tuple(range(1, x0.ndim)))
    negative_x0_prediction = xt - t_expanded * implicit_negative_prediction
    with torch.no_grad():
        negative_weight_factor = (torch.abs(negative_x0_prediction.double() - x0.double())
                                  .mean(dim=tuple(range(1, x0.ndim)), keepdim=True).clip(min=0.00001))
    negative_loss = ((negative_x0_prediction - x0) ** 2 / negative_weight_factor).mean(dim=tuple(range(1, x0.ndim)))
    ori_policy_loss = r * positive_loss / beta + (1.0 - r) * negative_loss / beta
    policy_loss = (ori_policy_loss * adv_clip_max).mean()
    loss = policy_loss
    kl_div_loss = ((forward_prediction - ref_forward_prediction) ** 2).mean(dim=tuple(range(1, x0.ndim)))
    loss += train_beta * torch.mean(kl_div_loss)
    return loss


def _set(params, values):
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)


def released_gradient(model, traj, advantages, cfg, old_weights, num_steps, seed, iteration):
    """The gradient of one optimizer step over the whole batch (one micro-batch, gradient accumulation over the
    K timesteps, train_nft_sd3.py:800-987), with the zoo's draws: each sample's generator gives its permutation of
    the T sampling steps (the first K trained, :810-816) and then its K noises (:868)."""
    params = model.trainable_parameters()
    trained = [p.detach().clone() for p in params]
    k = int(num_steps * cfg.timestep_fraction)
    x0 = traj.final.float()
    gens = sample_generators(seed, iteration, DIFFUSION_NFT_FORWARD, count=len(traj))
    perms, noises = [], []
    for g in gens:
        perms.append(torch.randperm(num_steps, generator=g))
        noises.append(torch.randn((k, *x0.shape[1:]), generator=g))
    timesteps = traj.sigmas[:-1][torch.stack(perms)] * 1000.0  # the scheduler's timesteps, shuffled per sample
    noise = torch.stack(noises)
    for p in params:
        p.grad = None
    for j in range(k):
        t = timesteps[:, j] / 1000.0
        xt = (1 - t.view(-1, *([1] * (x0.dim() - 1)))) * x0 + t.view(-1, *([1] * (x0.dim() - 1))) * noise[:, j]
        _set(params, old_weights)  # the "old" adapter
        with torch.no_grad():
            old_prediction = model.predict(xt, t, traj.cond).detach()
        _set(params, trained)  # the "default" adapter
        forward_prediction = model.predict(xt, t, traj.cond)
        with torch.no_grad(), model.reference():
            ref_forward_prediction = model.predict(xt, t, traj.cond)
        loss = released_loss(forward_prediction, old_prediction, ref_forward_prediction, xt, x0, t, advantages,
                             cfg.nft_beta, cfg.adv_clip, cfg.kl_beta)
        (loss / k).backward()
    grad = torch.cat([p.grad.flatten() for p in params])
    for p in params:
        p.grad = None
    return grad


# ---- the loss on fixed tensors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("beta, kl_beta", [(1.0, 1e-4), (0.1, 0.04), (0.5, 0.0)])
def test_loss_value_and_gradient_equal_the_released_formula(beta, kl_beta):
    gen = torch.Generator().manual_seed(3)
    shape = (6, 4, 3, 3)
    x0, noise = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    t = torch.tensor([0.05, 0.3, 0.5, 0.7, 0.9, 1.0])
    xt = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * noise
    v_old = noise - x0 + 0.3 * torch.randn(shape, generator=gen)
    v_ref = noise - x0 + 0.3 * torch.randn(shape, generator=gen)
    v = (v_old + 0.2 * torch.randn(shape, generator=gen)).requires_grad_(True)
    advantages = torch.tensor([-7.0, -5.0, -1.3, 0.0, 2.2, 9.0])  # beyond the clip on both sides
    ours = nft_loss(v, v_old, v_ref, xt, x0, t, advantages, beta, 5.0, kl_beta)
    (grad_ours,) = torch.autograd.grad(ours.loss.mean(), v)
    released = released_loss(v, v_old, v_ref, xt, x0, t, advantages, beta, 5.0, kl_beta)
    (grad_released,) = torch.autograd.grad(released, v)
    assert ours.loss.dtype == torch.float64 and released.dtype == torch.float64
    # the KL term is float32, summed in another order
    torch.testing.assert_close(ours.loss.mean(), released, rtol=1e-9, atol=0)
    torch.testing.assert_close(grad_ours, grad_released, rtol=1e-5, atol=1e-8)  # float32 gradients
    torch.testing.assert_close(ours.kl, ((v - v_ref) ** 2).mean(dim=(1, 2, 3)))


def test_loss_without_a_reference_has_no_kl():
    x0 = torch.randn(3, 2)
    v = torch.randn(3, 2)
    terms = nft_loss(v, v, None, x0, x0, torch.full((3,), 0.5), torch.zeros(3), 1.0, 5.0, 0.0)
    assert torch.equal(terms.kl, torch.zeros(3))


def test_r_is_the_clamped_affine_map_of_the_advantage():
    adv = torch.tensor([-100.0, -5.0, -2.5, 0.0, 2.5, 5.0, 100.0])
    assert nft_optimality(adv, 5.0).tolist() == [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert nft_optimality(torch.tensor([-1.0, 1.0, 3.0]), 2.0).tolist() == [0.25, 0.75, 1.0]


# ---- the old policy -------------------------------------------------------------------------------------------------
def test_decay_schedules_equal_the_released_return_decay():
    for decay_type in (0, 1, 2):
        for step in range(0, 1500):
            assert old_policy_decay(step, decay_type) == released_return_decay(step, decay_type), (decay_type, step)
    assert old_policy_decay(74, 2) == 0.0 and old_policy_decay(76, 2) == pytest.approx(0.0075)
    assert old_policy_decay(10**6, 1) == 0.5 and old_policy_decay(10**6, 2) == 0.999
    with pytest.raises(ValueError, match="decay_type"):
        old_policy_decay(3, 3)


@pytest.mark.parametrize("decay_type", [1, 2])
def test_old_policy_follows_the_released_update_over_50_iterations(toy_model, toy_prompts, decay_type):
    # two optimizer steps per iteration: after iteration i the release's global_step is 2 (i + 1) (:1021, :1035)
    alg = build(toy_model, {"decay_type": decay_type, "minibatches": 2, "group_size": 2})
    prompts = (toy_prompts[0][:2], toy_prompts[1][:2])
    params = toy_model.trainable_parameters()
    expected = [p.detach().clone() for p in params]  # old = theta at the start (:576-579)
    for i in range(50):
        alg.step(*prompts)
        decay = released_return_decay(2 * (i + 1), decay_type)
        expected = [e * decay + p.detach().clone() * (1.0 - decay) for e, p in zip(expected, params)]
        assert alg.logged["old_decay"] == decay
        for old, e in zip(alg.old_policy.weights, expected):
            torch.testing.assert_close(old, e, rtol=0, atol=0)
    assert alg.optimizer_steps == 100


def test_decay_type_0_keeps_the_old_policy_equal_to_the_trained_one(toy_model, toy_prompts):
    alg = build(toy_model, {"decay_type": 0})
    for _ in range(2):
        alg.step(*toy_prompts)
        for old, p in zip(alg.old_policy.weights, toy_model.trainable_parameters()):
            assert torch.equal(old, p.detach())


def _perturb_old(alg, scale=0.05, seed=9):
    gen = torch.Generator().manual_seed(seed)
    alg.old_policy.weights = [w + scale * torch.randn(w.shape, generator=gen) for w in alg.old_policy.weights]


def test_rollout_samples_the_old_policy_and_restores_the_trained_weights(toy_model, toy_prompts):
    alg = build(toy_model)
    _perturb_old(alg)
    trained = [p.detach().clone() for p in toy_model.trainable_parameters()]
    traj = alg.collect(*toy_prompts)
    assert all(torch.equal(p, t) for p, t in zip(toy_model.trainable_parameters(), trained))
    assert not traj.train.any() and not traj.sde.any()  # nothing recorded for training: no log-probs
    _set(toy_model.trainable_parameters(), alg.old_policy.weights)
    by_old = alg.fresh_rollout(*toy_prompts)
    _set(toy_model.trainable_parameters(), trained)
    assert torch.equal(traj.final, by_old.final)
    assert not torch.equal(alg.fresh_rollout(*toy_prompts).final, traj.final)  # the trained weights differ


def test_the_dpm2_rollout_is_the_released_dpm2_solver(toy_model, toy_prompts):
    """solver.py:207-260 (order 2): DDIM at the first and last step, the multistep second-order update between."""
    alg = build(toy_model, {"num_steps": 6})
    traj = alg.collect(*toy_prompts)
    sigmas = traj.sigmas.double()
    z = traj.latents[:, 0].float()
    outputs = []
    for i in range(6):
        with torch.no_grad():
            x0_pred = z - sigmas[i].float() * toy_model.velocity(z, sigmas[i].float().expand(len(z)), traj.cond)
        outputs.append(x0_pred)
        t, s = sigmas[i + 1], sigmas[i]
        if i == 0 or i == 5:  # ddim_update with eta 0
            noise_pred = (z - (1 - s) * x0_pred) / s
            z = ((1 - t) * x0_pred + t * noise_pred).float()
        else:  # multistep_dpm_solver_second_order_update
            s1 = sigmas[i - 1]
            lam = lambda x: torch.log(1 - x) - torch.log(x)  # noqa: E731
            h, h_0 = lam(t) - lam(s), lam(s) - lam(s1)
            d0, d1 = outputs[-1], (1.0 / (h_0 / h)) * (outputs[-1] - outputs[-2])
            z = ((t / s) * z - ((1 - t) * (torch.exp(-h) - 1.0)) * d0
                 - 0.5 * ((1 - t) * (torch.exp(-h) - 1.0)) * d1).float()
    torch.testing.assert_close(traj.final, z, rtol=1e-5, atol=1e-5)


# ---- one update against the transcription ---------------------------------------------------------------------------
def _ours_and_released(model, prompts, config, metadata=None):
    alg = algorithms.get("diffusion_nft")(model, rewards_for(model), {"max_grad_norm": 0.0, **config}, seed=0)
    _perturb_old(alg, scale=0.02)  # an old policy that differs from the trained one
    params = model.trainable_parameters()
    seen = {}
    plain_update = alg.update

    def update(traj, advantages):
        seen["released"] = released_gradient(model, traj, advantages, alg.config, alg.old_policy.weights,
                                             alg.num_steps, alg.seed, alg.iteration)
        alg.optimizer.step = lambda: seen.setdefault("ours", torch.cat([p.grad.flatten() for p in params]))
        return plain_update(traj, advantages)

    alg.update = update
    stats = alg.step(prompts, metadata)
    return seen["ours"], seen["released"], stats


def rewards_for(model):
    if model.sample_kind == "points":
        return rewards.build("toy_mode")
    from tests.adapter_training import MeanBrightness

    return MeanBrightness()


def test_toy_update_gradient_is_the_released_gradient(toy_model, toy_prompts):
    ours, released, stats = _ours_and_released(
        toy_model, toy_prompts[0], {"group_size": 4, "kl_beta": 0.04, "nft_beta": 0.3}, toy_prompts[1])
    assert float(released.norm()) > 0
    assert float((ours - released).norm() / released.norm()) < 1e-5


# ---- NFE, learning, resume, config ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", [
    {}, {"guidance": 2.5, "kl_beta": 0.04, "inner_epochs": 2, "timestep_fraction": 0.5}])
def test_nfe_counts_sampling_and_every_training_forward(toy_model, toy_prompts, variant):
    alg = build(toy_model, variant)
    stats = alg.step(*toy_prompts)
    cfg, b, t = alg.config, len(toy_prompts[0]) * alg.config.group_size, alg.num_steps
    c = toy_model.cfg_factor(cfg.guidance)
    k = max(1, int(t * cfg.timestep_fraction))
    forwards = 3 if cfg.kl_beta > 0 else 2  # current, old, reference
    assert stats.nfe_sampling == t * b * c
    assert stats.nfe_training == cfg.inner_epochs * forwards * c * b * k


def test_a_few_steps_raise_the_toy_reward(toy_model, toy_prompts):
    alg = build(toy_model, {"group_size": 8})
    means = [alg.step(*toy_prompts).reward_mean for _ in range(12)]
    assert sum(means[-3:]) / 3 > sum(means[:3]) / 3 + 0.05, means


def _state_bytes(alg):
    buffer = io.BytesIO()
    torch.save(alg.state_dict(), buffer)
    buffer.seek(0)
    return buffer


def test_resume_is_bit_identical(toy_prompts):
    config = {"decay_type": 1, "minibatches": 2, "inner_epochs": 2, "kl_beta": 0.01, "ema": True, "ema_every": 1}
    straight = build(models.get("toy2d")(), config)
    rows = [straight.step(*toy_prompts).row() for _ in range(4)]
    first = build(models.get("toy2d")(), config)
    for _ in range(2):
        first.step(*toy_prompts)
    resumed = build(models.get("toy2d")(), config)
    resumed.load_state_dict(torch.load(_state_bytes(first), weights_only=False))
    assert resumed.optimizer_steps == 8
    later = [resumed.step(*toy_prompts).row() for _ in range(2)]
    timing = ("t_sampling", "t_reward", "t_training")
    for a, b in zip(rows[2:], later):
        assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
    for x, y in zip(straight.model.trainable_parameters(), resumed.model.trainable_parameters()):
        assert torch.equal(x, y)
    for x, y in zip(straight.old_policy.weights, resumed.old_policy.weights):
        assert torch.equal(x, y)


def test_a_checkpoint_without_the_old_policy_is_refused(toy_model, toy_prompts):
    other = algorithms.get("flow_grpo")(toy_model, rewards.build("toy_mode"), TOY, seed=0)
    with pytest.raises(FlowZooError, match="old policy"):
        build(toy_model).load_state_dict(other.state_dict())


@pytest.mark.parametrize("bad, message", [
    ({"nft_beta": 0.0}, "nft_beta must be in \\(0, 1\\]"),
    ({"nft_beta": 1.5}, "nft_beta must be in \\(0, 1\\]"),
    ({"nft_beta": math.nan}, "nft_beta"),
    ({"decay_type": 3}, "decay_type"),
    ({"solver": "rk4"}, "solver"),
    ({"adv_clip": 0.0}, "adv_clip must be > 0"),
    ({"reuse_rollout_graph": True}, "reuse_rollout_graph"),
])
def test_bad_values_are_one_line_config_errors(toy_model, bad, message):
    with pytest.raises(ConfigError, match=message) as error:
        build(toy_model, bad)
    assert "\n" not in str(error.value)


def test_cli_trains_and_logs_the_diagnostics(tmp_path):
    from flowzoo.benchmark.cli import main

    run = tmp_path / "run"
    code = main(["train", "benchmark/configs/toy_flow_grpo.yaml", "algorithm.name=diffusion_nft", "train.steps=2",
                 f"run_dir={run}"])
    assert code in (0, None)
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"old_decay", "old_deviation", "nft_r_mean"} <= set(header)


# ---- the diffusers adapters (tiny random SD3 and Wan pipelines) ----------------------------------------------


@pytest.fixture(scope="module")
def sd3_model(tmp_path_factory):
    return random_lora_sd3(tmp_path_factory, "nft")


@needs_diffusers
def test_sd3_update_gradient_is_the_released_gradient(sd3_model):
    state = sd3_model.trainable_state_dict()
    try:
        ours, released, stats = _ours_and_released(
            sd3_model, ["a photo of a cat", "two red dogs"],
            {"group_size": 2, "num_steps": 4, "guidance": 1.0, "kl_beta": 1e-4, "nft_beta": 1.0, "lr": 1e-4})
    finally:
        sd3_model.load_trainable_state_dict(state)
    assert float(released.norm()) > 0
    assert float((ours - released).norm() / released.norm()) < 1e-5
    assert stats.nfe_training == 3 * 4 * 3  # current, old and reference at int(4 * .99) = 3 timesteps, 4 samples


@pytest.mark.parametrize("algorithm", ["diffusion_nft", "awm"])
def test_micro_batches_change_memory_not_the_update(toy_prompts, algorithm):
    """``micro_batch`` splits the forwards; the gradient is the same sum (to float rounding)."""
    from tests import test_awm

    make = build if algorithm == "diffusion_nft" else test_awm.build  # each with its toy recipe
    grads = []
    for micro in (None, 3):
        alg = make(models.get("toy2d")(), {"kl_beta": 0.04, "micro_batch": micro, "max_grad_norm": 0.0})
        params = alg.model.trainable_parameters()
        alg.optimizer.step = lambda: grads.append(torch.cat([p.grad.flatten() for p in params]))
        alg.step(*toy_prompts)
    assert float((grads[0] - grads[1]).norm() / grads[0].norm()) < 1e-5


@pytest.mark.parametrize("algorithm", ["diffusion_nft", "awm"])
def test_runner_resume_after_kill_gives_identical_metrics(tmp_path, monkeypatch, algorithm):
    """The runner's checkpoint carries the decoupled methods' weight copies: a run killed after its step-2 checkpoint
    and resumed writes the metrics of an uninterrupted one (as tests/test_cli.py checks for Flow-GRPO)."""
    import pandas as pd
    import yaml

    from flowzoo.benchmark.run.checkpoints import seal
    from flowzoo.benchmark.cli import main
    from flowzoo.benchmark.config.schema import resolved_dict
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.benchmark.run.runner import TIMING_COLUMNS, Runner

    config = "benchmark/configs/toy_flow_grpo.yaml"
    fast = ["train.steps=4", "train.prompts_per_step=4", "train.eval_every=2", "train.eval_samples_per_prompt=8",
            "train.save_samples=false", "algorithm.group_size=4", f"algorithm.name={algorithm}",
            "algorithm.kl_beta=0.01", "train.checkpoint_every=2"]
    full = tmp_path / "full"
    assert main(["train", config, *fast, f"run_dir={full}", "--quiet"]) == 0
    partial = tmp_path / "partial"
    cfg = load_config(config, [*fast, f"run_dir={partial}"])
    cfg.train.steps = 2  # a run killed after its step-2 checkpoint
    Runner(cfg, progress=False).run()
    (partial / "done.json").unlink()
    cfg_full = load_config(config, [*fast, f"run_dir={partial}"])
    state = torch.load(partial / "checkpoint.pt", weights_only=False)
    torch.save(seal(state, cfg_full), partial / "checkpoint.pt")
    (partial / "config.yaml").write_text(yaml.safe_dump(resolved_dict(cfg_full), sort_keys=False))
    cls, loaded = algorithms.get(algorithm), []
    plain = cls.load_extra_state
    monkeypatch.setattr(cls, "load_extra_state", lambda self, extra: loaded.append(extra) or plain(self, extra))
    assert main(["train", config, *fast, f"run_dir={partial}", "--quiet"]) == 0
    assert len(loaded) == 1 and loaded[0]["optimizer_steps"] == 2  # resumed from step 2, its copy restored

    def deterministic(path):
        frame = pd.read_csv(path / "metrics.csv")
        return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame])

    pd.testing.assert_frame_equal(deterministic(full), deterministic(partial))
