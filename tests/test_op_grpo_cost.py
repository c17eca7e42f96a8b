"""OP-GRPO's hybrid batch (algorithms/methods/op_grpo.py ``_hybrid_rollout``, ``_recompute_old``): the fresh and replayed
samples share their model calls, and the batch holds the samples that separate rollouts give."""

from __future__ import annotations

import math

import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms.engine.rollout import rollout, sample_generators
from flowzoo.streams import OP_GRPO_REGENERATION
from flowzoo.models.toy2d import prompt_set

PROMPTS = [p for p, _ in prompt_set()]
META = [m for _, m in prompt_set()]
T_OFF = 4


def _after_one_step():
    model = models.get("toy2d")(hidden=32, layers=2, pretrain_steps=300)
    alg = algorithms.get("op_grpo")(model, rewards.build("toy_mode"),
                                    {"group_size": 4, "clip_range": 0.2, "lr": 3e-3, "t_off": T_OFF}, seed=0)
    alg.step(PROMPTS, META)  # fills the buffer: every prompt then replays k = 1 sample next step
    return alg


def _counting(model):
    calls = []
    inner = model.velocity

    def velocity(x, *args, **kwargs):
        calls.append(x.shape[0])
        return inner(x, *args, **kwargs)

    model.velocity = velocity
    return calls


def test_replayed_samples_add_no_model_calls_of_their_own():
    alg = _after_one_step()
    calls = _counting(alg.model)
    traj = alg.collect(PROMPTS, META)
    batch, replayed, steps = len(traj), int(traj.off_policy.sum()), alg.num_steps
    assert (batch, replayed, steps) == (16, 4, 10)
    # T batched calls for the rollout, plus pi_old of the replayed samples' reused steps in chunks of the batch size
    # (separate rollouts took T + (T - t_off) + t_off calls here: 20)
    assert len(calls) == steps + math.ceil(replayed * T_OFF / batch) == 11
    # the same model evaluations as before: T per sample (the regenerated tail + the recomputed prefix)
    assert sum(calls) == batch * steps


def test_hybrid_batch_holds_the_samples_of_separate_rollouts():
    alg = _after_one_step()
    stored = {e.prompt: e for e in alg.buffer.entries}
    traj = alg.collect(PROMPTS, META)
    off = traj.off_policy
    # fresh samples: G - k = 3 per group, seeded as their own fresh rollout (group offset: replay count x prompts)
    fresh = alg.fresh_rollout(PROMPTS, META, group_offset=len(PROMPTS), group_size=3)
    torch.testing.assert_close(traj.latents[~off], fresh.latents, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(traj.log_probs[~off], fresh.log_probs, rtol=1e-5, atol=1e-6)
    # replayed samples: the stored prefix exactly, the tail regenerated from its latent at t_off with their streams
    prefix = torch.stack([stored[p].latents for p in traj.prompts[-4:]])
    assert off[-4:].all() and torch.equal(traj.latents[off, : T_OFF + 1], prefix)
    gens = sample_generators(alg.seed, alg.iteration, OP_GRPO_REGENERATION, count=4)
    plan = alg.make_plan(4)
    cond = alg.model.encode(traj.prompts[-4:], traj.metadata[-4:])
    tail, tail_lp = rollout(alg.model, cond, plan, prefix[:, T_OFF], gens, alg.config.guidance, start_step=T_OFF)
    torch.testing.assert_close(traj.latents[off, T_OFF:], tail[:, T_OFF:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(traj.log_probs[off, T_OFF:], tail_lp[:, T_OFF:], rtol=1e-5, atol=1e-6)
    # and pi_old of the reused steps: each recorded transition scored on its own under the current parameters
    rows = off.nonzero().flatten()
    with torch.no_grad():
        for t in range(T_OFF):
            expected = alg.score_transition(traj, rows, t).log_prob
            torch.testing.assert_close(traj.log_probs[off, t], expected, rtol=1e-5, atol=1e-6)
