"""OP-GRPO (algorithms/methods/op_grpo.py): hybrid rollout, sequence weight, truncation, ablations, resume, learning."""

from __future__ import annotations

import copy
import io
import math
import time

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms.engine.losses import sequence_log_weight
from flowzoo.algorithms.methods.op_grpo import OPGRPO
from flowzoo.algorithms.engine.rollout import sample_generators, sample_ode
from flowzoo.algorithms.engine.sde import sigma_schedule
from flowzoo.errors import ConfigError
from flowzoo.models.toy2d import prompt_set

PROMPTS = [p for p, _ in prompt_set()]
META = [m for _, m in prompt_set()]
SMALL = dict(hidden=32, layers=2, pretrain_steps=300)  # pretraining is memoised per process
BASE = {"group_size": 4, "clip_range": 0.2, "lr": 1e-3, "kl_beta": 0.0}


def make(name="op_grpo", seed=0, model_kw=SMALL, **cfg):
    model = models.get("toy2d")(**model_kw)
    return algorithms.get(name)(model, rewards.build("toy_mode"), {**BASE, **cfg}, seed=seed)


def params(alg):
    return [p.detach().clone() for p in alg.model.trainable_parameters()]


class Keep:
    """Wraps an algorithm's ``collect`` to keep every trajectory batch it produced."""

    def __init__(self, alg):
        self.batches = []
        inner = alg.collect

        def collect(prompts, metadata):
            traj = inner(prompts, metadata)
            self.batches.append(traj)
            return traj

        alg.collect = collect


def test_presets_and_config_validation():
    assert {"op_grpo", "op_grpo_no_correction", "op_grpo_naive_is", "op_grpo_no_truncation",
            "op_grpo_no_decay"} <= set(algorithms.names())
    model = models.get("toy2d")(**SMALL)
    reward = rewards.build("toy_mode")
    cfgs = {n: algorithms.get(n)(model, reward, BASE).config for n in
            ("op_grpo", "op_grpo_no_correction", "op_grpo_naive_is", "op_grpo_no_truncation", "op_grpo_no_decay")}
    assert cfgs["op_grpo"].correction == "sequence" and cfgs["op_grpo"].t_off == 5
    assert cfgs["op_grpo_no_correction"].correction == "none"
    assert cfgs["op_grpo_naive_is"].correction == "naive"
    assert cfgs["op_grpo_no_truncation"].t_off is None
    assert cfgs["op_grpo_no_decay"].buffer_decay == 1.0
    assert algorithms.get("op_grpo_no_decay")(model, reward, {**BASE, "buffer_decay": 0.5}).config.buffer_decay == 0.5
    for bad in ({"replay_k": 4}, {"off_policy_groups": 1.5}, {"t_off": -1}, {"t_off": 11}, {"buffer_decay": 0.0},
                {"weight_cap": 0.0}, {"correction": "other"}, {"replay_prompts": "buffer"},
                {"replay_prompts": "other"}, {"buffer_admission": "other"}, {"num_steps": 4, "t_off": 5}):
        with pytest.raises(ConfigError):
            OPGRPO(model, reward, {**BASE, **bad})


@pytest.mark.parametrize("cfg", [{}, {"replay_k": 0}])
def test_equals_flow_grpo_without_replay(cfg):
    """Empty buffer (first step) or k = 0 (every step): OP-GRPO is Flow-GRPO bit for bit (both recomputing the
    trained steps in the update, as OP-GRPO always does: Flow-GRPO's kept rollout graph gives the same update only to
    float rounding)."""
    steps = 1 if not cfg else 3
    op, fg = make(**cfg), make("flow_grpo", reuse_rollout_graph=False)
    for _ in range(steps):
        a, b = op.step(PROMPTS, META), fg.step(PROMPTS, META)
        assert (a.loss, a.reward_mean, a.ratio_mean, a.clip_frac, a.grad_norm) == (
            b.loss, b.reward_mean, b.ratio_mean, b.clip_frac, b.grad_norm)
    assert all(torch.equal(x, y) for x, y in zip(params(op), params(fg)))


def test_sequence_weight_hand_made():
    old = torch.tensor([[-1.0, -2.0, -0.5, 3.0], [0.0, 0.0, 0.0, 0.0]])
    off = torch.tensor([[-1.5, -1.0, -0.5, -100.0], [1.0, -2.0, 0.0, 0.0]])
    reused = torch.tensor([[True, True, True, False], [True, True, False, False]])
    log_w = sequence_log_weight(old, off, reused)
    ratios = torch.exp(old - off)
    expected = torch.stack([ratios[0, :3].prod(), ratios[1, :2].prod()])
    assert torch.allclose(torch.exp(log_w), expected, rtol=1e-6)
    assert log_w.tolist() == pytest.approx([0.5 - 1.0 + 0.0, -1.0 + 2.0])


def test_hybrid_rollout_layout_and_weight_without_grad():
    alg = make(t_off=5, lr=3e-3)
    keep = Keep(alg)
    alg.step(PROMPTS, META)
    assert len(alg.buffer) == 4
    stats = alg.step(PROMPTS, META)
    traj = keep.batches[-1]
    assert len(traj) == 16 and int(traj.off_policy.sum()) == 4  # G - 1 fresh + 1 replayed per group
    for gid in range(4):
        assert int((traj.group == gid).sum()) == 4 and int((traj.off_policy & (traj.group == gid)).sum()) == 1
    assert stats.extra["off_policy_frac"] == 0.25
    assert "clip_frac_off" in stats.extra and "clip_frac_on" in stats.extra
    assert {f"abs_log_ratio_t{t}" for t in range(5)} <= set(stats.extra)
    assert "abs_log_ratio_t5" not in stats.extra  # regenerated steps carry no off-policy ratio
    assert stats.extra["buffer_size"] == 4 and stats.extra["buffer_bytes"] > 0
    # the parameters moved between the two rollouts: pi_old != pi_off, the weight is sum of log-ratios, no grad
    off = traj.off_policy
    assert not traj.log_weight.requires_grad and traj.log_weight.grad_fn is None
    assert traj.log_weight[~off].eq(0).all() and traj.log_weight[off].ne(0).all()
    assert stats.extra["log_weight_max"] == pytest.approx(float(traj.log_weight[off].max()))


def test_partial_off_policy_fraction_and_k():
    alg = make(off_policy_groups=0.5, replay_k=2, t_off=5)
    keep = Keep(alg)
    alg.step(PROMPTS, META)
    alg.step(PROMPTS, META)
    traj = keep.batches[-1]
    replayed_groups = traj.group[traj.off_policy].unique()
    assert len(replayed_groups) == 2  # half of the 4 eligible groups
    for gid in replayed_groups.tolist():  # k = 2 copies of the one stored entry, with different regenerated tails
        rows = (traj.group == gid) & traj.off_policy
        assert int(rows.sum()) == 2 and int((traj.group == gid).sum()) == 4
        a, b = traj.latents[rows]
        assert torch.equal(a[:6], b[:6]) and not torch.equal(a[6:], b[6:])
    # without truncation identical copies are pointless: only distinct entries are replayed
    alg = make(replay_k=2, t_off=None)
    keep = Keep(alg)
    alg.step(PROMPTS, META)
    alg.step(PROMPTS, META)
    assert int(keep.batches[-1].off_policy.sum()) == 4


@pytest.mark.parametrize("t_off", [None, 5])
def test_current_parameters_give_unit_weight_and_ratio(t_off):
    """lr = 0: the stored trajectory was sampled by the current parameters, so pi_off == pi_old, w == 1 and the
    first update's ratio is 1 (clip_range 1e-6: a ratio off by more would be counted as clipped)."""
    alg = make(t_off=t_off, lr=0.0, weight_decay=0.0, clip_range=1e-6)
    keep = Keep(alg)
    alg.step(PROMPTS, META)
    stats = alg.step(PROMPTS, META)
    traj = keep.batches[-1]
    assert traj.off_policy.sum() == 4
    assert traj.log_weight.abs().max() < 1e-6  # recomputed in another batch layout: equal to float rounding
    assert abs(stats.ratio_mean - 1) < 1e-6 and stats.clip_frac == 0.0 and stats.extra["clip_frac_off"] == 0.0
    assert max(v for k, v in stats.extra.items() if k.startswith("abs_log_ratio_t")) < 1e-6


def test_truncation_keeps_prefix_regenerates_tail_and_rerewards():
    alg = make(t_off=4, lr=3e-3)
    keep = Keep(alg)
    alg.step(PROMPTS, META)
    first = keep.batches[0]
    stored = {e.prompt: e for e in copy.deepcopy(alg.buffer.entries)}
    alg.step(PROMPTS, META)
    traj = keep.batches[1]
    assert int(traj.off_policy.sum()) == 4
    for row in traj.off_policy.nonzero().flatten().tolist():
        prompt = traj.prompts[row]
        entry = stored[prompt]
        # the stored entry is the best fresh sample of that prompt's group in the first batch
        src_rows = [i for i, p in enumerate(first.prompts) if p == prompt]
        src = max(src_rows, key=lambda i: float(first.rewards[i]))
        assert torch.equal(entry.latents, first.latents[src, :5])
        assert entry.reward == float(first.rewards[src])
        assert torch.equal(traj.latents[row, :5], first.latents[src, :5])  # bit-identical prefix
        for t in range(5, 11):
            assert not torch.equal(traj.latents[row, t], first.latents[src, t])  # regenerated tail
        # regenerated steps carry the current rollout's log-probs, reused ones the recomputed pi_old
        assert traj.log_probs[row, 4:].ne(0).all()
    # the new final samples were rewarded afresh
    off = traj.off_policy
    fresh_score = alg.reward(alg.model.decode(traj.final[off]), [traj.prompts[i] for i in off.nonzero().flatten()],
                             [traj.metadata[i] for i in off.nonzero().flatten()]).score
    assert torch.equal(traj.rewards[off], fresh_score)


def test_entries_store_only_the_prefix_needed():
    alg = make(t_off=3)
    alg.step(PROMPTS, META)
    assert all(e.latents.shape[0] == 4 for e in alg.buffer.entries)
    alg = make(t_off=None)
    alg.step(PROMPTS, META)
    assert all(e.latents.shape[0] == 11 for e in alg.buffer.entries)


def test_naive_mode_uses_stored_log_probs_as_old():
    seq, naive = make(t_off=5, lr=3e-3), make("op_grpo_naive_is", t_off=5, lr=3e-3)
    keep_s, keep_n = Keep(seq), Keep(naive)
    for alg in (seq, naive):
        alg.step(PROMPTS, META)
    entries = {e.prompt: e for e in naive.buffer.entries}
    seq.step(PROMPTS, META)
    naive.step(PROMPTS, META)
    ts, tn = keep_s.batches[-1], keep_n.batches[-1]
    for row in tn.off_policy.nonzero().flatten().tolist():
        assert torch.equal(tn.log_probs[row, :5], entries[tn.prompts[row]].log_probs[:5])  # pi_off as "old"
    assert tn.log_weight.eq(0).all()
    # the sequence mode has the recomputed pi_old there instead, and log w = sum (pi_old - pi_off)
    assert torch.equal(tn.latents, ts.latents)  # same seeds, same parameters up to here: same batch
    off = ts.off_policy
    pi_off = torch.stack([entries[ts.prompts[r]].log_probs for r in off.nonzero().flatten().tolist()])
    assert not torch.equal(ts.log_probs[off, :5], pi_off[:, :5])
    expected = (ts.log_probs[off, :5] - pi_off[:, :5]).sum(1)
    assert torch.allclose(ts.log_weight[off], expected, atol=1e-6)


def test_no_correction_mode_has_unit_weight():
    alg = make("op_grpo_no_correction", lr=3e-3)
    keep = Keep(alg)
    alg.step(PROMPTS, META)
    stats = alg.step(PROMPTS, META)
    assert keep.batches[-1].off_policy.sum() == 4 and keep.batches[-1].log_weight.eq(0).all()
    assert stats.extra["abs_log_ratio_t0"] > 0  # still measured


def test_weight_cap_and_self_normalisation():
    alg = make(weight_cap=2.0, weight_self_normalize=True)
    lw = torch.tensor([0.0, math.log(8.0), -1.0])
    out = alg._transform_weights(lw)
    capped = torch.tensor([1.0, 2.0, math.exp(-1.0)])
    assert torch.allclose(torch.exp(out), capped / capped.mean())


def test_non_finite_log_weight_drops_sample_and_counts_it():
    alg = make(t_off=5, lr=3e-3)
    keep = Keep(alg)
    alg.step(PROMPTS, META)
    bad = alg.buffer.entries[0]
    bad.log_probs[1] = float("nan")
    stats = alg.step(PROMPTS, META)
    traj = keep.batches[-1]
    assert stats.extra["replay_dropped"] == 1 and stats.extra["replay_dropped_total"] == 1
    assert int(traj.off_policy.sum()) == 3 and len(traj) == 15
    assert bad.prompt not in [traj.prompts[i] for i in traj.off_policy.nonzero().flatten().tolist()]
    assert math.isfinite(stats.loss) and all(torch.isfinite(p).all() for p in params(alg))
    bad.log_probs[1] = float("-inf")  # log w = +inf: dropped as well
    bad.age = 0
    stats = alg.step(PROMPTS, META)
    assert stats.extra["replay_dropped_total"] >= 1 and math.isfinite(stats.loss)


def _run(steps, resume_at=None, **cfg):
    """``steps`` training steps drawn by the algorithm's prompt sampler (buffer mode: replay_buffer), the state saved
    and loaded into a new algorithm before step ``resume_at``, as a run resumes."""
    def built():
        alg = make(seed=3, t_off=5, kl_beta=0.04, off_policy_groups=0.75, **cfg)
        alg.use_prompts(list(zip(PROMPTS, META)), 8)
        return alg

    alg, rewards_seen = built(), []
    for i in range(steps):
        if i == resume_at:
            blob = io.BytesIO()
            torch.save(alg.state_dict(), blob)
            blob.seek(0)
            alg = built()
            alg.load_state_dict(torch.load(blob, weights_only=False))
        rewards_seen.append(alg.train_step(i + 1).reward_mean)
    return alg, rewards_seen


@pytest.mark.parametrize("cfg", [{}, {"replay_prompts": "buffer"}])
def test_resume_is_bit_identical(cfg):
    straight, r1 = _run(5, **cfg)
    resumed, r2 = _run(5, resume_at=2, **cfg)
    assert r1 == r2
    assert all(torch.equal(a, b) for a, b in zip(params(straight), params(resumed)))
    assert [(e.prompt, e.reward, e.age, e.version) for e in straight.buffer.entries] == [
        (e.prompt, e.reward, e.age, e.version) for e in resumed.buffer.entries]


def _eval(model):
    n = 256
    prompts, meta = [PROMPTS[i % 4] for i in range(n)], [META[i % 4] for i in range(n)]
    x = model.initial_noise(sample_generators(123, 0, count=n))
    x0 = sample_ode(model, model.encode(prompts, meta), sigma_schedule(10, 1.0), x)
    return float(rewards.build("toy_mode")(model.decode(x0), prompts, meta).score.mean())


def test_op_grpo_raises_toy_reward():
    t0 = time.perf_counter()
    alg = make(model_kw=dict(hidden=64, layers=2, pretrain_steps=400), group_size=8)
    before = _eval(alg.model)
    for _ in range(15):
        stats = alg.step(PROMPTS * 2, META * 2)
    after = _eval(alg.model)
    assert stats.extra["off_policy_frac"] > 0
    assert after > before + 0.2, (before, after)
    assert time.perf_counter() - t0 < 30


def test_non_finite_pi_off_outside_the_reused_steps_is_harmless():
    alg = make(t_off=5, lr=3e-3)
    alg.step(PROMPTS, META)
    for e in alg.buffer.entries:
        e.log_probs[8] = float("nan")  # a regenerated step: its stored log-prob is never used
    stats = alg.step(PROMPTS, META)
    assert stats.extra["replay_dropped"] == 0 and stats.extra["off_policy_frac"] == 0.25
    assert math.isfinite(stats.extra["log_weight_mean"]) and math.isfinite(stats.loss)


@pytest.mark.parametrize("change, replays", [
    ({}, True),
    ({"guidance": 2.0}, False),  # pi_off was sampled under guidance 1.5: pi_old now would be another density
    ({"log_prob_reduction": "sum"}, False),  # stored log-probs are means over latent dims
    ({"noise_level": 0.5}, False),  # another grid (StepPlan.same_grid)
], ids=["same", "guidance", "reduction", "noise-level"])
def test_a_stored_trajectory_replays_only_under_the_density_it_was_sampled_with(change, replays):
    """A resume with another guidance or log-prob reduction must not mix definitions in log w = log pi_old - log
    pi_off: the buffer's entries (kept across the resume) are then not replayed."""
    first = make(t_off=5, guidance=1.5)
    first.step(PROMPTS, META)
    assert len(first.buffer) > 0
    later = make(t_off=5, **{"guidance": 1.5, **change})
    later.buffer.load_state_dict(first.buffer.state_dict())
    keep = Keep(later)
    later.step(PROMPTS, META)
    assert bool(keep.batches[-1].off_policy.any()) == replays
