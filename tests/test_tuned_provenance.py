"""A run at a tuned recipe records where its values came from (config.yaml's ``recipe`` note: the tuned: directory,
the file and the values it set), the note is no part of the run's identity (a run with the same math is the same
run), and the report says which cells ran at tuned recipes; committed runs without notes keep loading."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from flowzoo.benchmark.analysis import stats
from flowzoo.benchmark.analysis.runs import load_runs
from flowzoo.benchmark.render.report import runs_section
from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.checkpoints import config_digest
from flowzoo.benchmark.config.schema import resolved_dict
from flowzoo.benchmark.run.runner import is_finished, killed_before_checkpoint
from flowzoo.benchmark.run.suite import expand, load_suite
from tests.test_tuning import write_suite

ROOT = Path(__file__).resolve().parents[1]


def _tuned_dir(tmp_path: Path) -> Path:
    tuned = tmp_path / "tuned"
    (tuned / "toy2d_mode").mkdir(parents=True)
    (tuned / "toy2d_mode" / "op_grpo.yaml").write_text(yaml.safe_dump(
        {"algorithm_keys": {"lr": 4.2e-4, "t_off": 3}, "sampler_keys": {}}))
    (tuned / "toy2d_mode@dynamic").mkdir()
    (tuned / "toy2d_mode@dynamic" / "flow_grpo.yaml").write_text(yaml.safe_dump(
        {"algorithm_keys": {"lr": 3.3e-4}, "sampler_keys": {"max_rounds": 5}}))
    return tuned


def test_a_tuned_cell_records_its_values_and_source_without_changing_its_identity(tmp_path):
    tuned = _tuned_dir(tmp_path)
    suite = load_suite(str(write_suite(tmp_path, tuned=str(tuned))))
    configs = {(c.task, c.algorithm_name, c.seed): c for c in expand(suite, tmp_path / "runs")}
    op = configs[("toy2d_mode", "op_grpo", 0)]
    assert op.recipe == {"tuned": str(tuned), "file": str(tuned / "toy2d_mode" / "op_grpo.yaml"),
                         "algorithm_keys": {"lr": 4.2e-4, "t_off": 3}, "sampler_keys": {}}
    pinned = configs[("toy2d_mode@pinned", "op_grpo", 0)]  # the base task's file; the control keeps its t_off 0
    assert pinned.algorithm["t_off"] == 0 and pinned.recipe["algorithm_keys"] == {"lr": 4.2e-4}
    dynamic = configs[("toy2d_mode@dynamic", "flow_grpo", 0)].recipe
    assert dynamic["sampler_keys"] == {"max_rounds": 5}
    assert dynamic["file"].endswith("toy2d_mode@dynamic/flow_grpo.yaml")
    untuned = configs[("toy2d_mode", "flow_grpo", 0)]
    assert untuned.recipe is None and "recipe" not in resolved_dict(untuned)  # config.yaml as before notes existed
    # the command line wins over the tuned layer: the note keeps only what the run holds
    overridden = next(c for c in expand(suite, tmp_path / "runs", ["algorithm.lr=1e-3"])
                      if (c.task, c.algorithm_name) == ("toy2d_mode", "op_grpo"))
    assert overridden.recipe["algorithm_keys"] == {"t_off": 3}
    # identity: the same math with or without the note is the same run (checkpoint seal, done.json digest)
    plain = copy.deepcopy(op)
    plain.recipe = None
    assert config_digest(plain) == config_digest(op)
    moved = copy.deepcopy(op)
    moved.recipe = {**op.recipe, "tuned": "elsewhere"}
    assert config_digest(moved) == config_digest(op)
    changed = copy.deepcopy(op)
    changed.algorithm["lr"] = 5e-4
    assert config_digest(changed) != config_digest(op)  # the values themselves are the identity


def test_bench_at_tuned_recipes_writes_the_note_and_the_report_names_the_tuned_cells(tmp_path):
    tuned = _tuned_dir(tmp_path)
    suite_file = write_suite(tmp_path, **{"defaults.train.steps": 2, "defaults.model.args":
                                          {"hidden": 32, "pretrain_steps": 30}})
    runs = tmp_path / "runs"
    assert main(["bench", str(suite_file), "--runs", str(runs), "--tuned", str(tuned), "--tasks", "toy2d_mode",
                 "--seeds", "0,1", "--workers", "1"]) == 0
    op_dir, flow_dir = (runs / "mini" / "toy2d_mode" / a / "s0" for a in ("op_grpo", "flow_grpo"))
    note = yaml.safe_load((op_dir / "config.yaml").read_text())["recipe"]
    assert note["tuned"] == str(tuned) and note["algorithm_keys"] == {"lr": 4.2e-4, "t_off": 3}
    assert "recipe" not in yaml.safe_load((flow_dir / "config.yaml").read_text())
    # the run is finished for the same config without the note (e.g. its values written into a suite by hand)
    config = next(c for c in expand(load_suite(str(suite_file)), runs)
                  if (c.task, c.algorithm_name, c.seed) == ("toy2d_mode", "op_grpo", 0))
    config.algorithm.update(lr=4.2e-4, t_off=3)
    assert config.recipe is None and is_finished(op_dir, config)
    section = "\n".join(runs_section(stats.analyze(runs)))
    assert "| recipe |" in section
    assert f"| `toy2d_mode` | `op_grpo` | 2 | 0, 1 | 2/2 | 2 | tuned: `{tuned}` |" in section, section
    assert "| `toy2d_mode` | `flow_grpo` | 2 | 0, 1 | 2/2 | 2 | — |" in section
    # the study page says which cells ran at tuned recipes
    assert main(["study", str(runs / "mini"), "--suite", str(suite_file), "--out", str(tmp_path / "study"),
                 "--claims", "none", "--resamples", "100"]) == 0
    page = (tmp_path / "study" / "README.md").read_text()
    assert f"Cells at tuned recipes (their runs' config.yaml `recipe` notes; the others ran at the suite's own " \
           f"recipe): `toy2d_mode` `op_grpo`: tuned: `{tuned}`." in page


def test_a_killed_fresh_tuned_run_is_still_recognised_as_a_leftover(tmp_path):
    suite = load_suite(str(write_suite(tmp_path, tuned=str(_tuned_dir(tmp_path)))))
    for config in [c for c in expand(suite, tmp_path / "runs") if c.task == "toy2d_mode" and c.seed == 0]:
        run_dir = config.resolved_run_dir()
        run_dir.mkdir(parents=True)
        (run_dir / ".lock").touch()
        (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved_dict(config), sort_keys=False))
        assert killed_before_checkpoint(run_dir), config.algorithm_name  # with and without its recipe note


def test_committed_tuned_runs_with_and_without_notes_load():
    """The sparse task's first 100 tuned runs predate the note; the 360 made after it (the dense task, the sparse
    ablations and both tasks' prompt-sampler controls) name their tuned directory."""
    runs_dir = ROOT / "reports" / "example-op-grpo-study" / "tuned" / "run-metrics"
    recipes: dict = {}
    runs = load_runs(runs_dir, recipes=recipes)
    assert len(recipes) == runs["run"].nunique() == 460
    noted = {run for run, where in recipes.items() if where is not None}
    assert set(recipes.values()) == {None, "reports/example-op-grpo-study-tuning/tuned"} and len(noted) == 360
    assert all("dense" in run or "op_grpo_no" in run or "naive_is" in run or "@" in run for run in noted)


def test_committed_tiny_tuned_runs_ran_at_their_cells_tuned_learning_rates():
    """Every run of the tiny study's tuned page names the tiny tuning's files, and its lr is its cell's chosen one (the
    @buffer_prompts control takes Flow-GRPO's): a run at the shared lr 1e-3 would be a shared-recipe run mislabelled."""
    runs_dir = ROOT / "reports" / "example-tiny-rare-counting-study" / "tuned" / "run-metrics"
    tuned = ROOT / "reports" / "example-tiny-rare-counting-study-tuning" / "tuned"
    chosen = {(task.name, file.stem): yaml.safe_load(file.read_text())["algorithm_keys"]["lr"]
              for task in tuned.iterdir() for file in task.glob("*.yaml")}
    configs = sorted(runs_dir.rglob("config.yaml"))
    assert len(configs) == len({c.parent for c in configs}) and len(configs) == 100
    for path in configs:
        config = yaml.safe_load(path.read_text())
        assert config["recipe"]["tuned"] == "reports/example-tiny-rare-counting-study-tuning/tuned", path
        name = config["algorithm"]["name"]
        cell = (config["task"], name) if (config["task"], name) in chosen else (config["task"].split("@")[0], name)
        assert config["algorithm"]["lr"] == chosen[cell] != 1e-3, path
