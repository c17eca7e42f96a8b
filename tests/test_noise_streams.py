"""A rollout's step noise drawn several steps at a time for small latents (algorithms.sde.NoiseStreams) is the noise
of step-by-step draws, value for value, and leaves every generator where step-by-step draws leave it."""

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms import sde
from flowzoo.algorithms.rollout import initial_noise, rollout, sample_generators


@pytest.mark.parametrize("serial", [True, False])
def test_serial_normal_draws_concatenate(serial):
    """The fact the streams rest on: under the limit one draw of n values equals n draws of one value each."""
    n = 7 if serial else sde.SERIAL_NORMAL_LIMIT
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    one_by_one = torch.cat([torch.randn((1,), generator=a) for _ in range(n)])
    together = torch.randn((n,), generator=b)
    assert torch.equal(one_by_one, together) is serial


@pytest.mark.parametrize("name, kernel, window", [
    ("flow_grpo", "flow_grpo", None), ("dance_grpo", "dance_grpo", None), ("flow_grpo", "cps", None),
    ("mix_grpo", "flow_grpo", (2, 7)),
])
def test_blocked_noise_equals_step_by_step_noise(name, kernel, window, monkeypatch):
    model = models.get("toy2d")(hidden=32, pretrain_steps=50)
    alg = algorithms.get(name)(model, rewards.build("toy_mode"), {"group_size": 4, "kernel": kernel}, seed=0)
    plan = alg.make_plan(8)
    cond = model.encode(["class 0"] * 4 + ["class 1"] * 4)
    start, stop = window or (0, None)

    def run():
        gens = sample_generators(3, 1, count=8)
        x = initial_noise(model, gens)
        latents, log_probs = rollout(model, cond, plan, x, gens, start_step=start, stop_step=stop)
        after = torch.stack([torch.randn((3,), generator=g) for g in gens])  # where each generator was left
        return latents, log_probs, after

    blocked = run()
    assert sde.NoiseStreams(sample_generators(0, count=1), (2,)).block == 7  # the toy tier's points: 7 steps a draw
    monkeypatch.setattr(sde, "SERIAL_NORMAL_LIMIT", 0)  # every stream draws step by step, as _noise does
    assert sde.NoiseStreams(sample_generators(0, count=1), (2,)).block == 1
    plain = run()
    for a, b in zip(blocked, plain):
        assert torch.equal(a, b)
    assert bool(plan.sde.any())


def test_streams_refuse_noise_of_another_shape():
    streams = sde.NoiseStreams(sample_generators(0, count=2), (2,))
    with pytest.raises(ValueError, match="noise for"):
        streams.draw(torch.zeros(3, 2))
