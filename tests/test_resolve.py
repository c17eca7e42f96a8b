"""benchmark/config/resolve.py: one resolver gives every command the same run keys.

A paper-suite cell resolved by bench, the same cell named ``SUITE:TASK/ALGORITHM`` to ``flowzoo train``, and a config
file holding the cell's keys all give one config; the layers keep their order (class < shared < recipe < own < tuned <
overrides) and the recipe follows the run's final algorithm, model and task."""

from __future__ import annotations

import copy

import pytest
import yaml

from flowzoo.benchmark.run.checkpoints import config_digest
from flowzoo.benchmark.config.schema import resolved_dict
from flowzoo.benchmark.run.loading import load_config, load_resolved
from flowzoo.benchmark.config.recipes import recipe
from flowzoo.benchmark.config.resolve import Layers, resolve
from flowzoo.benchmark.run.run_source import load_run
from flowzoo.benchmark.run.suite import cell_keys, cell_run, cells, expand, load_suite, parse_cell_ref
from flowzoo.benchmark.config.tuned import TunedValues
from flowzoo.cells import base_task
from flowzoo.errors import ConfigError

from tests.test_recipes import PAPER_SUITES, prompt_dir  # noqa: F401 (prompt_dir: the paper suites' prompt files)


def _same(a, b) -> None:
    assert resolved_dict(a) == resolved_dict(b)
    assert config_digest(a) == config_digest(b)


@pytest.mark.parametrize("suite_name", PAPER_SUITES)
def test_train_of_a_paper_cell_is_benchs_run_of_it(suite_name, prompt_dir, tmp_path):
    """Every cell of every paper suite: ``flowzoo train SUITE:TASK/ALG`` resolves the config bench runs, and a config
    file with the cell's keys (its own algorithm block, the suite's shared sampling keys the recipe leaves alone)
    resolves it too: train applies the released recipe by default."""
    suite = load_suite(suite_name)
    bench = {(c.task, c.algorithm_name): c for c in expand(suite, tmp_path / "runs", prompt_dir)
             if c.seed == suite.seeds[0]}
    assert sorted(bench) == sorted(cells(suite))
    for (task, alg), config in bench.items():
        alone, resolved = cell_run(f"{suite_name}:{task}/{alg}", prompt_dir, tmp_path / "runs")
        _same(alone, config)
        keys = cell_keys(suite, task, alg)
        offered = recipe(alg, base_task(task), keys.model)
        shared = {k: v for k, v in keys.shared.items() if k not in offered}
        data = {**copy.deepcopy(keys.data), "task": task, "seed": config.seed, "run_dir": config.run_dir,
                "algorithm": {"name": alg, **shared, **keys.own}}
        path = tmp_path / f"{task}-{alg}.yaml"
        path.write_text(yaml.safe_dump(data))
        from_file, file_resolved = load_resolved(path, prompt_dir)
        _same(from_file, config)
        assert file_resolved.recipe_offered == resolved.recipe_offered == offered


def test_a_config_file_gets_its_recipe_under_its_own_keys(prompt_dir, tmp_path):
    """dance_grpo on sd3: the recipe's group size 12 (not the class's 8) unless the file or the command line says
    otherwise; use_recipe=false gives the class defaults; the line train prints names the values it set."""
    from flowzoo.algorithms.methods.dance_grpo import DanceGRPO

    path = tmp_path / "dance.yaml"
    path.write_text(yaml.safe_dump({"task": "sd3_ocr", "algorithm": {"name": "dance_grpo", "lr": 1e-4},
                                    "model": {"name": "sd3"}, "reward": "ocr",
                                    "prompts": {"source": "files"}}))
    released = recipe("dance_grpo", "sd3_ocr", "sd3")["group_size"]
    assert released != DanceGRPO.Config().group_size
    config, resolved = load_resolved(path, prompt_dir)
    assert config.algorithm["group_size"] == released and config.algorithm["lr"] == 1e-4
    assert f"group_size={released}" in resolved.recipe_line() and "lr=" not in resolved.recipe_line()
    assert load_config(path, [*prompt_dir, "algorithm.group_size=4"]).algorithm["group_size"] == 4
    off, resolved_off = load_resolved(path, [*prompt_dir, "use_recipe=false"])
    assert off.algorithm["group_size"] == DanceGRPO.Config().group_size
    assert "recipe: off" in resolved_off.recipe_line()
    assert "use_recipe" not in resolved_dict(config) and resolved_dict(off)["use_recipe"] is False
    assert config_digest(off) != config_digest(config)  # the keys differ, so the runs do


def test_the_recipe_follows_the_final_algorithm_and_task(tmp_path):
    """``algorithm.name=`` on the command line gets that algorithm's recipe (toy2d: MixGRPO's window_tau 6), and a
    ``task@variant`` the recipe of its task."""
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump({"task": "toy2d_mode@variant", "algorithm": {"name": "flow_grpo"}}))
    mix, resolved = load_resolved(path, ["algorithm.name=mix_grpo"])
    assert mix.algorithm["window_tau"] == recipe("mix_grpo", "toy2d_mode", "toy2d")["window_tau"] == 6
    assert resolved.recipe_keys == {"window_tau": 6}
    assert "recipe: none" in load_resolved(path)[1].recipe_line()  # flow_grpo has no toy2d values


def test_the_layers_keep_their_order():
    """class < shared < recipe < own < tuned < overrides, and the tuned layer never replaces a pinned key."""
    data = {"task": "sd3_ocr", "model": {"name": "sd3"}}
    offered = recipe("mix_grpo", "sd3_ocr", "sd3")
    layers = Layers(shared={"group_size": 99, "micro_batch": 3}, own={"clip_range": 0.5, "kl_beta": 0.2},
                    pinned={"kl_beta": 0.2}, tuned=TunedValues({"clip_range": 0.3, "kl_beta": 0.9, "lr": 1e-5}, {}, "t"),
                    overrides=("algorithm.lr=2.0e-5",))
    out = resolve(data, "mix_grpo", layers)
    keys = out.data["algorithm"]
    assert keys["group_size"] == offered["group_size"] != 99  # the recipe over the shared block
    assert keys["micro_batch"] == 3  # a shared key the recipe leaves alone
    assert keys["clip_range"] == 0.3  # tuned over own
    assert keys["kl_beta"] == 0.2  # pinned: never tuned
    assert keys["lr"] == 2e-5  # the command line over everything
    assert "group_size" in out.recipe_keys and "clip_range" not in out.recipe_keys and "lr" not in out.recipe_keys


@pytest.mark.parametrize("ref, message", [
    ("nosuchsuite:toy2d_mode/flow_grpo", "unknown suite 'nosuchsuite'"),
    ("quick:nosuchtask/flow_grpo", "has no task 'nosuchtask'; tasks: "),
    ("quick:toy2d_mode/nosuchalg", "does not run 'nosuchalg' on toy2d_mode; it runs: "),
])
def test_a_bad_cell_reference_is_one_line_naming_the_choices(ref, message):
    with pytest.raises(ConfigError, match=message):
        load_run(ref)


def test_cell_references_and_files_are_told_apart(tmp_path):
    assert parse_cell_ref("quick:toy2d_mode/op_grpo") == ("quick", "toy2d_mode", "op_grpo")
    assert parse_cell_ref("benchmark/suites/quick.yaml:toy2d_mode@x/op_grpo") == (
        "benchmark/suites/quick.yaml", "toy2d_mode@x", "op_grpo")
    assert parse_cell_ref("benchmark/configs/toy_flow_grpo.yaml") is None
    assert parse_cell_ref("quick:toy2d_mode") is None
    odd = tmp_path / "a:b" / "c"
    odd.parent.mkdir()
    odd.write_text("task: t\n")
    assert parse_cell_ref(str(odd)) is None  # an existing file is a file


def test_a_cell_trained_alone_takes_the_seed_and_directory_asked(tmp_path):
    config, _ = cell_run("quick:toy2d_mode/op_grpo", ["seed=7", "train.steps=2"], tmp_path)
    assert config.seed == 7 and config.train.steps == 2
    assert config.resolved_run_dir() == tmp_path / "quick" / "toy2d_mode" / "op_grpo" / "s7"
    config, _ = cell_run("quick:toy2d_mode/op_grpo", [f"run_dir={tmp_path / 'x'}"], tmp_path)
    assert config.seed == load_suite("quick").seeds[0] and config.resolved_run_dir() == tmp_path / "x"


def test_train_prints_the_recipe_it_applied(tmp_path, capsys):
    from flowzoo.benchmark.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", "quick:toy2d_mode/mix_grpo", "train.steps=1", "train.eval_every=0",
                 "train.eval_samples_per_prompt=2", f"run_dir={run_dir}", "--quiet"]) == 0
    assert (run_dir / "done.json").is_file()
    main(["train", "quick:toy2d_mode/mix_grpo", "train.steps=1", "train.eval_every=0",
          "train.eval_samples_per_prompt=2", f"run_dir={run_dir}"])
    out = capsys.readouterr().out
    assert "recipe: mix_grpo.yaml for mix_grpo on toy2d, task toy2d_mode: window_tau=6" in out
    assert "run already finished" in out  # the second call found the first's run: the same config
