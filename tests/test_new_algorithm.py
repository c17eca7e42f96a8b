"""A throwaway algorithm defined here registers and trains on the toy tier, as docs/adding-an-algorithm.md says, and
needs no other file: no recipe file (an empty recipe), the default search space for ``flowzoo tune``."""

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from flowzoo import algorithms
from flowzoo import rewards
from flowzoo.algorithms.engine.base import Algorithm, AlgorithmConfig
from flowzoo.algorithms.engine.plans import window_plan
from flowzoo.benchmark.config import recipe_files, recipes, search_space
from flowzoo.benchmark.run.loading import build_config
from flowzoo.benchmark.tuning import tune as tuning
from flowzoo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class LastStepsConfig(AlgorithmConfig):
    trained_tail: int = 3  # SDE and training on the last few steps before the final one


class LastStepsGRPO(Algorithm):
    name = "test_last_steps_grpo"
    Config = LastStepsConfig

    def step_plan(self, batch):
        start = self.num_steps - 1 - self.config.trained_tail
        return window_plan(self.sigmas, start, self.config.trained_tail, batch, self.config.kernel, self.config.noise_level)


@pytest.fixture(scope="module", autouse=True)
def registered():
    algorithms.REGISTRY.add(LastStepsGRPO.name, LastStepsGRPO)
    yield
    algorithms.REGISTRY._entries.pop(LastStepsGRPO.name)


def test_registers_validates_and_trains(toy_model, toy_prompts):
    assert "test_last_steps_grpo" in algorithms.names()
    config = build_config({"algorithm": {"name": "test_last_steps_grpo", "trained_tail": 2}})
    assert config.algorithm["trained_tail"] == 2 and config.algorithm["clip_range"] == 1e-4
    with pytest.raises(ConfigError, match="unknown key 'tail'"):
        build_config({"algorithm": {"name": "test_last_steps_grpo", "tail": 2}})

    prompts, meta = toy_prompts
    alg = algorithms.get("test_last_steps_grpo")(
        toy_model, rewards.build("toy_mode"), {"clip_range": 0.2, "lr": 1e-3, "kl_beta": 0.0, "group_size": 8}, seed=0
    )
    traj = alg.collect(prompts, meta)
    assert traj.sde.tolist() == [False] * 6 + [True] * 3 + [False]
    assert torch.equal(traj.log_probs[:, :6], torch.zeros(len(traj), 6))
    history = [alg.step(prompts * 2, meta * 2).reward_mean for _ in range(15)]
    assert history[-1] > history[0]
    recomputed = 0 if alg.keeps_rollout_graph() else len(prompts) * 8 * 3  # no KL: the policy forward, if recomputed
    assert alg.step(prompts, meta).nfe_training == recomputed


def test_without_a_recipe_file_it_runs_the_class_defaults_and_tunes_over_the_default_space(tmp_path):
    """Adding an algorithm is one file: with no benchmark/recipes/<name>.yaml its recipe is empty on every task,
    docs/recipes.md stays current, and ``flowzoo tune`` tunes its learning rate over the default space (the shipped
    files' lr ranges) instead of refusing the cell."""
    import yaml

    name = LastStepsGRPO.name
    assert not recipe_files.recipe_path(name).is_file()
    for task, model in (("sd3_geneval", "sd3"), ("toy2d_mode", "toy2d"), ("tiny_counting_rare", "tiny")):
        assert recipes.recipe(name, task, model) == {}
    assert (ROOT / "docs" / "recipes.md").read_text() == recipes.recipe_table()

    assert search_space.space_paths(name) == [recipe_files.default_space_path()]
    for model in (None, "toy2d", "tiny"):  # the default space's ranges are those the shipped files declare
        ours, shipped = search_space.algorithm_space(name, model), search_space.algorithm_space("flow_grpo", model)
        assert list(ours) == ["lr"] and ours["lr"].describe() == shipped["lr"].describe()
    assert search_space.algorithm_space(name, "tiny")["lr"].high == 3e-3  # the tiny scope narrows it
    assert "the default space" in search_space.listing(name)[0]
    assert "the default space" not in search_space.listing("flow_grpo")[0]  # a file's own space replaces it

    suite = {
        "name": "one-file", "seeds": [0], "algorithms": ["flow_grpo", name],
        "defaults": {"algorithm": {"group_size": 8, "clip_range": 0.05, "lr": 1.0e-4, "kl_beta": 0.0},
                     "train": {"steps": 2, "prompts_per_step": 2, "eval_every": 2, "eval_samples_per_prompt": 4,
                               "save_samples": False, "threads": 1},
                     "model": {"name": "toy2d"}, "reward": "toy_mode"},
        "tasks": {"toy2d_mode": {}},
        "tuning": {"objective": "auc", "trials": 2, "seeds": [1000],
                   "validation": {"eval_seed": 54321, "prompts": "reported"}},
    }
    path = tmp_path / "one-file.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    loaded, design = tuning.load_tuning(str(path))
    cell = next(c for c in tuning.tuning_cells(loaded, design) if c.algorithm == name)
    assert list(cell.knobs) == ["lr"]
    assert tuning.check_space(loaded, design, cell, tmp_path) == 3  # both bounds and the log-midpoint load
