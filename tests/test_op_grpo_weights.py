"""OP-GRPO's off-policy math against values computed outside the algorithm's code:

* the sequence weight w = exp(log_weight) scales a sample's loss and gradient (w = 3 gives exactly 3x), its KL
  term included;
* pi_old of a replayed sample's reused steps is the policy at this rollout, recomputed here from the kernel on the
  recorded transitions, and log w = sum over reused steps of (log pi_old - log pi_off), with pi_off read from the
  earlier batch the stored trajectory came from (matched by its latents, not through the buffer);
* the update's gradient on a hybrid batch equals autograd of a separately written weighted surrogate, with the
  group advantages of the hybrid batch (wherever its replayed rows sit) worked out here;
* the NFE of an OP-GRPO iteration follows docs/op_grpo.md ("Cost"): a replayed sample costs t_off recompute passes
  plus T - t_off regeneration passes (``naive`` skips the recompute).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.value_helpers import META, PROMPTS, Keep, build, grads, perturb, transition_log_prob

T, T_OFF = 10, 5  # toy2d's default sampling steps; the reused prefix
#: every group whose prompt is stored gets one buffer sample (G - 1 fresh)
REPLAY = {"replay_prompts": "batch", "off_policy_groups": 1.0, "replay_k": 1}


def test_weight_scales_loss_and_gradient_exactly():
    """Same batch, advantages non-zero only on the 'replayed' rows, KL 0: log w = log 3 there gives 3x the loss and
    3x the gradient of log w = 0; a weight on rows whose advantage is 0 changes nothing."""
    alg = build("op_grpo", lr=0.0)
    traj = alg.collect(PROMPTS, META)
    replayed = torch.arange(3, len(traj), 4)  # the last member of each group, where OP-GRPO puts buffer samples
    traj.off_policy[replayed] = True
    advantages = torch.zeros(len(traj))
    advantages[replayed] = torch.tensor([1.5, -0.7, 0.9, -1.2])

    def update(log_weight):
        traj.log_weight = log_weight
        result = alg.update(traj, advantages)
        return result["loss"], grads(alg)

    loss_1, grad_1 = update(torch.zeros(len(traj)))
    three = torch.zeros(len(traj))
    three[replayed] = math.log(3.0)
    loss_3, grad_3 = update(three)
    assert abs(loss_1) > 1e-3 and loss_3 == pytest.approx(3 * loss_1, rel=1e-5)
    for g1, g3 in zip(grad_1, grad_3):
        torch.testing.assert_close(g3, 3 * g1, rtol=1e-5, atol=1e-8)
    elsewhere = three.clone()
    elsewhere[advantages == 0] = math.log(7.0)
    loss_e, grad_e = update(elsewhere)
    assert loss_e == pytest.approx(loss_3, rel=1e-6)
    for g3, ge in zip(grad_3, grad_e):
        torch.testing.assert_close(ge, g3, rtol=1e-6, atol=1e-9)


def test_weight_scales_the_kl_term_too():
    """The paper applies the sequence correction "as a multiplicative factor to the objective function" (arXiv
    2604.04142, method part B), whose per-sample term holds the KL penalty (Flow-GRPO's objective): with zero advantages the
    loss is the KL term alone, and w = 3 on the replayed rows scales exactly their share of it and of its gradient."""
    alg = build("op_grpo", lr=0.0, kl_beta=0.1)
    perturb(alg.model)
    traj = alg.collect(PROMPTS, META)
    replayed = torch.arange(3, len(traj), 4)
    traj.off_policy[replayed] = True
    advantages = torch.zeros(len(traj))

    def update(rows, weight):
        traj.log_weight = torch.zeros(len(traj))
        traj.log_weight[rows] = math.log(weight)
        result = alg.update(traj, advantages)
        return result["loss"], grads(alg)

    everyone = torch.arange(len(traj))
    others = everyone[~torch.isin(everyone, replayed)]
    loss_1, grad_1 = update(everyone, 1.0)
    loss_r, grad_r = update(replayed, 3.0)  # the replayed rows' KL counted 3x
    loss_o, grad_o = update(others, 3.0)  # the other rows' KL counted 3x
    assert loss_1 > 1e-6 and loss_r > loss_1 and loss_o > loss_1
    # the KL splits over the rows: (w_r - 1) part_r + (w_o - 1) part_o = 2 x the whole
    assert (loss_r - loss_1) + (loss_o - loss_1) == pytest.approx(2 * loss_1, rel=1e-5)
    for g1, gr, go in zip(grad_1, grad_r, grad_o):
        torch.testing.assert_close((gr - g1) + (go - g1), 2 * g1, rtol=1e-4, atol=1e-8)


def group_advantages_by_hand(rewards: torch.Tensor, group: torch.Tensor, eps=1e-4, clip=5.0) -> torch.Tensor:
    """(r - group mean) / (population group std + eps), clipped, in float64 over whatever rows share a group id."""
    r, g = rewards.double().numpy(), group.numpy()
    out = np.empty_like(r)
    for gid in np.unique(g):
        members = g == gid
        out[members] = (r[members] - r[members].mean()) / (r[members].std() + eps)
    return torch.from_numpy(np.clip(out, -clip, clip))


def test_hybrid_batch_pi_old_weight_advantages_and_gradient():
    alg = build("op_grpo", t_off=T_OFF, lr=3e-2, **REPLAY)
    keep = Keep(alg)
    alg.step(PROMPTS, META)
    first = keep.batches[0]
    checked = {}

    def check_then_update(traj, advantages, inner=alg.update):
        off = traj.off_policy.nonzero().flatten().tolist()
        assert len(off) == len(PROMPTS)  # one buffer sample per group (G - 1 fresh)
        # -- pi_old and the sequence weight, recomputed here ----------------------------------------------------
        expected_log_w, ref_log_w = [], []
        for r in off:
            src = [s for s in range(len(first)) if torch.equal(first.latents[s, : T_OFF + 1],
                                                                 traj.latents[r, : T_OFF + 1])]
            assert len(src) == 1  # the stored prefix is bit-identical to the earlier sample it came from
            pi_off = first.log_probs[src[0], :T_OFF]
            with torch.no_grad():
                pi_old = torch.stack([transition_log_prob(alg.model, traj, [r], t)[0] for t in range(T_OFF)])
                pi_ref = torch.stack([transition_log_prob(alg.model, traj, [r], t, reference=True)[0]
                                      for t in range(T_OFF)])
            torch.testing.assert_close(traj.log_probs[r, :T_OFF], pi_old, rtol=0, atol=2e-5)
            expected_log_w.append(float((pi_old - pi_off).sum()))
            ref_log_w.append(float((pi_ref - pi_off).sum()))
        expected_log_w = torch.tensor(expected_log_w)
        torch.testing.assert_close(traj.log_weight[off], expected_log_w, rtol=0, atol=1e-4)
        assert traj.log_weight[off].abs().min() > 0.02  # w != 1: dropping or inverting it changes the gradient
        assert (torch.tensor(ref_log_w) - expected_log_w).abs().max() > 0.02  # pi_old is not the reference's
        assert traj.log_weight[~traj.off_policy].eq(0).all()
        # -- advantages over the groups of the hybrid batch, wherever their rows sit ------------------------------
        torch.testing.assert_close(advantages.double(), group_advantages_by_hand(traj.rewards, traj.group),
                                   rtol=0, atol=1e-5)
        # -- the update's gradient: autograd of sum_i,t w_i (-A_i) ratio_i,t / (trained pairs) ------------------
        alg.optimizer.zero_grad(set_to_none=True)
        w = torch.exp(expected_log_w.new_zeros(len(traj)).index_put((torch.tensor(off),), expected_log_w))
        surrogate = 0.0
        for t in range(traj.num_steps):
            rows = traj.train[:, t].nonzero().flatten()
            if len(rows):
                log_prob = transition_log_prob(alg.model, traj, rows, t)
                ratio = torch.exp(log_prob - traj.log_probs[rows, t])  # 1 on the first update, slope d log pi
                surrogate = surrogate + (w[rows] * -advantages[rows] * ratio).sum()
        (surrogate / traj.train.sum()).backward()
        expected = grads(alg)
        alg.optimizer.zero_grad(set_to_none=True)
        result = inner(traj, advantages)
        for got, want in zip(grads(alg), expected):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
        checked["done"] = True
        return result

    alg.update = check_then_update
    alg.step(PROMPTS, META)
    assert checked.get("done")


@pytest.mark.parametrize("cfg", [
    {"t_off": T_OFF},
    {"t_off": None},
    {"t_off": 3, "correction": "naive"},
    {"t_off": T_OFF, "guidance": 2.0, "kl_beta": 0.04, "inner_epochs": 2},
], ids=["truncated", "no-truncation", "naive", "cfg-kl-2-epochs"])
def test_nfe_of_a_hybrid_iteration(cfg):
    alg = build("op_grpo", **REPLAY, **cfg)
    keep = Keep(alg)
    c = 2 if cfg.get("guidance", 1.0) != 1.0 else 1
    k = 2 if cfg.get("kl_beta", 0.0) > 0 else 1
    epochs = cfg.get("inner_epochs", 1)
    t_off = T if cfg["t_off"] is None else cfg["t_off"]
    recompute = 0 if cfg.get("correction") == "naive" else t_off
    trained = int(T * 0.99)  # flow_grpo's plan: the first 9 of 10 steps, fresh and replayed samples alike
    for step in range(3):
        stats = alg.step(PROMPTS, META)
        batch = len(keep.batches[-1])
        replayed = int(keep.batches[-1].off_policy.sum())
        assert batch == 4 * len(PROMPTS) and replayed == (0 if step == 0 else len(PROMPTS))
        sampling = c * ((batch - replayed) * T + replayed * (recompute + T - t_off))
        assert (stats.nfe_sampling, stats.nfe_training) == (sampling, epochs * k * c * batch * trained)
