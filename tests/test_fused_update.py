"""The fused update (``FlowModel.fused_update``, the toy tier's choice): one network call and one backward per
minibatch over all its trained (sample, step) pairs gives the gradient of the per-step accumulated update to float
rounding, for every registered algorithm, with and without a kept rollout graph; and it really makes fewer calls."""

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.models.toy2d import prompt_set

TOY_CONFIG = {"group_size": 4, "clip_range": 0.2, "kl_beta": 0.04, "lr": 0.0}  # lr 0: both paths see the same weights


def _run(name: str, fused: bool, extra: dict) -> tuple[list[torch.Tensor], object, int]:
    """The gradients left by the last of two iterations (the second replays, for OP-GRPO), its StepStats and the
    number of network calls the update made."""
    pairs = prompt_set()
    prompts, metadata = [p for p, _ in pairs], [m for _, m in pairs]
    model = models.get("toy2d")(hidden=32, pretrain_steps=50)
    model.fused_update = fused
    cls = algorithms.get(name)
    config = {"group_size": 4, "lr": 0.0} if cls.likelihood_free else {**TOY_CONFIG, **extra}
    alg = cls(model, rewards.build("toy_mode"), config, seed=0)
    alg.step(prompts, metadata)
    calls = []
    predict = model.predict
    model.predict = lambda *a, **k: calls.append(1) or predict(*a, **k)
    update = alg.update

    def counted_update(traj, advantages):
        calls.clear()
        return update(traj, advantages)

    alg.update = counted_update
    stats = alg.step(prompts, metadata)
    return [p.grad.clone() for p in model.trainable_parameters()], stats, len(calls)


@pytest.mark.parametrize("reuse", ["auto", False])
@pytest.mark.parametrize("name", algorithms.names())
def test_fused_update_gives_the_per_step_gradient(name, reuse):
    if reuse is False and algorithms.get(name).likelihood_free:
        pytest.skip("no rollout graph to keep")
    extra = {"reuse_rollout_graph": reuse}
    per_step, stats_a, calls_a = _run(name, False, extra)
    fused, stats_b, calls_b = _run(name, True, extra)
    scale = max(float(torch.cat([g.flatten() for g in per_step]).abs().max()), 1e-12)
    assert scale > 1e-8, "a zero gradient would prove nothing"
    for a, b in zip(per_step, fused):
        torch.testing.assert_close(b, a, atol=2e-6 * scale, rtol=1e-4)
    assert stats_b.loss == pytest.approx(stats_a.loss, rel=1e-4, abs=1e-7)
    assert stats_b.clip_frac == stats_a.clip_frac and stats_b.reward_mean == stats_a.reward_mean
    assert calls_b <= calls_a
    recomputes = not algorithms.get(name).likelihood_free and reuse is False
    if recomputes or name == "diffusion_nft":  # per-step calls before, one policy (+ reference) call per minibatch now
        assert calls_b < calls_a


@pytest.mark.parametrize("name", ["flow_grpo", "op_grpo", "diffusion_nft"])
def test_fused_tier_trains_to_the_same_weights(name):
    """Three iterations that move the weights (the fused update and torch's fused AdamW against the per-step update
    and the default AdamW) end at the same weights and rewards to float rounding."""
    pairs = prompt_set()
    prompts, metadata = [p for p, _ in pairs], [m for _, m in pairs]
    ends = []
    for fused in (False, True):
        model = models.get("toy2d")(hidden=32, pretrain_steps=50)
        model.fused_update = fused  # read when the algorithm builds its optimizer
        alg = algorithms.get(name)(model, rewards.build("toy_mode"), {"group_size": 4, "lr": 1e-3, "kl_beta": 0.04,
                                                                      "clip_range": 0.2, "minibatches": 2}, seed=0)
        assert alg.optimizer.defaults["fused"] is (True if fused else None)
        rewards_seen = [alg.step(prompts, metadata).reward_mean for _ in range(3)]
        ends.append(([p.detach().clone() for p in model.trainable_parameters()], rewards_seen))
    (a, ra), (b, rb) = ends
    assert rb == pytest.approx(ra, rel=1e-5)  # a dense reward: rounding moves it in its last digits
    moved = max(float((p - q.detach()).abs().max()) for p, q in zip(a, models.get("toy2d")(hidden=32, pretrain_steps=50)
                                                            .trainable_parameters()))
    assert moved > 1e-4  # the weights did move
    # Adam divides by sqrt(v): an element whose gradient is near zero turns rounding into a few % of one lr (1e-3)
    # step, by how much depends on the CPU's vector paths; every other element agrees to 1e-5 relative
    a, b = torch.cat([p.flatten() for p in a]), torch.cat([q.flatten() for q in b])
    close = torch.isclose(b, a, atol=2e-5, rtol=1e-5)
    assert close.float().mean() > 0.995, f"{int((~close).sum())} of {close.numel()} weights differ"
    assert float((a - b).abs().max()) < 0.1 * 1e-3  # none by 10% of one lr step
