"""No host sync in the step loop: one training iteration's device reads (each a stall between two GPU calls) and
host-to-device copies are a small constant, the same at T = 6 and T = 9, for every GRPO-family algorithm on the
SD3 adapter's own code (``tests/device_reads.py``: the model on the meta device, the bookkeeping on the host).

Before this change the rollout read the device once per step (``bool((std == 0).all())`` in ``sde_step``) and copied
three host tensors per step (the step's sigmas twice, its noise), the update read five values per chunk and the
group advantages ran ``unique`` on the device."""

from __future__ import annotations

import pytest
import torch

from flowzoo import algorithms
from flowzoo.algorithms.engine import sde
from flowzoo.benchmark.perf import gpu, gpu_large
from tests.device_reads import DeviceReads

#: device reads one iteration may make, whatever T: the reward's two finiteness checks (per reward call: each
#: ``rollout_batch`` of samples adds two), the first minibatch's policy drift, the update's sums (one read), the
#: gradient norm per optimizer step (2 here), the reward mean and std and the zero-std fraction of metrics.csv; with
#: ``drop_zero_advantage`` the kept rows once per update (``nonzero`` and their copy to the host: 2 more)
MAX_READS = 9

CASES = {
    "flow_grpo": {"kl_beta": 0.04, "micro_batch": 2, "minibatches": 2, "reuse_rollout_graph": False,
                  "drop_zero_advantage": True},
    "flow_grpo_fast": {},
    "dance_grpo": {"kernel": "dance_grpo", "shared_noise": True, "timestep_fraction": 0.6, "rollout_batch": 3},
    "mix_grpo": {},
    "op_grpo": {"off_policy_groups": 0.5, "t_off": 2, "kl_beta": 0.04},
    "flow_dppo": {"minibatches": 2, "micro_batch": 2, "sde_steps": 2, "timestep_fraction": 0.5},
    "grpo_guard": {"minibatches": 2, "micro_batch": 2},
}


@pytest.fixture(scope="module")
def sd3():
    return gpu.RandomSD3(gpu.TINY, resolution=32, device="meta", dtype="float32", lora_rank=4, text_tokens=6)


def reads_of_an_iteration(model, name: str, num_steps: int) -> DeviceReads:
    alg = algorithms.get(name)(model, gpu_large.MeanBrightness(), {"group_size": 4, "num_steps": num_steps,
                                                                  **CASES[name]}, seed=0)
    prompts = ["a cat", "two dogs"]
    with DeviceReads():
        alg.step(prompts)  # caches, and OP-GRPO's buffer: its second iteration replays
    with DeviceReads() as reads:
        alg.step(prompts)
    return reads


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_iterations_host_traffic_does_not_grow_with_the_steps(sd3, name):
    short, long = (reads_of_an_iteration(sd3, name, t) for t in (6, 9))
    assert short.reads == long.reads, (name, short.where, long.where)
    assert short.copies == long.copies
    # OP-GRPO's buffer (host-side) reads the batch's rewards once, the fresh rewards once and copies the groups' best
    # trajectories' latents and log-probs in one copy each: 4 more, whatever the number of groups
    reward_calls = -(-8 // CASES[name].get("rollout_batch", 8))
    # Flow-DPPO reads its KL mask's sums once per update (the masked fraction, the scores' mean and max): 1 more
    limit = (MAX_READS + 2 * (reward_calls - 1) + (4 if name == "op_grpo" else 0)
             + (2 if CASES[name].get("drop_zero_advantage") else 0) + (1 if name == "flow_dppo" else 0))
    assert long.total <= limit, dict(long.where)


def test_the_counter_sees_a_read_in_the_step_loop(sd3, monkeypatch):
    """The test above could fail: the former zero-noise check (a device read per step) is counted T times."""
    real = sde.sde_step

    def reading(*args, **kwargs):
        kwargs["deterministic"] = None  # read it from the step's std, on the device
        return real(*args, **kwargs)

    monkeypatch.setattr("flowzoo.algorithms.engine.rollout.sde_step", reading)
    short, long = (reads_of_an_iteration(sd3, "flow_grpo", t) for t in (3, 6))
    assert long.total - short.total >= 3


@pytest.mark.parametrize("kind", sde.KINDS)
@pytest.mark.parametrize("grid", sde.SIGMA_GRIDS)
def test_zero_noise_steps_known_on_the_host_match_the_kernel(kind, grid):
    """``deterministic_steps`` (host) says exactly where ``sde_step``'s std is 0 (CPS's last step to sigma 0, ...)."""
    for steps, shift, level in ((10, 3.0, 0.7), (4, 1.0, 0.3), (25, 5.0, 0.8)):
        sigmas = sde.sigma_schedule(steps, shift, grid=grid)
        quiet = sde.deterministic_steps(kind, sigmas, level)
        x, v = torch.randn(2, 3), torch.randn(2, 3)
        for t in range(steps):
            out = sde.sde_step(x, v, sigmas[t].expand(2), sigmas[t + 1].expand(2), kind=kind, noise_level=level,
                               generator=torch.Generator().manual_seed(t))
            assert bool(quiet[t]) == bool((out.std == 0).all()), (kind, grid, steps, t)
    assert bool(sde.deterministic_steps("cps", sde.sigma_schedule(10, 3.0), 0.7)[-1])
    with pytest.raises(ValueError, match="unknown SDE kind"):
        sde.deterministic_steps("ddim", sde.sigma_schedule(4), 0.7)
