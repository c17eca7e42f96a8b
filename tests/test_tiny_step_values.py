"""The correctness asserts of the benchmark-marked tiny-tier timings (tests/test_bench_tiny.py, skipped by the default
``--benchmark-skip``), on a small random tiny config so that the default test run checks them: with CFG a rollout
costs 2 passes per sample and step, the first update is on-policy (ratio 1, nothing clipped at the recipe's clip
range 1e-4), and with ``reuse_rollout_graph`` (the shipped tiny recipe) the update runs no forward pass of its own."""

from __future__ import annotations

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo.models.tiny_data import prompt_set
from flowzoo.rewards.base import Reward, RewardOutput

SMALL = dict(layers=2, heads=2, head_dim=8, text_width=16, text_layers=1, text_heads=2)
PROMPTS = prompt_set("shapes", 2, seed=1)
G, T, TRAINED = 4, 4, 2  # timestep_fraction 0.5: int(4 * 0.5) = 2 trained steps


class Brightness(Reward):
    """Mean pixel value: dense, non-zero advantages on a random model."""

    name = "brightness"

    def score(self, samples, prompts, metadata):
        return RewardOutput(samples.float().mean(dim=(1, 2, 3)))


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse-rollout-graph", "recompute"])
def test_tiny_step_nfe_with_cfg_and_on_policy_ratio(reuse):
    model = models.get("tiny")(weights=None, arch=SMALL, lora_rank=2, lora_alpha=4)
    assert model.default_guidance != 1.0  # CFG on: 2 passes per sample per step
    config = {"group_size": G, "num_steps": T, "timestep_fraction": 0.5, "kl_beta": 0.0, "clip_range": 1e-4,
              "lr": 1e-3, "reuse_rollout_graph": reuse}
    alg = algorithms.get("flow_grpo")(model, Brightness(), config, seed=0)
    stats = alg.step([p for p, _ in PROMPTS], [m for _, m in PROMPTS])
    batch = len(PROMPTS) * G
    assert stats.nfe_sampling == batch * T * 2
    assert stats.nfe_training == (0 if reuse else batch * TRAINED * 2)
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-5) and stats.clip_frac == 0.0
    assert stats.grad_norm > 0 and torch.isfinite(torch.tensor(stats.loss))
