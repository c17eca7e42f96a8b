"""The prompt-sampler hook (algorithms/prompt_samplers): the default draw is the one every earlier run made, each
sampler's rule, the filtering samplers' extra rounds counted in NFE, resumable state, and one-line refusals at config
load."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from flowzoo import algorithms
from flowzoo.algorithms import prompt_samplers
from flowzoo.algorithms.prompt_samplers import GroupOutcome
from flowzoo.algorithms.prompt_samplers.filters import BalancedDifficulty, DynamicSampling
from flowzoo.algorithms.prompt_samplers.variance import VariancePrioritised, largest_remainder
from flowzoo.benchmark.run.checkpoints import run_identity
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.loading import load_config
from flowzoo.errors import ConfigError
from flowzoo.rewards.base import Reward, RewardOutput
from tests.value_helpers import TINY, build
from flowzoo import models

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml"
POOL = [(f"p{i}", {"index": i, "tag": "even" if i % 2 == 0 else "odd"}) for i in range(12)]


def _old_prompt_batch(pool, seed, step, count):
    """The runner's uniform draw before samplers existed, written out again (the default must repeat it)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, step, 17]))
    copies = math.ceil(count / len(pool))
    return [pool[i] for i in rng.permutation(len(pool) * copies)[:count] % len(pool)]


def test_registry_lists_every_sampler_with_its_description_and_parameters(capsys):
    assert prompt_samplers.names() == ["difficulty", "dynamic", "replay_buffer", "uniform", "variance"]
    for name in prompt_samplers.names():
        assert prompt_samplers.get(name).name == name
    with pytest.raises(ConfigError, match="unknown prompt sampler 'nope'; known: difficulty"):
        prompt_samplers.get("nope")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "prompt samplers:" in out and "  variance " in out and "CGPO" in out
    assert main(["list", "difficulty"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("prompt sampler difficulty: Balanced online difficulty filtering") and "  low = 0.25" in out


@pytest.mark.parametrize("pool_size,groups", [(12, 8), (3, 8), (5, 5)])
def test_default_draw_is_the_draw_of_every_earlier_run(pool_size, groups):
    pool = POOL[:pool_size]
    alg = build()
    alg.use_prompts(pool, groups)
    for step in (1, 2, 7):
        draw = alg.prompt_sampler.draw(step, step - 1, alg)
        expected = _old_prompt_batch(pool, 0, step, groups)
        assert draw.prompts == [p for p, _ in expected] and draw.metadata == [m for _, m in expected]
        assert [pool[i][0] for i in draw.indices] == draw.prompts and not draw.from_buffer


def test_unset_sampler_keeps_the_run_identity_and_a_set_one_changes_it():
    plain = load_config(CONFIG, ["train.steps=2"])
    assert plain.train.prompt_sampler is None
    same = run_identity({"train": {"steps": 2, "prompt_sampler": None}}, set())
    assert same == run_identity({"train": {"steps": 2}}, set())  # a run made before samplers existed
    assert run_identity({"train": {"prompt_sampler": {"name": "dynamic"}}}, set()) != same


# ---- variance (CGPO) ---------------------------------------------------------------------------------------------
def _outcome(index, rewards):
    return GroupOutcome(index, POOL[index][0], torch.tensor(rewards, dtype=torch.float32))


def test_variance_sampler_draws_in_proportion_to_the_recent_variance():
    sampler = VariancePrioritised(POOL, 4, seed=0, config=VariancePrioritised.Config(floor=0.1))
    first = sampler.draw(1, 0)
    assert len(set(first.indices)) == 4  # distinct prompts; before any outcome every prompt is equal
    # prompts 0 and 1 had spread 0.25 (half successes), the rest none
    sampler.observe([_outcome(0, [1, 0, 1, 0]), _outcome(1, [0, 1, 0, 1])]
                    + [_outcome(i, [0, 0, 0, 0]) for i in range(2, 12)])
    p = sampler.probabilities(np.arange(12))
    assert p.sum() == pytest.approx(1.0)
    assert p[0] == pytest.approx(0.9 * 0.5 + 0.1 / 12) and p[5] == pytest.approx(0.1 / 12)
    counts = np.zeros(12)
    for step in range(2, 402):
        counts[sampler.draw(step, step - 1).indices] += 1
    assert min(counts[0], counts[1]) >= 390  # nearly always drawn (4 distinct of 12; they hold 91.7% of the mass)
    assert counts[2:].min() > 0 and counts[2:].sum() <= 820  # the floor keeps every other prompt reachable


def test_variance_estimate_is_smoothed_and_unseen_prompts_take_the_mean():
    sampler = VariancePrioritised(POOL, 2, seed=0, config=VariancePrioritised.Config(smoothing=0.5, floor=0.0))
    sampler.observe([_outcome(0, [1, 0]), _outcome(1, [0, 0])])  # variances 0.25 and 0
    sampler.observe([_outcome(0, [0, 0])])  # 0.5 * 0.25 + 0.5 * 0
    assert sampler.estimate[0] == pytest.approx(0.125) and sampler.estimate[1] == 0
    p = sampler.probabilities(np.arange(12))
    # ten unseen prompts at the mean 0.0625, prompt 0 at 0.125, prompt 1 at 0
    assert p[1] == 0 and p[0] == pytest.approx(2 * p[5]) and p[5] == pytest.approx(0.0625 / 0.75)


def test_category_calibration_splits_the_groups_by_size_and_variance():
    assert largest_remainder(np.array([0.5, 0.3, 0.2]), 10, np.array([9, 9, 9])).tolist() == [5, 3, 2]
    assert largest_remainder(np.array([0.9, 0.1]), 6, np.array([2, 9])).tolist() == [2, 4]  # capped
    config = VariancePrioritised.Config(category_key="tag", calibration=1.0, floor=0.0)
    sampler = VariancePrioritised(POOL, 4, seed=0, config=config)
    sampler.observe([_outcome(i, [1, 0] if i % 2 == 0 else [0, 0]) for i in range(12)])  # only "even" has spread
    for step in range(1, 20):
        draw = sampler.draw(step, step - 1)
        assert all(POOL[i][1]["tag"] == "even" for i in draw.indices)  # calibration 1: the variance decides
    sampler.config = VariancePrioritised.Config(category_key="tag", calibration=0.0, floor=1.0)
    tags = [POOL[i][1]["tag"] for i in sampler.draw(1, 0).indices]
    assert tags.count("even") == tags.count("odd") == 2  # calibration 0: categories by size (6 and 6)


def test_variance_state_resumes_and_a_pool_of_another_size_is_refused():
    sampler = VariancePrioritised(POOL, 4, seed=0)
    sampler.observe([_outcome(3, [1, 0, 0, 0])])
    again = VariancePrioritised(POOL, 4, seed=0)
    again.load_state_dict(sampler.state_dict())
    assert again.draw(5, 4).indices == sampler.draw(5, 4).indices
    with pytest.raises(ConfigError, match="holds 12 prompts, the pool 6"):
        VariancePrioritised(POOL[:6], 4, seed=0).load_state_dict(sampler.state_dict())


# ---- refusals at config load ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides,message", [
    (["train.prompt_sampler=nope"], "unknown prompt sampler 'nope'; known: difficulty, dynamic"),
    (["train.prompt_sampler={name: variance}", "train.prompts_per_step=8", "model.args.classes=4"],
     "draws 8 distinct prompts per step (train.prompts_per_step) but the training pool holds 4"),
    (["train.prompt_sampler={name: variance, category_key: tag}", "train.prompts_per_step=4"],
     "category_key 'tag': 4 of 4 training prompts have no such metadata key (e.g. 'class 0')"),
    (["train.prompt_sampler={name: variance, floor: 2}"], "train.prompt_sampler.floor must be in [0, 1], got 2"),
    (["train.prompt_sampler={name: dynamic, max_rounds: 0}"], "max_rounds must be in [1, 64], got 0"),
    (["train.prompt_sampler={name: difficulty, low: 0.8, high: 0.2}"], "need 0 <= low <= high <= 1"),
    (["train.prompt_sampler={name: dynamic, share: 0.5}"], "unknown key 'share'"),
    (["train.prompt_sampler=[dynamic]"], "train.prompt_sampler"),
    (["algorithm.name=op_grpo", "algorithm.replay_prompts=buffer", "algorithm.off_policy_groups=0.5",
      "train.prompt_sampler=variance"],
     "replay_prompts: buffer takes its buffer groups' prompts from the replay_buffer"),
    (["train.prompt_sampler={name: replay_buffer, share: 1.0}"], "share must be in [0, 1)"),
])
def test_bad_samplers_fail_at_config_load_in_one_line(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(CONFIG, [*overrides, f"run_dir={tmp_path / 'run'}"])
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


# ---- filtering samplers ------------------------------------------------------------------------------------------
class Sparse(Reward):
    """1 for a sample whose first coordinate is above 1.2 (rare under the untrained toy model), else 0."""

    name = "sparse_test"
    accepts = ("points",)

    def score(self, samples, prompts, metadata):
        return RewardOutput((samples[:, 0] > 1.2).float())


def _sparse(name="flow_grpo", **config):
    base = {"group_size": 4, "clip_range": 0.2, "lr": 1e-2, "kl_beta": 0.0}
    model = models.get("toy2d")(**TINY)
    return algorithms.get(name)(model, Sparse(), {**base, **config}, seed=0)


def test_dynamic_sampling_fills_the_batch_with_groups_that_have_spread_and_counts_every_rollout():
    pool = [(f"class {c}", {"class": c}) for c in range(4)] * 4
    reference = _sparse()
    reference.use_prompts(pool, 4)
    plain = reference.train_step(1)
    alg = _sparse()
    alg.use_prompts(pool, 4, {"name": "dynamic", "max_rounds": 6})
    seen = []
    alg.update = lambda traj, adv, seen=seen, inner=alg.update: seen.append(traj) or inner(traj, adv)
    stats = alg.train_step(1)
    rounds = int(stats.extra["sampler_rounds"])
    traj = seen[0]
    assert len(traj) == 16  # the batch size never changes
    assert stats.nfe_sampling == rounds * plain.nfe_sampling  # every round's rollout is counted
    spread = [float(traj.rewards[traj.group == g].std()) > 0 for g in traj.group.unique().tolist()]
    kept = stats.extra["sampler_kept_frac"] * rounds * 4
    assert sum(spread) == min(4, round(kept))  # kept groups first; unkept ones only complete a short batch
    assert 1 < rounds <= 6, "the test reward must leave first-round groups without spread"
    assert len(set(traj.group.tolist())) == 4 and traj.group.max() >= 16  # refill groups have ids from r * G * B


def test_difficulty_filter_keeps_intermediate_pass_rates():
    sampler = BalancedDifficulty(POOL, 2, seed=0)
    keeps = [sampler.keeps(torch.tensor(r, dtype=torch.float32)) for r in
             ([0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [0.6, 0.4, 0.4, 0.4])]
    assert keeps == [False, True, True, True, False, True]  # rates 0, .25, .5, .75, 1, .25 (threshold 0.5)
    dynamic = DynamicSampling(POOL, 2, seed=0)
    assert [dynamic.keeps(torch.tensor(r)) for r in ([0.0, 0.0], [0.3, 0.3], [0.0, 1e-6])] == [False, False, True]


def test_filtering_rounds_do_not_repeat_a_prompt_within_a_step():
    sampler = DynamicSampling(POOL, 3, seed=0, config=DynamicSampling.Config(max_rounds=4))
    drawn = sampler.draw(1, 0).indices + [i for r in (1, 2, 3) for i in sampler.refill(1, 0, r).indices]
    assert len(drawn) == len(set(drawn)) == 12 and sampler.refill(1, 0, 4) is None


# ---- the replay_buffer sampler without a replay buffer (OP-GRPO's prompts, no reuse) -----------------------------
def test_replay_buffer_sampler_keeps_its_own_prompt_buffer_for_flow_grpo():
    pool = [(f"class {c}", {"class": c}) for c in range(4)]
    alg = build()  # FirstCoordinate reward: every group has spread, its best sample beats the mean
    alg.use_prompts(pool, 4, {"name": "replay_buffer", "share": 0.5})
    assert not alg.prompt_sampler.draw(1, 0, alg).from_buffer  # empty before the first outcome
    first = alg.train_step(1)
    assert len(alg.prompt_sampler.own) == 4 and first.nfe_sampling > 0
    draw = alg.prompt_sampler.draw(2, 1, alg)
    assert draw.from_buffer == {2, 3} and set(draw.prompts[2:]) <= {p for p, _ in pool}
    blob = io.BytesIO()
    torch.save(alg.state_dict(), blob)
    blob.seek(0)
    again = build()
    again.use_prompts(pool, 4, {"name": "replay_buffer", "share": 0.5})
    again.load_state_dict(torch.load(blob, weights_only=False))
    assert again.prompt_sampler.draw(2, 1, again) == draw  # the buffer is part of the checkpoint


# ---- end to end -----------------------------------------------------------------------------------------------------
def test_train_with_a_sampler_writes_its_columns_and_resumes_identically(tmp_path, monkeypatch):
    args = ["train.steps=4", "train.eval_every=2", "train.save_samples=false", "train.checkpoint_every=2",
            "train.prompts_per_step=4", "train.prompt_sampler={name: variance, floor: 0.2}", "--quiet"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["train", str(CONFIG), *args, f"run_dir={straight}"]) == 0
    assert yaml.safe_load((straight / "config.yaml").read_text())["train"]["prompt_sampler"] == {
        "name": "variance", "floor": 0.2}
    real = algorithms.Algorithm.train_step

    def killed_at_step_3(self, step):
        if step == 3:
            raise KeyboardInterrupt  # the run dies after its step-2 checkpoint
        return real(self, step)

    monkeypatch.setattr(algorithms.Algorithm, "train_step", killed_at_step_3)
    assert main(["train", str(CONFIG), *args, f"run_dir={resumed}"]) != 0  # "interrupted; rerun ... to resume"
    monkeypatch.setattr(algorithms.Algorithm, "train_step", real)
    assert main(["train", str(CONFIG), *args, f"run_dir={resumed}"]) == 0  # steps 3-4 from the checkpoint
    drop = ["wall_s", "t_sampling", "t_reward", "t_training", "t_eval"]
    a, b = (pd.read_csv(d / "metrics.csv").drop(columns=drop) for d in (straight, resumed))
    pd.testing.assert_frame_equal(a, b)
    dynamic = tmp_path / "dynamic"
    assert main(["train", str(CONFIG), *args[:-2], "train.prompt_sampler=dynamic", "--quiet",
                 f"run_dir={dynamic}"]) == 0
    assert "sampler_rounds" in pd.read_csv(dynamic / "metrics.csv").columns
