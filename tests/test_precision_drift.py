"""The on-policy log-ratio drift: the update logs the largest |log pi_theta - log pi_old| of its first optimizer step's
on-policy pairs (0 when the recompute reproduces the rollout), and ``flowzoo perf --precision``'s measurement shows
what a reduced-precision rollout scored in float32 does to it."""

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.algorithms.engine.base import ONPOLICY_DRIFT
from flowzoo.models.toy2d import prompt_set


def _toy(name="flow_grpo", **config):
    pairs = prompt_set()
    model = models.get("toy2d")(hidden=32, pretrain_steps=50)
    alg = algorithms.get(name)(model, rewards.build("toy_mode"), {"group_size": 4, "lr": 1e-3, **config}, seed=0)
    return alg, [p for p, _ in pairs], [m for _, m in pairs]


@pytest.mark.parametrize("config", [{}, {"reuse_rollout_graph": False, "minibatches": 2}])
def test_update_logs_zero_drift_when_the_recompute_reproduces_the_rollout(config):
    alg, prompts, metadata = _toy(**config)
    assert [alg.step(prompts, metadata).extra[ONPOLICY_DRIFT] for _ in range(2)] == [0.0, 0.0]


def test_update_logs_the_drift_of_a_disagreeing_rollout_on_policy_rows_only():
    alg, prompts, metadata = _toy(reuse_rollout_graph=False)
    collect = alg.collect

    def shifted(*args, **kwargs):  # the rollout's recorded log-probs off by 0.01 (as a bf16 sampler would be)
        traj = collect(*args, **kwargs)
        traj.log_probs = traj.log_probs + 0.01 * traj.train.to(traj.log_probs.dtype)
        traj.off_policy = torch.zeros(len(traj), dtype=torch.bool)
        traj.off_policy[0] = True  # an off-policy row is left out of the on-policy drift
        traj.log_probs[0] += 5.0
        return traj

    alg.collect = shifted
    assert alg.step(prompts, metadata).extra[ONPOLICY_DRIFT] == pytest.approx(0.01, abs=1e-5)


def test_reduced_precision_rollout_drifts_under_a_float32_recompute():
    pytest.importorskip("diffusers")
    pytest.importorskip("peft")
    from flowzoo.benchmark.perf.precision import measure

    result = measure(None, "cpu", lora_rank=4, precisions=("float32", "bfloat16"),
                     overrides={"num_steps": 4, "group_size": 2})
    assert set(result["float32"]) == {"whole batch", "two halves", "float32 weights"}
    assert max(result["float32"]["whole batch"]) == 0.0  # the update's recompute is the rollout's computation
    assert len(result["bfloat16"]["float32 weights"]) == 3  # the trained steps: all but the last of 4
    assert max(result["bfloat16"]["float32 weights"]) > 1e-6  # bf16 sampling, float32 scoring: the ratio is not 1
