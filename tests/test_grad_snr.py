"""The gradient signal-to-noise diagnostic: its statistics on known vectors, and the measurement on the toy tier."""

import math
from pathlib import Path

import pytest
import torch

from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.loading import load_config
from flowzoo.benchmark.run.grad_snr import (
    batch_gradients, gradients_at, jackknife_se, measure, pairwise_cosines, significant_fraction,
)
from flowzoo.benchmark.run.runner import Runner

CONFIG = Path(__file__).resolve().parents[1] / "benchmark" / "configs" / "toy_flow_grpo.yaml"
SMALL = ["train.prompts_per_step=4", "algorithm.group_size=4"]


def test_pairwise_cosines_of_known_vectors():
    g = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    assert torch.allclose(pairwise_cosines(g), torch.tensor([0.0, 1 / math.sqrt(2), 1 / math.sqrt(2)]))
    with pytest.raises(ValueError, match="K >= 2"):
        pairwise_cosines(g[:1])


def test_jackknife_se_is_zero_for_equal_cosines_and_positive_otherwise():
    assert jackknife_se(torch.ones(5, 3)) == pytest.approx(0.0, abs=1e-6)
    assert jackknife_se(torch.randn(6, 50, generator=torch.Generator().manual_seed(0))) > 0
    assert math.isnan(jackknife_se(torch.ones(2, 3)))


def test_significant_fraction_finds_a_consistent_coordinate_and_not_noise():
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(16, 1000, generator=gen)
    assert significant_fraction(noise) < 0.03  # ~1% by chance at K = 16
    shifted = noise.clone()
    shifted[:, :100] += 5.0  # 100 coordinates with a mean 5 noise-sigmas away from 0
    assert significant_fraction(shifted) == pytest.approx(0.1, abs=0.02)


def test_batch_gradients_leave_the_weights_alone_and_are_deterministic():
    config = load_config(CONFIG, SMALL)
    runner = Runner(config, progress=False)
    runner.build()
    before = {k: v.clone() for k, v in runner.model.trainable_state_dict().items()}
    first, rewards, _ = gradients_at(runner, 3, progress=False)
    after = runner.model.trainable_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert runner.algorithm.iteration == 0 and not runner.algorithm.optimizer.state
    again, _, _ = batch_gradients(config, 3, progress=False)
    assert first.shape == (3, sum(p.numel() for p in runner.model.trainable_parameters())) and len(rewards) == 3
    assert torch.equal(first, again)
    assert not torch.allclose(first[0], first[1])  # fresh prompts and noise in every batch


def test_fixed_prompts_on_the_dense_toy_reward_give_aligned_gradients():
    # the toy tier learns its dense reward in a few dozen steps: batch gradients must point the same way
    result = measure(load_config(CONFIG, SMALL), batches=4, fixed_prompts=True, progress=False)
    assert result.batches == 4 and result.samples_per_batch == 16
    assert result.cos_mean > 0.2, result


def test_cli_prints_one_line_and_rejects_one_batch(capsys):
    assert main(["grad-snr", str(CONFIG), *SMALL, "--batches", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "3 batches of 16 samples: gradient cosine" in out and "nan" not in out
    for batches in ("1", "2"):  # the standard error is a leave-one-batch-out jackknife over pairs
        assert main(["grad-snr", str(CONFIG), "--batches", batches, "--quiet"]) == 2
        assert "--batches must be >= 3" in capsys.readouterr().err
