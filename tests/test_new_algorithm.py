"""A throwaway algorithm defined here registers and trains on the toy tier, as docs/adding-an-algorithm.md says."""

from dataclasses import dataclass

import pytest
import torch

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms.base import Algorithm, AlgorithmConfig
from flowzoo.algorithms.plans import window_plan
from flowzoo.benchmark.experiments.loading import build_config
from flowzoo.errors import ConfigError


@dataclass
class LastStepsConfig(AlgorithmConfig):
    trained_tail: int = 3  # SDE and training on the last few steps before the final one


class LastStepsGRPO(Algorithm):
    name = "test_last_steps_grpo"
    Config = LastStepsConfig

    def step_plan(self, batch):
        start = self.num_steps - 1 - self.config.trained_tail
        return window_plan(self.sigmas, start, self.config.trained_tail, batch, self.config.kernel, self.config.noise_level)


@pytest.fixture(scope="module", autouse=True)
def registered():
    algorithms.REGISTRY.add(LastStepsGRPO.name, LastStepsGRPO)
    yield
    algorithms.REGISTRY._entries.pop(LastStepsGRPO.name)


def test_registers_validates_and_trains(toy_model, toy_prompts):
    assert "test_last_steps_grpo" in algorithms.names()
    config = build_config({"algorithm": {"name": "test_last_steps_grpo", "trained_tail": 2}})
    assert config.algorithm["trained_tail"] == 2 and config.algorithm["clip_range"] == 1e-4
    with pytest.raises(ConfigError, match="unknown key 'tail'"):
        build_config({"algorithm": {"name": "test_last_steps_grpo", "tail": 2}})

    prompts, meta = toy_prompts
    alg = algorithms.get("test_last_steps_grpo")(
        toy_model, rewards.build("toy_mode"), {"clip_range": 0.2, "lr": 1e-3, "kl_beta": 0.0, "group_size": 8}, seed=0
    )
    traj = alg.collect(prompts, meta)
    assert traj.sde.tolist() == [False] * 6 + [True] * 3 + [False]
    assert torch.equal(traj.log_probs[:, :6], torch.zeros(len(traj), 6))
    history = [alg.step(prompts * 2, meta * 2).reward_mean for _ in range(15)]
    assert history[-1] > history[0]
    recomputed = 0 if alg.keeps_rollout_graph() else len(prompts) * 8 * 3  # no KL: the policy forward, if recomputed
    assert alg.step(prompts, meta).nfe_training == recomputed
