"""The speed defaults: ``reuse_rollout_graph: auto`` is on exactly where the recompute-free update is valid, and the
execution-only keys (``cfg_batch``, ``reuse_rollout_graph``) are no part of a run's identity, so runs made before
they existed, or with other values, are the same runs."""

import pytest

from flowzoo import algorithms
from flowzoo import models
from flowzoo import rewards
from flowzoo.benchmark.run.checkpoints import run_identity
from flowzoo.errors import ConfigError


@pytest.fixture(scope="module")
def toy():
    return models.get("toy2d")()


@pytest.mark.parametrize("name, config, on", [
    ("flow_grpo", {}, True),
    ("flow_grpo_fast", {}, True),
    ("mix_grpo", {}, True),
    ("flow_grpo", {"minibatches": 2}, False),  # a second optimizer step needs a fresh forward
    ("flow_grpo", {"inner_epochs": 2}, False),
    ("flow_grpo", {"micro_batch": 4}, False),  # a memory bound: kept graphs are not micro-batched
    ("dance_grpo", {}, False),  # random steps per sample
    ("op_grpo", {}, False),  # hybrid batches drop the fresh part's graphs
    ("flow_grpo", {"reuse_rollout_graph": False}, False),
    ("dance_grpo", {"reuse_rollout_graph": True}, True),  # an explicit choice is kept
])
def test_auto_reuse_is_on_where_valid(toy, name, config, on):
    alg = algorithms.get(name)(toy, rewards.build("toy_mode"), config)
    assert alg.config.reuse_rollout_graph == config.get("reuse_rollout_graph", "auto")
    assert alg.keeps_rollout_graph() is on
    traj = alg.collect(["class 0"], [{}])
    assert (traj.live is not None) is on


def test_explicit_reuse_with_two_optimizer_steps_is_refused(toy):
    with pytest.raises(ConfigError, match="reuse_rollout_graph needs inner_epochs 1 and minibatches 1.*minibatches 2"):
        algorithms.get("flow_grpo")(toy, rewards.build("toy_mode"), {"reuse_rollout_graph": True, "minibatches": 2})


def test_execution_keys_are_no_part_of_a_runs_identity():
    old = {"algorithm": {"name": "flow_grpo", "lr": 1e-3, "reuse_rollout_graph": False}, "train": {"threads": 1}}
    new = {"algorithm": {"name": "flow_grpo", "lr": 1e-3, "reuse_rollout_graph": "auto", "cfg_batch": "split"},
           "train": {"threads": 2}}
    assert run_identity(old, set()) == run_identity(new, set())
    other = {**new, "algorithm": {**new["algorithm"], "lr": 2e-3}}
    assert run_identity(old, set()) != run_identity(other, set())
