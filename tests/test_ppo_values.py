"""The PPO-clip objective and the update loop against values worked out independently of the code under test:

* the clip loss's value and gradient in each of its branches, by hand;
* the ratio of every (minibatch, epoch): minibatches partition the rows each epoch, the first one's ratio is 1, later
  ones equal exp(log pi_now - rollout log-prob) recomputed from the kernel after each optimizer step, and the rollout
  log-probs are never touched;
* ``micro_batch`` changes memory only: gradients, statistics and parameters equal the unsplit update's.
"""

from __future__ import annotations

import math

import pytest
import torch

from flowzoo.algorithms.engine.losses import ppo_clip_loss
from tests.value_helpers import META, PROMPTS, build, grads, params, perturb, transition_log_prob

# (ratio, advantage) -> (loss, d loss / d log_prob, counted as clipped) with clip range 0.2, by hand:
# loss = max(-A r, -A clip(r, 0.8, 1.2)); where the clipped term wins the loss is a constant (gradient 0),
# elsewhere it is -A r, whose derivative in log r is -A r.
CLIP_CASES = {
    "A>0, r above 1+eps: clipped, flat": (1.5, 2.0, -2.4, 0.0, True),
    "A>0, r below 1-eps: unclipped term wins": (0.5, 2.0, -1.0, -1.0, True),
    "A>0, r inside": (1.1, 2.0, -2.2, -2.2, False),
    "A<0, r above 1+eps: unclipped term wins": (1.5, -2.0, 3.0, 3.0, True),
    "A<0, r below 1-eps: clipped, flat": (0.5, -2.0, 1.6, 0.0, True),
    "A<0, r inside": (0.9, -2.0, 1.8, 1.8, False),
    "A=0": (1.5, 0.0, 0.0, 0.0, True),
}


@pytest.mark.parametrize("case", list(CLIP_CASES))
def test_clip_loss_value_and_gradient_in_every_branch(case):
    ratio, adv, loss, grad, clipped = CLIP_CASES[case]
    old = torch.tensor([-0.3])
    log_prob = (old + math.log(ratio)).requires_grad_(True)
    terms = ppo_clip_loss(log_prob, old, torch.tensor([adv]), clip_range=0.2)
    terms.loss.sum().backward()
    assert terms.ratio.item() == pytest.approx(ratio, rel=1e-6)
    assert terms.loss.item() == pytest.approx(loss, rel=1e-6, abs=1e-7)
    assert log_prob.grad.item() == pytest.approx(grad, rel=1e-6, abs=1e-7)
    assert bool(terms.clipped.item()) is clipped


def test_clip_loss_batch_is_elementwise():
    """All branches in one batch give the same per-element values and gradients as one at a time."""
    ratios, advs, losses, grads_, flags = map(list, zip(*CLIP_CASES.values()))
    old = torch.linspace(-1.0, 1.0, len(ratios))
    log_prob = (old + torch.tensor(ratios).log()).requires_grad_(True)
    terms = ppo_clip_loss(log_prob, old, torch.tensor(advs), clip_range=0.2)
    terms.loss.sum().backward()
    torch.testing.assert_close(terms.loss, torch.tensor(losses), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(log_prob.grad, torch.tensor(grads_), rtol=1e-6, atol=1e-6)
    assert terms.clipped.tolist() == flags


class Recorder:
    """Spies on one update: which (rows, t) the update scores between which optimizer steps, and the ratio
    exp(log pi - rollout log-prob) of each, recomputed from the kernel under the parameters of that moment."""

    def __init__(self, alg, traj):
        self.steps = 0
        self.calls = []  # (optimizer steps so far, t, rows, independent ratio)
        rollout_log_probs = traj.log_probs.clone()
        score, step = alg.score_transition, alg.optimizer.step

        def spy_score(tr, rows, t):
            steps = torch.as_tensor(t).expand(len(rows))  # a fused tier scores all trained steps in one call
            for step in steps.unique().tolist():
                picked = rows[steps == step]
                with torch.no_grad():
                    now = transition_log_prob(alg.model, tr, picked, step)
                ratio = torch.exp(now - rollout_log_probs[picked, step])
                self.calls.append((self.steps, step, picked.tolist(), ratio))
            return score(tr, rows, t)

        def spy_step(*args, **kwargs):
            self.steps += 1
            return step(*args, **kwargs)

        alg.score_transition = spy_score
        alg.optimizer.step = spy_step


@pytest.mark.parametrize("epochs, minibatches", [(1, 3), (2, 2)])
def test_ratio_of_every_minibatch_is_against_the_rollout_log_probs(epochs, minibatches):
    alg = build(inner_epochs=epochs, minibatches=minibatches, lr=2e-2)
    traj = alg.collect(PROMPTS, META)
    rollout_log_probs = traj.log_probs.clone()
    n = len(traj)
    spy = Recorder(alg, traj)
    # every advantage +1: each optimizer step raises log pi of the trained transitions, so a ratio taken against
    # refreshed "old" log-probs (1) or with a flipped sign (< 1) differs from the true one (> 1)
    stats = alg.update(traj, torch.ones(n))
    assert spy.steps == epochs * minibatches
    for epoch in range(epochs):
        seen: dict[tuple[int, int], int] = {}
        for mb in range(epoch * minibatches, (epoch + 1) * minibatches):
            for steps, t, rows, _ in spy.calls:
                if steps == mb:
                    for r in rows:
                        seen[(r, t)] = seen.get((r, t), 0) + 1
        # each trained (row, step) pair exactly once per epoch: the minibatches partition the batch
        assert seen == {(r, t): 1 for r in range(n) for t in range(traj.num_steps) if traj.train[r, t]}
    first = torch.cat([ratio for s, _, _, ratio in spy.calls if s == 0])
    torch.testing.assert_close(first, torch.ones_like(first), rtol=0, atol=1e-5)  # on-policy: exactly 1
    later = torch.cat([ratio for s, _, _, ratio in spy.calls if s > 0])
    assert float(later.mean()) > 1.0 + 1e-3  # the policy moved towards the +1 advantage
    everything = torch.cat([ratio for *_, ratio in spy.calls])
    assert stats["ratio_mean"] == pytest.approx(float(everything.mean()), rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(float(((everything - 1).abs() > 0.2).double().mean()), abs=1e-12)
    # loss with A = 1: max(-r, -clip(r, 0.8, 1.2)) = -min(r, clip(r)), averaged over the scored pairs
    assert stats["loss"] == pytest.approx(float(-torch.minimum(everything, everything.clamp(0.8, 1.2)).mean()),
                                          rel=1e-5)
    assert torch.equal(traj.log_probs, rollout_log_probs)  # the rollout's log-probs are never overwritten


@pytest.mark.parametrize("minibatches", [1, 2])
def test_micro_batch_equals_the_unsplit_update(minibatches):
    """Weighted rows, a non-zero KL (policy perturbed away from the reference) and a chunk size that does not divide
    the batch: the micro-batched update matches the unsplit one to float rounding."""
    lr = 0.0 if minibatches == 1 else 1e-2
    whole, split = build(kl_beta=0.04, minibatches=minibatches, lr=lr), build(kl_beta=0.04, minibatches=minibatches,
                                                                               lr=lr, micro_batch=3)
    for alg in (whole, split):
        perturb(alg.model)
    traj = whole.collect(PROMPTS, META)
    gen = torch.Generator().manual_seed(5)
    advantages = torch.randn(len(traj), generator=gen)
    traj.log_weight = 0.5 * torch.randn(len(traj), generator=gen)
    a, b = whole.update(traj, advantages), split.update(traj, advantages)
    assert a["kl"] > 1e-6  # the KL term is in play
    for key in ("loss", "kl", "ratio_mean", "clip_frac", "approx_kl", "grad_norm"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-9), key
    for ga, gb in zip(grads(whole), grads(split)):
        torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-7)
    for pa, pb in zip(params(whole), params(split)):
        torch.testing.assert_close(pb, pa, rtol=1e-5, atol=1e-7)
