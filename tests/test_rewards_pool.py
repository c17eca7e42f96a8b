"""RewardPool: background scoring overlaps the caller, copies its inputs, retries, and reports failures by name."""

import threading

import pytest
import torch

from flowzoo.rewards.base import Reward, RewardOutput
from flowzoo.rewards.errors import RewardError
from flowzoo.rewards.jpeg import JpegIncompressibility
from flowzoo.rewards.pool import RewardPool


class GatedMean(Reward):
    """Mean pixel value; waits for ``gate`` so a test can prove the caller ran while scoring was pending."""

    name = "gated_mean"

    def __init__(self):
        self.gate = threading.Event()

    def score(self, samples, prompts, metadata):
        assert self.gate.wait(5)
        return RewardOutput(samples.flatten(1).mean(1))


class Flaky(Reward):
    name = "flaky"

    def __init__(self, failures):
        self.failures = failures
        self.calls = 0

    def score(self, samples, prompts, metadata):
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError(f"disk hiccup {self.calls}")
        return RewardOutput(torch.ones(samples.shape[0]))


def test_scoring_overlaps_the_caller_and_uses_a_snapshot():
    reward = GatedMean()
    samples = torch.full((2, 3, 4, 4), 0.25)
    with RewardPool(reward) as pool:
        pending = pool.submit(samples, ["a", "b"])
        samples.fill_(1.0)  # the caller reuses its buffer while scoring is pending
        assert not pending.done()  # the caller is free while the reward works
        reward.gate.set()
        assert pending.result(timeout=5).score.tolist() == [0.25, 0.25]


def test_real_reward_result_equals_direct_call():
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with RewardPool(JpegIncompressibility()) as pool:
        pooled = pool.submit(images, ["", ""]).result()
    assert torch.equal(pooled.score, JpegIncompressibility()(images, ["", ""]).score)


def test_failure_names_the_reward_and_cause_and_retries_recover():
    with RewardPool(Flaky(failures=2), retries=1) as pool:
        with pytest.raises(RewardError, match=r"'flaky' failed after 2 attempts: OSError: disk hiccup 2"):
            pool.submit(torch.zeros(1, 3, 2, 2), ["x"]).result()
    flaky = Flaky(failures=1)
    with RewardPool(flaky, retries=1) as pool:
        assert pool.submit(torch.zeros(1, 3, 2, 2), ["x"]).result().score.tolist() == [1.0]
    assert flaky.calls == 2
