"""A rollout's step noise drawn several steps at a time for small latents (algorithms.engine.sde.NoiseStreams) is the noise
of step-by-step draws, value for value, and leaves every generator where step-by-step draws leave it."""

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms.engine import sde
from flowzoo.algorithms.engine.rollout import initial_noise, rollout, sample_generators


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


@pytest.mark.parametrize("numel", [16, 64, 4096])
def test_block_draws_of_whole_blocks_concatenate(numel):
    """The fact the rollout-wide draws rest on: for sizes that are multiples of 16 the sampler fills whole blocks in
    order, so one draw of k * n values is k draws of n values, and leaves the generator in the same state; a size
    that is not a multiple of 16 does not have this property (its last block is redrawn)."""
    for n, same in ((numel, True), (numel + 4, False)):
        a, b = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
        steps = torch.cat([torch.randn((n,), generator=a) for _ in range(5)])
        together = torch.randn((5 * n,), generator=b)
        assert torch.equal(steps, together) is same
        assert torch.equal(a.get_state(), b.get_state()) is same


@pytest.mark.parametrize("stop", [None, 5])
def test_rollout_wide_noise_equals_step_by_step(stop, monkeypatch):
    """Latents of 64 values: the rollout draws each sample's noise for all its noisy steps at once and moves it to the
    device in one copy; the latents, log-probs and generator states equal step-by-step draws (a rollout stopped
    early draws only the steps it runs)."""
    from flowzoo.algorithms.engine.trajectory import StepPlan

    sigmas = sde.sigma_schedule(8, 3.0)
    plan = StepPlan(sigmas, torch.ones(8, dtype=torch.bool), torch.ones(4, 8, dtype=torch.bool), "flow_grpo", 0.7)

    class Wide:  # a model whose latents have 64 values: a velocity that mixes them, no network
        nfe = 0
        device = torch.device("cpu")

        def velocity(self, x, sigma, cond, guidance=None, **_):
            return 0.3 * x.flip(-1) - sigma.reshape(-1, 1) * x

    def run():
        gens = sample_generators(4, 2, count=4)
        x = torch.stack([torch.randn(64, generator=g) for g in gens])
        latents, log_probs = rollout(Wide(), None, plan, x, gens, stop_step=stop)
        return latents, log_probs, torch.stack([torch.randn((3,), generator=g) for g in gens])

    draws = []
    real = sde.NoiseStreams.draw
    monkeypatch.setattr(sde.NoiseStreams, "draw", lambda self, like: draws.append(self.block) or real(self, like))
    blocked = run()
    assert set(draws) == {stop or 8}  # one block of every noisy step
    monkeypatch.setattr(sde, "SERIAL_NORMAL_LIMIT", 0)  # step by step, as _noise does
    plain = run()
    for a, b in zip(blocked, plain):
        assert torch.equal(a, b)
