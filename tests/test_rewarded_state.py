"""Which state of a trajectory the reward decodes, per algorithm, at the value level on the toy tier.

Released: DanceGRPO's trainers decode the last step's data prediction ``pred_original = x_{T-1} - sigma_{T-1} v``
after their sampling loop (XueZeyue/DanceGRPO fastvideo/train_grpo_flux_lora.py:192, train_grpo_flux.py:254,
train_grpo_wan_2_1.py:219); Flow-GRPO decodes the final latents of its pipeline
(flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py:178-180 at ac4c86e); MixGRPO decodes the final ``z`` unless
``--drop_last_sample`` is given, which its scripts leave commented out (Tencent-Hunyuan/MixGRPO
fastvideo/utils/sampling_utils.py:149-152, scripts/finetune/finetune_flux_grpo_MixGRPO.sh:197).
"""

import dataclasses

import pytest
import torch

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms.engine.sde import sde_step

TOY = {"clip_range": 0.2, "lr": 1e-3, "kl_beta": 0.0, "group_size": 4}


def build(name, model, config=None):
    return algorithms.get(name)(model, rewards.build("toy_mode"), {**TOY, **(config or {})}, seed=0)


def scored(alg, prompts):
    traj = alg.collect(*prompts)
    alg.score(traj)
    return traj


def test_dance_grpo_rewards_the_last_steps_data_prediction(toy_model, toy_prompts):
    alg = build("dance_grpo", toy_model)
    traj = scored(alg, toy_prompts)
    T = traj.num_steps
    x, sigma = traj.latents[:, T - 1], traj.sigmas[T - 1]
    # the linspace grid at the toy's shift 1: sigma_{T-1} = 1 / T, the last nonzero sigma
    assert float(sigma) == pytest.approx(1 / T) and float(traj.sigmas[T]) == 0
    with torch.no_grad():
        v = toy_model.velocity(x, sigma.expand(len(traj)), traj.cond, alg.config.guidance)
    expected = toy_model.decode(x - sigma * v)
    torch.testing.assert_close(traj.samples, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(traj.rewards, alg.reward(expected, traj.prompts, traj.metadata).score)
    # the final SDE sample is still recorded (and is the last transition's endpoint), but it is not what is rewarded:
    # it differs from the prediction by the last step's noise, std eta sqrt(sigma_{T-1})
    gap = (traj.final - (x - sigma * v)).std()
    assert float(gap) == pytest.approx(alg.config.noise_level * float(sigma) ** 0.5, rel=0.3)
    with torch.no_grad():
        step = sde_step(x, v, sigma.expand(len(traj)), traj.sigmas[T].expand(len(traj)), kind=traj.kind,
                        noise_level=traj.noise_level, prev_sample=traj.final)
    torch.testing.assert_close(step.log_prob, traj.log_probs[:, T - 1])


def test_dance_grpo_sample_option_rewards_the_final_sample(toy_model, toy_prompts):
    traj = scored(build("dance_grpo", toy_model, {"rewarded": "sample"}), toy_prompts)
    assert traj.prediction is None
    torch.testing.assert_close(traj.samples, toy_model.decode(traj.final), atol=0, rtol=0)


def test_dance_grpo_step_reward_is_the_predictions_reward(toy_model, toy_prompts):
    # the whole iteration: its logged reward is the reward of the decoded predictions of the same rollout
    alg = build("dance_grpo", toy_model)
    traj = alg.collect(*toy_prompts)
    fresh = build("dance_grpo", toy_model)  # same seed and iteration: the same rollout
    stats = fresh.step(*toy_prompts)
    score = alg.reward(toy_model.decode(traj.prediction), traj.prompts, traj.metadata).score
    assert stats.reward_mean == pytest.approx(float(score.mean()), abs=1e-6)


@pytest.mark.parametrize("name", [n for n in algorithms.names() if n != "dance_grpo"])
def test_every_other_algorithm_rewards_its_final_sample(toy_model, toy_prompts, name):
    traj = scored(build(name, toy_model), toy_prompts)
    assert traj.decode == "sample" and traj.prediction is None
    torch.testing.assert_close(traj.samples, toy_model.decode(traj.final), atol=0, rtol=0)


def test_a_trajectory_without_its_prediction_refuses_to_be_rewarded(toy_model, toy_prompts):
    traj = build("dance_grpo", toy_model).collect(*toy_prompts)
    assert traj.decode == "prediction"
    with pytest.raises(ValueError, match="did not record"):
        _ = dataclasses.replace(traj, prediction=None).rewarded


def test_select_and_cat_keep_each_samples_prediction(toy_model, toy_prompts):
    traj = build("dance_grpo", toy_model).collect(*toy_prompts)
    head, tail = traj.select([0, 1, 2]), traj.select(range(3, len(traj)))
    torch.testing.assert_close(head.rewarded, traj.prediction[:3])
    joined = type(traj).cat([head, tail])
    torch.testing.assert_close(joined.rewarded, traj.prediction)
    other = build("flow_grpo", toy_model).collect(*toy_prompts)
    with pytest.raises(ValueError, match="decoded states"):
        same_grid = dataclasses.replace(other.plan, sigmas=traj.sigmas, sde=traj.sde, kind=traj.kind,
                                        noise_level=traj.noise_level)
        type(traj).cat([traj, dataclasses.replace(other, plan=same_grid)])
